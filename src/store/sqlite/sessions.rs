//! The session cache: rows of `sessions`, their tombstones, and the keyset-paged list with
//! its recorded moves (`session_moves`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{QueryBuilder, Row, Sqlite};

use super::{
    BEGIN_IMMEDIATE, SqliteStore, from_json, from_micros, micros, opt_from_micros, to_json,
};
use crate::store::{
    ListQuery, Listed, Origin, SessionList, SessionMutation, SessionRecord, StoreError,
    StoreResult, merge_page, truncate_timestamps,
};

const PUT_SESSION: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
     ON CONFLICT (session_id) DO UPDATE SET \
     tenant = excluded.tenant, cwd = excluded.cwd, \
     additional_directories = excluded.additional_directories, title = excluded.title, \
     updated_at = excluded.updated_at, created_at = excluded.created_at, meta = excluded.meta, \
     archived = excluded.archived, origin = excluded.origin, deleted_at = excluded.deleted_at, \
     synced_at = excluded.synced_at \
     WHERE sessions.deleted_at IS NULL"
);

const GET_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = ?"
);

/// Parameters as in [`bind_session`] but with the key (`session_id`) last.
const UPDATE_SESSION: &str = "UPDATE sessions SET tenant = ?, cwd = ?, \
     additional_directories = ?, title = ?, updated_at = ?, created_at = ?, meta = ?, \
     archived = ?, origin = ?, deleted_at = ?, synced_at = ? WHERE session_id = ?";

const TOMBSTONE_LIVE: &str =
    "UPDATE sessions SET deleted_at = ? WHERE session_id = ? AND deleted_at IS NULL";

/// A bare tombstone for an id the cache does not know. Such an id can only have come from the
/// agent, hence `origin = 'upstream'`.
const INSERT_TOMBSTONE: &str = "INSERT INTO sessions \
     (session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
      archived, origin, deleted_at, synced_at) \
     VALUES (?1, ?2, '', '[]', NULL, ?3, ?3, NULL, 0, 'upstream', ?3, NULL) \
     ON CONFLICT (session_id) DO NOTHING";

fn dirs_to_json(dirs: &[String]) -> String {
    to_json(&Value::from(dirs))
}

fn dirs_from_json(text: &str, what: &str) -> StoreResult<Vec<String>> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "{what}: additional_directories is not an array of strings: {e}"
        ))
    })
}

/// A session row in its column representation.
struct SessionParams {
    session_id: String,
    tenant: String,
    cwd: String,
    additional_directories: String,
    title: Option<String>,
    updated_at: i64,
    created_at: i64,
    meta: Option<String>,
    archived: bool,
    origin: &'static str,
    deleted_at: Option<i64>,
    synced_at: Option<i64>,
}

impl SessionParams {
    fn new(record: &SessionRecord) -> Self {
        Self {
            session_id: record.session_id.clone(),
            tenant: record.tenant.clone(),
            cwd: record.cwd.clone(),
            additional_directories: dirs_to_json(&record.additional_directories),
            title: record.title.clone(),
            updated_at: micros(record.updated_at),
            created_at: micros(record.created_at),
            meta: record.meta.as_ref().map(to_json),
            archived: record.archived,
            origin: record.origin.as_str(),
            deleted_at: record.deleted_at.map(micros),
            synced_at: record.synced_at.map(micros),
        }
    }
}

/// Binds every column but `session_id`, in [`session_columns!`] order.
fn bind_session_fields<'q>(
    query: Query<'q, Sqlite, SqliteArguments<'q>>,
    p: &'q SessionParams,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    query
        .bind(&p.tenant)
        .bind(&p.cwd)
        .bind(&p.additional_directories)
        .bind(&p.title)
        .bind(p.updated_at)
        .bind(p.created_at)
        .bind(&p.meta)
        .bind(p.archived)
        .bind(p.origin)
        .bind(p.deleted_at)
        .bind(p.synced_at)
}

/// A listed row that has not moved: its position is its `updated_at`.
fn listed_at_updated(row: &SqliteRow) -> StoreResult<Listed> {
    let record = session_from_row(row)?;
    Ok(Listed {
        key: record.updated_at,
        record,
    })
}

/// `WHERE` for the list queries over `sessions s`: live rows of the query's archive state,
/// tenant and cwd.
fn push_list_filters(qb: &mut QueryBuilder<'_, Sqlite>, query: &ListQuery) {
    qb.push(" WHERE s.deleted_at IS NULL AND s.archived = ")
        .push_bind(query.archived.unwrap_or(false));
    if let Some(tenant) = &query.tenant {
        qb.push(" AND s.tenant = ").push_bind(tenant.clone());
    }
    if let Some(cwd) = &query.cwd {
        qb.push(" AND s.cwd = ").push_bind(cwd.clone());
    }
}

