//! Webhook subscriptions, per tenant: `POST /webhooks` and the routes under it. A subscription
//! names event kinds of the logs (or `*`), optionally one session; what matches is put in its
//! outbox by the store in the same transaction as the event (so nothing committed is missed),
//! and sent by `delivery.rs`. The signing secret is shown once, at creation and rotation.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::reach;
use crate::gateway::caller::Caller;
use crate::gateway::clock::now;
use crate::gateway::error::Error;
use crate::gateway::input::SessionId;
use crate::gateway::parts::records::Records;

use crate::events::EventHub;
use crate::store::{DeliveryRecord, EventKind, WebhookOutbox, WebhookRecord};

/// A subscription as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "wh_5f0c6a2e9b1d4c3e8a7f6b5d4c3e2a10", "url": "https://ci.example/hooks/acp", "events": [EventKind::TurnEnded.name(), EventKind::PermissionRequested.name()], "enabled": true, "tenant": "default", "createdAt": "2026-11-25T12:00:00Z", "updatedAt": "2026-11-25T12:00:00Z"}))]
pub struct WebhookView {
    pub id: String,
    pub url: String,
    /// Event kinds delivered (`*`: all).
    pub events: Vec<String>,
    /// Only this session's events, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `false` once disabled (by a client, or after a delivery failed for
    /// `--webhook-max-age`); `PATCH {"enabled": true}` enables it again.
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// The tenant whose sessions' events it receives (every tenant's when made with an admin key).
    pub tenant: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The signing secret (`whsec_…`): only in the answers that create or rotate it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl WebhookView {
    fn of(w: &WebhookRecord, with_secret: bool) -> Self {
        WebhookView {
            id: w.id.clone(),
            url: shown_url(&w.url),
            events: w.events.clone(),
            session_id: w.session_id.clone(),
            description: w.description.clone(),
            enabled: w.enabled,
            disabled_reason: w.disabled_reason.clone(),
            tenant: w.tenant.clone(),
            created_at: w.created_at,
            updated_at: w.updated_at,
            secret: with_secret.then(|| w.secret.clone()),
        }
    }
}

/// One event's delivery to one subscription.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": 42, "messageId": "sess_f15d4b67bbe3406688b9a02219da3c15.12", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "seq": 12, "event": EventKind::TurnEnded.name(), "status": "delivered", "attempts": 3, "lastStatusCode": 204, "lastResponseBody": "", "createdAt": "2026-11-25T12:00:00Z", "updatedAt": "2026-11-25T12:00:07Z"}))]
pub struct DeliveryView {
    pub id: i64,
    /// The `webhook-id` header: the same for every attempt (deduplicate on it).
    pub message_id: String,
    pub session_id: String,
    /// The event's sequence number in its log.
    pub seq: i64,
    pub event: String,
    /// `pending`, `delivered` or `failed` (retries given up).
    pub status: String,
    pub attempts: i32,
    /// When it is tried next (pending only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The last attempt's HTTP status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status_code: Option<i32>,
    /// The first 1 KiB of the last response's body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_response_body: Option<String>,
    /// Why the last attempt failed without a response (refused address, timeout, connection).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<DeliveryRecord> for DeliveryView {
    fn from(d: DeliveryRecord) -> Self {
        DeliveryView {
            id: d.id,
            message_id: d.message_id,
            session_id: d.session_id,
            seq: d.seq,
            event: d.kind,
            next_attempt_at: (d.status == "pending").then_some(d.next_attempt_at),
            status: d.status,
            attempts: d.attempts,
            last_status_code: d.last_status,
            last_response_body: d.last_body,
            last_error: d.last_error,
            created_at: d.created_at,
            updated_at: d.updated_at,
        }
    }
}

/// A page of deliveries, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"deliveries": [{"id": 42, "messageId": "sess_f15d4b67bbe3406688b9a02219da3c15.12", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "seq": 12, "event": EventKind::TurnEnded.name(), "status": "pending", "attempts": 1, "nextAttemptAt": "2026-11-25T12:00:10Z", "lastStatusCode": 500, "lastResponseBody": "try again", "createdAt": "2026-11-25T12:00:00Z", "updatedAt": "2026-11-25T12:00:05Z"}], "nextBefore": 42}))]
pub struct DeliveryPage {
    pub deliveries: Vec<DeliveryView>,
    /// Pass as `before` for the next (older) page; absent at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<i64>,
}

/// What `POST /webhooks` asks for.
#[derive(Debug, Default)]
pub struct NewWebhook {
    pub url: String,
    pub events: Vec<String>,
    pub session_id: Option<String>,
    pub description: Option<String>,
}

/// What `PATCH /webhooks/{id}` changes (`None`: unchanged).
#[derive(Debug, Default)]
pub struct WebhookPatch {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub description: Option<String>,
    pub enabled: Option<bool>,
}

/// A new signing secret: 32 random bytes (two v4 UUIDs, from a CSPRNG), base64.
fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    format!("whsec_{}", STANDARD.encode(bytes))
}

