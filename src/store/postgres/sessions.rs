//! The session cache: rows of `sessions`, their tombstones, and the keyset-paged list with
//! its recorded moves (`session_moves`).

use chrono::{DateTime, SubsecRound, Utc};
use serde_json::Value;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{Postgres, QueryBuilder, Row};

use super::PgStore;
use crate::store::{
    ListQuery, Listed, Origin, SessionList, SessionMutation, SessionRecord, StoreError,
    StoreResult, merge_page, truncate_timestamps,
};

const PUT_SESSION: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (session_id) DO UPDATE SET \
     tenant = EXCLUDED.tenant, cwd = EXCLUDED.cwd, \
     additional_directories = EXCLUDED.additional_directories, title = EXCLUDED.title, \
     updated_at = EXCLUDED.updated_at, created_at = EXCLUDED.created_at, meta = EXCLUDED.meta, \
     archived = EXCLUDED.archived, origin = EXCLUDED.origin, deleted_at = EXCLUDED.deleted_at, \
     synced_at = EXCLUDED.synced_at \
     WHERE sessions.deleted_at IS NULL"
);

const GET_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1"
);

const LOCK_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1 FOR UPDATE"
);

/// Same parameter order as [`PUT_SESSION`]; `session_id` ($1) is the key and is not changed.
const UPDATE_SESSION: &str = "UPDATE sessions SET tenant = $2, cwd = $3, \
     additional_directories = $4, title = $5, updated_at = $6, created_at = $7, meta = $8, \
     archived = $9, origin = $10, deleted_at = $11, synced_at = $12 WHERE session_id = $1";

const TOMBSTONE_LIVE: &str =
    "UPDATE sessions SET deleted_at = $2 WHERE session_id = $1 AND deleted_at IS NULL";

/// A bare tombstone for an id the cache does not know. Such an id can only have come from the
/// agent, hence `origin = 'upstream'`.
const INSERT_TOMBSTONE: &str = "INSERT INTO sessions \
     (session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
      archived, origin, deleted_at, synced_at) \
     VALUES ($1, $2, '', '[]'::jsonb, NULL, $3, $3, NULL, FALSE, 'upstream', $3, NULL) \
     ON CONFLICT (session_id) DO NOTHING";

/// Binds the twelve session columns ($1…$12) in [`session_columns!`] order.
fn bind_session<'q>(
    query: Query<'q, Postgres, PgArguments>,
    record: &'q SessionRecord,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(&record.session_id)
        .bind(&record.tenant)
        .bind(&record.cwd)
        .bind(Json(&record.additional_directories))
        .bind(&record.title)
        .bind(record.updated_at.trunc_subsecs(6))
        .bind(record.created_at.trunc_subsecs(6))
        .bind(record.meta.as_ref())
        .bind(record.archived)
        .bind(record.origin.as_str())
        .bind(record.deleted_at.map(|at| at.trunc_subsecs(6)))
        .bind(record.synced_at.map(|at| at.trunc_subsecs(6)))
}

fn session_from_row(row: &PgRow) -> StoreResult<SessionRecord> {
    let session_id: String = row.try_get("session_id")?;
    let dirs: Value = row.try_get("additional_directories")?;
    let additional_directories = serde_json::from_value(dirs).map_err(|e| {
        StoreError::Corrupt(format!(
            "session {session_id:?}: additional_directories is not an array of strings: {e}"
        ))
    })?;
    let origin: String = row.try_get("origin")?;
    Ok(SessionRecord {
        tenant: row.try_get("tenant")?,
        cwd: row.try_get("cwd")?,
        additional_directories,
        title: row.try_get("title")?,
        updated_at: row.try_get("updated_at")?,
        created_at: row.try_get("created_at")?,
        meta: row.try_get("meta")?,
        archived: row.try_get("archived")?,
        origin: Origin::parse(&origin)?,
        deleted_at: row.try_get("deleted_at")?,
        synced_at: row.try_get("synced_at")?,
        session_id,
    })
}