fn session_from_row(row: &SqliteRow) -> StoreResult<SessionRecord> {
    let session_id: String = row.try_get("session_id")?;
    let what = format!("session {session_id:?}");
    let dirs: String = row.try_get("additional_directories")?;
    let meta: Option<String> = row.try_get("meta")?;
    let origin: String = row.try_get("origin")?;
    Ok(SessionRecord {
        tenant: row.try_get("tenant")?,
        cwd: row.try_get("cwd")?,
        additional_directories: dirs_from_json(&dirs, &what)?,
        title: row.try_get("title")?,
        updated_at: from_micros(row.try_get("updated_at")?, &what)?,
        created_at: from_micros(row.try_get("created_at")?, &what)?,
        meta: meta.as_deref().map(|m| from_json(m, &what)).transpose()?,
        archived: row.try_get("archived")?,
        origin: Origin::parse(&origin)?,
        deleted_at: opt_from_micros(row.try_get("deleted_at")?, &what)?,
        synced_at: opt_from_micros(row.try_get("synced_at")?, &what)?,
        session_id,
    })
}

impl SqliteStore {
    pub(super) async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        let params = SessionParams::new(record);
        // One statement: the upsert's `WHERE` leaves a tombstoned row untouched (0 changes).
        let query = sqlx::query(PUT_SESSION).bind(&params.session_id);
        let done = bind_session_fields(query, &params)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(GET_SESSION)
            .bind(session_id)
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    pub(super) async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        // The immediate transaction holds the write lock from the read to the commit, so no
        // other write can slip in between (the SQLite counterpart of `SELECT … FOR UPDATE`).
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let row = sqlx::query(GET_SESSION)
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut record = session_from_row(&row)?;
        if record.deleted_at.is_some() {
            return Ok(None);
        }
        mutate(&mut record);
        // The id is the row's key: a mutation cannot move the row to another id.
        record.session_id = session_id.to_owned();
        truncate_timestamps(&mut record);
        let params = SessionParams::new(&record);
        bind_session_fields(sqlx::query(UPDATE_SESSION), &params)
            .bind(&params.session_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    pub(super) async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList> {
        let limit = query.limit.max(1) + 1;
        let Some(after) = &query.after else {
            // First page: the rows and the newest move, read by one statement (one snapshot).
            let mut qb = QueryBuilder::<Sqlite>::new(concat!(
                "SELECT ",
                session_columns!(),
                ", (SELECT COALESCE(MAX(id), 0) FROM session_moves) AS snapshot FROM sessions s"
            ));
            push_list_filters(&mut qb, query);
            qb.push(" ORDER BY updated_at DESC, session_id DESC LIMIT ")
                .push_bind(limit);
            let rows = qb.build().fetch_all(&self.reader).await?;
            let snapshot = match rows.first() {
                Some(row) => row.try_get("snapshot")?,
                None => 0,
            };
            let rows = rows
                .iter()
                .map(listed_at_updated)
                .collect::<StoreResult<_>>()?;
            return Ok(merge_page(query, snapshot, rows));
        };
        let at = micros(after.updated_at);
        // One statement, so that both parts see the same database: rows that have not moved
        // since the snapshot, at their current position, and rows that moved since, at the
        // position they had then.
        // (SQLite returns the bare column `from_updated_at` of the row that has the `MIN(id)`.)
        let mut qb = QueryBuilder::<Sqlite>::new(concat!(
            "SELECT * FROM (SELECT ",
            session_columns!(),
            ", s.updated_at AS list_key FROM sessions s"
        ));
        push_list_filters(&mut qb, query);
        qb.push(" AND (updated_at, session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(
                ") AND NOT EXISTS (SELECT 1 FROM session_moves m \
                 WHERE m.session_id = s.session_id AND m.id > ",
            )
            .push_bind(after.snapshot)
            .push(") ORDER BY updated_at DESC, session_id DESC LIMIT ")
            .push_bind(limit)
            .push(concat!(
                ") AS kept UNION ALL SELECT * FROM (SELECT ",
                session_columns!(),
                ", m.from_updated_at AS list_key FROM (SELECT session_id, from_updated_at, MIN(id) \
                 FROM session_moves WHERE id > "
            ))
            .push_bind(after.snapshot)
            .push(" GROUP BY session_id) m JOIN sessions s USING (session_id)");
        push_list_filters(&mut qb, query);
        qb.push(" AND (m.from_updated_at, s.session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(") ORDER BY m.from_updated_at DESC, s.session_id DESC LIMIT ")
            .push_bind(limit)
            .push(") AS moved");
        let rows = qb.build().fetch_all(&self.reader).await?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok(Listed {
                    key: from_micros(row.try_get("list_key")?, "list_key")?,
                    record: session_from_row(row)?,
                })
            })
            .collect::<StoreResult<_>>()?;
        Ok(merge_page(query, after.snapshot, rows))
    }

    pub(super) async fn synced_session_ids(&self) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT session_id FROM sessions WHERE deleted_at IS NULL AND synced_at IS NOT NULL",
        )
        .fetch_all(&self.reader)
        .await?)
    }

    pub(super) async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        Ok(sqlx::query("DELETE FROM session_moves WHERE moved_at < ?")
            .bind(micros(before))
            .execute(&self.writer)
            .await?
            .rows_affected())
    }

    pub(super) async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let at = micros(at);
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let updated = sqlx::query(TOMBSTONE_LIVE)
            .bind(at)
            .bind(session_id)
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
