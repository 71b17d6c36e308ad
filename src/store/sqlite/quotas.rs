//! Counting under the write lock (`BEGIN IMMEDIATE`) on SQLite: a tenant's slots, for taking
//! one (the slots and live sessions of the one gateway serving the file are counted, any other
//! replica's being a dead process's; `impl_quotas!` inserts the slot in the same transaction if
//! the quota allows), and a session's watchers (`impl_watchers!` changes them in a transaction
//! that holds the lock already; a person's are counted on the one gateway serving the file).

use sqlx::SqliteConnection;

use super::store::{SqliteStore, micros};
use crate::store::error::StoreResult;
use crate::store::quotas::TenantSlot;

/// The tenant's slots of kind `$2` held by replica `$4`, but holder `$3`'s, since `$5`; with its
/// sessions that replica holds live for kind `session`.
const IN_USE: &str = "SELECT \
     (SELECT count(*) FROM tenant_slots \
      WHERE tenant = $1 AND kind = $2 AND holder <> $3 AND replica_id = $4 AND taken_at >= $5) \
   + (CASE WHEN $2 = 'session' THEN \
      (SELECT count(*) FROM session_owners o JOIN sessions s ON s.session_id = o.session_id \
       WHERE s.tenant = $1 AND o.session_id <> $3 AND o.replica_id = $4) ELSE 0 END) AS in_use";

/// Watcher `$2`'s rows of session `$1` on replica `$3`, the one serving the file: any other
/// replica's are a dead process's, whatever the lease (`$4`, microseconds, never negative).
pub(super) const WATCHER_STREAMS: &str = "SELECT count(*) FROM session_watchers \
     WHERE session_id = $1 AND author = $2 AND (replica = $3 OR $4 < 0)";

impl SqliteStore {
    /// How many slots of `slot`'s tenant and kind count, read in `tx`, which holds the write
    /// lock (the rest of
    /// [`TenantQuotas::take_tenant_slot`](crate::store::quotas::TenantQuotas::take_tenant_slot)
    /// is `impl_quotas!`'s).
    pub(super) async fn slots_in_use(
        &self,
        tx: &mut SqliteConnection,
        slot: &TenantSlot<'_>,
    ) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(IN_USE)
            .bind(slot.tenant)
            .bind(slot.kind.as_str())
            .bind(slot.holder)
            .bind(slot.replica)
            .bind(micros(slot.counted_since()))
            .fetch_one(tx)
            .await?)
    }

    /// Nothing: the write lock `tx` holds keeps every other change out until it ends (see
    /// [`SessionWatchers`](crate::store::SessionWatchers)).
    pub(super) async fn lock_watchers(
        &self,
        _tx: &mut SqliteConnection,
        _session_id: &str,
    ) -> StoreResult<()> {
        Ok(())
    }
}
