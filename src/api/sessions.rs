//! `/sessions` and `/sessions/{id}`: list, create, read, rename, delete, status, resume, close.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::header_lists;
use super::extract::{AppState, Json, Path, Query, SessionPath};
use super::responses::{
    AgentFailed, InvalidSessionParams, NoReadyMember, SessionBusy, UnknownOrDeletedSession,
    UnknownSession,
};
use crate::config::WhoAnswers;
use crate::gateway::input::SessionId;
use crate::gateway::output::{SessionPage, SessionView, StatusView};
use crate::gateway::{Caller, InitialSettings, NewSession, NewWorkspace, SessionFilter};

/// `POST /sessions` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"cwd": "/home/me/project", "additionalDirectories": ["/home/me/shared"], "mcpServers": [], "mode": "code", "model": "echo-large", "config": {"effort": "high"}}))]
pub struct CreateSession {
    /// Absolute, normalised path of an existing directory: where the agent works. Required,
    /// except with a scratch `workspace` (which is where the agent works); with a worktree
    /// `workspace`, the repository (its top level) the worktree is made of.
    pub cwd: Option<String>,
    /// A workspace the gateway makes for the session, where the agent works: its files are
    /// served under `/sessions/{id}/files`, and what changed in it under `/diff`.
    pub workspace: Option<WorkspaceRequest>,
    /// ACP `McpServer` objects, passed through; default `[]`.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub mcp_servers: Vec<Value>,
    /// Extra workspace roots (absolute).
    #[serde(default)]
    pub additional_directories: Vec<String>,
    /// A mode to set before answering (as `PUT /sessions/{id}/mode`).
    pub mode: Option<String>,
    /// A model to set before answering (as `PUT /sessions/{id}/model`).
    pub model: Option<String>,
    /// Config option values to set before answering, by option id (as
    /// `PUT /sessions/{id}/config/{configId}`), after the mode and the model.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub config: serde_json::Map<String, Value>,
    /// The agent to start it in (`GET /agents`); default: the gateway's default agent.
    pub agent: Option<String>,
    /// Who may answer its permission requests and elicitations (default: the tenant's,
    /// `anyone` unless the config file says).
    pub who_answers: Option<WhoAnswers>,
    /// Passed to `session/new` unchanged (e.g. Claude Code's `_meta.claudeCode.options`).
    #[serde(rename = "_meta")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Value>,
}

/// A workspace for a new session.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"kind": "worktree", "ref": "main"}))]
pub struct WorkspaceRequest {
    pub kind: WorkspaceKind,
    /// For a worktree: the branch, tag or commit it starts from (the repository's `HEAD` by
    /// default).
    #[serde(rename = "ref")]
    pub reference: Option<String>,
}

impl WorkspaceRequest {
    /// A workspace asked for in JSON other than a `POST /sessions` body (`/acp`'s
    /// `session/new` `_meta.workspace`), checked alike.
    pub fn checked(asked: Value) -> Result<NewWorkspace, ApiError> {
        let asked: WorkspaceRequest =
            serde_json::from_value(asked).map_err(|e| ApiError::Validation(e.to_string()))?;
        NewWorkspace::try_from(asked)
    }
}

impl TryFrom<WorkspaceRequest> for NewWorkspace {
    type Error = ApiError;

    fn try_from(w: WorkspaceRequest) -> Result<Self, ApiError> {
        match (w.kind, w.reference) {
            (WorkspaceKind::Scratch, None) => Ok(NewWorkspace::Scratch),
            (WorkspaceKind::Scratch, Some(_)) => Err(ApiError::Validation(
                "a scratch workspace starts empty: \"ref\" is for a worktree".into(),
            )),
            (WorkspaceKind::Worktree, reference) => Ok(NewWorkspace::Worktree { reference }),
        }
    }
}

/// What kind of workspace the gateway makes.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceKind {
    /// An empty folder of the session's own under `--workspace-dir`, removed with the session
    /// (unless `--keep-workspaces`).
    Scratch,
    /// A git worktree of the repository `cwd` names, under `--workspace-dir` on a branch
    /// `acp/<session id>` of the session's own (the repository's own checkout untouched),
    /// removed with its branch when the session is deleted (unless `--keep-workspaces`).
    Worktree,
}

