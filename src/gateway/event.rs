//! The gateway's own events, typed: [`GatewayEvent`], what it logs in a session's log (and what
//! only a session's stream sends: `state`, `gap`), and [`GatewayLifecycleEvent`], what it logs in
//! the lifecycle log. Each variant is named after its [`EventKind`] and carries its `data`, a
//! struct that is both what the gateway writes (its JSON is the event's payload) and, for the
//! OpenAPI document, the schema of that `data` (`event_schema.rs` puts the variants together by
//! kind). The agent's updates are not here: they are logged as the agent sent them.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::{RefOr, Schema};

use super::caller::Author;
use super::output::{QueuedView, SessionView, Status, WatcherView};
use super::problem::Problem;
use super::state::SessionState;
use crate::store::{EventKind, NewLifecycleEvent, Payload, SessionRecord};
use crate::workspace::changes::Checkpoint;

/// Schemas by name, as [`ToSchema::schemas`] collects them.
pub type Schemas = Vec<(String, RefOr<Schema>)>;

/// One kind of event as the document lists it: its kind and the schema of its `data`.
#[derive(Clone, Copy)]
pub struct Variant {
    pub kind: EventKind,
    /// The name of the `data` schema.
    pub data: fn() -> Cow<'static, str>,
    /// Adds the `data` schema and the schemas it refers to.
    pub register: fn(&mut Schemas),
}

impl Variant {
    /// Kind `kind`, whose `data` is a `T`.
    pub const fn of<T: ToSchema>(kind: EventKind) -> Self {
        Variant {
            kind,
            data: T::name,
            register: register::<T>,
        }
    }
}

fn register<T: ToSchema>(out: &mut Schemas) {
    out.push((T::name().into_owned(), T::schema()));
    T::schemas(out);
}

/// `events! { Enum { Variant(Data), … } }` declares an enum of events whose variants are named
/// after their [`EventKind`], with its `kind`, its payload and its [`Variant`]s in that order.
macro_rules! events {
    ($(#[$doc:meta])* $name:ident { $( $variant:ident($data:ty), )* }) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {
            $( $variant($data), )*
        }

        impl $name {
            /// Every kind of it, in the order the document lists them.
            pub const VARIANTS: &'static [Variant] = &[$( Variant::of::<$data>(EventKind::$variant), )*];

            pub fn kind(&self) -> EventKind {
                match self {
                    $( $name::$variant(_) => EventKind::$variant, )*
                }
            }

            /// Its `data` as a JSON value.
            pub fn to_value(&self) -> Value {
                match self {
                    $( $name::$variant(data) => serde_json::to_value(data), )*
                }
                .expect("an event serialises")
            }
        }
    };
}

events! {
    /// An event of the gateway's in a session's log or stream.
    GatewayEvent {
        TurnStarted(TurnStarted),
        TurnEnded(TurnEnded),
        PermissionRequested(PermissionRequested),
        PermissionResolved(PermissionResolved),
        ElicitationRequested(ElicitationRequested),
        ElicitationResolved(ElicitationResolved),
        ElicitationCompleted(ElicitationCompleted),
        SessionDeleted(SessionDeleted),
        AgentExited(AgentExited),
        StateChanged(StateChanged),
        Forked(Forked),
        WorkspaceChanged(WorkspaceChanged),
        PromptQueued(PromptQueued),
        PromptWithdrawn(PromptWithdrawn),
        Gap(Gap),
        State(StateSnapshot),
    }
}

events! {
    /// An event of the lifecycle log (`GET /events`).
    GatewayLifecycleEvent {
        SessionCreated(LifecycleSession),
        SessionUpdated(LifecycleSession),
        SessionStatus(LifecycleStatus),
        SessionDeleted(SessionDeleted),
        WebhookDisabled(WebhookDisabled),
        WatchersChanged(WatchersChanged),
        UsageBudget(UsageBudget),
    }
}

/// The payload as stored and sent: the text of its value, written as a value of `json!` was
/// (the same text, key for key).
impl From<&GatewayEvent> for Payload {
    fn from(event: &GatewayEvent) -> Self {
        Payload::from_value(&event.to_value())
    }
}

impl GatewayLifecycleEvent {
    /// `session_created`: `r` was made (or found in the agent's list), shown as `session`.
    pub fn created(r: &SessionRecord, session: SessionView) -> Self {
        Self::SessionCreated(LifecycleSession::new(r, session))
    }

    /// `session_updated`: `r` changed, shown as `session`.
    pub fn updated(r: &SessionRecord, session: SessionView) -> Self {
        Self::SessionUpdated(LifecycleSession::new(r, session))
    }

    /// `session_status`: `r` became `status`.
    pub fn status(r: &SessionRecord, status: Status, reason: Option<&str>) -> Self {
        Self::SessionStatus(LifecycleStatus {
            session_id: r.session_id.clone(),
            agent: r.agent.clone(),
            status,
            reason: reason.map(str::to_owned),
        })
    }

