//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order, each
//! append announced to the other replicas.

use chrono::{SubsecRound, Utc};

use super::PgStore;
use super::replicas::LIFECYCLE_CHANNEL;
use crate::store::common::INSERT_LIFECYCLE;
use crate::store::{NewLifecycleEvent, StoreResult, StoredLifecycleEvent};

/// Transaction-scoped advisory lock that serialises lifecycle appends (see `append_lifecycle`).
const LIFECYCLE_LOCK_KEY: i64 = 0x6163_7067_775f_6c63; // "acpgw_lc"

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
            .bind(super::nul_safe(&event.payload).as_ref())
            .bind(created_at)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LIFECYCLE_CHANNEL)
            .bind(format!("{} {seq}", self.replica))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(event.stored(seq, created_at))
    }
}