/// A webhook URL as [`reach::check_url`] allows it.
fn check_url(url: &str, allowed: reach::Allowed) -> Result<(), Error> {
    reach::check_url(url, allowed).map_err(Error::Invalid)
}

/// `url` as shown back: its userinfo (a user name and password, or a token) replaced by
/// `***`, so that `GET /webhooks` never shows a credential.
fn shown_url(url: &str) -> String {
    crate::redact::url(url)
}

fn check_events(events: &[String]) -> Result<(), Error> {
    if events.is_empty() || events.len() > 64 {
        return Err(Error::Invalid(
            "events must list 1 to 64 event kinds (or \"*\")".into(),
        ));
    }
    for kind in events {
        let logged = EventKind::parse(kind).is_some_and(|k| !EventKind::STREAM.contains(&k));
        let known = kind == "*" || logged || (kind.starts_with('_') && kind.len() <= 128);
        if !known {
            return Err(Error::Invalid(format!(
                "unknown event kind {kind:?}: use \"*\", an extension `_…`, or one of {}",
                EventKind::names(&[EventKind::GATEWAY, EventKind::UPDATES].concat()).join(", ")
            )));
        }
    }
    Ok(())
}

fn check_description(description: Option<&str>) -> Result<(), Error> {
    match description {
        Some(d) if d.chars().count() > 1000 || d.contains('\0') => Err(Error::Invalid(
            "description must be at most 1000 characters, without NUL".into(),
        )),
        _ => Ok(()),
    }
}

/// Webhook settings.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The non-public addresses that may be reached too.
    pub allowed: reach::Allowed,
    /// Bound on one attempt (connect, send, answer).
    pub timeout: Duration,
    /// The first retry's delay, doubled at each attempt up to `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// How long a delivery is retried before it fails and its subscription is disabled.
    pub max_age: Duration,
    /// How often due deliveries are looked for.
    pub poll: Duration,
    /// Largest body sent: a bigger event is sent without its `data` (`truncated: true`).
    pub max_body: usize,
}

/// The webhook subscriptions and the task that delivers their outbox.
pub struct Webhooks {
    /// Who may name which session.
    records: Arc<Records>,
    /// The subscriptions and their deliveries, as stored.
    outbox: Arc<dyn WebhookOutbox>,
    /// Where a disabled subscription is announced.
    hub: Arc<EventHub>,
    config: WebhookConfig,
    /// Ends the delivery task.
    stop: CancellationToken,
}

impl Webhooks {
    /// How deliveries are sent.
    pub(super) fn config(&self) -> &WebhookConfig {
        &self.config
    }

    /// Where a disabled subscription is announced.
    pub(super) fn hub(&self) -> &EventHub {
        &self.hub
    }

    /// Cancelled at shutdown: ends the delivery task.
    pub(super) fn stopping(&self) -> &CancellationToken {
        &self.stop
    }
}

impl Webhooks {
    pub(in crate::gateway) fn new(
        records: Arc<Records>,
        outbox: Arc<dyn WebhookOutbox>,
        hub: Arc<EventHub>,
        config: WebhookConfig,
        stop: CancellationToken,
    ) -> Self {
        Webhooks {
            records,
            outbox,
            hub,
            config,
            stop,
        }
    }

    /// The subscriptions and their deliveries, as stored.
    pub(in crate::gateway) fn outbox(&self) -> &dyn WebhookOutbox {
        self.outbox.as_ref()
    }

    /// `POST /webhooks`: the subscription, with its secret (shown only here and at rotation).
    pub async fn create(&self, caller: &Caller, new: NewWebhook) -> Result<WebhookView, Error> {
        check_url(&new.url, self.config.allowed)?;
        check_events(&new.events)?;
        check_description(new.description.as_deref())?;
        if let Some(id) = &new.session_id {
            self.records.get(caller, &SessionId::parse(id)?).await?;
        }
        let at = now();
        let record = WebhookRecord {
            id: format!("wh_{}", uuid::Uuid::new_v4().simple()),
            tenant: caller.tenant.clone(),
            admin: caller.admin,
            url: new.url,
            events: new.events,
            session_id: new.session_id,
            description: new.description,
            secret: new_secret(),
            enabled: true,
            disabled_reason: None,
            created_at: at,
            updated_at: at,
        };
        self.outbox().put_webhook(&record).await?;
        Ok(WebhookView::of(&record, true))
    }

    /// `GET /webhooks`: the caller's (every tenant's for an admin).
    pub async fn list(&self, caller: &Caller) -> Result<Vec<WebhookView>, Error> {
        let all = self.outbox().list_webhooks(caller.scope()).await?;
        Ok(all.iter().map(|w| WebhookView::of(w, false)).collect())
    }

