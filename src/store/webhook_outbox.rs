//! Webhooks: the subscriptions ([`WebhookRecord`](super::WebhookRecord)) and their outbox, one
//! row per event to send to one webhook ([`DeliveryRecord`](super::DeliveryRecord)), as
//! `records.rs` holds them with how an attempt ended ([`Attempt`](super::Attempt)).
//!
//! Delivery rows are inserted by the appends themselves, in the statement or transaction that
//! stores the events (each backend's `events.rs` and `lifecycle.rs`), so that an event stored is
//! an event that will be sent; senders claim them with leases (each backend's `webhook_outbox.rs`).
//! The rest runs alike on both backends and is written once here: the SQL (the outbox insert
//! too, [`insert_deliveries!`], which each backend completes in its dialect), and
//! [`impl_webhooks!`], which writes a backend's
//! [`WebhookOutbox`](crate::store::contract::WebhookOutbox) impl.

use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{Database, Encode, Type};

use super::records::WebhookRecord;

/// The `webhooks` columns, in the order of [`PUT_WEBHOOK`]'s parameters: first those
/// [`bind_webhook`] binds, then those an update leaves.
macro_rules! webhook_columns {
    () => {
        "id, url, events, session_id, description, secret, enabled, disabled_reason, \
         updated_at, tenant, admin, created_at"
    };
}

/// The `webhook_deliveries` columns a [`DeliveryRecord`](super::DeliveryRecord) is read from.
macro_rules! delivery_columns {
    () => {
        "id, webhook_id, message_id, session_id, tenant, seq, kind, payload, event_at, status, \
         attempts, next_attempt_at, retry_from, last_status, last_body, last_error, created_at, \
         updated_at"
    };
}

/// The outbox insert of an append, which `pg_insert_deliveries!` and `sqlite_insert_deliveries!`
/// complete in their backend's dialect: one delivery per event of `$from` (a FROM item naming the events `i`, with their
/// `session_id`, `seq`, `kind`, `created_at`) and enabled webhook `w` that hears it, `$message_id`,
/// `$tenant` and `$payload` the expressions of those columns (the others take their defaults),
/// `$filter` what follows the join's condition (more of it, or a `WHERE`). A webhook hears an
/// event of a kind it lists or `*` (`$hears_kind`), of its session when it names one (compared
/// to `$event_session`), of its tenant unless it is an admin's. Deliveries are numbered in log
/// order, `$lock` the backend's locking of the webhook rows; an event already delivered to a
/// webhook (by message id) is not inserted again.
macro_rules! insert_deliveries {
    (
        from: $from:literal,
        message_id: $message_id:literal,
        tenant: $tenant:literal,
        payload: $payload:literal,
        filter: $filter:expr,
        event_session: $event_session:literal,
        hears_kind: $hears_kind:literal,
        lock: $lock:literal $(,)?
    ) => {
        concat!(
            "INSERT INTO webhook_deliveries (webhook_id, message_id, session_id, tenant, seq, kind, \
             payload, event_at, next_attempt_at, retry_from, created_at, updated_at) SELECT w.id, ",
            $message_id,
            ", i.session_id, ",
            $tenant,
            ", i.seq, i.kind, ",
            $payload,
            ", i.created_at, i.created_at, i.created_at, i.created_at, i.created_at FROM ",
            $from,
            " JOIN webhooks w ON w.enabled AND (w.admin OR w.tenant = ",
            $tenant,
            ") AND (w.session_id IS NULL OR w.session_id = ",
            $event_session,
            ") AND ",
            $hears_kind,
            $filter,
            " ORDER BY i.session_id, i.seq, w.id",
            $lock,
            " ON CONFLICT (webhook_id, message_id) DO NOTHING"
        )
    };
}

/// The ids of the deliveries
/// [`WebhookOutbox::claim_deliveries`](crate::store::contract::WebhookOutbox::claim_deliveries)
/// takes (`$2` now, `$4` how many), lowest first, `$lock` the backend's row locking: of the first
/// pending delivery of each (webhook, session), those due (`next_attempt_at` reached, lease free or
/// expired) of an enabled webhook. The first ones are found in the partial index of pending
/// deliveries, whatever the number of those delivered before; the status is checked again on the
/// row, which PostgreSQL re-reads when it locks a row changed meanwhile.
macro_rules! due_deliveries {
    ($lock:literal) => {
        concat!(
            "SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id \
             WHERE d.id IN (SELECT MIN(p.id) FROM webhook_deliveries p \
             WHERE p.status = 'pending' GROUP BY p.webhook_id, p.session_id) \
             AND w.enabled AND d.status = 'pending' AND d.next_attempt_at <= $2 \
             AND (d.lease_until IS NULL OR d.lease_until < $2) ORDER BY d.id LIMIT $4",
            $lock
        )
    };
}

