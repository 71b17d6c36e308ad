//! Who follows the hub live: per session a broadcast channel of its committed runs, made when
//! the session gets its first subscriber and forgotten when it has none, and one broadcast
//! channel of the lifecycle events. A subscriber that falls behind a channel's buffer reads the
//! log instead (`stream.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use super::run::{Run, lifecycle_wake};
use crate::store::StoredLifecycleEvent;

/// Lifecycle events kept in the live broadcast buffer before a subscriber is considered behind
/// (and reads the log instead).
const LIFECYCLE_BUFFER: usize = 1024;
/// Runs (each one commit's events of a session) kept in a followed session's broadcast buffer
/// before a subscriber is considered behind (and reads the log instead). A buffer's slots are
/// allocated when the session gets its first subscriber: this is most of what a subscriber
/// costs in memory (`bench/memory.sh`).
const SESSION_BUFFER: usize = 128;

/// The live broadcast channels: one per followed session, one of the lifecycle events. The
/// only owner of their lock, which no `.await` is held across.
pub(super) struct Followers {
    sessions: Mutex<HashMap<String, broadcast::Sender<Arc<Run>>>>,
    lifecycle: broadcast::Sender<Arc<StoredLifecycleEvent>>,
}

impl Followers {
    pub(super) fn new() -> Self {
        Followers {
            sessions: Mutex::default(),
            lifecycle: broadcast::channel(LIFECYCLE_BUFFER).0,
        }
    }

    /// A new subscriber of the session's runs (its channel is made if it has none; the
    /// channels of sessions nobody follows any more are forgotten).
    pub(super) fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Arc<Run>> {
        let mut map = self.sessions.lock().expect("hub lock");
        map.retain(|_, tx| tx.receiver_count() > 0);
        map.entry(session_id.to_owned())
            .or_insert_with(|| broadcast::channel(SESSION_BUFFER).0)
            .subscribe()
    }

    /// A new subscriber of the lifecycle events.
    pub(super) fn subscribe_lifecycle(&self) -> broadcast::Receiver<Arc<StoredLifecycleEvent>> {
        self.lifecycle.subscribe()
    }

    /// The session's broadcast sender, when it has live subscribers.
    fn of(&self, session_id: &str) -> Option<broadcast::Sender<Arc<Run>>> {
        (self.sessions.lock().expect("hub lock"))
            .get(session_id)
            .filter(|tx| tx.receiver_count() > 0)
            .cloned()
    }

    /// Whether the session has live subscribers.
    pub(super) fn followed(&self, session_id: &str) -> bool {
        self.of(session_id).is_some()
    }

    /// Sends `run()` to the session's live subscribers; with none, the run is not built (nor,
    /// then, ever encoded).
    pub(super) fn broadcast(&self, session_id: &str, run: impl FnOnce() -> Run) {
        if let Some(tx) = self.of(session_id) {
            let _ = tx.send(Arc::new(run()));
        }
    }

    /// Sends a stored lifecycle event (or a wake-up) to the lifecycle subscribers.
    pub(super) fn announce(&self, event: StoredLifecycleEvent) {
        let _ = self.lifecycle.send(Arc::new(event));
    }

    /// Wakes every subscriber, of every session and of the lifecycle: they read the logs (what
    /// another replica appended may be anywhere).
    pub(super) fn wake_all(&self) {
        let senders: Vec<_> = (self.sessions.lock().expect("hub lock"))
            .values()
            .cloned()
            .collect();
        for tx in senders {
            let _ = tx.send(Arc::new(Run::wake(i64::MAX)));
        }
        self.announce(lifecycle_wake(i64::MAX));
    }
}
