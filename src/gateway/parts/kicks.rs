//! Which sessions have prompts queued here, and the wake-ups of the queue's runner
//! (`gateway/queue.rs`): a session whose turn ended, to run its next prompt.

use std::collections::HashSet;
use std::sync::Mutex;

use tokio::sync::mpsc;

/// The sessions with prompts queued here, and the wake-ups of the runner: a session whose turn
/// ended, to run its next prompt.
pub(in crate::gateway) struct Kicks {
    queued: Mutex<HashSet<String>>,
    tx: mpsc::Sender<String>,
    rx: Mutex<Option<mpsc::Receiver<String>>>,
}

impl Default for Kicks {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(1024);
        Kicks {
            queued: Mutex::default(),
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

impl Kicks {
    /// Runs the session's next queued prompt soon, if it has one (a full channel leaves it to
    /// the sweep).
    pub(in crate::gateway) fn kick(&self, session_id: &str) {
        let known = self
            .queued
            .lock()
            .expect("queued lock")
            .contains(session_id);
        if known {
            let _ = self.tx.try_send(session_id.to_owned());
        }
    }

    /// Whether the session has prompts queued, as far as this replica knows.
    pub(in crate::gateway) fn mark(&self, session_id: &str, queued: bool) {
        let mut sessions = self.queued.lock().expect("queued lock");
        if queued {
            sessions.insert(session_id.to_owned());
        } else {
            sessions.remove(session_id);
        }
    }
}

impl Kicks {
    /// The wake-ups, for the one runner (`None` once taken).
    pub(in crate::gateway) fn take_receiver(&self) -> Option<mpsc::Receiver<String>> {
        self.rx.lock().expect("kicks lock").take()
    }
}