/// A listed row that has not moved: its position is its `updated_at`.
fn listed_at_updated(row: &PgRow) -> StoreResult<Listed> {
    let record = session_from_row(row)?;
    Ok(Listed {
        key: record.updated_at,
        record,
    })
}

/// `WHERE` for the list queries over `sessions s`: live rows of the query's archive state,
/// tenant and cwd.
fn push_list_filters(qb: &mut QueryBuilder<'_, Postgres>, query: &ListQuery) {
    qb.push(" WHERE s.deleted_at IS NULL AND s.archived = ")
        .push_bind(query.archived.unwrap_or(false));
    if let Some(tenant) = &query.tenant {
        qb.push(" AND s.tenant = ").push_bind(tenant.clone());
    }
    if let Some(cwd) = &query.cwd {
        qb.push(" AND s.cwd = ").push_bind(cwd.clone());
    }
}

impl PgStore {
    pub(super) async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        // One statement: the upsert's `WHERE` leaves a tombstoned row untouched (0 rows).
        let done = bind_session(sqlx::query(PUT_SESSION), record)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(super) async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(GET_SESSION)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    pub(super) async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        let mut tx = self.pool.begin().await?;
        // `FOR UPDATE` holds the row until commit, so concurrent updates of one session queue
        // up instead of overwriting each other's changes.
        let row = sqlx::query(LOCK_SESSION)
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
        bind_session(sqlx::query(UPDATE_SESSION), &record)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    pub(super) async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList> {
        let limit = query.limit.max(1) + 1;
        let Some(after) = &query.after else {
            // First page: the rows and the newest move, read by one statement (one snapshot).
            let mut qb = QueryBuilder::<Postgres>::new(concat!(
                "SELECT ",
                session_columns!(),
                ", (SELECT COALESCE(MAX(id), 0) FROM session_moves) AS snapshot FROM sessions s"
            ));
            push_list_filters(&mut qb, query);
            qb.push(" ORDER BY updated_at DESC, session_id DESC LIMIT ")
                .push_bind(limit);
            let rows = qb.build().fetch_all(&self.pool).await?;
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
        let at = after.updated_at.trunc_subsecs(6);
        // One statement, so that both parts see the same database: rows that have not moved
        // since the snapshot, at their current position, and rows that moved since, at the
        // position they had then.
        let mut qb = QueryBuilder::<Postgres>::new(concat!(
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
                ", m.from_updated_at AS list_key FROM (SELECT DISTINCT ON (session_id) session_id, from_updated_at \
                 FROM session_moves WHERE id > "
            ))
            .push_bind(after.snapshot)
            .push(" ORDER BY session_id, id) m JOIN sessions s USING (session_id)");
        push_list_filters(&mut qb, query);
        qb.push(" AND (m.from_updated_at, s.session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(") ORDER BY m.from_updated_at DESC, s.session_id DESC LIMIT ")
            .push_bind(limit)
            .push(") AS moved");
        let rows = qb.build().fetch_all(&self.pool).await?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok(Listed {
                    key: row.try_get("list_key")?,
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
        .fetch_all(&self.pool)
        .await?)
    }

    pub(super) async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        Ok(sqlx::query("DELETE FROM session_moves WHERE moved_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    pub(super) async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let at = at.trunc_subsecs(6);
        let tombstone_live = || {
            sqlx::query(TOMBSTONE_LIVE)
                .bind(session_id)
                .bind(at)
                .execute(&self.pool)
        };
        if tombstone_live().await?.rows_affected() == 1 {
            return Ok(true);
        }
        let inserted = sqlx::query(INSERT_TOMBSTONE)
            .bind(session_id)
            .bind(tenant)
            .bind(at)
            .execute(&self.pool)
            .await?;
        if inserted.rows_affected() == 1 {
            return Ok(false);
        }
        // The row appeared between the two statements (a concurrent insert). Rows are never
        // removed, so this second attempt is decisive: it either tombstones a live row or finds
        // one that is already deleted.
        Ok(tombstone_live().await?.rows_affected() == 1)
    }
}
