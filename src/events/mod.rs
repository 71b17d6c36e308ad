//! The event hub: every session event is appended to the durable log in the store first, then
//! broadcast to live subscribers. Subscribers read the log from their cursor, then follow the
//! broadcast; whenever they fall behind or see a gap they go back to the log, so a slow
//! subscriber never slows the agent and never misses or repeats an event.
//!
//! Appends go through one writer task (group commit): it takes everything queued, in order, and
//! writes each session's share in one transaction, so a fast-streaming agent costs one commit per
//! batch rather than one per chunk; after each commit it pauses briefly (`COMMIT_PACE`) so that
//! the next batch gathers without waking it. The queue is bounded: when the store falls behind,
//! the agent's stdout is read more slowly, and nothing is dropped. Events older than the
//! retention limits are pruned; a subscriber whose cursor points into pruned history first gets
//! a `gap` event.

pub mod payloads;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::store::{
    Appended, LogWriter, NewEvent, NewLifecycleEvent, STABLE_CURSOR_FOR, Store, StoreResult,
    StoredEvent, StoredLifecycleEvent,
};

/// Events kept in each live broadcast buffer before a subscriber is considered behind.
const LIVE_BUFFER: usize = 1024;
/// Most frames written to a subscriber in one go.
const MAX_WRITE: usize = 256;
/// Page size when a subscriber reads the log.
const PAGE: i64 = 500;
/// Keep-alive comment interval on every stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Events queued for the writer before appenders wait.
const QUEUE: usize = 8192;
/// The least time between the end of one commit of the event log and the start of the next,
/// unless someone waits for one ([`EventHub::append`], [`EventHub::flush`]) or the last batch
/// was full: events queued meanwhile gather into one commit, without waking the writer. An
/// event queued while the writer is idle is committed at once; a streaming turn's are
/// committed (and reach live subscribers) in batches about this far apart. On a small
/// machine each commit, and each wake-up of the writer, takes CPU and file-system time from
/// the agent the gateway is waiting for (see the README's Performance section).
const COMMIT_PACE: Duration = Duration::from_millis(2);
/// Most events written in one batch.
const MAX_BATCH: usize = 2048;

/// How long events are kept (per session).
#[derive(Debug, Clone, Copy, Default)]
pub struct Retention {
    /// Keep at most this many of each session's latest events (`None`: all).
    pub max_events: Option<i64>,
    /// Drop events older than this (`None`: never).
    pub max_age: Option<Duration>,
}

struct Queued {
    session_id: String,
    /// `None`: a barrier ([`EventHub::flush`]), answered once everything before it is stored.
    event: Option<NewEvent>,
    /// Raise the session's `updated_at` to at least this, with the event.
    touch: Option<DateTime<Utc>>,
    done: Option<oneshot::Sender<Result<i64, String>>>,
}

/// Per-session and lifecycle broadcast, backed by the store's logs.
pub struct EventHub {
    store: Arc<dyn Store>,
    sessions: Mutex<HashMap<String, broadcast::Sender<Arc<Frame>>>>,
    lifecycle: broadcast::Sender<Arc<StoredLifecycleEvent>>,
    /// Ends the SSE streams.
    shutdown: CancellationToken,
    queue: mpsc::Sender<Queued>,
    /// The writer's pause after each commit ([`COMMIT_PACE`]).
    pace: Duration,
    /// Ends the writer's pause: someone waits for a commit.
    urgent: Notify,
    /// The writer and the pruner; stopped by [`EventHub::close`] after everything is written.
    tasks: TaskTracker,
    closing: CancellationToken,
    appended: AtomicU64,
    /// Group commits (each one broadcast to live subscribers as one frame).
    commits: AtomicU64,
    /// Commits that raised a session's `updated_at` ([`EventHub::enqueue_touching`]).
    touches: AtomicU64,
    streams: Arc<StreamStats>,
}

/// Counters of the SSE streams (for `/metrics`).
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Streams open now.
    pub open: AtomicU64,
    /// Times a subscriber fell behind the live broadcast and went back to the log.
    pub lagged: AtomicU64,
    /// Streams closed because the log could not be read (the client reconnects).
    pub closed: AtomicU64,
}

