//! Taking a tenant's slot on SQLite: under the write lock (`BEGIN IMMEDIATE`), the slots (and
//! live sessions) of the one gateway serving the file are counted (any other replica's are a
//! dead process's), and the slot inserted if the quota allows.

use super::store::{BEGIN_IMMEDIATE, SqliteStore, micros};
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

impl SqliteStore {
    /// [`TenantQuotas::take_tenant_slot`](crate::store::quotas::TenantQuotas::take_tenant_slot).
    pub(super) async fn take_slot(&self, slot: &TenantSlot<'_>, quota: u64) -> StoreResult<bool> {
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let in_use: i64 = sqlx::query_scalar(IN_USE)
            .bind(slot.tenant)
            .bind(slot.kind.as_str())
            .bind(slot.holder)
            .bind(slot.replica)
            .bind(micros(slot.counted_since()))
            .fetch_one(&mut *tx)
            .await?;
        if u64::try_from(in_use).unwrap_or(0) >= quota {
            return Ok(false);
        }
        sqlx::query(crate::store::quotas::TAKE)
            .bind(slot.kind.as_str())
            .bind(slot.holder)
            .bind(slot.tenant)
            .bind(slot.replica)
            .bind(micros(slot.now))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}
