//! What the service appends to a session's log and to the lifecycle log, through the event
//! hub: waiting for the commit, or queued at the writer's pace.
//! The logs as stored ([`EventLog`]) are reached here too, for what the service reads of them.

use std::sync::Arc;

use super::records::Records;
use crate::events::EventHub;
use crate::gateway::clock::now;
use crate::gateway::event::{GatewayEvent, GatewayLifecycleEvent};
use crate::store::{EventLog, NewEvent, Payload, SessionRecord};

/// The logs, as the service writes them.
#[derive(Clone)]
pub(in crate::gateway) struct Log {
    hub: Arc<EventHub>,
    /// Where an append that touches a session notes it.
    records: Arc<Records>,
    /// The logs as stored, for reads.
    events: Arc<dyn EventLog>,
}

/// What the hub appends for `event`: its kind's name and its payload, encoded here once.
fn event(event: &GatewayEvent) -> NewEvent {
    NewEvent {
        kind: event.kind().name().to_owned(),
        payload: event.into(),
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

    /// Appends a lifecycle event about `r`.
    pub(in crate::gateway) async fn lifecycle(
        &self,
        r: &SessionRecord,
        event: GatewayLifecycleEvent,
    ) {
        self.hub.lifecycle(event.stored(&r.tenant)).await;
    }

    /// Appends a lifecycle event about a session of `tenant`.
    pub(in crate::gateway) async fn lifecycle_of(
        &self,
        tenant: &str,
        event: GatewayLifecycleEvent,
    ) {
        self.hub.lifecycle(event.stored(tenant)).await;
    }

    /// Appends to a session's log and waits for the commit.
    pub(in crate::gateway) async fn append(&self, session_id: &str, e: GatewayEvent) {
        // Errors are logged by the writer.
        let _ = self.hub.append(session_id, event(&e)).await;
    }

    /// Appends without waiting for the store: used on the dispatch loop so that a streaming
    /// agent is read at the writer's pace, not one commit per update. Order is kept.
    pub(in crate::gateway) async fn enqueue(&self, session_id: &str, e: GatewayEvent) {
        self.hub.enqueue(session_id, event(&e)).await;
    }

    /// As [`Log::enqueue`], an event the agent sent, of its kind (a `sessionUpdate` tag or an
    /// extension notification's method, which the gateway may not know) and as it came.
    pub(in crate::gateway) async fn enqueue_agents(
        &self,
        session_id: &str,
        kind: &str,
        payload: Payload,
    ) {
        let event = NewEvent {
            kind: kind.to_owned(),
            payload,
        };
        self.hub.enqueue(session_id, event).await;
    }

    /// As [`Log::enqueue`], and the writer commits it without its pause: for the event that
    /// ends a turn, which a client waits to see.
    pub(in crate::gateway) async fn enqueue_now(&self, session_id: &str, e: GatewayEvent) {
        self.hub.enqueue_now(session_id, event(&e)).await;
    }

    /// As [`Log::enqueue`], for the event that opens a turn: the session's `updatedAt` becomes
    /// now, in the same commit (a change of the gateway's own, see [`Records::mark_touched`]),
    /// and the commit waits briefly for the turn's first answer
    /// ([`EventHub::enqueue_opening`](crate::events::EventHub::enqueue_opening)).
    pub(in crate::gateway) async fn enqueue_opening(&self, session_id: &str, e: GatewayEvent) {
        self.records.mark_touched(session_id);
        self.hub.enqueue_opening(session_id, event(&e), now()).await;
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
