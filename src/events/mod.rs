//! The event hub: every session event is appended to the durable log in the store first, then
//! broadcast to live subscribers. Subscribers read the log from their cursor, then follow the
//! broadcast; whenever they fall behind or see a gap they go back to the log, so a slow
//! subscriber never slows the agent and never misses or repeats an event.
//!
//! Appends go through one writer task (group commit): it takes everything queued, in order, and
//! writes each session's share in one transaction, so a fast-streaming agent costs one commit per
//! batch rather than one per chunk. The queue is bounded: when the store falls behind, the agent's
//! stdout is read more slowly, and nothing is dropped. Events older than the retention limits are
//! pruned; a subscriber whose cursor points into pruned history first gets a `gap` event.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::store::{
    NewEvent, NewLifecycleEvent, Store, StoreResult, StoredEvent, StoredLifecycleEvent,
};

/// Events kept in each live broadcast buffer before a subscriber is considered behind.
const LIVE_BUFFER: usize = 1024;
/// Page size when a subscriber reads the log.
const PAGE: i64 = 500;
/// Keep-alive comment interval on every stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Events queued for the writer before appenders wait.
const QUEUE: usize = 8192;
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
    event: NewEvent,
    done: Option<oneshot::Sender<Result<i64, String>>>,
}

/// Per-session and lifecycle broadcast, backed by the store's logs.
pub struct EventHub {
    store: Arc<dyn Store>,
    sessions: Mutex<HashMap<String, broadcast::Sender<Arc<StoredEvent>>>>,
    lifecycle: broadcast::Sender<Arc<StoredLifecycleEvent>>,
    /// Ends the SSE streams.
    shutdown: CancellationToken,
    queue: mpsc::Sender<Queued>,
    /// The writer and the pruner; stopped by [`EventHub::close`] after everything is written.
    tasks: TaskTracker,
    closing: CancellationToken,
    appended: AtomicU64,
}

type Reader<T> =
    Box<dyn FnMut(i64) -> Pin<Box<dyn Future<Output = StoreResult<Vec<T>>> + Send>> + Send>;

/// Something with a position in a log.
pub trait Sequenced {
    fn seq(&self) -> i64;
}
impl Sequenced for StoredEvent {
    fn seq(&self) -> i64 {
        self.seq
    }
}
impl Sequenced for StoredLifecycleEvent {
    fn seq(&self) -> i64 {
        self.seq
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
        let (queue, rx) = mpsc::channel(QUEUE);
        let hub = Arc::new(EventHub {
            store,
            sessions: Mutex::default(),
            lifecycle: broadcast::channel(LIVE_BUFFER).0,
            shutdown,
            queue,
            tasks: TaskTracker::new(),
            closing: CancellationToken::new(),
            appended: AtomicU64::new(0),
        });
        let writer = hub.clone();
        hub.tasks.spawn(async move { writer.write(rx).await });
        if retention.max_events.is_some() || retention.max_age.is_some() {
            let pruner = hub.clone();
            hub.tasks
                .spawn(async move { pruner.prune(retention).await });
        }
        hub
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

    /// Appends to a session's log and waits until it is stored (and broadcast); returns its
    /// sequence number.
    pub async fn append(&self, session_id: &str, event: NewEvent) -> Result<i64, String> {
        let (tx, rx) = oneshot::channel();
        self.enqueue_with(session_id, event, Some(tx)).await;
        rx.await
            .unwrap_or_else(|_| Err("the event writer has stopped".into()))
    }

    /// Queues an append without waiting for it to be stored. Order is kept: it is written
    /// before anything queued (or appended) later.
    pub async fn enqueue(&self, session_id: &str, event: NewEvent) {
        self.enqueue_with(session_id, event, None).await;
    }

    async fn enqueue_with(
        &self,
        session_id: &str,
        event: NewEvent,
        done: Option<oneshot::Sender<Result<i64, String>>>,
    ) {
        let item = Queued {
            session_id: session_id.to_owned(),
            event,
            done,
        };
        if let Err(mpsc::error::SendError(item)) = self.queue.send(item).await {
            tracing::error!(
                session = item.session_id,
                kind = item.event.kind,
                "the event writer has stopped; event not stored"
            );
        }
    }

    /// The writer: group commit of everything queued, session by session, in queue order.
    async fn write(&self, mut rx: mpsc::Receiver<Queued>) {
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
            self.write_batch(&mut batch).await;
        }
    }

