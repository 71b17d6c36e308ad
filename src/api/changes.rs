//! What changed in a session's workspace: `GET /sessions/{id}/diff` (JSON, or the whole patch
//! with `Accept: text/x-diff`), `GET /sessions/{id}/checkpoints` and `POST
//! /sessions/{id}/revert`.

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::{AppState, Json, Path, Query, SessionPath, header_lists};
use super::responses::{MalformedParams, NoGit, NoWorkspace, UnknownSession};
use crate::gateway::{Caller, Checkpoint, CheckpointsView, DiffView, SessionId};

/// `GET /sessions/{id}/diff` parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DiffParams {
    /// A checkpoint's id: what it changed against the one before it (by default, the files
    /// as they are now against the workspace's base).
    pub checkpoint: Option<String>,
}

/// `POST /sessions/{id}/revert` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"to": "base"}))]
pub struct RevertBody {
    /// A checkpoint's id, or `base`: the files are made as they were then.
    pub to: String,
}

/// The files changed in the session's workspace.
///
/// Each with its status, line counts and patch: against the workspace's base, or what one
/// checkpoint changed.
#[utoipa::path(get, operation_id = "getDiff", path = "/sessions/{id}/diff", tag = "files",
    params(SessionPath, DiffParams,
        ("Accept" = Option<String>, Header, description = "`text/x-diff`: the whole unified patch instead of JSON")),
    responses(
        (status = 200, description = "The changed files (untracked ones included, ignored ones not)", content(
            (DiffView = "application/json"),
            (String = "text/x-diff"),
        )),
        MalformedParams,
        (status = 404, description = "Unknown session, or no such checkpoint", body = crate::gateway::Problem, content_type = "application/problem+json"),
        NoWorkspace,
        NoGit,
    ))]
pub async fn diff(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    Query(p): Query<DiffParams>,
) -> Result<Response, ApiError> {
    let changes = s.gateway.changes();
    let checkpoint = p.checkpoint.as_deref();
    if header_lists(&headers, header::ACCEPT, "text/x-diff") {
        let patch = changes.patch(&caller, &id, checkpoint).await?;
        return Ok((
            [(header::CONTENT_TYPE, "text/x-diff; charset=utf-8")],
            patch,
        )
            .into_response());
    }
    Ok(Json(changes.diff(&caller, &id, checkpoint).await?).into_response())
}

/// The checkpoints of the session's workspace.
///
/// One after each turn that changed its files, and one after each revert.
#[utoipa::path(get, operation_id = "listCheckpoints", path = "/sessions/{id}/checkpoints", tag = "files",
    params(SessionPath),
    responses(
        (status = 200, description = "Newest first", body = CheckpointsView),
        UnknownSession,
        NoWorkspace,
        NoGit,
    ))]
pub async fn checkpoints(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<CheckpointsView>, ApiError> {
    let listed = s.gateway.changes().checkpoints(&caller, &id).await?;
    Ok(Json(listed))
}

/// Make the workspace's files as they were at a checkpoint, or at the base.
///
/// The revert is a checkpoint of its own, so it can be reverted in turn.
#[utoipa::path(post, operation_id = "revertWorkspace", path = "/sessions/{id}/revert", tag = "files",
    params(SessionPath),
    request_body = RevertBody,
    responses(
        (status = 200, description = "The checkpoint the files are now at", body = Checkpoint),
        (status = 404, description = "Unknown session, or no such checkpoint", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 409, description = "A turn is running, or the session has no workspace of the gateway's", body = crate::gateway::Problem, content_type = "application/problem+json"),
        NoGit,
    ))]
pub async fn revert(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Json(body): Json<RevertBody>,
) -> Result<Json<Checkpoint>, ApiError> {
    let at = s.gateway.changes().revert(&caller, &id, &body.to).await?;
    Ok(Json(at))
}
