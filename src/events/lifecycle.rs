//! The lifecycle log's writer (`GET /events`): one task storing lifecycle events in the order
//! they were queued, retrying while the store is unavailable as the event log's writer does,
//! then waking the lifecycle subscribers. Whoever emits an event (a member's exit, a session
//! becoming live or saved) only queues it, so a store outage never holds them up nor drops it.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::followers::Followers;
use super::retry::{RETRY_FIRST, wait_to_retry};
use super::stopping::Stopping;
use crate::store::{EventLog, NewLifecycleEvent, StoreError};

/// Lifecycle events waiting to be stored; past it, whoever emits one waits.
const LIFECYCLE_QUEUE: usize = 1024;
/// Lifecycle events stored in one append at most.
const LIFECYCLE_BATCH: usize = LIFECYCLE_QUEUE;

/// The handle to the lifecycle log's writer: queues lifecycle events for it.
pub(super) struct Lifecycle {
    queue: mpsc::Sender<NewLifecycleEvent>,
}

impl Lifecycle {
    /// Starts the writer, one of `stopping`'s tasks, storing in `log` and waking `followers`.
    pub(super) fn start(
        log: Arc<dyn EventLog>,
        followers: Arc<Followers>,
        stopping: &Stopping,
    ) -> Self {
        let (queue, rx) = mpsc::channel(LIFECYCLE_QUEUE);
        let task = LifecycleTask {
            log,
            followers,
            stopping: stopping.clone(),
        };
        stopping.spawn(task.run(rx));
        Lifecycle { queue }
    }

    /// Queues a lifecycle event; subscribers are woken once it is stored.
    pub(super) async fn queue(&self, event: NewLifecycleEvent) {
        if let Err(mpsc::error::SendError(event)) = self.queue.send(event).await {
            tracing::error!(
                session = event.session_id,
                kind = event.kind,
                "the lifecycle log's writer has stopped; this lifecycle event is not stored"
            );
        }
    }
}

/// The lifecycle log's writer task.
struct LifecycleTask {
    log: Arc<dyn EventLog>,
    followers: Arc<Followers>,
    stopping: Stopping,
}

impl LifecycleTask {
    /// Stores the queued lifecycle events until the hub closes, and what was queued by
    /// then; during an outage, until the store is back or the shutdown gives up on it. What
    /// has queued up meanwhile is stored in one append (a list sync announcing thousands of
    /// sessions costs a transaction per thousand, not per session).
    async fn run(self, mut rx: mpsc::Receiver<NewLifecycleEvent>) {
        loop {
            let next = tokio::select! {
                biased;
                next = rx.recv() => next,
                _ = self.stopping.closing() => rx.try_recv().ok(),
            };
            let Some(event) = next else { return };
            let mut batch = vec![event];
            while batch.len() < LIFECYCLE_BATCH {
                match rx.try_recv() {
                    Ok(event) => batch.push(event),
                    Err(_) => break,
                }
            }
            if !self.store_lifecycle(&batch).await {
                let mut lost = batch.len();
                while rx.try_recv().is_ok() {
                    lost += 1;
                }
                tracing::error!(
                    events = lost,
                    "the store is still unavailable at shutdown: these lifecycle events are not stored"
                );
                return;
            }
        }
    }

    /// Stores lifecycle events, then wakes the subscribers; one the store refuses is lost
    /// alone. False when the shutdown gave up waiting for the store.
    async fn store_lifecycle(&self, events: &[NewLifecycleEvent]) -> bool {
        let refused = match self.append_lifecycle(events).await {
            Outcome::Stored => return true,
            Outcome::GaveUp => return false,
            Outcome::Refused(e) if events.len() == 1 => vec![(e, &events[0])],
            Outcome::Refused(_) => {
                let mut refused = Vec::new();
                for event in events {
                    match self.append_lifecycle(std::slice::from_ref(event)).await {
                        Outcome::Stored => {}
                        Outcome::GaveUp => return false,
                        Outcome::Refused(e) => refused.push((e, event)),
                    }
                }
                refused
            }
        };
        for (e, event) in refused {
            tracing::error!(error = %e, session = event.session_id, kind = event.kind, "the store refused this lifecycle event; it is not stored");
        }
        true
    }

    /// One append of lifecycle events, retried while the store is unavailable. (A retry after a
    /// connection lost mid-commit may store the events twice.)
    async fn append_lifecycle(&self, events: &[NewLifecycleEvent]) -> Outcome {
        let mut pause = RETRY_FIRST;
        let mut failures: u32 = 0;
        loop {
            match self.log.append_lifecycle(events).await {
                Ok(stored) => {
                    if failures > 0 {
                        tracing::warn!(failures, "the lifecycle log is written again");
                    }
                    for event in stored {
                        self.followers.announce(event);
                    }
                    return Outcome::Stored;
                }
                Err(e) if e.is_about_the_data() => return Outcome::Refused(e),
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(20) {
                        tracing::warn!(error = %e, failures, "cannot append to the lifecycle log; retrying until it can");
                    }
                    if wait_to_retry(&self.stopping, &mut pause).await.is_err() {
                        return Outcome::GaveUp;
                    }
                }
            }
        }
    }
}

/// How an append of lifecycle events ended.
enum Outcome {
    Stored,
    /// The store refused the data: appending it again fails again.
    Refused(StoreError),
    /// The shutdown gave up waiting for the store.
    GaveUp,
}
