//! The session cache: rows of `sessions`, their tombstones, and how the list finds the moves
//! recorded in `session_moves`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Sqlite;
use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;

use super::{BEGIN_IMMEDIATE, SqliteStore, micros, to_json};
use crate::store::common::{GET_SESSION, TOMBSTONE_LIVE};
use crate::store::listing::FirstMoves;
use crate::store::{SessionRecord, StoreResult};

/// The row [`Store::update_session`](crate::store::Store::update_session) changes. Its
/// transaction is an immediate one, which holds the write lock from this read to the commit, so
/// no other write can slip in between (the SQLite counterpart of `SELECT … FOR UPDATE`).
pub(super) const LOCK_SESSION: &str = GET_SESSION;

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

/// Binds the twelve session columns ($1…$12) in [`session_columns!`] order, in their column
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
}

impl SqliteStore {
    pub(super) async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let at = micros(at);
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