    async fn write_batch(&self, batch: &mut Vec<Queued>) {
        // Group by session, keeping each session's order (sessions are independent logs).
        let mut groups: Vec<(String, Vec<Queued>)> = Vec::new();
        for item in batch.drain(..) {
            match groups.iter_mut().find(|(id, _)| *id == item.session_id) {
                Some((_, items)) => items.push(item),
                None => groups.push((item.session_id.clone(), vec![item])),
            }
        }
        for (session_id, items) in groups {
            let events: Vec<NewEvent> = items.iter().map(|i| i.event.clone()).collect();
            match self.store.append_events(&session_id, &events).await {
                Ok(stored) => {
                    self.appended
                        .fetch_add(stored.len() as u64, Ordering::Relaxed);
                    let sender = self
                        .sessions
                        .lock()
                        .expect("hub lock")
                        .get(&session_id)
                        .cloned();
                    if let Some(tx) = sender {
                        for e in &stored {
                            let _ = tx.send(Arc::new(e.clone()));
                        }
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
    }

    /// Applies the retention limits now and then.
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
            match self.store.prune_events(retention.max_events, before).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(pruned = n, "event retention"),
                Err(e) => tracing::warn!(error = %e, "event retention failed"),
            }
        }
    }

    /// Appends a lifecycle event, then wakes `GET /events` subscribers.
    pub async fn lifecycle(&self, event: NewLifecycleEvent) -> StoreResult<StoredLifecycleEvent> {
        let stored = self.store.append_lifecycle(&event).await?;
        let _ = self.lifecycle.send(Arc::new(stored.clone()));
        Ok(stored)
    }

    fn subscribe(&self, session_id: &str) -> broadcast::Receiver<Arc<StoredEvent>> {
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
    ) -> StoreResult<impl Stream<Item = Result<Event, Infallible>> + Send + use<>> {
        let rx = self.subscribe(session_id);
        let cursor = match after {
            Some(a) => a,
            None => self.store.last_event_seq(session_id).await?,
        };
        let (store, id) = (self.store.clone(), session_id.to_owned());
        let read: Reader<StoredEvent> = Box::new(move |after| {
            let (store, id) = (store.clone(), id.clone());
            Box::pin(async move { read_with_gap(store.as_ref(), &id, after).await })
        });
        let events =
            tail(rx, read, cursor, |_| true).map(|e| Ok(encode(e.seq, &e.kind, &e.payload)));
        Ok(events.take_until(self.shutdown.clone().cancelled_owned()))
    }

    /// The SSE stream of lifecycle events from `after` (`None`: from the live tail).
    pub async fn lifecycle_sse(
        &self,
        tenant: Option<String>,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Result<Event, Infallible>> + Send + use<>> {
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
        let events = tail(rx, read, cursor, keep).map(|e| Ok(encode(e.seq, &e.kind, &e.payload)));
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

/// One SSE frame.
fn encode(seq: i64, kind: &str, payload: &serde_json::Value) -> Event {
    Event::default()
        .id(seq.to_string())
        .event(kind)
        .data(payload.to_string())
}

/// Wraps an event stream as an SSE response with keep-alives.
pub fn sse_response<S>(stream: S) -> impl axum::response::IntoResponse
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// Follows a log: reads pages after `cursor`, then the live broadcast, returning to the log on
/// lag or on a gap in the broadcast. `keep` filters events (the log reader filters likewise).
fn tail<T: Sequenced + Send + Sync + 'static>(
    rx: broadcast::Receiver<Arc<T>>,
    read: Reader<T>,
    cursor: i64,
    keep: impl Fn(&T) -> bool + Send + 'static,
) -> impl Stream<Item = Arc<T>> + Send {
    struct State<T, K> {
        rx: broadcast::Receiver<Arc<T>>,
        read: Reader<T>,
        cursor: i64,
        buf: VecDeque<Arc<T>>,
        live: bool,
        keep: K,
    }
    let state = State {
        rx,
        read,
        cursor,
        buf: VecDeque::new(),
        live: false,
        keep,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.buf.pop_front() {
                s.cursor = e.seq();
                return Some((e, s));
            }
            if !s.live {
                match (s.read)(s.cursor).await {
                    Ok(page) => {
                        s.live = (page.len() as i64) < PAGE;
                        let cursor = s.cursor;
                        s.buf
                            .extend(page.into_iter().filter(|e| e.seq() > cursor).map(Arc::new));
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "reading the event log failed; closing the stream");
                        return None;
                    }
                }
                continue;
            }
            match s.rx.recv().await {
                Ok(e) if e.seq() <= s.cursor => {}
                Ok(e) if e.seq() == s.cursor + 1 => {
                    if (s.keep)(&e) {
                        s.buf.push_back(e);
                    } else {
                        s.cursor = e.seq();
                    }
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => s.live = false,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}
