//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order.

use chrono::{SubsecRound, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{SqliteStore, from_json, from_micros, micros, to_json};
use crate::store::{NewLifecycleEvent, StoreResult, StoredLifecycleEvent};

const INSERT_LIFECYCLE: &str = "INSERT INTO lifecycle_events \
     (session_id, tenant, kind, payload, created_at) VALUES (?, ?, ?, ?, ?) RETURNING seq";

const READ_LIFECYCLE_ALL: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE seq > ? ORDER BY seq LIMIT ?";

const READ_LIFECYCLE_TENANT: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?";

const LAST_LIFECYCLE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM lifecycle_events";

fn lifecycle_from_row(row: &SqliteRow) -> StoreResult<StoredLifecycleEvent> {
    let seq: i64 = row.try_get("seq")?;
    let what = format!("lifecycle event {seq}");
    let payload: String = row.try_get("payload")?;
    Ok(StoredLifecycleEvent {
        seq,
        session_id: row.try_get("session_id")?,
        tenant: row.try_get("tenant")?,
        kind: row.try_get("kind")?,
        payload: from_json(&payload, &what)?,
        created_at: from_micros(row.try_get("created_at")?, &what)?,
    })
}

impl SqliteStore {
    pub(super) async fn append_lifecycle(
        &self,
        event: &NewLifecycleEvent,
    ) -> StoreResult<StoredLifecycleEvent> {
        let payload = to_json(&event.payload);
        let created_at = Utc::now().trunc_subsecs(6);
        // A single statement on the single writer connection: numbers are handed out in commit
        // order, so readers polling `seq > after` never skip one.
        let seq: i64 = sqlx::query_scalar(INSERT_LIFECYCLE)
            .bind(&event.session_id)
            .bind(&event.tenant)
            .bind(&event.kind)
            .bind(&payload)
            .bind(micros(created_at))
            .fetch_one(&self.writer)
            .await?;
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
            Some(tenant) => sqlx::query(READ_LIFECYCLE_TENANT).bind(tenant),
        };
        let rows = query
            .bind(after)
            .bind(limit.max(0))
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(lifecycle_from_row).collect()
    }

    pub(super) async fn last_lifecycle_seq(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(LAST_LIFECYCLE_SEQ)
            .fetch_one(&self.reader)
            .await?)
    }
}
