//! The session cache: rows of `sessions`, their tombstones, and how the list finds the moves
//! recorded in `session_moves`.

use serde_json::Value;
use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Row, Sqlite};

use super::store::{BEGIN_IMMEDIATE, SqliteStore, micros, to_json};
use crate::store::common::{GET_SESSION, TOMBSTONE_LIVE};
use crate::store::error::StoreResult;
use crate::store::listing::FirstMoves;
use crate::store::records::{ListedSession, SessionRecord};

/// The row
/// [`SessionRecords::update_session`](crate::store::contract::SessionRecords::update_session)
/// changes. Its transaction is an immediate one, which holds the write lock from this read to the
/// commit, so no other write can slip in between (the SQLite counterpart of `SELECT … FOR UPDATE`).
pub(super) const LOCK_SESSION: &str = GET_SESSION;

/// SQLite's limit on bound parameters per statement.
const MAX_BINDS: usize = 32_766;
/// Session rows per statement of [`SqliteStore::put_sessions`]: seventeen parameters each.
const ROWS_PER_PUT: usize = MAX_BINDS / 17;

/// `INSERT … VALUES` of `rows` session rows. The parameters are anonymous (`?`): SQLite finds
/// a numbered one by its number in a list, so that binding thousands of them would take time
/// growing with the square of their count.
fn put_sessions_statement(rows: usize) -> String {
    let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let mut sql = String::with_capacity(200 + rows * (row.len() + 2));
    sql.push_str(concat!(
        "INSERT INTO sessions (",
        session_columns!(),
        ") VALUES "
    ));
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(row);
    }
    sql.push_str(replace_unless_tombstoned!("MAX"));
    sql
}

/// The page as one JSON array of `[id, digest]` pairs (`$1`).
const SESSIONS_TO_SYNC: &str =
    sessions_to_sync!("(SELECT value ->> 0 AS id, value ->> 1 AS digest FROM json_each($1)) AS l");

/// [`SESSIONS_TO_SYNC`] of the page `listed`.
pub(super) fn to_sync_query(
    listed: &[ListedSession],
) -> Query<'static, Sqlite, SqliteArguments<'static>> {
    let page: Vec<(&str, i64)> = listed
        .iter()
        .map(|l| (l.session_id.as_str(), l.digest))
        .collect();
    let page = serde_json::to_string(&page).expect("strings and numbers serialize");
    sqlx::query(SESSIONS_TO_SYNC).bind(page)
}

/// A bare tombstone for an id the cache does not know. Such an id can only have come from the
/// agent, hence `origin = 'upstream'`.
const INSERT_TOMBSTONE: &str = "INSERT INTO sessions \
     (session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
      archived, origin, deleted_at, synced_at) \
     VALUES (?1, ?2, '', '[]', NULL, ?3, ?3, NULL, 0, 'upstream', ?3, NULL) \
     ON CONFLICT (session_id) DO NOTHING";

/// Each session's first move since the snapshot. SQLite has no `DISTINCT ON`; it returns the
/// bare column `from_updated_at` of the row that has the `MIN(id)`.
pub(super) const FIRST_MOVES: FirstMoves = FirstMoves {
    head: "SELECT session_id, from_updated_at, MIN(id) FROM session_moves WHERE id > ",
    tail: " GROUP BY session_id",
};

/// Binds the seventeen session columns in [`session_columns!`] order, in their column
/// representation.
pub(super) fn bind_session<'q>(
    query: Query<'q, Sqlite, SqliteArguments<'q>>,
    record: &'q SessionRecord,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    query
        .bind(&record.session_id)
        .bind(&record.tenant)
        .bind(&record.cwd)
        .bind(to_json(&Value::from(
            record.additional_directories.as_slice(),
        )))
        .bind(&record.title)
        .bind(micros(record.updated_at))
        .bind(micros(record.created_at))
        .bind(record.meta.as_ref().map(to_json))
        .bind(record.archived)
        .bind(record.origin.as_str())
        .bind(record.deleted_at.map(micros))
        .bind(record.synced_at.map(micros))
        .bind(record.listed)
        .bind(&record.agent)
        .bind(&record.people.owner)
        .bind(&record.people.owner_name)
        .bind(&record.people.who_answers)
}

impl SqliteStore {
    pub(super) async fn put_sessions(&self, records: &[SessionRecord]) -> StoreResult<Vec<String>> {
        let mut written = Vec::with_capacity(records.len());
        for chunk in records.chunks(ROWS_PER_PUT) {
            let sql = put_sessions_statement(chunk.len());
            let query = chunk.iter().fold(sqlx::query(&sql), bind_session);
            for row in query.fetch_all(&self.writer).await? {
                written.push(row.try_get(0)?);
            }
        }
        Ok(written)
    }

    /// [`SessionRecords::tombstone_session`](crate::store::contract::SessionRecords::tombstone_session),
    /// `at` in unix microseconds.
    pub(super) async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: i64,
    ) -> StoreResult<bool> {
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let updated = sqlx::query(TOMBSTONE_LIVE)
            .bind(session_id)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        let tombstoned_live = updated.rows_affected() == 1;
        if !tombstoned_live {
            // Unknown (insert a bare tombstone) or already deleted (nothing to do). No other
            // write can run inside this transaction, so there is no race between the two.
            sqlx::query(INSERT_TOMBSTONE)
                .bind(session_id)
                .bind(tenant)
                .bind(at)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(tombstoned_live)
    }
}

impl SqliteStore {
    /// The events of an imported session (see
    /// [`SessionImports`](crate::store::imports::SessionImports)), in `tx`, as they are.
    pub(super) async fn insert_imported(
        &self,
        tx: &mut sqlx::SqliteConnection,
        session_id: &str,
        events: &[crate::store::event::StoredEvent],
    ) -> StoreResult<()> {
        let mut insert = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO session_events (session_id, seq, kind, payload, created_at) ",
        );
        insert.push_values(events, |mut row, e| {
            row.push_bind(session_id)
                .push_bind(e.seq)
                .push_bind(&e.kind)
                .push_bind(e.payload.as_str())
                .push_bind(micros(e.created_at));
        });
        insert.build().execute(tx).await?;
        Ok(())
    }
}
