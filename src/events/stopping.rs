//! How the hub stops: the shutdown that ends the subscribers' streams, the closing that stops
//! its tasks once what is queued is written, the word of a shutdown that gives up on a store
//! that stays down, and the tasks themselves, which [`Stopping::close`] waits for.

use std::future::Future;

use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

/// The hub's tasks and the words that stop them; each task holds a copy.
#[derive(Clone)]
pub(super) struct Stopping {
    /// Ends the subscribers' streams (the gateway's shutdown).
    shutdown: CancellationToken,
    /// Stops the writers (after what is queued) and the pruner.
    closing: CancellationToken,
    /// Ends the writers' retries of a failing append: shutdown has waited long enough.
    abandon: CancellationToken,
    /// The event log's writer has finished.
    finished: CancellationToken,
    /// The writers' tasks, the pruner and the other hub tasks.
    tasks: TaskTracker,
}

impl Stopping {
    /// `shutdown` ends the subscribers' streams.
    pub(super) fn new(shutdown: CancellationToken) -> Self {
        Stopping {
            shutdown,
            closing: CancellationToken::new(),
            abandon: CancellationToken::new(),
            finished: CancellationToken::new(),
            tasks: TaskTracker::new(),
        }
    }

    /// Runs `task` as one of the hub's: [`Stopping::close`] waits for it.
    pub(super) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// The event log's writer (on a thread of its own) has finished when `stopped` is: tracked
    /// like the tasks, so that [`Stopping::close`] returns once the writer has finished.
    pub(super) fn finish_with(&self, stopped: oneshot::Receiver<()>) {
        let finished = self.finished.clone();
        self.tasks.spawn(async move {
            let _ = stopped.await;
            finished.cancel();
        });
    }

    /// Starts closing and waits until every task has ended.
    pub(super) async fn close(&self) {
        self.closing.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Completes once the hub is closing.
    pub(super) async fn closing(&self) {
        self.closing.cancelled().await;
    }

    /// Completes once the gateway shuts down.
    pub(super) async fn shutting_down(&self) {
        self.shutdown.cancelled().await;
    }

    /// Completes when the gateway shuts down, for a stream to end with.
    pub(super) fn streams_end(&self) -> WaitForCancellationFutureOwned {
        self.shutdown.clone().cancelled_owned()
    }

    /// The shutdown stops waiting for the store: the writers' retries end.
    pub(super) fn give_up(&self) {
        self.abandon.cancel();
    }

    /// Completes once the shutdown has given up on the store.
    pub(super) async fn given_up(&self) {
        self.abandon.cancelled().await;
    }

    /// Completes once the event log's writer has finished.
    pub(super) async fn finished(&self) {
        self.finished.cancelled().await;
    }
}
