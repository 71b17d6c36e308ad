//! The webhook outbox on PostgreSQL: the insert each append runs in its own statement
//! ([`pg_insert_deliveries!`], used by `events.rs` and `lifecycle.rs`), and the claim of due
//! deliveries, one statement that locks what it takes (`FOR UPDATE SKIP LOCKED`) so that two
//! replicas never claim the same row. The rest is written once in `store/webhook_outbox.rs`.

use chrono::{DateTime, Utc};

use super::store::PgStore;
use crate::store::error::StoreResult;
use crate::store::records::{DeliveryRecord, WebhookRecord};
use crate::store::rows::{delivery_from, webhook_from};

/// The outbox insert of an append, a statement (or data-modifying CTE) of its own: the
/// [`insert_deliveries!`] of `from`, `message_id`, `tenant`, `payload` and `filter` (any further
/// condition on the event, ` AND …`), each followed by a comma, in PostgreSQL's dialect.
///
/// The webhook rows are locked (`FOR KEY SHARE`, as the foreign key's check would lock them) as
/// they are read: a webhook deleted meanwhile is then skipped, where the foreign key's check
/// would fail the append.
macro_rules! pg_insert_deliveries {
    ($($use_case:tt)*) => {
        insert_deliveries!(
            $($use_case)*
            event_session: "i.session_id COLLATE \"C\"",
            hears_kind: "w.events ?| ARRAY[i.kind, '*']",
            lock: " FOR KEY SHARE OF w",
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
    /// [`WebhookOutbox::claim_deliveries`](crate::store::contract::WebhookOutbox::claim_deliveries),
    /// its timestamps to the microsecond.
    pub(super) async fn claim_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<(DeliveryRecord, WebhookRecord)>> {
        let rows = sqlx::query(CLAIM_DELIVERIES)
            .bind(owner)
            .bind(now)
            .bind(lease_until)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((delivery_from(row)?, webhook_from(row, "w_")?)))
            .collect()
    }
}
