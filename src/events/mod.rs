//! The event hub: every session event is appended to the durable log in the store first, then
//! broadcast to live subscribers. Subscribers read the log from their cursor, then follow the
//! broadcast; whenever they fall behind or see a gap they go back to the log, so a slow
//! subscriber never slows the agent and never misses or repeats an event.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::store::{
    NewEvent, NewLifecycleEvent, Store, StoreResult, StoredEvent, StoredLifecycleEvent,
};

/// Events kept in each live broadcast buffer before a subscriber is considered behind.
const LIVE_BUFFER: usize = 1024;
/// Page size when a subscriber reads the log.
const PAGE: i64 = 500;
/// Keep-alive comment interval on every stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Per-session and lifecycle broadcast, backed by the store's logs.
pub struct EventHub {
    store: Arc<dyn Store>,
    sessions: Mutex<HashMap<String, broadcast::Sender<Arc<StoredEvent>>>>,
    lifecycle: broadcast::Sender<Arc<StoredLifecycleEvent>>,
    shutdown: CancellationToken,
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
    pub fn new(store: Arc<dyn Store>, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(EventHub {
            store,
            sessions: Mutex::default(),
            lifecycle: broadcast::channel(LIVE_BUFFER).0,
            shutdown,
        })
    }

    /// Appends to a session's log, then wakes its subscribers.
    pub async fn append(
        &self,
        session_id: &str,
        events: Vec<NewEvent>,
    ) -> StoreResult<Vec<StoredEvent>> {
        let stored = self.store.append_events(session_id, &events).await?;
        let sender = self
            .sessions
            .lock()
            .expect("hub lock")
            .get(session_id)
            .cloned();
        if let Some(tx) = sender {
            for e in &stored {
                let _ = tx.send(Arc::new(e.clone()));
            }
        }
        Ok(stored)
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
            Box::pin(async move { store.read_events(&id, after, PAGE).await })
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
