//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order, each
//! append announced to the other replicas.

use chrono::{SubsecRound, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::PgStore;
use super::replicas::LIFECYCLE_CHANNEL;
use crate::store::{NewLifecycleEvent, StoreResult, StoredLifecycleEvent};

/// Transaction-scoped advisory lock that serialises lifecycle appends (see `append_lifecycle`).
const LIFECYCLE_LOCK_KEY: i64 = 0x6163_7067_775f_6c63; // "acpgw_lc"

const INSERT_LIFECYCLE: &str = "INSERT INTO lifecycle_events \
     (session_id, tenant, kind, payload, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING seq";

const READ_LIFECYCLE_ALL: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE seq > $1 ORDER BY seq LIMIT $2";

const READ_LIFECYCLE_TENANT: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE tenant = $3 AND seq > $1 ORDER BY seq LIMIT $2";

const LAST_LIFECYCLE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM lifecycle_events";

fn lifecycle_from_row(row: &PgRow) -> StoreResult<StoredLifecycleEvent> {
    Ok(StoredLifecycleEvent {
        seq: row.try_get("seq")?,
        session_id: row.try_get("session_id")?,
        tenant: row.try_get("tenant")?,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        created_at: row.try_get("created_at")?,
    })
}

impl PgStore {
    pub(super) async fn append_lifecycle(
        &self,
        event: &NewLifecycleEvent,
    ) -> StoreResult<StoredLifecycleEvent> {
        let created_at = Utc::now().trunc_subsecs(6);
        let mut tx = self.pool.begin().await?;
        // A bare `bigserial` hands out numbers at insert time, but concurrent transactions may
        // commit in another order, so a reader polling `seq > after` could move past a number
        // that becomes visible only later and miss that event for good. Taking this lock before
        // the insert and holding it to commit makes numbering order equal commit order.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(LIFECYCLE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        let seq: i64 = sqlx::query_scalar(INSERT_LIFECYCLE)
            .bind(&event.session_id)
            .bind(&event.tenant)
            .bind(&event.kind)
            .bind(&event.payload)
            .bind(created_at)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LIFECYCLE_CHANNEL)
            .bind(format!("{} {seq}", self.replica))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(StoredLifecycleEvent {
            seq,
            session_id: event.session_id.clone(),
            tenant: event.tenant.clone(),
            kind: event.kind.clone(),
            payload: event.payload.clone(),
            created_at,
        })
    }

    pub(super) async fn read_lifecycle(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        let query = match tenant {
            None => sqlx::query(READ_LIFECYCLE_ALL),
            Some(_) => sqlx::query(READ_LIFECYCLE_TENANT),
        };
        let mut query = query.bind(after).bind(limit.max(0));
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(lifecycle_from_row).collect()
    }

    pub(super) async fn last_lifecycle_seq(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(LAST_LIFECYCLE_SEQ)
            .fetch_one(&self.pool)
            .await?)
    }
}