/// Counts one open stream for as long as it lives.
struct OpenStream(Arc<StreamStats>);

impl OpenStream {
    fn new(stats: Arc<StreamStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        OpenStream(stats)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

type Reader<T> =
    Box<dyn FnMut(i64) -> Pin<Box<dyn Future<Output = StoreResult<Vec<T>>> + Send>> + Send>;

/// Something with a position in a log: one event, or a run of consecutive ones.
pub trait Sequenced {
    /// The (last) sequence number.
    fn seq(&self) -> i64;
    /// The first sequence number of a run.
    fn first_seq(&self) -> i64 {
        self.seq()
    }
    /// A wake-up without the events: the log reaches `seq()`, written by another replica.
    fn is_wake(&self) -> bool;
}

/// Consecutive session events encoded once as SSE frames, shared by every live subscriber:
/// the writer broadcasts one per committed batch, so a thousand subscribers are woken once per
/// batch rather than once per event.
pub struct Frame {
    first: i64,
    seq: i64,
    bytes: Bytes,
}

impl Frame {
    fn new(e: &StoredEvent) -> Self {
        Frame {
            first: e.seq,
            seq: e.seq,
            bytes: encode(e.seq, &e.kind, &e.payload),
        }
    }

    /// Another replica appended up to `seq`: subscribers read the log.
    fn wake(seq: i64) -> Self {
        Frame {
            first: seq,
            seq,
            bytes: Bytes::new(),
        }
    }

    /// `events` must be consecutive and non-empty.
    fn run(events: &[StoredEvent]) -> Self {
        Frame {
            first: events[0].seq,
            seq: events[events.len() - 1].seq,
            bytes: concat(events.iter().map(|e| encode(e.seq, &e.kind, &e.payload))),
        }
    }
}

impl Sequenced for Frame {
    fn seq(&self) -> i64 {
        self.seq
    }
    fn first_seq(&self) -> i64 {
        self.first
    }
    fn is_wake(&self) -> bool {
        self.bytes.is_empty()
    }
}
impl Sequenced for StoredLifecycleEvent {
    fn seq(&self) -> i64 {
        self.seq
    }
    /// Stored lifecycle events always have a kind; a wake-up has none.
    fn is_wake(&self) -> bool {
        self.kind.is_empty()
    }
}

/// The niceness of the event log writer's thread: request handling and agents go first on a
/// busy CPU.
const LOG_WRITER_NICE: u8 = 5;

/// Lowers the calling thread's CPU priority to [`LOG_WRITER_NICE`]. The writer commits in the
/// background (no request waits for it; readers of the log flush the queue first), so on a
/// machine with few cores its commits should not delay a prompt's answer or slow an agent
/// that shares the cores. Not being allowed to is harmless.
fn log_writer_priority() {
    use thread_priority::{ThreadPriority, ThreadPriorityValue, set_current_thread_priority};
    // The crate maps 0..=99 linearly onto niceness 19..=-20, rounding towards 19.
    let value = 99 * (19 - u16::from(LOG_WRITER_NICE)) / 39;
    let set = u8::try_from(value)
        .ok()
        .and_then(|v| ThreadPriorityValue::try_from(v).ok())
        .map(|v| set_current_thread_priority(ThreadPriority::Crossplatform(v)));
    if !matches!(set, Some(Ok(()))) {
        tracing::debug!(?set, "cannot lower the event log writer's priority");
    }
}

/// A lifecycle wake-up (see [`Sequenced::is_wake`]).
fn lifecycle_wake(seq: i64) -> StoredLifecycleEvent {
    StoredLifecycleEvent {
        seq,
        session_id: String::new(),
        tenant: String::new(),
        kind: String::new(),
        payload: serde_json::Value::Null,
        created_at: chrono::Utc::now(),
    }
}

impl EventHub {
    /// Starts the writer (and the pruner, when `retention` limits anything). `shutdown` ends
    /// the SSE streams; [`EventHub::close`] stops the writer once the queue is written.
    pub fn new(
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
        retention: Retention,
    ) -> Arc<Self> {
        Self::with_pace(store, shutdown, retention, COMMIT_PACE)
    }

    /// As [`EventHub::new`], with `pace` between commits instead of [`COMMIT_PACE`].
    fn with_pace(
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
        retention: Retention,
        pace: Duration,
    ) -> Arc<Self> {
        let (queue, rx) = mpsc::channel(QUEUE);
        let hub = Arc::new(EventHub {
            store,
            sessions: Mutex::default(),
            lifecycle: broadcast::channel(LIVE_BUFFER).0,
            shutdown,
            queue,
            pace,
            urgent: Notify::new(),
            tasks: TaskTracker::new(),
            closing: CancellationToken::new(),
            appended: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            touches: AtomicU64::new(0),
            streams: Arc::default(),
        });
        let writer = hub.clone();
        let (written, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("acp-event-log".into())
            .spawn(move || {
                log_writer_priority();
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
        hub.tasks.spawn(async move {
            let _ = stopped.await;
        });
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
            r = self.store.appended_elsewhere() => r,
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
            match next {
                None => return,
                Some(Appended::Session { session_id, seq }) => {
                    self.broadcast(&session_id, || Frame::wake(seq));
                }
                Some(Appended::Lifecycle { seq }) => {
                    let _ = self.lifecycle.send(Arc::new(lifecycle_wake(seq)));
                }
                Some(Appended::Lost) => {
                    let senders: Vec<_> = self
                        .sessions
                        .lock()
                        .expect("hub lock")
                        .values()
                        .cloned()
                        .collect();
                    for tx in senders {
                        let _ = tx.send(Arc::new(Frame::wake(i64::MAX)));
                    }
                    let _ = self.lifecycle.send(Arc::new(lifecycle_wake(i64::MAX)));
                }
            }
        }
    }

    /// Writes what is queued, then stops the writer and the pruner.
    pub async fn close(&self) {
        self.closing.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Events appended since start (for `/metrics`).
    pub fn appended(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    /// Group commits since start (for `/metrics`).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Commits that changed the session cache: a session list read before one may be stale.
    pub fn touches(&self) -> u64 {
        self.touches.load(Ordering::SeqCst)
    }

    /// Counters of the SSE streams.
    pub fn streams(&self) -> &StreamStats {
        &self.streams
    }

    /// Appends to a session's log and waits until it is stored (and broadcast); returns its
    /// sequence number.
    pub async fn append(&self, session_id: &str, event: NewEvent) -> Result<i64, String> {
        let (tx, rx) = oneshot::channel();
        self.enqueue_with(session_id, event, None, Some(tx)).await;
        rx.await
            .unwrap_or_else(|_| Err("the event writer has stopped".into()))
    }

    /// Queues an append without waiting for it to be stored. Order is kept: it is written
    /// before anything queued (or appended) later.
    pub async fn enqueue(&self, session_id: &str, event: NewEvent) {
        self.enqueue_with(session_id, event, None, None).await;
    }

    /// As [`EventHub::enqueue`], and the session's `updated_at` is raised to at least `at` in
    /// the same commit; [`EventHub::touches`] counts such commits.
    pub async fn enqueue_touching(&self, session_id: &str, event: NewEvent, at: DateTime<Utc>) {
        self.enqueue_with(session_id, event, Some(at), None).await;
    }

    /// Waits until everything queued so far is stored (read-your-writes for log readers).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        let barrier = Queued {
            session_id: String::new(),
            event: None,
            touch: None,
            done: Some(tx),
        };
        if self.send(barrier).await.is_ok() {
            let _ = rx.await;
        }
    }

    async fn enqueue_with(
        &self,
        session_id: &str,
        event: NewEvent,
        touch: Option<DateTime<Utc>>,
        done: Option<oneshot::Sender<Result<i64, String>>>,
    ) {
        let item = Queued {
            session_id: session_id.to_owned(),
            event: Some(event),
            touch,
            done,
        };
        if let Err(mpsc::error::SendError(item)) = self.send(item).await {
            tracing::error!(
                session = item.session_id,
                kind = item.event.map(|e| e.kind),
                "the event writer has stopped; event not stored"
            );
        }
    }

    /// Queues `item` for the writer; one that someone waits for ends the writer's pause.
    async fn send(&self, item: Queued) -> Result<(), mpsc::error::SendError<Queued>> {
        let waited_for = item.done.is_some();
        self.queue.send(item).await?;
        if waited_for {
            self.urgent.notify_one();
        }
        Ok(())
    }

    /// The writer: group commit of everything queued, session by session, in queue order, then
    /// a pause of [`EventHub::pace`] unless someone waits for a commit or the batch was full.
    async fn write(&self, mut rx: mpsc::Receiver<Queued>) {
        let mut log = self.store.log_writer();
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                biased;
                item = rx.recv() => item,
                _ = self.closing.cancelled() => {
                    rx.close();
                    rx.recv().await
                }
            };
            let Some(first) = first else { return };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(item) => batch.push(item),
                    Err(_) => break,
                }
            }
            let full = batch.len() == MAX_BATCH;
            self.write_batch(log.as_mut(), &mut batch).await;
            if !full {
                tokio::select! {
                    biased;
                    _ = self.urgent.notified() => {}
                    _ = self.closing.cancelled() => {}
                    _ = tokio::time::sleep(self.pace) => {}
                }
            }
        }
    }

