//! The sessions' states as the service keeps them: folded from each log up to a position and
//! stored as a snapshot there, refreshed after a turn that changed them, and what the gateway
//! learns outside the agent's updates (a `session/new` result, a setter's answer) logged as a
//! `state_changed` event.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio_util::task::TaskTracker;

use super::log::Log;
use crate::gateway::error::Error;
use crate::gateway::event::{GatewayEvent, StateChanged};
use crate::gateway::state::{SessionState, StateAt};
use crate::store::{EventKind, StateSnapshots};

/// The sessions' states: folded from their logs, snapshots stored, what the gateway learns
/// outside updates logged.
pub(in crate::gateway) struct States {
    log: Log,
    /// Where the snapshots are kept.
    snapshots: Arc<dyn StateSnapshots>,
    /// Sessions whose log got a state event since their state snapshot was last stored here
    /// (see [`States::refresh_after_turn`]).
    dirty: Mutex<HashSet<String>>,
    /// The snapshot refreshes.
    tasks: TaskTracker,
}

impl States {
    pub(in crate::gateway) fn new(
        log: Log,
        snapshots: Arc<dyn StateSnapshots>,
        tasks: TaskTracker,
    ) -> Self {
        States {
            log,
            snapshots,
            dirty: Mutex::default(),
            tasks,
        }
    }

    /// Notes that a state event was logged for `session_id` (see [`States::refresh_after_turn`]).
    pub(in crate::gateway) fn state_changed_in_turn(&self, session_id: &str) {
        let mut dirty = self.dirty.lock().expect("state_dirty lock");
        if !dirty.contains(session_id) {
            dirty.insert(session_id.to_owned());
        }
    }

    /// After a turn that logged state events (the agent's updates, a prompt's `usage`): the
    /// snapshot is moved to the log's end in the background, so that a read folds little and
    /// retention, which prunes old events, finds what they made in the snapshot (a prune
    /// within the moment between the turn's commit and this one could still miss them).
    pub(in crate::gateway) fn refresh_after_turn(self: &Arc<Self>, session_id: &str, usage: bool) {
        let dirty = self
            .dirty
            .lock()
            .expect("state_dirty lock")
            .remove(session_id);
        if !dirty && !usage {
            return;
        }
        let (this, id) = (self.clone(), session_id.to_owned());
        self.tasks.spawn(async move {
            this.log.flush().await;
            if let Err(e) = this.state_of(&id).await {
                tracing::warn!(session = id, error = %e, "cannot store the state snapshot");
            }
        });
    }

    /// Logs what an agent's answer (to `session/new`, load, resume, fork, or a setter) says of
    /// the state — its `modes`, `models` and `configOptions` — as a `state_changed` event, when
    /// that changes the state. `extra` goes into the event as is (what a setter set).
    pub(in crate::gateway) async fn note_state(
        &self,
        session_id: &str,
        source: &str,
        result: &Value,
    ) -> Result<(), Error> {
        self.note_change(session_id, source, result, StateChanged::default())
            .await
    }

    pub(in crate::gateway) async fn note_change(
        &self,
        session_id: &str,
        source: &str,
        result: &Value,
        mut change: StateChanged,
    ) -> Result<(), Error> {
        let given = |key| result.get(key).filter(|v: &&Value| !v.is_null()).cloned();
        change.modes = given("modes").or(change.modes);
        change.models = given("models").or(change.models);
        change.config_options = given("configOptions").or(change.config_options);
        let says = [
            &change.modes,
            &change.models,
            &change.config_options,
            &change.value,
        ];
        if says.iter().all(|part| part.is_none()) && change.config_id.is_none() {
            return Ok(());
        }
        change.session_id = session_id.to_owned();
        change.source = source.to_owned();
        let change = GatewayEvent::StateChanged(change);
        self.log.flush().await;
        let now = self.state_of(session_id).await?.state;
        let mut next = now.clone();
        next.apply(change.kind(), &change.to_value());
        if next != now {
            self.log.append(session_id, change).await;
        }
        Ok(())
    }

    /// The state folded to the log's end: the stored snapshot, then the state events after it
    /// (the snapshot moves forward when there were any).
    pub(in crate::gateway) async fn state_of(&self, session_id: &str) -> Result<StateAt, Error> {
        let store = self.log.events();
        // The position first: every event up to it is committed, so the fold is exact there.
        let last = store.last_event_seq(session_id).await?;
        let (from, mut state) = match self.snapshots.session_state(session_id).await? {
            Some((seq, value)) => (seq, serde_json::from_value(value).unwrap_or_default()),
            None => (0, SessionState::default()),
        };
        if last <= from {
            return Ok(StateAt { seq: from, state });
        }
        let kinds = EventKind::names(EventKind::STATE);
        let events = store
            .read_events_of_kinds(session_id, (from, last), &kinds)
            .await?;
        for e in &events {
            if let Some(kind) = EventKind::parse(&e.kind) {
                state.apply(kind, &e.payload.to_value());
            }
        }
        if !events.is_empty() {
            let value = serde_json::to_value(&state).expect("a state serialises");
            if let Err(e) = self
                .snapshots
                .put_session_state(session_id, last, &value)
                .await
            {
                tracing::warn!(session = session_id, error = %e, "cannot store the state snapshot");
            }
        }
        Ok(StateAt { seq: last, state })
    }
}