pub(crate) const PUT_WEBHOOK: &str = concat!(
    "INSERT INTO webhooks (",
    webhook_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
);

pub(crate) const GET_WEBHOOK: &str = concat!(
    "SELECT ",
    webhook_columns!(),
    " FROM webhooks WHERE id = $1"
);

pub(crate) const LIST_WEBHOOKS_ALL: &str = concat!(
    "SELECT ",
    webhook_columns!(),
    " FROM webhooks ORDER BY created_at DESC, id DESC"
);

pub(crate) const LIST_WEBHOOKS_TENANT: &str = concat!(
    "SELECT ",
    webhook_columns!(),
    " FROM webhooks WHERE tenant = $1 ORDER BY created_at DESC, id DESC"
);

/// Everything but the id, the tenant, `admin` and `created_at`, its parameters those of
/// [`bind_webhook`].
pub(crate) const UPDATE_WEBHOOK: &str = "UPDATE webhooks SET url = $2, events = $3, \
     session_id = $4, description = $5, secret = $6, enabled = $7, disabled_reason = $8, \
     updated_at = $9 WHERE id = $1";

/// Binds the parameters [`PUT_WEBHOOK`] and [`UPDATE_WEBHOOK`] share, `$1`…`$9`: `w`'s id, the
/// columns an update changes, and `updated_at` (as the backend binds a timestamp).
pub(crate) fn bind_webhook<'q, DB, T>(
    query: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    w: &'q WebhookRecord,
    updated_at: T,
) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    T: 'q + Encode<'q, DB> + Type<DB>,
    String: Encode<'q, DB> + Type<DB>,
    Option<String>: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    Json<&'q Vec<String>>: Encode<'q, DB> + Type<DB>,
{
    query
        .bind(&w.id)
        .bind(&w.url)
        .bind(Json(&w.events))
        .bind(&w.session_id)
        .bind(&w.description)
        .bind(&w.secret)
        .bind(w.enabled)
        .bind(&w.disabled_reason)
        .bind(updated_at)
}

/// Its deliveries go with it (`ON DELETE CASCADE`).
pub(crate) const DELETE_WEBHOOK: &str = "DELETE FROM webhooks WHERE id = $1";

/// `$1`'s deliveries with `id < $2`, newest first, at most `$3`.
pub(crate) const LIST_DELIVERIES: &str = concat!(
    "SELECT ",
    delivery_columns!(),
    " FROM webhook_deliveries WHERE webhook_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3"
);

pub(crate) const GET_DELIVERY: &str = concat!(
    "SELECT ",
    delivery_columns!(),
    " FROM webhook_deliveries WHERE webhook_id = $1 AND id = $2"
);

/// Due again at `$3`, from which retries count again; whoever held it has lost it.
pub(crate) const RETRY_DELIVERY: &str = "UPDATE webhook_deliveries SET status = 'pending', \
     next_attempt_at = $3, retry_from = $3, lease_owner = NULL, lease_until = NULL, \
     updated_at = $3 WHERE webhook_id = $1 AND id = $2";

/// Records an attempt of delivery `$1` if `$2` holds it: status `$3`, next attempt at `$4`
/// (NULL: unchanged), the response's status `$5`, body `$6` and error `$7`, at `$8`.
pub(crate) const FINISH_DELIVERY: &str = "UPDATE webhook_deliveries SET status = $3, \
     attempts = attempts + 1, next_attempt_at = COALESCE($4, next_attempt_at), \
     last_status = $5, last_body = $6, last_error = $7, lease_owner = NULL, \
     lease_until = NULL, updated_at = $8 WHERE id = $1 AND lease_owner = $2";