    async fn write_batch(&self, log: &mut dyn LogWriter, batch: &mut Vec<Queued>) {
        // Group by session, keeping each session's order (sessions are independent logs).
        let mut groups: Vec<(String, Vec<Queued>)> = Vec::new();
        let mut barriers = Vec::new();
        for item in batch.drain(..) {
            if item.event.is_none() {
                barriers.extend(item.done);
                continue;
            }
            match groups.iter_mut().find(|(id, _)| *id == item.session_id) {
                Some((_, items)) => items.push(item),
                None => groups.push((item.session_id.clone(), vec![item])),
            }
        }
        for (session_id, mut items) in groups {
            let events: Vec<NewEvent> = items.iter_mut().filter_map(|i| i.event.take()).collect();
            let touch = items.iter().filter_map(|i| i.touch).max();
            match log.append(&session_id, &events, touch).await {
                Ok(stored) => {
                    self.appended
                        .fetch_add(stored.len() as u64, Ordering::Relaxed);
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    if touch.is_some() {
                        self.touches.fetch_add(1, Ordering::SeqCst);
                    }
                    if !stored.is_empty() {
                        self.broadcast(&session_id, || Frame::run(&stored));
                    }
                    for (item, e) in items.into_iter().zip(&stored) {
                        if let Some(done) = item.done {
                            let _ = done.send(Ok(e.seq));
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(session = session_id, error = %e, events = items.len(), "cannot append to the event log");
                    for item in items {
                        if let Some(done) = item.done {
                            let _ = done.send(Err(e.to_string()));
                        }
                    }
                }
            }
        }
        // Everything queued before the barriers is in this batch or an earlier one: stored.
        for done in barriers {
            let _ = done.send(Ok(0));
        }
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
                match self.store.prune_events(retention.max_events, before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(pruned = n, "event retention"),
                    Err(e) => tracing::warn!(error = %e, "event retention failed"),
                }
            }
            let moves_before = chrono::Utc::now()
                - chrono::Duration::from_std(STABLE_CURSOR_FOR).expect("an hour fits");
            if let Err(e) = self.store.prune_moves(moves_before).await {
                tracing::warn!(error = %e, "pruning list moves failed");
            }
        }
    }

