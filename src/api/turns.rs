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
use crate::gateway::{Caller, PermissionView, Prompt, TurnResult};

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
/// it on `GET /sessions/{id}/events`.
#[utoipa::path(post, operation_id = "promptSession", path = "/sessions/{id}/prompt", tag = "turns", params(SessionPath,
        ("Prefer" = Option<String>, Header, description = "`respond-async` to get 202 without waiting for the turn")),
    request_body = PromptBody,
    responses(
        (status = 200, description = "The turn ended", body = TurnResult),
        (status = 202, description = "The turn started (Prefer: respond-async)"),
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