/// `impl_webhooks!(Backend { reads, writes, time })` implements
/// [`WebhookOutbox`](crate::store::contract::WebhookOutbox) for `Backend` (invoked by
/// [`impl_store!`], from its parameters of the same names): these use cases read through the
/// pool `self.reads`, write through `self.writes` and bind a timestamp as `time(at)`, as
/// [`impl_store!`]'s do; `claim_deliveries` forwards to the backend's own.
macro_rules! impl_webhooks {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident, time: $time:path $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::contract::WebhookOutbox for $backend {
            async fn put_webhook(
                &self,
                w: &$crate::store::records::WebhookRecord,
            ) -> $crate::store::error::StoreResult<()> {
                use chrono::SubsecRound;
                $crate::store::webhook_outbox::bind_webhook(
                    sqlx::query($crate::store::webhook_outbox::PUT_WEBHOOK),
                    w,
                    $time(w.updated_at.trunc_subsecs(6)),
                )
                .bind(&w.tenant)
                .bind(w.admin)
                .bind($time(w.created_at.trunc_subsecs(6)))
                .execute(&self.$writes)
                .await?;
                Ok(())
            }

            async fn get_webhook(
                &self,
                id: &str,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::records::WebhookRecord>>
            {
                let row = sqlx::query($crate::store::webhook_outbox::GET_WEBHOOK)
                    .bind(id)
                    .fetch_optional(&self.$reads)
                    .await?;
                row.as_ref()
                    .map(|row| $crate::store::rows::webhook_from(row, ""))
                    .transpose()
            }

            async fn list_webhooks(
                &self,
                tenant: Option<&str>,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::records::WebhookRecord>> {
                let query = match tenant {
                    None => sqlx::query($crate::store::webhook_outbox::LIST_WEBHOOKS_ALL),
                    Some(tenant) => {
                        sqlx::query($crate::store::webhook_outbox::LIST_WEBHOOKS_TENANT)
                            .bind(tenant)
                    }
                };
                let rows = query.fetch_all(&self.$reads).await?;
                rows.iter()
                    .map(|row| $crate::store::rows::webhook_from(row, ""))
                    .collect()
            }

            async fn update_webhook(
                &self,
                w: &$crate::store::records::WebhookRecord,
            ) -> $crate::store::error::StoreResult<bool> {
                use chrono::SubsecRound;
                let updated = $crate::store::webhook_outbox::bind_webhook(
                    sqlx::query($crate::store::webhook_outbox::UPDATE_WEBHOOK),
                    w,
                    $time(w.updated_at.trunc_subsecs(6)),
                )
                .execute(&self.$writes)
                .await?;
                Ok(updated.rows_affected() > 0)
            }

            async fn delete_webhook(&self, id: &str) -> $crate::store::error::StoreResult<bool> {
                let deleted = sqlx::query($crate::store::webhook_outbox::DELETE_WEBHOOK)
                    .bind(id)
                    .execute(&self.$writes)
                    .await?;
                Ok(deleted.rows_affected() > 0)
            }

            async fn list_deliveries(
                &self,
                webhook_id: &str,
                before: Option<i64>,
                limit: i64,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::records::DeliveryRecord>>
            {
                let rows = sqlx::query($crate::store::webhook_outbox::LIST_DELIVERIES)
                    .bind(webhook_id)
                    .bind(before.unwrap_or(i64::MAX))
                    .bind(limit.max(0))
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter()
                    .map($crate::store::rows::delivery_from)
                    .collect()
            }

            async fn get_delivery(
                &self,
                webhook_id: &str,
                id: i64,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::records::DeliveryRecord>>
            {
                let row = sqlx::query($crate::store::webhook_outbox::GET_DELIVERY)
                    .bind(webhook_id)
                    .bind(id)
                    .fetch_optional(&self.$reads)
                    .await?;
                row.as_ref()
                    .map($crate::store::rows::delivery_from)
                    .transpose()
            }

            async fn retry_delivery(
                &self,
                webhook_id: &str,
                id: i64,
                now: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::error::StoreResult<bool> {
                use chrono::SubsecRound;
                let retried = sqlx::query($crate::store::webhook_outbox::RETRY_DELIVERY)
                    .bind(webhook_id)
                    .bind(id)
                    .bind($time(now.trunc_subsecs(6)))
                    .execute(&self.$writes)
                    .await?;
                Ok(retried.rows_affected() > 0)
            }

            async fn claim_deliveries(
                &self,
                owner: &str,
                now: chrono::DateTime<chrono::Utc>,
                lease_until: chrono::DateTime<chrono::Utc>,
                limit: i64,
            ) -> $crate::store::error::StoreResult<
                Vec<(
                    $crate::store::records::DeliveryRecord,
                    $crate::store::records::WebhookRecord,
                )>,
            > {
                use chrono::SubsecRound;
                if limit <= 0 {
                    return Ok(Vec::new());
                }
                let now = $time(now.trunc_subsecs(6));
                let lease_until = $time(lease_until.trunc_subsecs(6));
                self.claim_deliveries(owner, now, lease_until, limit).await
            }

            async fn finish_delivery(
                &self,
                id: i64,
                owner: &str,
                attempt: &$crate::store::records::Attempt,
                now: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::error::StoreResult<bool> {
                use chrono::SubsecRound;
                use $crate::store::records::Attempt;
                let (next, status, body, error) = match attempt {
                    Attempt::Delivered { status, body } => (None, Some(*status), Some(body), None),
                    Attempt::Failed {
                        status,
                        body,
                        error,
                        next,
                    } => (*next, *status, body.as_ref(), Some(error)),
                };
                let finished = sqlx::query($crate::store::webhook_outbox::FINISH_DELIVERY)
                    .bind(id)
                    .bind(owner)
                    .bind(attempt.status())
                    .bind(next.map(|at| $time(at.trunc_subsecs(6))))
                    .bind(status)
                    .bind(body)
                    .bind(error)
                    .bind($time(now.trunc_subsecs(6)))
                    .execute(&self.$writes)
                    .await?;
                Ok(finished.rows_affected() > 0)
            }
        }
    };
}