/// `PATCH /sessions/{id}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(example = json!({"title": "Fix the flaky login test"}))]
pub struct PatchSession {
    /// New title; `null` clears it, except on an agent that keeps titles itself
    /// (`session/set_title` advertised), which cannot clear one: then 422. Absent: unchanged.
    #[serde(default, with = "::serde_with::rust::double_option")]
    #[schema(value_type = Option<String>)]
    pub title: Option<Option<String>>,
    /// Who may answer its permission requests and elicitations; only the session's owner (or
    /// an admin) may change it (else 403). Absent: unchanged.
    pub who_answers: Option<WhoAnswers>,
}

/// `GET /sessions` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only sessions with exactly this working directory.
    pub cwd: Option<String>,
    /// `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1–200 (default 50).
    pub limit: Option<i64>,
    /// `true`: only archived sessions; default: only non-archived.
    pub archived: Option<bool>,
    /// `true`: sync the cache with the agent's `session/list` before answering.
    pub refresh: Option<bool>,
    /// Only the sessions of this agent.
    pub agent: Option<String>,
    /// Only the sessions this user created; `me`: the caller (whose key or token names a user).
    pub owner: Option<String>,
}

/// List sessions, newest first.
///
/// List sessions from the cache, newest `updatedAt` first, with keyset pagination. Pages are
/// stable: a session updated while a client pages keeps its first-page position (for an hour),
/// so no session is skipped or repeated. The cache follows the agent's `session/list` (at start,
/// every `--sync-interval`, and before answering with `refresh=true`). Recently read pages are
/// answered from memory until a session changes; `Cache-Control: no-cache` reads the store.
#[utoipa::path(get, operation_id = "listSessions", path = "/sessions", tag = "sessions", params(ListParams),
    responses(
        (status = 200, description = "One page of sessions", body = SessionPage),
        (status = 400, description = "Malformed cursor or limit, or a cursor of another listing", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "cwd is not an absolute, normalised path", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "refresh=true and the agent's session/list failed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "refresh=true and no pool member is ready", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_sessions(
    State(s): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    Query(p): Query<ListParams>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    // `Cache-Control: no-cache` reads the page from the store even if it was read before.
    let fresh = header_lists(&headers, header::CACHE_CONTROL, "no-cache");
    let filter = SessionFilter {
        cwd: p.cwd,
        cursor: p.cursor,
        limit: p.limit,
        archived: p.archived,
        refresh: p.refresh == Some(true),
        agent: p.agent,
        owner: p.owner,
    };
    let body = s
        .gateway
        .sessions()
        .list_sessions(&caller, filter, fresh)
        .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body))
}

/// Create a session on the least-loaded ready pool member (`session/new`).
///
/// `mode`, `model` and `config` are applied before the answer, which carries the session's
/// `state`; one the agent refuses (or does not offer) fails the create and leaves no session.
#[utoipa::path(post, operation_id = "createSession", path = "/sessions", tag = "sessions", request_body = CreateSession,
    responses(
        (status = 201, description = "Created; `Location` names it", body = SessionView),
        (status = 501, description = "A mode, model or config option was asked for and the agent offers none", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The agent failed", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "The agent did not answer in time", body = Problem, content_type = "application/problem+json"),
        InvalidSessionParams, NoReadyMember,
    ))]
pub async fn create_session(
    State(s): State<AppState>,
    caller: Caller,
    Json(body): Json<CreateSession>,
) -> Result<impl IntoResponse, ApiError> {
    let new = NewSession {
        cwd: body.cwd,
        workspace: body.workspace.map(NewWorkspace::try_from).transpose()?,
        additional_directories: body.additional_directories,
        mcp_servers: body.mcp_servers,
        meta: body.meta,
        agent: body.agent,
        who_answers: body.who_answers,
        settings: InitialSettings {
            mode: body.mode,
            model: body.model,
            config: body.config.into_iter().collect(),
        },
    };
    let view = s.gateway.create().create_session(&caller, new).await?;
    let location = format!("/sessions/{}", view.session_id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view),
    ))
}

/// One session from the cache, with its gateway status.
#[utoipa::path(get, operation_id = "getSession", path = "/sessions/{id}", tag = "sessions", params(SessionPath),
    responses(
        (status = 200, description = "The session", body = SessionView),
        UnknownOrDeletedSession,
    ))]
pub async fn get_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(s.gateway.sessions().get_session(&caller, &id).await?))
}

