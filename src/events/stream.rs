//! The subscribers' side of the hub: a stream follows a log from its cursor, then the live
//! broadcast, going back to the log when it falls behind; what it yields is typed events, in
//! batches, whose wire form each edge writes (SSE in `api/`, ACP notifications in `/acp`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::broadcast;

use super::followers::Followers;
use super::run::{Run, Sequenced};
use super::stages::StageTimes;
use super::stopping::Stopping;
use crate::store::{EventKind, EventLog, StoreResult, StoredEvent, StoredLifecycleEvent};

/// Most items (runs, lifecycle events) yielded to a subscriber in one batch (one write).
const MAX_WRITE: usize = 256;
/// Page size when a subscriber reads the log.
const PAGE: i64 = 500;

/// Counters of the event streams (for `/metrics`).
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Streams open now.
    open: AtomicU64,
    /// Times a subscriber fell behind the live broadcast and went back to the log.
    lagged: AtomicU64,
    /// Streams closed because the log could not be read (the client reconnects).
    closed: AtomicU64,
}

/// The counters of the event streams, as read at one time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCounts {
    /// Streams open now.
    pub open: u64,
    /// Times a subscriber fell behind the live broadcast and went back to the log.
    pub lagged: u64,
    /// Streams closed because the log could not be read (the client reconnects).
    pub closed: u64,
}

impl StreamStats {
    /// The counters now.
    pub fn read(&self) -> StreamCounts {
        StreamCounts {
            open: self.open.load(Ordering::Relaxed),
            lagged: self.lagged.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
        }
    }

    /// A stream opened.
    fn opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream ended.
    fn ended(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A subscriber fell behind the live broadcast.
    fn fell_behind(&self) {
        self.lagged.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream closed because the log could not be read.
    fn failed(&self) {
        self.closed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts one open stream for as long as it lives.
struct OpenStream(Arc<StreamStats>);

impl OpenStream {
    fn new(stats: Arc<StreamStats>) -> Self {
        stats.opened();
        OpenStream(stats)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.ended();
    }
}

type Reader<T> =
    Box<dyn FnMut(i64) -> Pin<Box<dyn Future<Output = StoreResult<Vec<T>>> + Send>> + Send>;

/// The subscribers' side of the hub: opens streams that follow a log and counts them.
pub(super) struct Streams {
    log: Arc<dyn EventLog>,
    followers: Arc<Followers>,
    stats: Arc<StreamStats>,
    /// Its shutdown ends the streams.
    stopping: Stopping,
    /// Where the time from a commit to a subscriber's stream taking it is counted.
    stages: Arc<StageTimes>,
}

impl Streams {
    pub(super) fn new(
        log: Arc<dyn EventLog>,
        followers: Arc<Followers>,
        stopping: Stopping,
        stages: Arc<StageTimes>,
    ) -> Self {
        Streams {
            log,
            followers,
            stats: Arc::default(),
            stopping,
            stages,
        }
    }

    /// Counters of the event streams.
    pub(super) fn stats(&self) -> &StreamStats {
        &self.stats
    }

    /// The events of one session from `after` (`None`: from the live tail), in batches: each
    /// batch is what reached the subscriber together (one write).
    pub(super) async fn session(
        &self,
        session_id: &str,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Vec<Arc<Run>>> + Send + use<>> {
        let rx = self.followers.subscribe(session_id);
        let cursor = match after {
            Some(a) => a,
            None => self.log.last_event_seq(session_id).await?,
        };
        let (store, id) = (self.log.clone(), session_id.to_owned());
        let read: Reader<Run> = Box::new(move |after| {
            let (store, id) = (store.clone(), id.clone());
            Box::pin(async move {
                let page = read_with_gap(store.as_ref(), &id, after).await?;
                Ok(page.into_iter().map(Run::one).collect())
            })
        });
        let stages = self.stages.clone();
        let events = tail(rx, read, cursor, |_| true, self.stats.clone()).map(move |batch| {
            let now = std::time::Instant::now();
            for at in batch.iter().filter_map(|run| run.committed_at()) {
                stages.handed.observe(now - at);
            }
            batch
        });
        Ok(events.take_until(self.stopping.streams_end()))
    }

    /// The lifecycle events from `after` (`None`: from the live tail), of `tenant`'s sessions
    /// (`None`: all), in batches as [`Streams::session`]'s.
    pub(super) async fn lifecycle(
        &self,
        tenant: Option<String>,
        after: Option<i64>,
    ) -> StoreResult<impl Stream<Item = Vec<Arc<StoredLifecycleEvent>>> + Send + use<>> {
        let rx = self.followers.subscribe_lifecycle();
        let cursor = match after {
            Some(a) => a,
            None => self.log.last_lifecycle_seq().await?,
        };
        let (store, t) = (self.log.clone(), tenant.clone());
        let read: Reader<StoredLifecycleEvent> = Box::new(move |after| {
            let (store, t) = (store.clone(), t.clone());
            Box::pin(async move { store.read_lifecycle(t.as_deref(), after, PAGE).await })
        });
        let keep = move |e: &StoredLifecycleEvent| tenant.as_deref().is_none_or(|t| t == e.tenant);
        let events = tail(rx, read, cursor, keep, self.stats.clone());
        Ok(events.take_until(self.stopping.streams_end()))
    }
}

/// A page of a session's log after `after`; if retention removed events right after `after`,
/// the page starts with a synthetic `gap` event `{from, to}` whose id is `to`, so that a client
/// resuming from it continues with the first event still kept.
async fn read_with_gap(
    store: &dyn EventLog,
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
            kind: EventKind::Gap.name().to_owned(),
            payload:
                serde_json::json!({"sessionId": session_id, "from": after + 1, "to": next - 1})
                    .into(),
            created_at: chrono::Utc::now(),
        };
        page.insert(0, gap);
    }
    Ok(page)
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
                        s.open.0.failed();
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
                        s.open.0.fell_behind();
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
