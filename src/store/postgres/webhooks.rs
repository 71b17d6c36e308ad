//! The webhook outbox on PostgreSQL: the insert each append runs in its own statement
//! ([`pg_insert_deliveries!`], used by `events.rs` and `lifecycle.rs`), and the claim of due
//! deliveries, one statement that locks what it takes (`FOR UPDATE SKIP LOCKED`) so that two
//! replicas never claim the same row. The rest is written once in `store/webhooks.rs`.

use chrono::{DateTime, SubsecRound, Utc};

use super::store::PgStore;
use crate::store::rows::{delivery_from, webhook_from};
use crate::store::{DeliveryRecord, StoreResult, WebhookRecord};

/// The outbox insert of an append, a statement (or data-modifying CTE) of its own: one
/// delivery per event of `$from` (a FROM item naming the events `i`, with their `session_id`,
/// `seq`, `kind`, `created_at`) and enabled webhook that hears it, `$message_id`, `$tenant` and
/// `$payload` the expressions of its columns, `$and` any further condition on the event. A
/// webhook hears an event of a kind it lists (or `*`), of its session when it names one, of its
/// tenant unless it is an admin's. Deliveries are numbered in log order; an event already
/// delivered to a webhook (by message id) is not inserted again.
///
/// The webhook rows are locked (`FOR KEY SHARE`, as the foreign key's check would lock them) as
/// they are read: a webhook deleted meanwhile is then skipped, where the foreign key's check
/// would fail the append.
macro_rules! pg_insert_deliveries {
    (
        from: $from:literal,
        message_id: $message_id:literal,
        tenant: $tenant:literal,
        payload: $payload:literal,
        and: $and:literal $(,)?
    ) => {
        concat!(
            delivery_insert_columns!(),
            "SELECT w.id, ",
            $message_id,
            ", i.session_id, ",
            $tenant,
            ", i.seq, i.kind, ",
            $payload,
            ", i.created_at, i.created_at, i.created_at, i.created_at, i.created_at FROM ",
            $from,
            " JOIN webhooks w ON w.enabled AND (w.admin OR w.tenant = ",
            $tenant,
            ") AND (w.session_id IS NULL OR w.session_id = i.session_id COLLATE \"C\") \
             AND w.events ?| ARRAY[i.kind, '*']",
            $and,
            " ORDER BY i.session_id, i.seq, w.id FOR KEY SHARE OF w \
             ON CONFLICT (webhook_id, message_id) DO NOTHING"
        )
    };
}

/// Leases the due deliveries to `$1` until `$3` (see [`due_deliveries!`]) and returns each with
/// its webhook, whose columns are named `w_…`.
const CLAIM_DELIVERIES: &str = concat!(
    "WITH claimed AS (UPDATE webhook_deliveries SET lease_owner = $1, lease_until = $3 \
     WHERE id IN (",
    due_deliveries!(" FOR UPDATE OF d SKIP LOCKED"),
    ") RETURNING ",
    delivery_columns!(),
    ") SELECT c.*, w.id AS w_id, w.tenant AS w_tenant, w.admin AS w_admin, w.url AS w_url, \
     w.events AS w_events, w.session_id AS w_session_id, w.description AS w_description, \
     w.secret AS w_secret, w.enabled AS w_enabled, w.disabled_reason AS w_disabled_reason, \
     w.created_at AS w_created_at, w.updated_at AS w_updated_at \
     FROM claimed c JOIN webhooks w ON w.id = c.webhook_id ORDER BY c.id"
);

impl PgStore {
    pub(super) async fn claim_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<(DeliveryRecord, WebhookRecord)>> {
        let rows = sqlx::query(CLAIM_DELIVERIES)
            .bind(owner)
            .bind(now.trunc_subsecs(6))
            .bind(lease_until.trunc_subsecs(6))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((delivery_from(row)?, webhook_from(row, "w_")?)))
            .collect()
    }
}
