//! Per-tenant quotas across replicas: the slots a tenant's running turns and the sessions
//! being made live hold ([`TenantSlot`]), counted against a quota when one is taken, and each
//! tenant's prompts per minute. Taking a slot counts and inserts under one lock per tenant and
//! kind (an advisory lock on PostgreSQL, the write lock on SQLite), so that replicas taking
//! slots at once never go past the quota together. The SQL both backends run alike is here;
//! `postgres/quotas.rs` and `sqlite/quotas.rs` count the slots of their live replicas.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::error::StoreResult;

/// What a slot bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A running turn, held by its session's id.
    Turn,
    /// A session being made live, until its replica holds it: it counts with the tenant's
    /// live sessions.
    Session,
}

impl SlotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SlotKind::Turn => "turn",
            SlotKind::Session => "session",
        }
    }
}

/// How long a session's slot counts at most: making a session live takes less (an agent's
/// answer within the control timeout), and a slot whose release was lost frees itself.
pub const SESSION_SLOT_MAX: Duration = Duration::from_secs(120);

/// A slot to take.
#[derive(Debug, Clone)]
pub struct TenantSlot<'a> {
    pub kind: SlotKind,
    pub holder: &'a str,
    pub tenant: &'a str,
    /// The replica taking it (its slots count while it beats).
    pub replica: &'a str,
    /// How long a silent replica's slots still count (its heartbeat lease).
    pub lease: Duration,
    pub now: DateTime<Utc>,
}

impl TenantSlot<'_> {
    /// The oldest slot of this kind that still counts.
    pub fn counted_since(&self) -> DateTime<Utc> {
        match self.kind {
            SlotKind::Turn => DateTime::<Utc>::UNIX_EPOCH,
            SlotKind::Session => {
                self.now - chrono::Duration::from_std(SESSION_SLOT_MAX).expect("two minutes")
            }
        }
    }
}

/// What each tenant has under way across the replicas, counted against its quotas: slots
/// (sessions, turns) held by live replicas, and prompts per minute.
#[async_trait]
pub trait TenantQuotas: Send + Sync + 'static {
    /// Takes `slot` unless its tenant already has `quota` under way: its slots of that kind
    /// held by live replicas (a session's slot for [`SESSION_SLOT_MAX`](super::SESSION_SLOT_MAX)
    /// at most) and, for [`SlotKind::Session`], the sessions they hold live. True when taken
    /// (a slot of the same holder is taken over).
    async fn take_tenant_slot(&self, slot: &TenantSlot<'_>, quota: u64) -> StoreResult<bool>;

    /// Frees the slot of `kind` that `holder` holds (nothing if none).
    async fn release_tenant_slot(&self, kind: SlotKind, holder: &str) -> StoreResult<()>;

    /// Counts a prompt of `tenant` in `minute` (unix time / 60) unless it has `quota` there
    /// already: true when counted.
    async fn count_tenant_prompt(&self, tenant: &str, minute: i64, quota: u64)
    -> StoreResult<bool>;

    /// Deletes the prompt counts of minutes before `before`; returns how many.
    async fn prune_tenant_prompts(&self, before: i64) -> StoreResult<u64>;
}

/// Inserts (or takes over) a slot: `$1` kind, `$2` holder, `$3` tenant, `$4` replica, `$5` now.
pub const TAKE: &str = "INSERT INTO tenant_slots (kind, holder, tenant, replica_id, taken_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (kind, holder) DO UPDATE SET \
     tenant = excluded.tenant, replica_id = excluded.replica_id, taken_at = excluded.taken_at";
pub const RELEASE: &str = "DELETE FROM tenant_slots WHERE kind = $1 AND holder = $2";
/// Counts a prompt of tenant `$1` in minute `$2` unless it has `$3` there already.
pub const COUNT_PROMPT: &str = "INSERT INTO tenant_prompts (tenant, minute, prompts) \
     VALUES ($1, $2, 1) ON CONFLICT (tenant, minute) DO UPDATE SET \
     prompts = tenant_prompts.prompts + 1 WHERE tenant_prompts.prompts < $3";
pub const PRUNE_PROMPTS: &str = "DELETE FROM tenant_prompts WHERE minute < $1";

/// `impl_quotas!(Backend { reads, writes, begin_write, time })` implements [`TenantQuotas`]
/// for `Backend`, from the parameters of the same names of
/// [`impl_store!`](crate::store::common), which invokes it: the use cases both backends run
/// alike. Taking a slot counts the slots in use with the backend's own `slots_in_use`, in the
/// writing transaction that then inserts it.
macro_rules! impl_quotas {
    (
        $backend:ty {
            reads: $reads:ident,
            writes: $writes:ident,
            begin_write: $begin:ident($($begin_arg:expr)?),
            time: $time:path $(,)?
        }
    ) => {
        #[async_trait::async_trait]
        impl $crate::store::quotas::TenantQuotas for $backend {
            async fn take_tenant_slot(
                &self,
                slot: &$crate::store::quotas::TenantSlot<'_>,
                quota: u64,
            ) -> $crate::store::error::StoreResult<bool> {
                let mut tx = self.$writes.$begin($($begin_arg)?).await?;
                let in_use = self.slots_in_use(&mut tx, slot).await?;
                if u64::try_from(in_use).unwrap_or(0) >= quota {
                    return Ok(false);
                }
                sqlx::query($crate::store::quotas::TAKE)
                    .bind(slot.kind.as_str())
                    .bind(slot.holder)
                    .bind(slot.tenant)
                    .bind(slot.replica)
                    .bind($time(slot.now))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(true)
            }

            async fn release_tenant_slot(
                &self,
                kind: $crate::store::quotas::SlotKind,
                holder: &str,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::quotas::RELEASE)
                    .bind(kind.as_str())
                    .bind(holder)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn count_tenant_prompt(
                &self,
                tenant: &str,
                minute: i64,
                quota: u64,
            ) -> $crate::store::error::StoreResult<bool> {
                let counted = sqlx::query($crate::store::quotas::COUNT_PROMPT)
                    .bind(tenant)
                    .bind(minute)
                    .bind(i64::try_from(quota).unwrap_or(i64::MAX))
                    .execute(&self.$writes)
                    .await?;
                Ok(counted.rows_affected() == 1)
            }

            async fn prune_tenant_prompts(
                &self,
                before: i64,
            ) -> $crate::store::error::StoreResult<u64> {
                let pruned = sqlx::query($crate::store::quotas::PRUNE_PROMPTS)
                    .bind(before)
                    .execute(&self.$writes)
                    .await?;
                Ok(pruned.rows_affected())
            }
        }
    };
}
