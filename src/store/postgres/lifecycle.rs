//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order, each
//! append announced to the other replicas and inserting its webhook deliveries.

use chrono::{SubsecRound, Utc};
use sqlx::types::Json;

use super::replicas::LIFECYCLE_CHANNEL;
use super::store::PgStore;
use crate::store::error::StoreResult;
use crate::store::kind::EventKind;
use crate::store::records::{NewLifecycleEvent, StoredLifecycleEvent};

/// Transaction-scoped advisory lock that serialises lifecycle appends (see `append_lifecycle`).
const LIFECYCLE_LOCK_KEY: i64 = 0x6163_7067_775f_6c63; // "acpgw_lc"

/// Inserts the events given as arrays of session ids, tenants, kinds and payloads, in their
/// order, all created at `$5`, and their webhook deliveries (see [`pg_insert_deliveries!`]),
/// but those of kind `$6` (a session's deletion), which the session's own log has too.
const INSERT_LIFECYCLE: &str = concat!(
    "WITH inserted AS (INSERT INTO lifecycle_events \
     (session_id, tenant, kind, payload, created_at) \
     SELECT e.session_id, e.tenant, e.kind, e.payload, $5 \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[]) WITH ORDINALITY \
     AS e(session_id, tenant, kind, payload, ord) ORDER BY e.ord \
     RETURNING seq, session_id, tenant, kind, payload, created_at), \
     delivered AS (",
    pg_insert_deliveries!(
        from: "inserted i",
        message_id: "'lifecycle:' || i.seq",
        tenant: "i.tenant",
        payload: "i.payload",
        filter: " AND i.kind <> $6",
    ),
    ") SELECT seq FROM inserted"
);

impl PgStore {
    pub(super) async fn append_lifecycle(
        &self,
        events: &[NewLifecycleEvent],
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
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
        let column = |f: fn(&NewLifecycleEvent) -> &str| events.iter().map(f).collect::<Vec<_>>();
        let payloads: Vec<_> = events
            .iter()
            .map(|e| Json(super::store::nul_safe(&e.payload)))
            .collect();
        let seqs: Vec<i64> = sqlx::query_scalar(INSERT_LIFECYCLE)
            .bind(column(|e| &e.session_id))
            .bind(column(|e| &e.tenant))
            .bind(column(|e| &e.kind))
            .bind(payloads)
            .bind(created_at)
            .bind(EventKind::SessionDeleted.name())
            .fetch_all(&mut *tx)
            .await?;
        let last = seqs.iter().max().copied().unwrap_or_default();
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LIFECYCLE_CHANNEL)
            .bind(format!("{} {last}", self.replica))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        NewLifecycleEvent::stored_all(events, seqs, created_at)
    }
}
