//! The lifecycle log's writer (`GET /events`): one task storing lifecycle events in the order
//! they were queued, retrying while the store is unavailable as the event log's writer does,
//! then waking the lifecycle subscribers. Whoever emits an event (a member's exit, a session
//! becoming live or saved) only queues it, so a store outage never holds them up nor drops it.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::EventHub;
use super::writer::RETRY_FIRST;
use crate::store::NewLifecycleEvent;

/// Lifecycle events waiting to be stored; past it, whoever emits one waits.
pub(super) const LIFECYCLE_QUEUE: usize = 1024;

impl EventHub {
    /// Queues a lifecycle event; subscribers are woken once it is stored.
    pub async fn lifecycle(&self, event: NewLifecycleEvent) {
        if let Err(mpsc::error::SendError(event)) = self.lifecycle_queue.send(event).await {
            tracing::error!(
                session = event.session_id,
                kind = event.kind,
                "the lifecycle log's writer has stopped; this lifecycle event is not stored"
            );
        }
    }

    /// Stores the queued lifecycle events until [`EventHub::close`], and what was queued by
    /// then; during an outage, until the store is back or the shutdown gives up on it.
    pub(super) async fn write_lifecycle(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<NewLifecycleEvent>,
    ) {
        loop {
            let next = tokio::select! {
                biased;
                next = rx.recv() => next,
                _ = self.closing.cancelled() => rx.try_recv().ok(),
            };
            let Some(event) = next else { return };
            if !self.store_lifecycle(&event).await {
                let mut lost = 1;
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

    /// Stores one lifecycle event, retrying while the store is unavailable, then wakes the
    /// subscribers. False when the shutdown gave up waiting for the store. (A retry after a
    /// connection lost mid-commit may store the event twice.)
    async fn store_lifecycle(&self, event: &NewLifecycleEvent) -> bool {
        let mut pause = RETRY_FIRST;
        let mut failures: u32 = 0;
        loop {
            match self.store.append_lifecycle(event).await {
                Ok(stored) => {
                    if failures > 0 {
                        tracing::warn!(failures, "the lifecycle log is written again");
                    }
                    let _ = self.lifecycle.send(Arc::new(stored));
                    return true;
                }
                Err(e) if e.is_about_the_data() => {
                    tracing::error!(error = %e, session = event.session_id, kind = event.kind, "the store refused this lifecycle event; it is not stored");
                    return true;
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(20) {
                        tracing::warn!(error = %e, failures, "cannot append to the lifecycle log; retrying until it can");
                    }
                    if self.wait_to_retry(&mut pause).await.is_err() {
                        return false;
                    }
                }
            }
        }
    }
}
