//! The subscribers' side of the hub: a stream follows a log from its cursor, then the live
//! broadcast, going back to the log when it falls behind; what it yields is SSE framing.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use tokio::sync::broadcast;

use super::{EventHub, LIVE_BUFFER, StreamStats};
use crate::store::{Store, StoreResult, StoredEvent, StoredLifecycleEvent};

/// Most frames written to a subscriber in one go.
const MAX_WRITE: usize = 256;
/// Page size when a subscriber reads the log.
const PAGE: i64 = 500;
/// Keep-alive comment interval on every stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

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
            bytes: frames([e]),
        }
    }

    /// Another replica appended up to `seq`: subscribers read the log.
    pub(super) fn wake(seq: i64) -> Self {
        Frame {
            first: seq,
            seq,
            bytes: Bytes::new(),
        }
    }

    /// `events` must be consecutive and non-empty.
    pub(super) fn run(events: &[StoredEvent]) -> Self {
        Frame {
            first: events[0].seq,
            seq: events[events.len() - 1].seq,
            bytes: frames(events),
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

/// A lifecycle wake-up (see [`Sequenced::is_wake`]).
pub(super) fn lifecycle_wake(seq: i64) -> StoredLifecycleEvent {
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
            .map(|batch| frames(batch.iter().map(|e| &**e)));
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
            payload:
                serde_json::json!({"sessionId": session_id, "from": after + 1, "to": next - 1})
                    .into(),
            created_at: chrono::Utc::now(),
        };
        page.insert(0, gap);
    }
    Ok(page)
}

/// An event as an SSE frame: `id`, `event` and one `data` line (JSON never contains a raw
/// newline).
pub(super) trait Framed {
    fn seq(&self) -> i64;
    fn kind(&self) -> &str;
    fn data(&self) -> &dyn std::fmt::Display;
}

impl Framed for StoredEvent {
    fn seq(&self) -> i64 {
        self.seq
    }
    fn kind(&self) -> &str {
        &self.kind
    }
    fn data(&self) -> &dyn std::fmt::Display {
        &self.payload
    }
}

impl Framed for StoredLifecycleEvent {
    fn seq(&self) -> i64 {
        self.seq
    }
    fn kind(&self) -> &str {
        &self.kind
    }
    fn data(&self) -> &dyn std::fmt::Display {
        &self.payload
    }
}

/// One event as its SSE frame (an event the gateway makes up for one stream, such as a
/// state snapshot).
pub fn frame(event: &StoredEvent) -> Bytes {
    frames([event])
}

/// `events` as consecutive frames in one buffer (delivered together, they become one write).
/// Lone surrogates are written as the escapes they came as ([`crate::surrogates`]).
fn frames<'a, E: Framed + 'a>(events: impl IntoIterator<Item = &'a E>) -> Bytes {
    use std::fmt::Write;
    let mut out = BytesMut::new();
    for e in events {
        // The event name comes from the agent: keep it on one line whatever it sends.
        let kind = e.kind();
        let kind = if kind.contains(['\n', '\r']) {
            std::borrow::Cow::Owned(kind.replace(['\n', '\r'], "_"))
        } else {
            std::borrow::Cow::Borrowed(kind)
        };
        let _ = write!(
            out,
            "id: {}\nevent: {kind}\ndata: {}\n\n",
            e.seq(),
            e.data()
        );
    }
    match crate::surrogates::restore(&out) {
        std::borrow::Cow::Borrowed(_) => out.freeze(),
        std::borrow::Cow::Owned(restored) => Bytes::from(restored),
    }
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

    #[test]
    fn frames_stay_well_formed_whatever_the_agent_names_its_updates() {
        let event = StoredEvent {
            session_id: "s".into(),
            seq: 7,
            kind: "evil\nevent: forged".into(),
            payload: serde_json::json!({"text": "two\nlines\r"}).into(),
            created_at: chrono::Utc::now(),
        };
        let frame = frames([&event]);
        assert_eq!(
            std::str::from_utf8(&frame).unwrap(),
            "id: 7\nevent: evil_event: forged\ndata: {\"text\":\"two\\nlines\\r\"}\n\n"
        );
    }
}
