//! The hub itself: its two queues (what waits for the log writer, `writer.rs`, and for the
//! lifecycle log's, `lifecycle.rs`), its broadcast channels, its tasks, retention and the
//! wake-ups from other replicas.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::run::Run;
use super::run::lifecycle_wake;
use super::traced::Traced;
use crate::store::StoredLifecycleEvent;
use crate::store::{
    Appended, EventLog, NewEvent, NewLifecycleEvent, STABLE_CURSOR_FOR, SessionRecords, Store,
};

/// Lifecycle events kept in the live broadcast buffer before a subscriber is considered behind
/// (and reads the log instead).
pub(super) const LIFECYCLE_BUFFER: usize = 1024;
/// Runs (each one commit's events of a session) kept in a followed session's broadcast buffer
/// before a subscriber is considered behind (and reads the log instead). A buffer's slots are
/// allocated when the session gets its first subscriber: this is most of what a subscriber
/// costs in memory (`bench/memory.sh`).
pub(super) const SESSION_BUFFER: usize = 128;

/// Events queued for the writer before appenders wait.
pub(super) const QUEUE: usize = 8192;
/// The least time between the end of one commit of the event log and the start of the next,
/// unless someone waits for one ([`EventHub::append`], [`EventHub::flush`]) or the last batch
/// was full: events queued meanwhile gather into one commit, without waking the writer. An
/// event queued while the writer is idle is committed at once; a streaming turn's are
/// committed (and reach live subscribers) in batches about this far apart. On a small
/// machine each commit, and each wake-up of the writer, takes CPU and file-system time from
/// the agent the gateway is waiting for (see `bench/README.md`).
pub(super) const COMMIT_PACE: Duration = Duration::from_millis(2);
/// A commit of fewer events than this leaves the writer quiet: the end of a turn then ends its
/// pause, so that a client sees the turn end with the answer. A larger commit means events
/// arrive faster than the pace gathers them; turns' ends then wait for the pace like the rest,
/// and the commits (and their CPU) stay few.
pub(super) const QUIET_BATCH: usize = 64;
/// Lifecycle events waiting to be stored; past it, whoever emits one waits.
pub(super) const LIFECYCLE_QUEUE: usize = 1024;

/// An append waiting for the writer (`writer.rs`).
pub(super) struct Queued {
    pub(super) session_id: String,
    /// `None`: a barrier ([`EventHub::flush`]), answered once everything before it is stored.
    pub(super) event: Option<NewEvent>,
    /// Raise the session's `updated_at` to at least this, with the event.
    pub(super) touch: Option<DateTime<Utc>>,
    pub(super) done: Option<oneshot::Sender<Result<i64, String>>>,
    /// The span whose trace the append belongs to (a turn's), while traces are exported.
    pub(super) span: Option<tracing::Span>,
}

/// How long events are kept (per session).
#[derive(Debug, Clone, Copy, Default)]
pub struct Retention {
    /// Keep at most this many of each session's latest events (`None`: all).
    pub max_events: Option<i64>,
    /// Drop events older than this (`None`: never).
    pub max_age: Option<Duration>,
}

/// Per-session and lifecycle broadcast, backed by the store's logs.
pub struct EventHub {
    /// The logs, as stored.
    pub(super) log: Arc<dyn EventLog>,
    /// Whose list moves the pruner forgets.
    records: Arc<dyn SessionRecords>,
    pub(super) sessions: Mutex<HashMap<String, broadcast::Sender<Arc<Run>>>>,
    pub(super) lifecycle: broadcast::Sender<Arc<StoredLifecycleEvent>>,
    /// Lifecycle events waiting for their writer (`lifecycle.rs`).
    pub(super) lifecycle_queue: mpsc::Sender<NewLifecycleEvent>,
    /// Ends the subscribers' streams.
    pub(super) shutdown: CancellationToken,
    pub(super) queue: mpsc::Sender<Queued>,
    /// The writer's pause after each commit ([`COMMIT_PACE`]).
    pub(super) pace: Duration,
    /// Ends the writer's pause: someone waits for a commit, or a followed turn has ended
    /// while the writer is quiet.
    pub(super) urgent: Notify,
    /// The writer's last batch was small ([`QUIET_BATCH`]): a turn's end may end its pause
    /// ([`EventHub::enqueue_now`]).
    pub(super) quiet: AtomicBool,
    /// The writer and the pruner; stopped by [`EventHub::close`] after everything is written.
    pub(super) tasks: TaskTracker,
    pub(super) closing: CancellationToken,
    /// Ends the writer's retries of a failing append: shutdown has waited long enough.
    pub(super) abandon: CancellationToken,
    /// The writer's last append failed, and it is retrying.
    pub(super) failing: AtomicBool,
    /// The writer has finished.
    pub(super) finished: CancellationToken,
    pub(super) appended: AtomicU64,
    /// Group commits (each one broadcast to live subscribers as one run).
    pub(super) commits: AtomicU64,
    /// Commits that raised a session's `updated_at` ([`EventHub::enqueue_touching`]), and every
    /// append another replica announced (it may have changed any cached session).
    pub(super) touches: AtomicU64,
    pub(super) streams: Arc<StreamStats>,
    /// The sessions whose appends are traced, and their spans.
    pub(super) traced: Traced,
}

