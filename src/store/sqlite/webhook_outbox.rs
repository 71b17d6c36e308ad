//! The webhook outbox on SQLite: the insert each append runs in its transaction
//! ([`sqlite_insert_deliveries!`], used by `events.rs` and `lifecycle.rs`), and the claim of due
//! deliveries (one writer at a time: a transaction is enough to keep two claims apart). The
//! rest is written once in `store/webhook_outbox.rs`.

use super::store::{BEGIN_IMMEDIATE, SqliteStore};
use crate::store::error::StoreResult;
use crate::store::records::{DeliveryRecord, WebhookRecord};
use crate::store::rows::{delivery_from, webhook_from};

/// The outbox insert of an append, a statement of its own in the append's transaction, with
/// anonymous parameters (`?`) in `$where` only: the [`insert_deliveries!`] of `$from` (its
/// events with their `payload` too), `$message_id` and `$tenant` in SQLite's dialect, of the
/// events `$where` selects.
macro_rules! sqlite_insert_deliveries {
    (
        from: $from:literal,
        message_id: $message_id:literal,
        tenant: $tenant:literal,
        where: $where:literal $(,)?
    ) => {
        insert_deliveries!(
            from: $from,
            message_id: $message_id,
            tenant: $tenant,
            payload: "i.payload",
            filter: concat!(" WHERE ", $where),
            event_session: "i.session_id",
            hears_kind: "EXISTS (SELECT 1 FROM json_each(w.events) k WHERE k.value IN (i.kind, '*'))",
            lock: "",
        )
    };
}

/// Leases the due deliveries to `$1` until `$3` (see [`due_deliveries!`]) and returns them.
const CLAIM_DELIVERIES: &str = concat!(
    "UPDATE webhook_deliveries SET lease_owner = $1, lease_until = $3 WHERE id IN (",
    due_deliveries!(""),
    ") RETURNING ",
    delivery_columns!()
);

impl SqliteStore {
    /// [`WebhookOutbox::claim_deliveries`](crate::store::contract::WebhookOutbox::claim_deliveries),
    /// its timestamps in unix microseconds.
    pub(super) async fn claim_deliveries(
        &self,
        owner: &str,
        now: i64,
        lease_until: i64,
        limit: i64,
    ) -> StoreResult<Vec<(DeliveryRecord, WebhookRecord)>> {
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let rows = sqlx::query(CLAIM_DELIVERIES)
            .bind(owner)
            .bind(now)
            .bind(lease_until)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let mut claimed = rows
            .iter()
            .map(delivery_from)
            .collect::<StoreResult<Vec<_>>>()?;
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        claimed.sort_by_key(|d| d.id);
        let mut qb = sqlx::QueryBuilder::new(concat!(
            "SELECT ",
            webhook_columns!(),
            " FROM webhooks WHERE id IN ("
        ));
        let webhook_ids: std::collections::BTreeSet<&str> =
            claimed.iter().map(|d| d.webhook_id.as_str()).collect();
        let mut ids = qb.separated(", ");
        for id in webhook_ids {
            ids.push_bind(id);
        }
        qb.push(")");
        let webhooks = qb
            .build()
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| webhook_from(row, ""))
            .collect::<StoreResult<Vec<_>>>()?;
        tx.commit().await?;
        // Each claimed delivery's webhook is there: the claim reads them in its transaction.
        Ok(claimed
            .into_iter()
            .filter_map(|d| {
                let w = webhooks.iter().find(|w| w.id == d.webhook_id)?.clone();
                Some((d, w))
            })
            .collect())
    }
}