/// Set or clear the title (`session/set_title` when the agent advertises it; cached either way).
#[utoipa::path(patch, operation_id = "updateSession", path = "/sessions/{id}", tag = "sessions", params(SessionPath),
    request_body = PatchSession,
    responses(
        (status = 200, description = "The updated session", body = SessionView),
        (status = 400, description = "Invalid id or JSON", body = Problem, content_type = "application/problem+json"),
        UnknownOrDeletedSession, AgentFailed,
    ))]
pub async fn patch_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Json(body): Json<PatchSession>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(
        s.gateway
            .sessions()
            .patch_session(&caller, &id, body.title, body.who_answers)
            .await?,
    ))
}

/// Delete a session.
///
/// Delete a session: closes it if live, calls `session/delete` when advertised, and removes it
/// from the list at once. Idempotent: an unknown id also answers 204.
#[utoipa::path(delete, operation_id = "deleteSession", path = "/sessions/{id}", tag = "sessions", params(SessionPath),
    responses(
        (status = 204, description = "Deleted (or never existed)"),
        (status = 502, description = "The agent failed to delete it (it is already gone from the list)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<StatusCode, ApiError> {
    s.gateway.sessions().delete_session(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Whether the session is live, saved or unknown. Never loads, resumes or creates anything.
#[utoipa::path(get, operation_id = "getSessionStatus", path = "/sessions/{id}/status", tag = "sessions", params(SessionPath),
    responses(
        (status = 200, description = "The status (`not_found` for unknown ids)", body = StatusView),
    ))]
pub async fn session_status(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<StatusView>, ApiError> {
    Ok(Json(s.gateway.sessions().status(&caller, &id).await?))
}

/// Attach a saved session to a pool member (`session/resume`, else `session/load`).
#[utoipa::path(post, operation_id = "resumeSession", path = "/sessions/{id}/resume", tag = "sessions", params(SessionPath),
    responses(
        (status = 200, description = "The session, now live", body = SessionView),
        (status = 409, description = "A turn is running or it is being resumed", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The agent can neither resume nor load sessions", body = Problem, content_type = "application/problem+json"),
        UnknownSession, AgentFailed, NoReadyMember,
    ))]
pub async fn resume_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(s.gateway.sessions().resume(&caller, &id).await?))
}

/// Free the agent's resources for a live session (`session/close`); it stays listed.
#[utoipa::path(post, operation_id = "closeSession", path = "/sessions/{id}/close", tag = "sessions", params(SessionPath),
    responses(
        (status = 204, description = "Closed (or was not live)"),
        (status = 501, description = "The agent does not support session/close", body = Problem, content_type = "application/problem+json"),
        UnknownSession, AgentFailed,
    ))]
pub async fn close_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<StatusCode, ApiError> {
    s.gateway.sessions().close(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Archive a session.
///
/// Archive a session: it is then listed only with `archived=true` and must be unarchived before
/// it is prompted or resumed. Through `session/archive` when the agent advertises it (which also
/// frees the session on the agent), else in the gateway's cache only.
#[utoipa::path(post, operation_id = "archiveSession", path = "/sessions/{id}/archive", tag = "sessions", params(SessionPath),
    responses(
        (status = 200, description = "The session, archived", body = SessionView),
        UnknownSession, SessionBusy, AgentFailed, NoReadyMember,
    ))]
pub async fn archive_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<SessionView>, ApiError> {
    set_archived(s, caller, id, true).await
}

/// Unarchive a session (`session/unarchive` when the agent advertises archive).
#[utoipa::path(post, operation_id = "unarchiveSession", path = "/sessions/{id}/unarchive", tag = "sessions", params(SessionPath),
    responses(
        (status = 200, description = "The session, not archived", body = SessionView),
        UnknownSession, SessionBusy, AgentFailed, NoReadyMember,
    ))]
pub async fn unarchive_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<SessionView>, ApiError> {
    set_archived(s, caller, id, false).await
}

/// [`archive_session`] and [`unarchive_session`]: one call, which differs only in `archived`.
async fn set_archived(
    s: AppState,
    caller: Caller,
    id: SessionId,
    archived: bool,
) -> Result<Json<SessionView>, ApiError> {
    let sessions = s.gateway.sessions();
    Ok(Json(sessions.set_archived(&caller, &id, archived).await?))
}
