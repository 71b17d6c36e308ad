//! Per-tenant limits across replicas (`--tenant-max-sessions`, `--tenant-max-turns`,
//! `--tenant-prompts-per-minute`, and a tenant's own in `[tenants.NAME]`): each is counted in
//! the store, so that all replicas share one count, and a request past one is refused with
//! [`Error::TenantLimit`] (429). A turn holds a slot from its prompt to its `turn_ended`; a
//! session being made live (created, forked, resumed) holds one until its replica holds the
//! session, which then counts among the tenant's live sessions itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::cluster::{Cluster, replica_id};
use crate::config::TenantFlags;
use crate::gateway::error::Error;
use crate::store::{SlotKind, TenantQuotas, TenantSlot};

/// Seconds a client refused for a count of things at once is asked to wait.
const RETRY_AFTER_BUSY: u64 = 5;

/// The limits, and where they are counted.
pub(in crate::gateway) struct Quotas {
    flags: TenantFlags,
    store: Arc<dyn TenantQuotas>,
    cluster: Arc<Cluster>,
    /// The last minute whose older prompt counts were pruned.
    pruned: AtomicI64,
}

/// A slot taken: given back with [`Quotas::release`].
#[must_use = "a slot is given back with Quotas::release"]
pub(in crate::gateway) struct Held {
    kind: SlotKind,
    holder: String,
}

impl Quotas {
    pub(in crate::gateway) fn new(
        flags: TenantFlags,
        store: Arc<dyn TenantQuotas>,
        cluster: Arc<Cluster>,
    ) -> Self {
        Quotas {
            flags,
            store,
            cluster,
            pruned: AtomicI64::new(0),
        }
    }

    /// A turn of `tenant`'s session `session_id`: counts the prompt against the tenant's
    /// prompts per minute and takes a turn slot. `None` when neither is limited.
    pub(in crate::gateway) async fn turn(
        &self,
        tenant: &str,
        session_id: &str,
    ) -> Result<Option<Held>, Error> {
        let limits = self.flags.limits(tenant);
        let held = self
            .take(SlotKind::Turn, tenant, session_id, limits.max_turns)
            .await?;
        let per_minute = limits.prompts_per_minute.unwrap_or(0);
        if per_minute > 0 {
            let now = chrono::Utc::now().timestamp();
            let minute = now.div_euclid(60);
            if self.pruned.swap(minute, Ordering::Relaxed) != minute {
                // The counts of minutes gone, once a minute per replica.
                if let Err(e) = self.store.prune_tenant_prompts(minute - 1).await {
                    tracing::warn!(error = %e, "old prompt counts not pruned");
                }
            }
            let counted = self
                .store
                .count_tenant_prompt(tenant, minute, per_minute)
                .await;
            if !matches!(counted, Ok(true)) {
                if let Some(held) = held {
                    self.release(held).await;
                }
                counted?;
                return Err(refused(
                    tenant,
                    "prompts",
                    per_minute,
                    Some(60),
                    u64::try_from(60 - now.rem_euclid(60)).unwrap_or(60),
                    format!(
                        "tenant {tenant:?} has sent its {per_minute} prompts of this minute; send more in the next one"
                    ),
                ));
            }
            metrics::counter!("acp_gateway_tenant_prompts_total", "tenant" => tenant.to_owned())
                .increment(1);
        }
        Ok(held)
    }

    /// Runs `making`, which makes a session of `tenant` live (`holder`: its id, or the
    /// create's own name for it until the agent gives one), counted among the tenant's live
    /// sessions by a slot of its own, given back when `making` ends, however it ends (uncounted
    /// when live sessions are not limited). Refused, `making` never runs.
    pub(in crate::gateway) async fn making_live<T>(
        &self,
        tenant: &str,
        holder: &str,
        making: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let quota = self.flags.limits(tenant).max_sessions;
        let slot = self.take(SlotKind::Session, tenant, holder, quota).await?;
        let made = making.await;
        if let Some(slot) = slot {
            self.release(slot).await;
        }
        made
    }

    async fn take(
        &self,
        kind: SlotKind,
        tenant: &str,
        holder: &str,
        quota: Option<u64>,
    ) -> Result<Option<Held>, Error> {
        let Some(quota) = quota.filter(|q| *q > 0) else {
            return Ok(None);
        };
        let slot = TenantSlot {
            kind,
            holder,
            tenant,
            replica: replica_id(),
            lease: self.cluster.lease(),
            now: chrono::Utc::now(),
        };
        if self.store.take_tenant_slot(&slot, quota).await? {
            return Ok(Some(Held {
                kind,
                holder: holder.to_owned(),
            }));
        }
        Err(match kind {
            SlotKind::Turn => refused(
                tenant,
                "turns",
                quota,
                None,
                RETRY_AFTER_BUSY,
                format!(
                    "tenant {tenant:?} already runs its maximum of {quota} turns at once; retry when one has ended"
                ),
            ),
            SlotKind::Session => refused(
                tenant,
                "sessions",
                quota,
                None,
                RETRY_AFTER_BUSY,
                format!(
                    "tenant {tenant:?} already holds its maximum of {quota} live sessions; close some (or let them idle out) and retry"
                ),
            ),
        })
    }

    /// Gives a slot back (a failure is logged: a turn's slot then counts until its replica
    /// stops, a session's for two minutes at most).
    pub(in crate::gateway) async fn release(&self, held: Held) {
        if let Err(e) = self
            .store
            .release_tenant_slot(held.kind, &held.holder)
            .await
        {
            tracing::warn!(error = %e, holder = held.holder, kind = held.kind.as_str(), "a tenant's slot was not given back");
        }
    }
}

/// A refusal, counted in `/metrics` by tenant and limit.
pub(super) fn refused(
    tenant: &str,
    limit: &'static str,
    quota: u64,
    window_secs: Option<u64>,
    retry_after_secs: u64,
    message: String,
) -> Error {
    metrics::counter!("acp_gateway_tenant_limited_total", "tenant" => tenant.to_owned(), "limit" => limit)
        .increment(1);
    Error::TenantLimit {
        message,
        limit,
        quota,
        window_secs,
        retry_after_secs,
    }
}
