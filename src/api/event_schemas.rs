//! The schemas of the events' `data`, for the OpenAPI document: one per kind of event the
//! gateway writes (`event_unions.rs` puts them together by `event`). These types only describe
//! what the gateway writes (as JSON built where each event happens); a test reads real streams
//! and checks every payload against them.
#![allow(dead_code)] // described, never constructed

use serde_json::Value;
use utoipa::ToSchema;

use super::error::Problem;
use crate::gateway::output::{SessionView, Status};

/// `state_changed`: what an agent's answer said of the session's state (to `session/new`,
/// load, resume, fork or a setter), logged when it changed the state.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateChanged {
    session_id: String,
    /// The ACP method answered: `session/new`, `session/set_mode`, ….
    source: String,
    /// Merged into the known `modes` (a setter names only `currentModeId`).
    #[schema(value_type = Option<Object>)]
    modes: Option<Value>,
    /// Merged into the known `models`.
    #[schema(value_type = Option<Object>)]
    models: Option<Value>,
    /// The whole option list, replacing the known one.
    #[schema(value_type = Option<Vec<Object>>)]
    config_options: Option<Value>,
    /// For `session/set_config_option`: the option set and its value.
    config_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    value: Option<Value>,
}

/// `forked`: the first event of a fork, naming its parent and the parent's log position at
/// the fork (the history before it is the parent's).
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    session_id: String,
    parent_session_id: String,
    parent_seq: i64,
}

/// `state` (only first in a `?snapshot=true` stream): the session's state at `seq`, which is
/// also the event's `id`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateSnapshot {
    session_id: String,
    seq: i64,
    state: crate::gateway::SessionState,
}

/// Any ACP `sessionUpdate` tag: the agent's `session/update` params as sent, including
/// variants the gateway does not know.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionUpdateData {
    session_id: String,
    /// The ACP `SessionUpdate`, tagged by `sessionUpdate`.
    #[schema(value_type = Object)]
    update: Value,
    /// `true` when replayed by `session/load` into an empty log.
    replay: Option<bool>,
    #[serde(rename = "_meta")]
    #[schema(value_type = Option<Object>)]
    meta: Option<Value>,
}

/// `turn_started`: a prompt was sent to the agent.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnStarted {
    session_id: String,
    /// The ACP `ContentBlock[]` sent.
    #[schema(value_type = Vec<Object>)]
    prompt: Vec<Value>,
}

/// `turn_ended`: the agent answered `session/prompt` (`stopReason`) or the turn failed
/// (`error`).
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnEnded {
    session_id: String,
    /// `end_turn`, `max_tokens`, `max_turn_requests`, `refusal` or `cancelled`.
    stop_reason: Option<String>,
    error: Option<Problem>,
    /// The prompt result's token `usage`, when the agent gave one.
    #[schema(value_type = Option<Object>)]
    usage: Option<Value>,
    /// The prompt result's `_meta`, when the agent gave one.
    #[serde(rename = "_meta")]
    #[schema(value_type = Option<Object>)]
    meta: Option<Value>,
}

/// `permission_requested`: the agent asks before a tool call; answer it with
/// `POST /sessions/{id}/permissions/{requestId}`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionRequested {
    session_id: String,
    request_id: String,
    /// The ACP `session/request_permission` params (`toolCall`, `options`).
    #[schema(value_type = Object)]
    request: Value,
    /// When it is refused for the client unless answered before (`--permission-timeout`).
    deadline: Option<chrono::DateTime<chrono::Utc>>,
}

/// `permission_resolved`: how a permission request ended.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionResolved {
    session_id: String,
    request_id: String,
    /// The ACP outcome: `{outcome: "selected", optionId}` or `{outcome: "cancelled"}`.
    #[schema(value_type = Object)]
    outcome: Value,
    /// `answered`, `cancelled`, `timeout` or `policy`.
    reason: String,
}

/// `elicitation_requested`: the agent asks the user for structured input (`elicitation/create`:
/// a form, or a URL to visit); answer it with `POST /sessions/{id}/elicitations/{requestId}`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationRequested {
    session_id: String,
    request_id: String,
    /// The ACP `elicitation/create` params (`mode`, `message`, `toolCallId`; `requestedSchema` in
    /// form mode, `elicitationId` and `url` in URL mode).
    #[schema(value_type = Object)]
    request: Value,
    /// When it is declined unanswered (`--permission-timeout`); absent: never.
    deadline: Option<String>,
}

/// `elicitation_resolved`: how an elicitation ended.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationResolved {
    session_id: String,
    request_id: String,
    /// The ACP action sent to the agent: `accept`, `decline` or `cancel`.
    action: String,
    /// With `accept`: the content sent to the agent.
    #[schema(value_type = Option<Object>)]
    content: Option<Value>,
    /// `answered`, `cancelled`, `timeout` or `policy`.
    reason: String,
}

/// `elicitation_completed`: the agent says the interaction a URL elicitation sent the user to
/// is over (`elicitation/complete`).
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationCompleted {
    session_id: String,
    /// The gateway's id of the elicitation.
    request_id: String,
    /// The agent's `elicitationId`.
    elicitation_id: String,
}

/// `session_deleted`: the session was deleted (through the gateway, or it vanished from the
/// agent's list: reason `vanished_upstream`). The stream ends after it.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionDeleted {
    session_id: String,
    /// The agent the session lived in (in `GET /events`).
    agent: Option<String>,
    reason: Option<String>,
}

/// `agent_exited`: the agent process holding the session exited; the session is `saved`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentExited {
    session_id: String,
    /// The pool member that held it; `null` when the gateway replica holding it died (its
    /// heartbeat lease expired).
    member: Option<u32>,
    /// Exit code, when it exited normally.
    code: Option<i32>,
    /// Signal number, when it was killed by one.
    signal: Option<i32>,
}

/// `gap`: events `from`–`to` were removed by retention before this client read them; its `id`
/// is `to`, so resuming from it continues with the first event kept.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gap {
    session_id: String,
    from: i64,
    to: i64,
}

/// `webhook_disabled`: a subscription's delivery (of this session's event) failed for
/// `--webhook-max-age`, and the subscription was disabled.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDisabled {
    session_id: String,
    webhook_id: String,
    reason: String,
}

/// `session_created`, `session_updated`: the session as `GET /sessions/{id}` shows it.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleSession {
    session_id: String,
    /// The agent the session lives in.
    agent: String,
    session: SessionView,
}

/// `session_status`: the session became `live` or `saved` (reason `idle` when the idle
/// timeout closed it).
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleStatus {
    session_id: String,
    /// The agent the session lives in.
    agent: String,
    status: Status,
    reason: Option<String>,
}
