//! Server-Sent Events on the wire: the hub's typed events written as SSE frames (`id`, `event`,
//! one `data` line), and the response that carries them with a keep-alive comment.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use crate::events::{Run, StoredEvent, StoredLifecycleEvent};

/// Keep-alive comment interval on every stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A batch of a session's stream as buffers, one per run: each run is encoded once, by the first
/// subscriber that writes it, and every other subscriber shares those bytes (never copied into a
/// buffer of its own). The connection writes what is ready together in one write: HTTP/1.1 as
/// one vectored write of its chunks, HTTP/2 as the frames of one flush.
pub fn session_frames(
    batch: Vec<Arc<Run>>,
) -> futures::stream::Iter<impl Iterator<Item = Bytes> + Send> {
    futures::stream::iter(batch.into_iter().map(|run| run.encoded(run_frames)))
}

/// A run's events as frames: the one encoding every [`Run`] is given.
fn run_frames(events: &[StoredEvent]) -> Bytes {
    frames(events)
}

/// A batch of the lifecycle stream as one buffer (one write).
pub fn lifecycle_frames(batch: &[Arc<StoredLifecycleEvent>]) -> Bytes {
    frames(batch.iter().map(|e| &**e))
}

/// An event as an SSE frame: `id`, `event` and one `data` line (JSON never contains a raw
/// newline).
trait Framed {
    /// Its id, event name and data.
    fn frame(&self) -> (i64, &str, &dyn std::fmt::Display);
}

impl Framed for StoredEvent {
    fn frame(&self) -> (i64, &str, &dyn std::fmt::Display) {
        (self.seq, &self.kind, &self.payload)
    }
}

impl Framed for StoredLifecycleEvent {
    fn frame(&self) -> (i64, &str, &dyn std::fmt::Display) {
        (self.seq, &self.kind, &self.payload)
    }
}

/// `events` as consecutive frames in one buffer (delivered together, they become one write).
/// Lone surrogates are written as the escapes they came as ([`crate::surrogates`]).
fn frames<'a, E: Framed + 'a>(events: impl IntoIterator<Item = &'a E>) -> Bytes {
    use std::fmt::Write;
    let mut out = BytesMut::new();
    for e in events {
        // The event name comes from the agent: keep it on one line whatever it sends.
        let (seq, kind, data) = e.frame();
        let kind = if kind.contains(['\n', '\r']) {
            std::borrow::Cow::Owned(kind.replace(['\n', '\r'], "_"))
        } else {
            std::borrow::Cow::Borrowed(kind)
        };
        let _ = write!(out, "id: {seq}\nevent: {kind}\ndata: {data}\n\n");
    }
    match crate::surrogates::restore(&out) {
        std::borrow::Cow::Borrowed(_) => out.freeze(),
        std::borrow::Cow::Owned(restored) => Bytes::from(restored),
    }
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

/// Whether `res` is an event stream (which layers that buffer or keep a body leave alone).
pub(super) fn is_event_stream(res: &axum::response::Response) -> bool {
    res.headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
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
