//! Webhook subscriptions and their deliveries: `/webhooks`, `/webhooks/{id}`,
//! `/webhooks/{id}/rotate-secret`, `/webhooks/{id}/deliveries` and
//! `/webhooks/{id}/deliveries/{deliveryId}/retry`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Deserialize;
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::{AppState, Json, Path, Query};
use super::responses::{InvalidWebhook, MalformedParams, UnknownWebhook};
use crate::gateway::{
    Caller, DeliveryPage, DeliveryView, EventKind, NewWebhook, WebhookPatch, WebhookView,
};

/// `POST /webhooks` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"url": "https://ci.example/hooks/acp", "events": [EventKind::TurnEnded.name(), EventKind::PermissionRequested.name()], "description": "CI"}))]
pub struct CreateWebhook {
    /// An `http(s)` URL; it must resolve to a public address unless the gateway runs with
    /// `--webhook-allow-private`.
    pub url: String,
    /// Event kinds of the logs (`turn_ended`, `permission_requested`, `elicitation_requested`,
    /// `session_created`, `session_deleted`, `agent_exited`, an ACP `sessionUpdate` tag…) or `*`.
    pub events: Vec<String>,
    /// Only this session's events.
    pub session_id: Option<String>,
    pub description: Option<String>,
}

/// `PATCH /webhooks/{id}` body: what changes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"enabled": true}))]
pub struct PatchWebhook {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub description: Option<String>,
    /// `true` enables a disabled subscription again (its pending deliveries go out).
    pub enabled: Option<bool>,
}

/// `GET /webhooks/{id}/deliveries` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryParams {
    /// Only deliveries older than this id (`nextBefore` of the previous page).
    pub before: Option<i64>,
    /// Page size, 1–200 (default 50).
    pub limit: Option<i64>,
}

/// Subscribe to events.
///
/// Deliveries are POSTed with the Standard Webhooks headers (`webhook-id`, the same for every
/// attempt; `webhook-timestamp`; `webhook-signature`: `v1,` HMAC-SHA256 with the `secret`
/// returned here, shown only now) and a JSON body `{type, timestamp, data: {sessionId, tenant,
/// id, event, data}}`, at least once, in log order per session, retried with backoff.
#[utoipa::path(post, operation_id = "createWebhook", path = "/webhooks", tag = "webhooks", request_body = CreateWebhook,
    responses(
        (status = 201, description = "The subscription, with its signing secret", body = WebhookView,
            headers(("Location" = String, description = "/webhooks/{id}"))),
        (status = 404, description = "sessionId names no session of the caller's", body = Problem, content_type = "application/problem+json"),
        InvalidWebhook,
    ))]
pub async fn create_webhook(
    State(s): State<AppState>,
    caller: Caller,
    Json(body): Json<CreateWebhook>,
) -> Result<impl IntoResponse, ApiError> {
    let new = NewWebhook {
        url: body.url,
        events: body.events,
        session_id: body.session_id,
        description: body.description,
    };
    let view = s.gateway.webhooks().create(&caller, new).await?;
    let location = format!("/webhooks/{}", view.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view),
    ))
}

/// List subscriptions (the caller tenant's; every tenant's for an admin key).
#[utoipa::path(get, operation_id = "listWebhooks", path = "/webhooks", tag = "webhooks",
    responses((status = 200, description = "The subscriptions, newest first", body = Vec<WebhookView>)))]
pub async fn list_webhooks(
    State(s): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<WebhookView>>, ApiError> {
    Ok(Json(s.gateway.webhooks().list(&caller).await?))
}

/// A subscription.
#[utoipa::path(get, operation_id = "getWebhook", path = "/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The subscription (without its secret)", body = WebhookView),
        UnknownWebhook,
    ))]
pub async fn get_webhook(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    Ok(Json(s.gateway.webhooks().get(&caller, &id).await?))
}

/// Change a subscription (URL, events, description, enabled).
#[utoipa::path(patch, operation_id = "patchWebhook", path = "/webhooks/{id}", tag = "webhooks", request_body = PatchWebhook,
    params(("id" = String, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The subscription", body = WebhookView),
        UnknownWebhook, InvalidWebhook,
    ))]
pub async fn patch_webhook(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Json(body): Json<PatchWebhook>,
) -> Result<Json<WebhookView>, ApiError> {
    let patch = WebhookPatch {
        url: body.url,
        events: body.events,
        description: body.description,
        enabled: body.enabled,
    };
    Ok(Json(s.gateway.webhooks().patch(&caller, &id, patch).await?))
}

/// Delete a subscription and its deliveries (idempotent).
#[utoipa::path(delete, operation_id = "deleteWebhook", path = "/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "Webhook id")),
    responses((status = 204, description = "Deleted, or there was none")))]
pub async fn delete_webhook(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.gateway.webhooks().delete(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replace the signing secret.
#[utoipa::path(post, operation_id = "rotateWebhookSecret", path = "/webhooks/{id}/rotate-secret", tag = "webhooks",
    params(("id" = String, Path, description = "Webhook id")),
    responses(
        (status = 200, description = "The subscription with its new secret, which signs every attempt from now on", body = WebhookView),
        UnknownWebhook,
    ))]
pub async fn rotate_secret(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    Ok(Json(
        s.gateway.webhooks().rotate_secret(&caller, &id).await?,
    ))
}

/// A subscription's deliveries, newest first.
#[utoipa::path(get, operation_id = "listWebhookDeliveries", path = "/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "Webhook id"), DeliveryParams),
    responses(
        (status = 200, description = "One page of deliveries: status, attempts, last response code and body", body = DeliveryPage),
        MalformedParams, UnknownWebhook,
    ))]
pub async fn list_deliveries(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(p): Query<DeliveryParams>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let page = s
        .gateway
        .webhooks()
        .deliveries(&caller, &id, p.before, p.limit.unwrap_or(50))
        .await?;
    Ok(Json(page))
}

/// Send a delivery again (a failed one, or a pending one now).
#[utoipa::path(post, operation_id = "retryWebhookDelivery", path = "/webhooks/{id}/deliveries/{deliveryId}/retry", tag = "webhooks",
    params(("id" = String, Path, description = "Webhook id"), ("deliveryId" = i64, Path, description = "Delivery id")),
    responses(
        (status = 202, description = "Pending again, due now", body = DeliveryView),
        (status = 400, description = "A delivery id that is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown webhook or delivery", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn retry_delivery(
    State(s): State<AppState>,
    caller: Caller,
    Path((id, delivery)): Path<(String, i64)>,
) -> Result<impl IntoResponse, ApiError> {
    let view = s
        .gateway
        .webhooks()
        .retry_delivery(&caller, &id, delivery)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}