    /// Appends a lifecycle event, then wakes `GET /events` subscribers.
    pub async fn lifecycle(&self, event: NewLifecycleEvent) -> StoreResult<StoredLifecycleEvent> {
        let stored = self.store.append_lifecycle(&event).await?;
        let _ = self.lifecycle.send(Arc::new(stored.clone()));
        Ok(stored)
    }

    /// Sends `frame()` to the session's live subscribers; with none, the frame is not built
    /// (encoding a commit's events is wasted work when nobody follows the session).
    fn broadcast(&self, session_id: &str, frame: impl FnOnce() -> Frame) {
        let sender = self
            .sessions
            .lock()
            .expect("hub lock")
            .get(session_id)
            .filter(|tx| tx.receiver_count() > 0)
            .cloned();
        if let Some(tx) = sender {
            let _ = tx.send(Arc::new(frame()));
        }
    }

    fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Arc<Frame>> {
        let mut map = self.sessions.lock().expect("hub lock");
        map.retain(|_, tx| tx.receiver_count() > 0);
        map.entry(session_id.to_owned())
            .or_insert_with(|| broadcast::channel(LIVE_BUFFER).0)
            .subscribe()
    }

    /// The SSE stream of one session from `after` (`None`: from the live tail).
    pub async fn session_sse(
        &self,
        session_id: &str,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Bytes> + Send + use<>> {
        let rx = self.subscribe(session_id);
        let cursor = match after {
            Some(a) => a,
            None => self.store.last_event_seq(session_id).await?,
        };
        let (store, id) = (self.store.clone(), session_id.to_owned());
        let read: Reader<Frame> = Box::new(move |after| {
            let (store, id) = (store.clone(), id.clone());
            Box::pin(async move {
                let page = read_with_gap(store.as_ref(), &id, after).await?;
                Ok(page.iter().map(Frame::new).collect())
            })
        });
        let events = tail(rx, read, cursor, |_| true, self.streams.clone())
            .map(|batch| concat(batch.iter().map(|f| f.bytes.clone())));
        Ok(events.take_until(self.shutdown.clone().cancelled_owned()))
    }

    /// The SSE stream of lifecycle events from `after` (`None`: from the live tail).
    pub async fn lifecycle_sse(
        &self,
        tenant: Option<String>,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Bytes> + Send + use<>> {
        let rx = self.lifecycle.subscribe();
        let cursor = match after {
            Some(a) => a,
            None => self.store.last_lifecycle_seq().await?,
        };
        let (store, t) = (self.store.clone(), tenant.clone());
        let read: Reader<StoredLifecycleEvent> = Box::new(move |after| {
            let (store, t) = (store.clone(), t.clone());
            Box::pin(async move { store.read_lifecycle(t.as_deref(), after, PAGE).await })
        });
        let keep = move |e: &StoredLifecycleEvent| tenant.as_deref().is_none_or(|t| t == e.tenant);
        let events = tail(rx, read, cursor, keep, self.streams.clone())
            .map(|batch| concat(batch.iter().map(|e| encode(e.seq, &e.kind, &e.payload))));
        Ok(events.take_until(self.shutdown.clone().cancelled_owned()))
    }
}

/// A page of a session's log after `after`; if retention removed events right after `after`,
/// the page starts with a synthetic `gap` event `{from, to}` whose id is `to`, so that a client
/// resuming from it continues with the first event still kept.
async fn read_with_gap(
    store: &dyn Store,
    session_id: &str,
    after: i64,
) -> StoreResult<Vec<StoredEvent>> {
    // The last sequence number is read first: any event up to it that still exists is then in
    // the page, so a hole before the page's first event can only be pruned history, never an
    // event committed between the two reads.
    let last = store.last_event_seq(session_id).await?;
    let mut page = store.read_events(session_id, after, PAGE).await?;
    let next = match page.first() {
        Some(first) => first.seq,
        None => last.max(after) + 1,
    };
    if next > after + 1 {
        let gap = StoredEvent {
            session_id: session_id.to_owned(),
            seq: next - 1,
            kind: "gap".to_owned(),
            payload: serde_json::json!({"sessionId": session_id, "from": after + 1, "to": next - 1}),
            created_at: chrono::Utc::now(),
        };
        page.insert(0, gap);
    }
    Ok(page)
}

/// One SSE frame: `id`, `event` and one `data` line (JSON never contains a raw newline).
fn encode(seq: i64, kind: &str, payload: &serde_json::Value) -> Bytes {
    // The event name comes from the agent: keep it on one line whatever it sends.
    let kind: String = kind
        .chars()
        .map(|c| if c == '\n' || c == '\r' { '_' } else { c })
        .collect();
    Bytes::from(format!("id: {seq}\nevent: {kind}\ndata: {payload}\n\n"))
}

/// Frames delivered together become one write.
fn concat(frames: impl Iterator<Item = Bytes>) -> Bytes {
    let frames: Vec<Bytes> = frames.collect();
    if let [one] = frames.as_slice() {
        return one.clone(); // shared, not copied
    }
    let mut out = BytesMut::with_capacity(frames.iter().map(Bytes::len).sum());
    for f in &frames {
        out.extend_from_slice(f);
    }
    out.freeze()
}

/// An SSE response body: the frames, with a keep-alive comment every [`KEEP_ALIVE`]; it ends
/// when the frames end.
pub fn sse_response<S>(frames: S) -> axum::response::Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let start = tokio::time::Instant::now() + KEEP_ALIVE;
    let keep_alive =
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval_at(start, KEEP_ALIVE))
            .map(|_| Some(Bytes::from_static(b": keep-alive\n\n")));
    let frames = frames
        .map(Some)
        .chain(futures::stream::once(async { None }));
    let body = futures::stream::select(frames, keep_alive)
        .take_while(|item| std::future::ready(item.is_some()))
        .map(|item| Ok::<_, Infallible>(item.unwrap_or_default()));
    axum::response::Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "text/event-stream")
        .body(axum::body::Body::from_stream(body))
        .expect("static headers")
}

