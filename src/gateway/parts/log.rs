//! What the service appends to a session's log and to the lifecycle log, through the event
//! hub: waiting for the commit, or queued at the writer's pace.
//! The logs as stored ([`EventLog`]) are reached here too, for what the service reads of them.

use std::sync::Arc;

use serde_json::{Value, json};

use super::records::Records;
use crate::events::EventHub;
use crate::gateway::clock::now;
use crate::store::{EventLog, NewEvent, NewLifecycleEvent, Payload, SessionRecord};

/// The kinds the gateway itself logs, besides the agent's `sessionUpdate` tags and extension
/// notifications (`_…`): in sessions' logs, then in the lifecycle log.
pub const GATEWAY_KINDS: &[&str] = &[
    "turn_started",
    "turn_ended",
    "permission_requested",
    "permission_resolved",
    "elicitation_requested",
    "elicitation_resolved",
    "elicitation_completed",
    "session_deleted",
    "agent_exited",
    "state_changed",
    "forked",
    "session_created",
    "session_updated",
    "session_status",
    "webhook_disabled",
];

/// The ACP v1 `sessionUpdate` tags an agent sends without a client capability the gateway would
/// have to advertise.
pub const UPDATE_KINDS: &[&str] = &[
    "user_message_chunk",
    "agent_message_chunk",
    "agent_thought_chunk",
    "tool_call",
    "tool_call_update",
    "plan",
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
    "session_info_update",
    "usage_update",
];

/// Whether `kind` names an event of the gateway's own (the logs' and the streams' `state` and
/// `gap`), which an agent's `sessionUpdate` tag may not take.
pub(in crate::gateway) fn gateway_kind(kind: &str) -> bool {
    GATEWAY_KINDS.contains(&kind) || matches!(kind, "state" | "gap")
}

/// The logs, as the service writes them.
#[derive(Clone)]
pub(in crate::gateway) struct Log {
    hub: Arc<EventHub>,
    /// Where an append that touches a session notes it.
    records: Arc<Records>,
    /// The logs as stored, for reads.
    events: Arc<dyn EventLog>,
}

fn event(kind: &str, payload: impl Into<Payload>) -> NewEvent {
    NewEvent {
        kind: kind.to_owned(),
        payload: payload.into(),
    }
}

impl Log {
    pub(in crate::gateway) fn new(
        hub: Arc<EventHub>,
        records: Arc<Records>,
        events: Arc<dyn EventLog>,
    ) -> Self {
        Log {
            hub,
            records,
            events,
        }
    }

    /// The logs as stored: what the service reads of them (appends go through the hub).
    pub(in crate::gateway) fn events(&self) -> &dyn EventLog {
        self.events.as_ref()
    }

    /// Until the guard is dropped, the session's appends are written in `span`'s trace (a
    /// sampled turn's; see [`crate::events::Traced`]).
    pub(in crate::gateway) fn traced_in(&self, session_id: &str, span: &tracing::Span) -> TracedIn {
        self.hub.traced().begin(session_id, span);
        TracedIn {
            hub: self.hub.clone(),
            session_id: session_id.to_owned(),
        }
    }

    /// The hub, for its streams and numbers.
    pub(in crate::gateway) fn hub(&self) -> &EventHub {
        &self.hub
    }

    /// Appends a lifecycle event about `r` (`extra` is merged into its payload).
    pub(in crate::gateway) async fn lifecycle(&self, r: &SessionRecord, kind: &str, extra: Value) {
        let mut payload = json!({"sessionId": r.session_id, "agent": r.agent});
        if let (Value::Object(p), Value::Object(e)) = (&mut payload, extra) {
            p.extend(e);
        }
        let ev = NewLifecycleEvent {
            session_id: r.session_id.clone(),
            tenant: r.tenant.clone(),
            kind: kind.into(),
            payload,
        };
        self.hub.lifecycle(ev).await;
    }

    /// Appends to a session's log and waits for the commit.
    pub(in crate::gateway) async fn append(
        &self,
        session_id: &str,
        kind: &str,
        payload: impl Into<Payload>,
    ) {
        // Errors are logged by the writer.
        let _ = self.hub.append(session_id, event(kind, payload)).await;
    }

    /// Appends without waiting for the store: used on the dispatch loop so that a streaming
    /// agent is read at the writer's pace, not one commit per update. Order is kept.
    pub(in crate::gateway) async fn enqueue(
        &self,
        session_id: &str,
        kind: &str,
        payload: impl Into<Payload>,
    ) {
        self.hub.enqueue(session_id, event(kind, payload)).await;
    }

    /// As [`Log::enqueue`], and the writer commits it without its pause: for the event that
    /// ends a turn, which a client waits to see.
    pub(in crate::gateway) async fn enqueue_now(
        &self,
        session_id: &str,
        kind: &str,
        payload: impl Into<Payload>,
    ) {
        self.hub.enqueue_now(session_id, event(kind, payload)).await;
    }

    /// As [`Log::enqueue`], and the session's `updatedAt` becomes now, in the same commit (a
    /// change of the gateway's own, see [`Records::mark_touched`]).
    pub(in crate::gateway) async fn enqueue_touching(
        &self,
        session_id: &str,
        kind: &str,
        payload: impl Into<Payload>,
    ) {
        self.records.mark_touched(session_id);
        let event = event(kind, payload);
        self.hub.enqueue_touching(session_id, event, now()).await;
    }

    /// Waits until everything appended so far is stored.
    pub(in crate::gateway) async fn flush(&self) {
        self.hub.flush().await;
    }
}

/// Ends [`Log::traced_in`] when dropped: when the turn has queued its `turn_ended`, or when it
/// never ran (its request was dropped first).
pub(in crate::gateway) struct TracedIn {
    hub: Arc<EventHub>,
    session_id: String,
}

impl Drop for TracedIn {
    fn drop(&mut self) {
        self.hub.traced().end(&self.session_id);
    }
}
