//! Elicitations: the agent's `elicitation/create` requests of a session (a form to fill, or a
//! URL to visit), listed while they wait and answered here.

use axum::extract::State;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::{AppState, Json, Path, SessionPath};
use super::responses::{AlreadyResolved, UnknownSession};
use crate::gateway::input::SessionId;
use crate::gateway::{Caller, ElicitationReply, ElicitationView};

/// `POST /sessions/{id}/elicitations/{requestId}` body: `{action: "accept", content}`,
/// `{action: "decline"}` or `{action: "cancel"}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"action": "accept", "content": {"name": "Ada"}}))]
pub struct ElicitationAnswer {
    pub action: ElicitationReply,
    /// With `accept` in form mode only: an object matching the request's `requestedSchema`.
    #[schema(value_type = Option<Object>)]
    pub content: Option<Value>,
}

/// Pending `elicitation/create` requests of a session.
#[utoipa::path(get, operation_id = "listElicitations", path = "/sessions/{id}/elicitations", tag = "turns", params(SessionPath),
    responses(
        (status = 200, description = "Pending elicitations, oldest first", body = Vec<ElicitationView>),
        UnknownSession,
    ))]
pub async fn list_elicitations(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<Vec<ElicitationView>>, ApiError> {
    Ok(Json(s.gateway.requests().elicitations(&caller, &id).await?))
}

/// Answer an elicitation.
///
/// `{action: "accept", content}` with content valid for the request's `requestedSchema`
/// (every mismatch is named in the 422; a URL elicitation is accepted without content),
/// `{action: "decline"}` or `{action: "cancel"}`.
#[utoipa::path(post, operation_id = "answerElicitation", path = "/sessions/{id}/elicitations/{requestId}", tag = "turns",
    params(("id" = String, Path, description = "Session id"), ("requestId" = String, Path, description = "Elicitation id")),
    request_body = ElicitationAnswer,
    responses(
        (status = 200, description = "Resolved", body = ElicitationView),
        (status = 404, description = "Unknown elicitation", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`content` missing, not matching the requested schema, or given with decline or cancel", body = Problem, content_type = "application/problem+json"),
        AlreadyResolved,
    ))]
pub async fn answer_elicitation(
    State(s): State<AppState>,
    caller: Caller,
    Path((id, request_id)): Path<(SessionId, String)>,
    Json(body): Json<ElicitationAnswer>,
) -> Result<Json<ElicitationView>, ApiError> {
    Ok(Json(
        s.gateway
            .requests()
            .answer_elicitation(
                &caller,
                &id,
                &request_id,
                body.action,
                body.content.as_ref(),
            )
            .await?,
    ))
}
