//! Counting under a transaction-scoped advisory lock on PostgreSQL: a tenant's slots, for taking
//! one (under the lock of the tenant and kind, the slots and live sessions of replicas that beat
//! within the lease are counted; `impl_quotas!` inserts the slot in the same transaction if the
//! quota allows), and a session's watchers (`impl_watchers!` changes them under the lock of the
//! session's watchers, and a person's are counted on replicas that beat within the lease).

use sqlx::PgConnection;

use super::store::PgStore;
use crate::store::error::StoreResult;
use crate::store::quotas::TenantSlot;

/// The tenant's slots of kind `$2` held by live replicas, but holder `$3`'s, since `$5`; with
/// its sessions owned by live replicas for kind `session`. `$4`: the lease in microseconds.
const IN_USE: &str = "SELECT \
     (SELECT count(*) FROM tenant_slots t JOIN replicas r ON r.id = t.replica_id \
      WHERE t.tenant = $1 AND t.kind = $2 AND t.holder <> $3 AND t.taken_at >= $5 \
      AND r.heartbeat_at >= now() - $4 * interval '1 microsecond') \
   + (CASE WHEN $2 = 'session' THEN \
      (SELECT count(*) FROM session_owners o JOIN sessions s ON s.session_id = o.session_id \
       JOIN replicas r ON r.id = o.replica_id \
       WHERE s.tenant = $1 AND o.session_id <> $3 \
       AND r.heartbeat_at >= now() - $4 * interval '1 microsecond') ELSE 0 END) AS in_use";

/// Watcher `$2`'s rows of session `$1` on replica `$3` and on the replicas that beat within
/// `$4` microseconds.
pub(super) const WATCHER_STREAMS: &str = "SELECT count(*) FROM session_watchers w \
     LEFT JOIN replicas r ON r.id = w.replica \
     WHERE w.session_id = $1 AND w.author = $2 \
     AND (w.replica = $3 OR r.heartbeat_at >= now() - $4 * interval '1 microsecond')";

impl PgStore {
    /// How many slots of `slot`'s tenant and kind count, under the advisory lock of that tenant
    /// and kind, which `tx` holds until it ends (the rest of
    /// [`TenantQuotas::take_tenant_slot`](crate::store::quotas::TenantQuotas::take_tenant_slot)
    /// is `impl_quotas!`'s).
    pub(super) async fn slots_in_use(
        &self,
        tx: &mut PgConnection,
        slot: &TenantSlot<'_>,
    ) -> StoreResult<i64> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!(
                "tenant-slots/{}/{}",
                slot.kind.as_str(),
                slot.tenant
            ))
            .execute(&mut *tx)
            .await?;
        let lease = i64::try_from(slot.lease.as_micros()).unwrap_or(i64::MAX);
        Ok(sqlx::query_scalar(IN_USE)
            .bind(slot.tenant)
            .bind(slot.kind.as_str())
            .bind(slot.holder)
            .bind(lease)
            .bind(slot.counted_since())
            .fetch_one(tx)
            .await?)
    }

    /// Holds off other changes of `session_id`'s watchers until `tx` ends (see
    /// [`SessionWatchers`](crate::store::SessionWatchers)).
    pub(super) async fn lock_watchers(
        &self,
        tx: &mut PgConnection,
        session_id: &str,
    ) -> StoreResult<()> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("session-watchers/{session_id}"))
            .execute(tx)
            .await?;
        Ok(())
    }
}
