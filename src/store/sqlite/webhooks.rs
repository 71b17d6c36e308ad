//! The webhook outbox on SQLite: the insert each append runs in its transaction
//! ([`sqlite_insert_deliveries!`], used by `events.rs` and `lifecycle.rs`), and the claim of due
//! deliveries (one writer at a time: a transaction is enough to keep two claims apart). The
//! rest is written once in `store/webhooks.rs`.

use chrono::{DateTime, Utc};

use super::store::{BEGIN_IMMEDIATE, SqliteStore, micros};
use crate::store::rows::{delivery_from, webhook_from};
use crate::store::{DeliveryRecord, StoreResult, WebhookRecord};

/// The outbox insert of an append, a statement of its own in the append's transaction, with
/// anonymous parameters (`?`) in `$where` only: one delivery per event of `$from` (a FROM item
/// naming the events `i`, with their `session_id`, `seq`, `kind`, `payload`, `created_at`) that
/// `$where` selects and enabled webhook that hears it, `$message_id` and `$tenant` the
/// expressions of those columns. A webhook hears an event of a kind it lists (or `*`), of its
/// session when it names one, of its tenant unless it is an admin's. Deliveries are numbered in
/// log order; an event already delivered to a webhook (by message id) is not inserted again.
macro_rules! sqlite_insert_deliveries {
    (
        from: $from:literal,
        message_id: $message_id:literal,
        tenant: $tenant:literal,
        where: $where:literal $(,)?
    ) => {
        concat!(
            delivery_insert_columns!(),
            "SELECT w.id, ",
            $message_id,
            ", i.session_id, ",
            $tenant,
            ", i.seq, i.kind, i.payload, i.created_at, i.created_at, i.created_at, \
             i.created_at, i.created_at FROM ",
            $from,
            " JOIN webhooks w ON w.enabled AND (w.admin OR w.tenant = ",
            $tenant,
            ") AND (w.session_id IS NULL OR w.session_id = i.session_id) \
             AND EXISTS (SELECT 1 FROM json_each(w.events) k WHERE k.value IN (i.kind, '*')) \
             WHERE ",
            $where,
            " ORDER BY i.session_id, i.seq, w.id ON CONFLICT (webhook_id, message_id) DO NOTHING"
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
    pub(super) async fn claim_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<(DeliveryRecord, WebhookRecord)>> {
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let rows = sqlx::query(CLAIM_DELIVERIES)
            .bind(owner)
            .bind(micros(now))
            .bind(micros(lease_until))
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