/// Counters of the event streams (for `/metrics`).
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Streams open now.
    pub open: AtomicU64,
    /// Times a subscriber fell behind the live broadcast and went back to the log.
    pub lagged: AtomicU64,
    /// Streams closed because the log could not be read (the client reconnects).
    pub closed: AtomicU64,
}

impl EventHub {
    /// Starts the writer (and the pruner, when `retention` limits anything). `shutdown` ends
    /// the subscribers' streams; [`EventHub::close`] stops the writer once the queue is written.
    pub fn new(
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
        retention: Retention,
    ) -> Arc<Self> {
        Self::with_pace(store, shutdown, retention, COMMIT_PACE)
    }

    /// As [`EventHub::new`], with `pace` between commits instead of [`COMMIT_PACE`].
    pub(super) fn with_pace(
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
        retention: Retention,
        pace: Duration,
    ) -> Arc<Self> {
        let (queue, rx) = mpsc::channel(QUEUE);
        let (lifecycle_queue, lifecycle_rx) = mpsc::channel(LIFECYCLE_QUEUE);
        let hub = Arc::new(EventHub {
            log: store.clone(),
            records: store,
            sessions: Mutex::default(),
            lifecycle: broadcast::channel(LIFECYCLE_BUFFER).0,
            lifecycle_queue,
            shutdown,
            queue,
            pace,
            urgent: Notify::new(),
            quiet: AtomicBool::new(true),
            tasks: TaskTracker::new(),
            closing: CancellationToken::new(),
            abandon: CancellationToken::new(),
            failing: AtomicBool::new(false),
            finished: CancellationToken::new(),
            appended: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            touches: AtomicU64::new(0),
            streams: Arc::default(),
            traced: Traced::default(),
        });
        let writer = hub.clone();
        let (written, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("acp-event-log".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(writer.write(rx)),
                    Err(e) => tracing::error!(error = %e, "cannot start the event log writer"),
                }
                drop(written);
            })
            .expect("the event log writer thread starts");
        // Tracked like the other tasks: `close` returns once the writer has finished.
        let finished = hub.finished.clone();
        hub.tasks.spawn(async move {
            let _ = stopped.await;
            finished.cancel();
        });
        let lifecycle = hub.clone();
        hub.tasks
            .spawn(async move { lifecycle.write_lifecycle(lifecycle_rx).await });
        let pruner = hub.clone();
        hub.tasks
            .spawn(async move { pruner.prune(retention).await });
        let follower = hub.clone();
        hub.tasks
            .spawn(async move { follower.follow_other_replicas().await });
        hub
    }

    /// Wakes local subscribers when another replica appends to a log they follow (PostgreSQL).
    /// The notification carries only the position; the subscribers read the events from the
    /// log, as they do after falling behind.
    async fn follow_other_replicas(&self) {
        let appended = tokio::select! {
            r = self.log.appended_elsewhere() => r,
            _ = self.shutdown.cancelled() => return,
        };
        let mut appended = match appended {
            Ok(Some(stream)) => stream,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for other replicas' appends; subscribers here follow only this replica's");
                return;
            }
        };
        loop {
            let next = tokio::select! {
                next = appended.next() => next,
                _ = self.shutdown.cancelled() => return,
            };
            let Some(appended) = next else { return };
            // Another replica's write may have created, changed or moved a session in the
            // list: a page this replica read before it is stale now.
            self.touches.fetch_add(1, Ordering::SeqCst);
            match appended {
                Appended::Session { session_id, seq } => {
                    self.broadcast(&session_id, || Run::wake(seq));
                }
                Appended::Lifecycle { seq } => {
                    let _ = self.lifecycle.send(Arc::new(lifecycle_wake(seq)));
                }
                Appended::Lost => {
                    let senders: Vec<_> = self
                        .sessions
                        .lock()
                        .expect("hub lock")
                        .values()
                        .cloned()
                        .collect();
                    for tx in senders {
                        let _ = tx.send(Arc::new(Run::wake(i64::MAX)));
                    }
                    let _ = self.lifecycle.send(Arc::new(lifecycle_wake(i64::MAX)));
                }
            }
        }
    }

    /// Writes what is queued, then stops the writer and the pruner. During a store outage this
    /// waits until the store is back or the bound set by [`EventHub::give_up_after`] passes.
    pub async fn close(&self) {
        self.closing.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Bounds a shutdown during a store outage: `limit` from now, the writer stops retrying,
    /// fails whoever waits, and logs, per session, how many queued events were not stored.
    /// Armed when shutdown begins, because until then appenders (an agent's dispatch, which
    /// stopping the pool waits for) may be waiting on the full queue.
    pub fn give_up_after(self: &Arc<Self>, limit: Duration) {
        let hub = self.clone();
        self.tasks.spawn(async move {
            let mut at = tokio::time::Instant::now() + limit;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = hub.finished.cancelled() => return,
                }
                // Only an outage is given up on: a healthy writer still draining is left to
                // finish (each of its appends is bounded by the store's own timeouts).
                if hub.log_failing() {
                    tracing::error!(
                        ?limit,
                        "the event log could not be written within the shutdown's bound; giving up"
                    );
                    hub.abandon.cancel();
                    return;
                }
                at += Duration::from_millis(100);
            }
        });
    }

    /// The writer's last append failed and it is retrying (the store is down or cannot write):
    /// appenders wait.
    pub fn log_failing(&self) -> bool {
        self.failing.load(Ordering::SeqCst)
    }

    /// Events appended since start (for `/metrics`).
    pub fn appended(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    /// Group commits since start (for `/metrics`).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Commits that changed the session cache, here or (PostgreSQL) on another replica: a
    /// session list read before one may be stale.
    pub fn touches(&self) -> u64 {
        self.touches.load(Ordering::SeqCst)
    }

    /// Which sessions' appends are written in a turn's trace.
    pub fn traced(&self) -> &Traced {
        &self.traced
    }

    /// Counters of the event streams.
    pub fn streams(&self) -> &StreamStats {
        &self.streams
    }

    /// Applies the retention limits now and then, and forgets list moves older than
    /// [`STABLE_CURSOR_FOR`].
    async fn prune(&self, retention: Retention) {
        let every = retention
            .max_age
            .map_or(Duration::from_secs(5), |age| age / 4)
            .clamp(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = self.closing.cancelled() => return,
            }
            let before = retention.max_age.map(|age| {
                chrono::Utc::now()
                    - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX)
            });
            if retention.max_events.is_some() || before.is_some() {
                match self.log.prune_events(retention.max_events, before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(pruned = n, "event retention"),
                    Err(e) => tracing::warn!(error = %e, "event retention failed"),
                }
            }
            let moves_before = chrono::Utc::now()
                - chrono::Duration::from_std(STABLE_CURSOR_FOR).expect("an hour fits");
            if let Err(e) = self.records.prune_moves(moves_before).await {
                tracing::warn!(error = %e, "pruning list moves failed");
            }
        }
    }

    /// The session's broadcast sender, when it has live subscribers.
    fn followers(&self, session_id: &str) -> Option<broadcast::Sender<Arc<Run>>> {
        (self.sessions.lock().expect("hub lock"))
            .get(session_id)
            .filter(|tx| tx.receiver_count() > 0)
            .cloned()
    }

    /// Whether the session has live subscribers.
    pub(super) fn followed(&self, session_id: &str) -> bool {
        self.followers(session_id).is_some()
    }

    /// Sends `run()` to the session's live subscribers; with none, the run is not built (nor,
    /// then, ever encoded).
    pub(super) fn broadcast(&self, session_id: &str, run: impl FnOnce() -> Run) {
        if let Some(tx) = self.followers(session_id) {
            let _ = tx.send(Arc::new(run()));
        }
    }
}
