//! Prompt turns, cancellation and permission requests.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::header_lists;
use super::extract::{AppState, Json, Path, SessionPath};
use super::responses::{AlreadyResolved, NoReadyMember, UnknownSession};
use crate::gateway::input::SessionId;
use crate::gateway::{Caller, PermissionView, Prompt, QueuedView, TurnResult};

/// `POST /sessions/{id}/prompt` body: ACP content blocks, or plain text.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"prompt": [{"type": "text", "text": "Explain what src/main.rs does"}]}))]
pub struct PromptBody {
    /// ACP `ContentBlock[]`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt: Option<Vec<Value>>,
    /// Shorthand for one text block.
    pub text: Option<String>,
}

/// `POST /sessions/{id}/permissions/{requestId}` body: `{optionId}` or `{outcome: "cancelled"}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"optionId": "allow"}))]
pub struct PermissionAnswer {
    /// One of the request's `options[].optionId`.
    pub option_id: Option<String>,
    /// `"cancelled"` to refuse without choosing an option.
    pub outcome: Option<String>,
}

/// Send a prompt and wait for the turn to end.
///
/// Send a prompt (`session/prompt`) and wait for the turn to end. A saved session is resumed
/// first. With `Prefer: respond-async` the answer is 202 as soon as the turn has started; follow
/// it on `GET /sessions/{id}/events`. With `Prefer: queue` the prompt joins the session's queue
/// and runs when the turns before it have ended (202 with the queued prompt, whose `Location`
/// is in the queue); with `Prefer: interrupt` it goes first and the running turn is cancelled.
/// Without either, a prompt while a turn runs is 409.
#[utoipa::path(post, operation_id = "promptSession", path = "/sessions/{id}/prompt", tag = "turns", params(SessionPath,
        ("Prefer" = Option<String>, Header, description = "`respond-async` to get 202 without waiting for the turn; `queue` to queue the prompt behind the running turn; `interrupt` to cancel the running turn and run this prompt next")),
    request_body = PromptBody,
    responses(
        (status = 200, description = "The turn ended", body = TurnResult),
        (status = 202, description = "The prompt was queued (Prefer: queue or interrupt), or the turn started (Prefer: respond-async, no body)", body = QueuedView),
        (status = 429, description = "The session's queue is full (--max-queued-prompts)", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Malformed JSON or id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A turn is already running on this session", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid prompt", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The session is saved and the agent can neither resume nor load", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The agent failed or exited during the turn", body = Problem, content_type = "application/problem+json"),
        UnknownSession, NoReadyMember,
    ))]
pub async fn prompt(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    Json(body): Json<PromptBody>,
) -> Result<Response, ApiError> {
    let respond_async = header_lists(&headers, "prefer", "respond-async");
    let prompt = Prompt::new(body.prompt, body.text)?;
    let interrupt = header_lists(&headers, "prefer", "interrupt");
    if interrupt || header_lists(&headers, "prefer", "queue") {
        let queue = s.gateway.queue();
        let queued = queue.enqueue(&caller, &id, prompt, interrupt).await?;
        let location = format!("/sessions/{}/queue/{}", id.as_str(), queued.queue_id);
        let applied = if interrupt { "interrupt" } else { "queue" };
        return Ok((
            StatusCode::ACCEPTED,
            [
                (header::LOCATION, location),
                (
                    header::HeaderName::from_static("preference-applied"),
                    applied.into(),
                ),
            ],
            Json(queued),
        )
            .into_response());
    }
    match s
        .gateway
        .turns()
        .prompt(&caller, &id, prompt, !respond_async)
        .await?
    {
        Some(result) => Ok(Json(result).into_response()),
        None => {
            let location = format!("/sessions/{}/events", id.as_str());
            Ok((
                StatusCode::ACCEPTED,
                [
                    (header::LOCATION, location),
                    (
                        header::HeaderName::from_static("preference-applied"),
                        "respond-async".into(),
                    ),
                ],
            )
                .into_response())
        }
    }
}

/// Cancel the running turn (`session/cancel`); pending permission requests resolve as `cancelled`.
#[utoipa::path(post, operation_id = "cancelTurn", path = "/sessions/{id}/cancel", tag = "turns", params(SessionPath),
    responses(
        (status = 204, description = "Cancel sent (a no-op when no turn runs)"),
        UnknownSession,
    ))]
pub async fn cancel(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<StatusCode, ApiError> {
    s.gateway.turns().cancel(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pending `session/request_permission` requests of a session.
#[utoipa::path(get, operation_id = "listPermissions", path = "/sessions/{id}/permissions", tag = "turns", params(SessionPath),
    responses(
        (status = 200, description = "Pending requests, oldest first", body = Vec<PermissionView>),
        UnknownSession,
    ))]
pub async fn list_permissions(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<Vec<PermissionView>>, ApiError> {
    Ok(Json(s.gateway.requests().permissions(&caller, &id).await?))
}

/// Answer a permission request with `{optionId}` or `{outcome: "cancelled"}`.
#[utoipa::path(post, operation_id = "answerPermission", path = "/sessions/{id}/permissions/{requestId}", tag = "turns",
    params(("id" = String, Path, description = "Session id"), ("requestId" = String, Path, description = "Permission request id")),
    request_body = PermissionAnswer,
    responses(
        (status = 200, description = "Resolved", body = PermissionView),
        (status = 404, description = "Unknown request", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not one of the offered options", body = Problem, content_type = "application/problem+json"),
        AlreadyResolved,
    ))]
pub async fn answer_permission(
    State(s): State<AppState>,
    caller: Caller,
    Path((id, request_id)): Path<(SessionId, String)>,
    Json(body): Json<PermissionAnswer>,
) -> Result<Json<PermissionView>, ApiError> {
    Ok(Json(
        s.gateway
            .requests()
            .answer_permission(
                &caller,
                &id,
                &request_id,
                body.option_id,
                body.outcome.as_deref(),
            )
            .await?,
    ))
}

/// List the session's queued prompts.
///
/// The session's queued prompts: the one whose turn runs (`started`), then those waiting, in
/// the order they will run.
#[utoipa::path(get, operation_id = "listQueue", path = "/sessions/{id}/queue", tag = "turns", params(SessionPath),
    responses(
        (status = 200, description = "The queue", body = Vec<QueuedView>),
        UnknownSession,
    ))]
pub async fn queue(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<Vec<QueuedView>>, ApiError> {
    Ok(Json(s.gateway.queue().list(&caller, &id).await?))
}

/// Withdraw a queued prompt.
///
/// Withdraw a queued prompt whose turn has not started (its author, the session's owner or an
/// admin).
#[utoipa::path(delete, operation_id = "withdrawQueuedPrompt", path = "/sessions/{id}/queue/{queueId}", tag = "turns",
    params(("id" = String, Path, description = "Session id"), ("queueId" = String, Path, description = "Queued prompt id")),
    responses(
        (status = 204, description = "Withdrawn"),
        (status = 403, description = "Neither its author, the session's owner nor an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such queued prompt (or session)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Its turn has started", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn withdraw(
    State(s): State<AppState>,
    caller: Caller,
    Path((id, queue_id)): Path<(SessionId, String)>,
) -> Result<StatusCode, ApiError> {
    let queue = s.gateway.queue();
    queue.withdraw(&caller, &id, &queue_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