    /// `session_deleted`: `r` was deleted.
    pub fn deleted(r: &SessionRecord, reason: Option<&str>) -> Self {
        Self::SessionDeleted(SessionDeleted {
            session_id: r.session_id.clone(),
            agent: Some(r.agent.clone()),
            reason: reason.map(str::to_owned),
        })
    }

    /// The event to append for the session of `tenant` it is about.
    pub fn stored(&self, tenant: &str) -> NewLifecycleEvent {
        let session_id = match self {
            Self::SessionCreated(e) | Self::SessionUpdated(e) => &e.session_id,
            Self::SessionStatus(e) => &e.session_id,
            Self::SessionDeleted(e) => &e.session_id,
            Self::WebhookDisabled(e) => &e.session_id,
            Self::WatchersChanged(e) => &e.session_id,
            Self::UsageBudget(e) => &e.session_id,
        };
        NewLifecycleEvent {
            session_id: session_id.clone(),
            tenant: tenant.to_owned(),
            kind: self.kind().name().into(),
            payload: self.to_value(),
        }
    }
}

/// `state_changed`: what an agent's answer said of the session's state (to `session/new`,
/// load, resume, fork or a setter), logged when it changed the state.
#[serde_with::skip_serializing_none]
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateChanged {
    pub session_id: String,
    /// The ACP method answered: `session/new`, `session/set_mode`, ….
    pub source: String,
    /// Merged into the known `modes` (a setter names only `currentModeId`).
    #[schema(value_type = Option<Object>)]
    pub modes: Option<Value>,
    /// Merged into the known `models`.
    #[schema(value_type = Option<Object>)]
    pub models: Option<Value>,
    /// The whole option list, replacing the known one.
    #[schema(value_type = Option<Vec<Object>>)]
    pub config_options: Option<Value>,
    /// For `session/set_config_option`: the option set and its value.
    pub config_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub value: Option<Value>,
}

/// `forked`: the first event of a fork, naming its parent and the parent's log position at
/// the fork (the history before it is the parent's).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    pub session_id: String,
    pub parent_session_id: String,
    pub parent_seq: i64,
}

/// `workspace_changed`: a turn (or a revert) changed the files of the session's workspace;
/// `checkpoint` keeps them as they are now, `GET /sessions/{id}/diff?checkpoint=` shows how.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceChanged {
    pub session_id: String,
    pub checkpoint: Checkpoint,
    /// The paths that changed (after a rename, the new one).
    pub paths: Vec<String>,
}

/// `state` (only first in a `?snapshot=true` stream): the session's state at `seq`, which is
/// also the event's `id`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateSnapshot {
    pub session_id: String,
    pub seq: i64,
    // Boxed: the largest of the events by far, and the rarest.
    pub state: Box<SessionState>,
}

/// Any ACP `sessionUpdate` tag: the agent's `session/update` params as sent, including
/// variants the gateway does not know.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionUpdateData {
    pub session_id: String,
    /// The ACP `SessionUpdate`, tagged by `sessionUpdate`.
    #[schema(value_type = Object)]
    pub update: Value,
    /// `true` when replayed by `session/load` into an empty log.
    pub replay: Option<bool>,
    #[serde(rename = "_meta")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Value>,
}

/// `turn_started`: a prompt was sent to the agent.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnStarted {
    pub session_id: String,
    /// The ACP `ContentBlock[]` sent.
    #[schema(value_type = Vec<Object>)]
    pub prompt: Vec<Value>,
    /// Who sent it (absent in turns logged by gateways that did not record authors).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<Author>,
    /// The queued prompt it runs (`Prefer: queue` or `interrupt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_id: Option<String>,
}

/// `watchers_changed` (lifecycle): someone opened their first stream of the session, or ended
/// their last; everyone watching it now.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchersChanged {
    pub session_id: String,
    pub watchers: Vec<WatcherView>,
}

/// `prompt_queued`: a prompt joined the session's queue (`Prefer: queue` or `interrupt`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptQueued {
    pub session_id: String,
    #[serde(flatten)]
    pub queued: QueuedView,
}

/// `prompt_withdrawn`: a queued prompt left the queue before its turn: withdrawn by someone
/// (`by`), or by the gateway because its turn could not start (`reason` says why).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptWithdrawn {
    pub session_id: String,
    pub queue_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<Author>,
    /// `withdrawn`, or why its turn could not start.
    pub reason: String,
}

/// `turn_ended`: the agent answered `session/prompt` (`stopReason`) or the turn failed
/// (`error`).
#[derive(Debug, Default, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnEnded {
    pub session_id: String,
    /// `end_turn`, `max_tokens`, `max_turn_requests`, `refusal` or `cancelled`.
    // The answer's value as it came (`null` when it had none); absent when the turn failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub stop_reason: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
    /// The prompt result's token `usage`, when the agent gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
    /// The prompt result's `_meta`, when the agent gave one.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Value>,
}