/// Follows a log: reads pages after `cursor`, then the live broadcast, returning to the log on
/// lag or on a gap in the broadcast. `keep` filters events (the log reader filters likewise).
fn tail<T: Sequenced + Send + Sync + 'static>(
    rx: broadcast::Receiver<Arc<T>>,
    read: Reader<T>,
    cursor: i64,
    keep: impl Fn(&T) -> bool + Send + 'static,
    stats: Arc<StreamStats>,
) -> impl Stream<Item = Vec<Arc<T>>> + Send {
    struct State<T, K> {
        rx: broadcast::Receiver<Arc<T>>,
        read: Reader<T>,
        cursor: i64,
        buf: VecDeque<Arc<T>>,
        live: bool,
        keep: K,
        open: OpenStream,
    }
    let state = State {
        rx,
        read,
        cursor,
        buf: VecDeque::new(),
        live: false,
        keep,
        open: OpenStream::new(stats),
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if !s.buf.is_empty() {
                let n = s.buf.len().min(MAX_WRITE);
                let batch: Vec<Arc<T>> = s.buf.drain(..n).collect();
                s.cursor = batch.last().map_or(s.cursor, |e| e.seq());
                return Some((batch, s));
            }
            if !s.live {
                // A busy store (e.g. many subscribers catching up at once) gets a few retries
                // before the stream closes; the client then reconnects with its Last-Event-ID.
                let mut read = (s.read)(s.cursor).await;
                for attempt in 1..=3u32 {
                    if read.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100) * attempt).await;
                    read = (s.read)(s.cursor).await;
                }
                match read {
                    Ok(page) => {
                        s.live = (page.len() as i64) < PAGE;
                        let cursor = s.cursor;
                        s.buf
                            .extend(page.into_iter().filter(|e| e.seq() > cursor).map(Arc::new));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "reading the event log failed; closing the stream");
                        s.open.0.closed.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
                continue;
            }
            // Wait for the next live event, then take whatever else is already there.
            let mut next = Some(s.rx.recv().await);
            let mut last = s.cursor;
            while let Some(received) = next.take() {
                match received {
                    Ok(e) if e.seq() <= last => {}
                    Ok(e) if e.is_wake() => {
                        s.live = false;
                        break;
                    }
                    Ok(e) if e.first_seq() == last + 1 => {
                        last = e.seq();
                        if (s.keep)(&e) {
                            s.buf.push_back(e);
                        } else if s.buf.is_empty() {
                            s.cursor = last;
                        }
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        s.open.0.lagged.fetch_add(1, Ordering::Relaxed);
                        s.live = false;
                        break;
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        if s.buf.is_empty() {
                            return None;
                        }
                        break;
                    }
                }
                if s.buf.len() < MAX_WRITE {
                    next = match s.rx.try_recv() {
                        Ok(e) => Some(Ok(e)),
                        Err(broadcast::error::TryRecvError::Lagged(n)) => {
                            Some(Err(broadcast::error::RecvError::Lagged(n)))
                        }
                        Err(_) => None,
                    };
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `flush` returns once everything queued before it is stored. On this single-threaded
    /// runtime the writer cannot run between the enqueues and the read unless `flush` waits.
    #[tokio::test]
    async fn flush_waits_for_everything_queued_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = crate::store::connect(&url, "test-replica")
            .await
            .unwrap()
            .store;
        let hub = EventHub::new(
            store.clone(),
            CancellationToken::new(),
            Retention::default(),
        );
        for i in 0..100 {
            let payload = serde_json::json!({"i": i});
            let event = NewEvent {
                kind: "x".into(),
                payload,
            };
            hub.enqueue("s", event).await;
        }
        hub.flush().await;
        assert_eq!(store.read_events("s", 0, 1000).await.unwrap().len(), 100);
        hub.close().await;
    }

    async fn appended(store: &Arc<dyn Store>, session: &str) -> usize {
        store.read_events(session, 0, 1000).await.unwrap().len()
    }

    fn event(i: usize) -> NewEvent {
        NewEvent {
            kind: "x".into(),
            payload: serde_json::json!({"i": i}),
        }
    }

    /// After a commit the writer pauses: what is queued meanwhile waits and then goes into one
    /// commit. An event queued while the writer is idle is committed at once, and a `flush`
    /// or an awaited `append` ends the pause instead of waiting it out. The pace here is far
    /// longer than the test, so that no timing decides the outcome.
    #[tokio::test]
    async fn events_queued_during_the_pause_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = crate::store::connect(&url, "test-replica")
            .await
            .unwrap()
            .store;
        let pace = Duration::from_secs(600);
        let hub = EventHub::with_pace(
            store.clone(),
            CancellationToken::new(),
            Retention::default(),
            pace,
        );
        hub.enqueue("s", event(0)).await;
        // The counter moves just after the commit becomes readable: wait for both.
        let committed = async {
            while appended(&store, "s").await == 0 || hub.commits() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), committed)
            .await
            .expect("an event queued while the writer is idle is committed without a pause");
        assert_eq!(hub.commits(), 1);

        for i in 1..50 {
            hub.enqueue("s", event(i)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            appended(&store, "s").await,
            1,
            "the writer pauses after a commit"
        );
        tokio::time::timeout(Duration::from_secs(30), hub.flush())
            .await
            .expect("a flush ends the pause");
        assert_eq!(appended(&store, "s").await, 50);
        assert_eq!(
            hub.commits(),
            2,
            "what was queued during the pause is one commit"
        );

        hub.enqueue("s", event(50)).await;
        let seq = tokio::time::timeout(Duration::from_secs(30), hub.append("s", event(51)))
            .await
            .expect("an awaited append ends the pause")
            .unwrap();
        assert_eq!(seq, 52);
        assert_eq!(hub.commits(), 3);
        tokio::time::timeout(Duration::from_secs(30), hub.close())
            .await
            .expect("closing ends the pause");
    }

    #[test]
    fn frames_stay_well_formed_whatever_the_agent_names_its_updates() {
        let payload = serde_json::json!({"text": "two\nlines\r"});
        let frame = encode(7, "evil\nevent: forged", &payload);
        assert_eq!(
            std::str::from_utf8(&frame).unwrap(),
            "id: 7\nevent: evil_event: forged\ndata: {\"text\":\"two\\nlines\\r\"}\n\n"
        );
    }
}