    /// The subscription, if the caller may see it (404 otherwise, as for an unknown id).
    async fn webhook_record(&self, caller: &Caller, id: &str) -> Result<WebhookRecord, Error> {
        match self.outbox().get_webhook(id).await? {
            Some(w) if caller.sees(&w.tenant) => Ok(w),
            _ => Err(Error::NotFound(format!("no webhook {id}"))),
        }
    }

    /// `GET /webhooks/{id}`.
    pub async fn get(&self, caller: &Caller, id: &str) -> Result<WebhookView, Error> {
        Ok(WebhookView::of(
            &self.webhook_record(caller, id).await?,
            false,
        ))
    }

    /// `PATCH /webhooks/{id}`: enabling it again clears why it was disabled; its pending
    /// deliveries then go out.
    pub async fn patch(
        &self,
        caller: &Caller,
        id: &str,
        patch: WebhookPatch,
    ) -> Result<WebhookView, Error> {
        let mut w = self.webhook_record(caller, id).await?;
        if let Some(url) = patch.url {
            check_url(&url, self.config.allowed)?;
            w.url = url;
        }
        if let Some(events) = patch.events {
            check_events(&events)?;
            w.events = events;
        }
        if let Some(description) = patch.description {
            check_description(Some(&description))?;
            w.description = Some(description);
        }
        if let Some(enabled) = patch.enabled {
            w.enabled = enabled;
            w.disabled_reason = (!enabled).then(|| "disabled by a client".to_owned());
        }
        w.updated_at = now();
        self.update_webhook_row(&w).await?;
        Ok(WebhookView::of(&w, false))
    }

    async fn update_webhook_row(&self, w: &WebhookRecord) -> Result<(), Error> {
        if self.outbox().update_webhook(w).await? {
            Ok(())
        } else {
            Err(Error::NotFound(format!("no webhook {}", w.id)))
        }
    }

    /// `DELETE /webhooks/{id}`: with its deliveries; idempotent.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<(), Error> {
        match self.webhook_record(caller, id).await {
            Ok(_) => {
                self.outbox().delete_webhook(id).await?;
                Ok(())
            }
            Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `POST /webhooks/{id}/rotate-secret`: the new secret signs every attempt from now on.
    pub async fn rotate_secret(&self, caller: &Caller, id: &str) -> Result<WebhookView, Error> {
        let mut w = self.webhook_record(caller, id).await?;
        w.secret = new_secret();
        w.updated_at = now();
        self.update_webhook_row(&w).await?;
        Ok(WebhookView::of(&w, true))
    }

    /// `GET /webhooks/{id}/deliveries`.
    pub async fn deliveries(
        &self,
        caller: &Caller,
        id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<DeliveryPage, Error> {
        if !(1..=200).contains(&limit) {
            return Err(Error::Malformed("limit must be between 1 and 200".into()));
        }
        self.webhook_record(caller, id).await?;
        let mut rows = self.outbox().list_deliveries(id, before, limit + 1).await?;
        let more = rows.len() as i64 > limit;
        rows.truncate(limit as usize);
        let next_before = more.then(|| rows.last().map(|d| d.id)).flatten();
        Ok(DeliveryPage {
            deliveries: rows.into_iter().map(DeliveryView::from).collect(),
            next_before,
        })
    }

    /// `POST /webhooks/{id}/deliveries/{deliveryId}/retry`: pending again, due now, with a
    /// full `--webhook-max-age` of retries ahead.
    pub async fn retry_delivery(
        &self,
        caller: &Caller,
        id: &str,
        delivery: i64,
    ) -> Result<DeliveryView, Error> {
        self.webhook_record(caller, id).await?;
        let missing = || Error::NotFound(format!("no delivery {delivery} of webhook {id}"));
        if !self.outbox().retry_delivery(id, delivery, now()).await? {
            return Err(missing());
        }
        let row = self
            .outbox()
            .get_delivery(id, delivery)
            .await?
            .ok_or_else(missing)?;
        Ok(row.into())
    }
}

/// The JSON body of a delivery: the event as the SSE stream has it (`id`, `event`, `data`),
/// with its session and tenant, in the Standard Webhooks envelope (`type`, `timestamp`,
/// `data`); `data.data` is left out (`truncated: true`) when it would exceed `max`.
pub(in crate::gateway) fn body(d: &DeliveryRecord, max: usize) -> Vec<u8> {
    let mut event = serde_json::json!({
        "sessionId": d.session_id,
        "tenant": d.tenant,
        "id": d.seq,
        "event": d.kind,
        "data": d.payload,
    });
    let envelope = |event: &Value| {
        serde_json::to_vec(&serde_json::json!({
            "type": d.kind,
            "timestamp": d.event_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "data": event,
        }))
        .unwrap_or_default()
    };
    let whole = envelope(&event);
    if whole.len() <= max {
        return whole;
    }
    event["data"] = Value::Null;
    event["truncated"] = Value::Bool(true);
    envelope(&event)
}
