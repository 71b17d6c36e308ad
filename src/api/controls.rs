//! Session controls and forks: `PUT /sessions/{id}/mode`, `/model`, `/config/{configId}` and
//! `POST /sessions/{id}/fork`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::{AppState, Json, Path, SessionPath};
use super::responses::{
    AgentFailed, AgentRefused, ArchivedSession, InvalidSessionParams, UnknownOrDeletedSession,
};
use crate::gateway::input::SessionId;
use crate::gateway::output::SessionView;
use crate::gateway::{Caller, Fork, StateAt};

/// `PUT /sessions/{id}/mode` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"modeId": "code"}))]
pub struct SetMode {
    /// One of the session's `availableModes` (or the values of its `mode` option).
    pub mode_id: String,
}

/// `PUT /sessions/{id}/model` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"modelId": "echo-large"}))]
pub struct SetModel {
    /// One of the session's `availableModels` (or the values of its `model` option).
    pub model_id: String,
}

/// `PUT /sessions/{id}/config/{configId}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"value": "high"}))]
pub struct SetConfig {
    #[schema(schema_with = string_or_boolean)]
    pub value: Value,
}

/// `SetConfig.value`'s schema.
fn string_or_boolean() -> utoipa::openapi::Object {
    use utoipa::openapi::{ObjectBuilder, Type, schema::SchemaType};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Boolean]))
        .description(Some(
            "A `select` option's value id, or a `boolean` option's `true`/`false`.",
        ))
        .build()
}

/// `POST /sessions/{id}/fork` body (all optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"cwd": "/home/me/project"}))]
pub struct ForkSession {
    /// Where the fork works; default: the parent's `cwd`.
    pub cwd: Option<String>,
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub mcp_servers: Vec<Value>,
    #[serde(default)]
    pub additional_directories: Vec<String>,
    /// Passed to `session/fork` unchanged.
    #[serde(rename = "_meta")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Value>,
}

/// Set the session's mode.
///
/// Through the agent's config option of category `mode` when it offers one, else
/// `session/set_mode`; a saved session is resumed first. Answers the new state.
#[utoipa::path(put, operation_id = "setSessionMode", path = "/sessions/{id}/mode", tag = "sessions", request_body = SetMode,
    params(SessionPath),
    responses(
        (status = 200, description = "The session's state after the change", body = StateAt),
        (status = 422, description = "A mode the agent does not offer (or a malformed body)", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The agent offers no modes", body = Problem, content_type = "application/problem+json"),
        UnknownOrDeletedSession, AgentRefused, ArchivedSession,
    ))]
pub async fn set_mode(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Json(body): Json<SetMode>,
) -> Result<Json<StateAt>, ApiError> {
    Ok(Json(
        s.gateway
            .controls()
            .set_mode(&caller, &id, &body.mode_id)
            .await?,
    ))
}

/// Set the session's model.
///
/// Through the agent's config option of category `model` when it offers one, else
/// `session/set_model` where the agent offered `models`. Answers the new state.
#[utoipa::path(put, operation_id = "setSessionModel", path = "/sessions/{id}/model", tag = "sessions", request_body = SetModel,
    params(SessionPath),
    responses(
        (status = 200, description = "The session's state after the change", body = StateAt),
        (status = 422, description = "A model the agent does not offer (or a malformed body)", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The agent offers no models", body = Problem, content_type = "application/problem+json"),
        UnknownOrDeletedSession, AgentRefused, ArchivedSession,
    ))]
pub async fn set_model(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Json(body): Json<SetModel>,
) -> Result<Json<StateAt>, ApiError> {
    Ok(Json(
        s.gateway
            .controls()
            .set_model(&caller, &id, &body.model_id)
            .await?,
    ))
}

/// Set one of the session's config options (`session/set_config_option`).
///
/// Any option the agent offers, categories the gateway does not know included. Answers the
/// new state, with the whole option list as the agent returned it.
#[utoipa::path(put, operation_id = "setSessionConfigOption", path = "/sessions/{id}/config/{configId}", tag = "sessions", request_body = SetConfig,
    params(("id" = String, Path, description = "Session id"), ("configId" = String, Path, description = "The option's id")),
    responses(
        (status = 200, description = "The session's state after the change", body = StateAt),
        (status = 422, description = "An unknown option, or a value it does not take", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The agent offers no config options", body = Problem, content_type = "application/problem+json"),
        UnknownOrDeletedSession, AgentRefused, ArchivedSession,
    ))]
pub async fn set_config(
    State(s): State<AppState>,
    caller: Caller,
    Path((id, config_id)): Path<(SessionId, String)>,
    Json(body): Json<SetConfig>,
) -> Result<Json<StateAt>, ApiError> {
    let state = s
        .gateway
        .controls()
        .set_config(&caller, &id, &config_id, &body.value)
        .await?;
    Ok(Json(state))
}

/// Fork a session (`session/fork`).
///
/// A new session with the parent's conversation, on the agent's side. Its log starts with a
/// `forked` event naming the parent and the parent's log position (`parentSessionId`,
/// `parentSeq`): the history before it is the parent's, read from the parent's log.
#[utoipa::path(post, operation_id = "forkSession", path = "/sessions/{id}/fork", tag = "sessions", request_body = ForkSession,
    params(("id" = String, Path, description = "The session to fork")),
    responses(
        (status = 201, description = "The fork; `Location` names it", body = SessionView),
        (status = 501, description = "The agent does not advertise fork", body = Problem, content_type = "application/problem+json"),
        UnknownOrDeletedSession, InvalidSessionParams, AgentFailed,
    ))]
pub async fn fork_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Json(body): Json<ForkSession>,
) -> Result<impl IntoResponse, ApiError> {
    let fork = Fork {
        cwd: body.cwd,
        additional_directories: body.additional_directories,
        mcp_servers: body.mcp_servers,
        meta: body.meta,
    };
    let view = s.gateway.create().fork_session(&caller, &id, fork).await?;
    let location = format!("/sessions/{}", view.session_id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view),
    ))
}