/// `permission_requested`: the agent asks before a tool call; answer it with
/// `POST /sessions/{id}/permissions/{requestId}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionRequested {
    pub session_id: String,
    pub request_id: String,
    /// The ACP `session/request_permission` params (`toolCall`, `options`).
    #[schema(value_type = Object)]
    pub request: Value,
    /// When it is refused for the client unless answered before (`--permission-timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
}

/// `permission_resolved`: how a permission request ended.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionResolved {
    pub session_id: String,
    pub request_id: String,
    /// The ACP outcome: `{outcome: "selected", optionId}` or `{outcome: "cancelled"}`.
    #[schema(value_type = Object)]
    pub outcome: Value,
    /// `answered`, `cancelled`, `timeout`, `policy`, or `withdrawn` (the agent cancelled its
    /// request with `$/cancel_request`).
    pub reason: String,
    /// Who answered (`reason` `answered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<Author>,
}

/// `elicitation_requested`: the agent asks the user for structured input (`elicitation/create`:
/// a form, or a URL to visit); answer it with `POST /sessions/{id}/elicitations/{requestId}`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationRequested {
    pub session_id: String,
    pub request_id: String,
    /// The ACP `elicitation/create` params (`mode`, `message`, `toolCallId`; `requestedSchema` in
    /// form mode, `elicitationId` and `url` in URL mode).
    #[schema(value_type = Object)]
    pub request: Value,
    /// When it is declined unanswered (`--permission-timeout`); absent: never.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub deadline: Option<DateTime<Utc>>,
}

/// `elicitation_resolved`: how an elicitation ended.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationResolved {
    pub session_id: String,
    pub request_id: String,
    /// The ACP action sent to the agent: `accept`, `decline` or `cancel`.
    #[schema(value_type = String)]
    pub action: Value,
    /// With `accept`: the content sent to the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub content: Option<Value>,
    /// `answered`, `cancelled`, `timeout`, `policy`, or `withdrawn` (the agent cancelled its
    /// request with `$/cancel_request`).
    pub reason: String,
    /// Who answered (`reason` `answered`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<Author>,
}

/// `elicitation_completed`: the agent says the interaction a URL elicitation sent the user to
/// is over (`elicitation/complete`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ElicitationCompleted {
    pub session_id: String,
    /// The gateway's id of the elicitation.
    pub request_id: String,
    /// The agent's `elicitationId`.
    pub elicitation_id: String,
}

/// `session_deleted`: the session was deleted (through the gateway, or it vanished from the
/// agent's list: reason `vanished_upstream`). The stream ends after it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionDeleted {
    pub session_id: String,
    /// The agent the session lived in (in `GET /events`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `agent_exited`: the agent process holding the session exited; the session is `saved`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentExited {
    pub session_id: String,
    /// The pool member that held it; `null` when the gateway replica holding it died (its
    /// heartbeat lease expired).
    pub member: Option<u32>,
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when it was killed by one.
    pub signal: Option<i32>,
}

/// `gap`: events `from`–`to` were removed by retention before this client read them; its `id`
/// is `to`, so resuming from it continues with the first event kept.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gap {
    pub session_id: String,
    pub from: i64,
    pub to: i64,
}

/// `webhook_disabled`: a subscription's delivery (of this session's event) failed for
/// `--webhook-max-age`, and the subscription was disabled.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDisabled {
    pub session_id: String,
    pub webhook_id: String,
    pub reason: String,
}

/// `usage_budget`: a tenant's spend of the day (UTC) passed 80 % or 100 % of one of its daily
/// budgets, with the turn of `sessionId`; sent once per tenant, day, budget and threshold.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageBudget {
    pub session_id: String,
    pub tenant: String,
    /// `tokens-per-day` or `cost-per-day`.
    pub budget: String,
    /// The currency of a cost budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    pub limit: f64,
    /// What the tenant has spent today.
    pub spent: f64,
    /// 80 or 100.
    pub percent: u8,
    /// `YYYY-MM-DD`.
    pub day: String,
}

/// `session_created`, `session_updated`: the session as `GET /sessions/{id}` shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleSession {
    pub session_id: String,
    /// The agent the session lives in.
    pub agent: String,
    pub session: SessionView,
}

impl LifecycleSession {
    fn new(r: &SessionRecord, session: SessionView) -> Self {
        LifecycleSession {
            session_id: r.session_id.clone(),
            agent: r.agent.clone(),
            session,
        }
    }
}

/// `session_status`: the session became `live` or `saved` (reason `idle` when the idle
/// timeout closed it).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleStatus {
    pub session_id: String,
    /// The agent the session lives in.
    pub agent: String,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
