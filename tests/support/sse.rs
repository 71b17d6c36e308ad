//! One SSE reader for tests and benches: [`Sse`] splits a response body into frames in place
//! (a thousand bench subscribers cost their process little), and parses one into an
//! [`SseEvent`] only when asked; plus what tests compare streamed events with.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use serde_json::Value;

use super::PATIENCE;

/// One SSE event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: i64,
    pub event: String,
    pub data: Value,
}

/// An event stream over a reqwest body. Cancel-safe: a read dropped half-way loses nothing.
pub struct Sse {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    start: usize,
    frame_end: memchr::memmem::Finder<'static>,
}

impl Sse {
    /// Wraps a response whose body is an event stream.
    pub fn from_response(res: reqwest::Response) -> Sse {
        Sse {
            body: Box::pin(res.bytes_stream()),
            buf: Vec::new(),
            start: 0,
            frame_end: memchr::memmem::Finder::new(b"\n\n"),
        }
    }

    /// `GET url` for an event stream, resuming after `last_event_id` when given.
    pub fn request(
        http: &reqwest::Client,
        url: &str,
        last_event_id: Option<i64>,
    ) -> reqwest::RequestBuilder {
        let req = http.get(url).header("accept", "text/event-stream");
        match last_event_id {
            Some(id) => req.header("last-event-id", id.to_string()),
            None => req,
        }
    }

    /// Opens the stream at `url` after `last`, for a follower that reconnects until a deadline:
    /// `None`, after a short pause, when it cannot be opened now because a gateway is down (no
    /// answer: refused, or cut as its process died) or its store or the session's replica is
    /// (503). Any other answer fails the test at once.
    pub async fn reopen(http: &reqwest::Client, url: &str, last: i64) -> Option<Sse> {
        match Sse::request(http, url, Some(last)).send().await {
            Ok(r) if r.status() == 200 => return Some(Sse::from_response(r)),
            Ok(r) if r.status() == 503 => {}
            Err(e) if e.is_connect() || e.is_request() => {}
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                panic!("{url} after {last}: {status}, not a stream nor a gateway down: {body}");
            }
            Err(e) => panic!("{url} after {last}: {e:?}, not a stream nor a gateway down"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        None
    }

    /// Opens [`Sse::request`] without looking at the status (an error body ends at once).
    pub async fn open(http: &reqwest::Client, url: &str, last_event_id: Option<i64>) -> Sse {
        Sse::from_response(Sse::request(http, url, last_event_id).send().await.unwrap())
    }

    /// The next raw frame (without its blank line), or `None` when the stream ended.
    pub async fn next_frame(&mut self) -> Option<Frame<'_>> {
        let frame = loop {
            if let Some(end) = self.frame_end.find(&self.buf[self.start..]) {
                let frame = self.start..self.start + end;
                self.start += end + 2;
                break frame;
            }
            self.buf.drain(..self.start);
            self.start = 0;
            match self.body.next().await {
                Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                _ => return None,
            }
        };
        Some(Frame(&self.buf[frame]))
    }

    /// The next event (skipping comments), or `None` if the stream ended. Panics after PATIENCE.
    pub async fn next(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(PATIENCE, self.next_event())
            .await
            .expect("no SSE event within PATIENCE")
    }

    async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let frame = self.next_frame().await?;
            // A frame without an id is a keep-alive comment.
            if let Some(id) = frame.id() {
                return Some(SseEvent {
                    id,
                    event: frame.event().to_owned(),
                    data: serde_json::from_str(&frame.data()).unwrap(),
                });
            }
        }
    }

    /// Reads events until one named `event` arrives; returns all read, that one included.
    pub async fn until(&mut self, event: &str) -> Vec<SseEvent> {
        let mut out = vec![];
        loop {
            let e = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before {event}; got {out:?}"));
            let done = e.event == event;
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

/// One frame of an event stream, unparsed.
pub struct Frame<'a>(&'a [u8]);

impl<'a> Frame<'a> {
    fn field(&self, name: &str) -> impl Iterator<Item = &'a str> {
        let name = name.as_bytes();
        self.0.split(|b| *b == b'\n').filter_map(move |line| {
            let value = line.strip_prefix(name)?.strip_prefix(b":")?;
            let value = value.strip_prefix(b" ").unwrap_or(value);
            std::str::from_utf8(value).ok()
        })
    }

    /// Its `id:`, if it has one (events do, keep-alive comments do not).
    pub fn id(&self) -> Option<i64> {
        self.field("id").next()?.trim().parse().ok()
    }

    /// Its `event:`, `message` when it names none.
    pub fn event(&self) -> &'a str {
        self.field("event").next().map_or("message", str::trim)
    }

    /// Its `data:` lines, concatenated.
    pub fn data(&self) -> String {
        self.field("data").collect()
    }

    /// The whole frame as it arrived, for a reader that only searches it.
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// The last event of a `/history` page.
pub fn last_event(history: &Value) -> &Value {
    history["events"]
        .as_array()
        .and_then(|events| events.last())
        .unwrap_or_else(|| panic!("no events in {history}"))
}

/// The first of `events` named `name`; panics when there is none.
pub fn find_event<'a>(events: &'a [SseEvent], name: &str) -> &'a SseEvent {
    events
        .iter()
        .find(|e| e.event == name)
        .unwrap_or_else(|| panic!("no {name} in {events:?}"))
}

/// The `seq` of every event of a `/history` page, in page order.
pub fn seqs(history: &Value) -> Vec<i64> {
    history["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events in {history}"))
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect()
}

/// Streamed events as (id, event) pairs, to compare with [`super::Gateway::logged`].
pub fn positions(events: &[SseEvent]) -> Vec<(i64, String)> {
    events.iter().map(|e| (e.id, e.event.clone())).collect()
}

/// The text of `agent_message_chunk` events, concatenated.
pub fn chunk_text(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "agent_message_chunk")
        .map(|e| {
            e.data["update"]["content"]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}
