//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order.

use chrono::{SubsecRound, Utc};

use super::{SqliteStore, micros, to_json};
use crate::store::common::INSERT_LIFECYCLE;
use crate::store::{NewLifecycleEvent, StoreResult, StoredLifecycleEvent};

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
        Ok(event.stored(seq, created_at))
    }
}
