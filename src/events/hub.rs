//! The hub itself, the face of the folder: its parts (the log writer's handle, `writer.rs`;
//! the lifecycle log's, `lifecycle.rs`; the live broadcast channels, `followers.rs`; the
//! subscribers' streams, `stream.rs`; its tasks and how they stop, `stopping.rs`), retention and
//! the wake-ups from other replicas.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::followers::Followers;
use super::lifecycle::Lifecycle;
use super::run::Run;
use super::run::lifecycle_wake;
use super::stages::StageTimes;
use super::stopping::Stopping;
use super::stream::{StreamStats, Streams};
use super::traced::Traced;
use super::writer::{COMMIT_PACE, Writer};
use crate::store::{
    Appended, EventLog, NewEvent, NewLifecycleEvent, STABLE_CURSOR_FOR, SessionRecords, Store,
    StoreResult, StoredLifecycleEvent,
};

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
    log: Arc<dyn EventLog>,
    /// Whose list moves the pruner forgets.
    records: Arc<dyn SessionRecords>,
    /// The session logs' writer.
    writer: Writer,
    /// The lifecycle log's writer.
    lifecycle: Lifecycle,
    /// The live broadcast channels.
    followers: Arc<Followers>,
    /// The subscribers' streams.
    streams: Streams,
    /// How long events spend at each stage.
    stages: Arc<StageTimes>,
    /// The writers and the pruner, stopped by [`EventHub::close`] after everything is written.
    stopping: Stopping,
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
        let log: Arc<dyn EventLog> = store.clone();
        let stopping = Stopping::new(shutdown);
        let followers = Arc::new(Followers::new());
        let stages = Arc::new(StageTimes::default());
        let hub = Arc::new(EventHub {
            writer: Writer::start(
                log.clone(),
                followers.clone(),
                &stopping,
                pace,
                stages.clone(),
            ),
            lifecycle: Lifecycle::start(log.clone(), followers.clone(), &stopping),
            streams: Streams::new(
                log.clone(),
                followers.clone(),
                stopping.clone(),
                stages.clone(),
            ),
            stages,
            log,
            records: store,
            followers,
            stopping,
        });
        let pruner = hub.clone();
        hub.stopping
            .spawn(async move { pruner.prune(retention).await });
        let follower = hub.clone();
        hub.stopping
            .spawn(async move { follower.follow_other_replicas().await });
        hub
    }

    /// Appends to a session's log and waits until it is stored (and broadcast); returns its
    /// sequence number.
    pub async fn append(&self, session_id: &str, event: NewEvent) -> Result<i64, String> {
        self.writer.append(session_id, event).await
    }

    /// Queues an append without waiting for it to be stored. Order is kept: it is written
    /// before anything queued (or appended) later.
    pub async fn enqueue(&self, session_id: &str, event: NewEvent) {
        self.writer.enqueue(session_id, event).await;
    }

    /// As [`EventHub::enqueue`], and, when someone follows the session live, the writer's
    /// pause (`COMMIT_PACE`) ends unless the writer is busy (`QUIET_BATCH`): what ends a turn
    /// reaches its subscribers with the answer, not a pace later. Unfollowed, it waits for the
    /// pace: the commit it would cost falls on the client's next request instead.
    pub async fn enqueue_now(&self, session_id: &str, event: NewEvent) {
        self.writer.enqueue_now(session_id, event).await;
    }

    /// As [`EventHub::enqueue`], for the event that opens a turn: the session's `updated_at` is
    /// raised to at least `at` in the same commit ([`EventHub::touches`] counts such commits),
    /// and an idle writer waits up to its pace for the turn's first answer before committing
    /// it, so that a turn answered at once is stored in one commit.
    pub async fn enqueue_opening(&self, session_id: &str, event: NewEvent, at: DateTime<Utc>) {
        self.writer.enqueue_opening(session_id, event, at).await;
    }

    /// Waits until everything queued so far is stored (read-your-writes for log readers).
    /// Returns at once while the writer retries a failed append (the store is down): a reader
    /// then gets what is stored, or the store's error, instead of waiting for the outage.
    pub async fn flush(&self) {
        self.writer.flush().await;
    }

    /// Waits until everything queued so far is stored, however long the store is down (until
    /// a shutdown gives up on it).
    pub async fn stored(&self) {
        self.writer.stored().await;
    }

    /// Queues a lifecycle event; subscribers are woken once it is stored.
    pub async fn lifecycle(&self, event: NewLifecycleEvent) {
        self.lifecycle.queue(event).await;
    }

    /// The events of one session from `after` (`None`: from the live tail), in batches: each
    /// batch is what reached the subscriber together (one write).
    pub async fn session_stream(
        &self,
        session_id: &str,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Vec<Arc<Run>>> + Send + use<>> {
        self.streams.session(session_id, after).await
    }

    /// The lifecycle events from `after` (`None`: from the live tail), of `tenant`'s sessions
    /// (`None`: all), in batches as [`EventHub::session_stream`]'s.
    pub async fn lifecycle_stream(
        &self,
        tenant: Option<String>,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Vec<Arc<StoredLifecycleEvent>>> + Send + use<>> {
        self.streams.lifecycle(tenant, after).await
    }

    /// Wakes local subscribers when another replica appends to a log they follow (PostgreSQL).
    /// The notification carries only the position; the subscribers read the events from the
    /// log, as they do after falling behind.
    async fn follow_other_replicas(&self) {
        let appended = tokio::select! {
            r = self.log.appended_elsewhere() => r,
            _ = self.stopping.shutting_down() => return,
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
                _ = self.stopping.shutting_down() => return,
            };
            let Some(appended) = next else { return };
            // Another replica's write may have created, changed or moved a session in the
            // list: a page this replica read before it is stale now.
            self.writer.touched_elsewhere();
            match appended {
                Appended::Session { session_id, seq } => {
                    self.followers.broadcast(&session_id, || Run::wake(seq));
                }
                Appended::Lifecycle { seq } => self.followers.announce(lifecycle_wake(seq)),
                Appended::Lost => self.followers.wake_all(),
            }
        }
    }

    /// Writes what is queued, then stops the writer and the pruner. During a store outage this
    /// waits until the store is back or the bound set by [`EventHub::give_up_after`] passes.
    pub async fn close(&self) {
        self.stopping.close().await;
    }

    /// Bounds a shutdown during a store outage: `limit` from now, the writer stops retrying,
    /// fails whoever waits, and logs, per session, how many queued events were not stored.
    /// Armed when shutdown begins, because until then appenders (an agent's dispatch, which
    /// stopping the pool waits for) may be waiting on the full queue.
    pub fn give_up_after(self: &Arc<Self>, limit: Duration) {
        let hub = self.clone();
        self.stopping.spawn(async move {
            let mut at = tokio::time::Instant::now() + limit;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = hub.stopping.finished() => return,
                }
                // Only an outage is given up on: a healthy writer still draining is left to
                // finish (each of its appends is bounded by the store's own timeouts).
                if hub.log_failing() {
                    tracing::error!(
                        ?limit,
                        "the event log could not be written within the shutdown's bound; giving up"
                    );
                    hub.stopping.give_up();
                    return;
                }
                at += Duration::from_millis(100);
            }
        });
    }

    /// The writer's last append failed and it is retrying (the store is down or cannot write):
    /// appenders wait.
    pub fn log_failing(&self) -> bool {
        self.writer.failing()
    }

    /// Events appended since start (for `/metrics`).
    pub fn appended(&self) -> u64 {
        self.writer.appended()
    }

    /// Group commits since start (for `/metrics`).
    pub fn commits(&self) -> u64 {
        self.writer.commits()
    }

    /// Commits that changed the session cache, here or (PostgreSQL) on another replica: a
    /// session list read before one may be stale.
    pub fn touches(&self) -> u64 {
        self.writer.touches()
    }

    /// Which sessions' appends are written in a turn's trace.
    pub fn traced(&self) -> &Traced {
        self.writer.traced()
    }

    /// Counters of the event streams.
    pub fn streams(&self) -> &StreamStats {
        self.streams.stats()
    }

    /// How long events spend at each stage on their way to subscribers (for `/metrics`).
    pub fn stages(&self) -> &StageTimes {
        &self.stages
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
                _ = self.stopping.closing() => return,
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
}
