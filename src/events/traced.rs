//! Which trace a session's appends belong to, while traces are exported: a running turn names
//! its span ([`Traced::begin`]), each append queued meanwhile carries it, and the log
//! writer writes each batch in a `log write` span per turn it carries, that turn's child. So an
//! operator reading a turn's trace sees when, and in how many commits, its events were stored.
//! With traces off nothing is looked up or carried.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::Span;

/// The spans of the sessions whose appends are traced ([`EventHub::traced`](super::EventHub::traced)).
#[derive(Default)]
pub struct Traced {
    /// Whether a span is sampled: set once, when traces are exported.
    sampled: OnceLock<fn(&Span) -> bool>,
    spans: Mutex<HashMap<String, Span>>,
    /// How many sessions are traced now: an append looks no further while there are none.
    traced: AtomicUsize,
}

impl Traced {
    /// Traces are exported: appends made during a turn whose span is `sampled` are written in
    /// its trace.
    pub fn turn_on(&self, sampled: fn(&Span) -> bool) {
        let _ = self.sampled.set(sampled);
    }

    /// From now on, until [`Traced::end`], the session's appends belong to `span` (its running
    /// turn's). Nothing while traces are off, or when `span` is not sampled.
    pub fn begin(&self, session_id: &str, span: &Span) {
        if self.sampled.get().is_some_and(|sampled| sampled(span)) {
            let mut spans = self.spans.lock().expect("traced spans lock");
            if spans.insert(session_id.to_owned(), span.clone()).is_none() {
                self.traced.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The session's appends belong to no span any more (its turn has queued its last one).
    pub fn end(&self, session_id: &str) {
        if self.traced.load(Ordering::Relaxed) > 0 {
            let mut spans = self.spans.lock().expect("traced spans lock");
            if spans.remove(session_id).is_some() {
                self.traced.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The span the session's appends belong to now (its running turn's), if traced: the
    /// parent of what else the turn waits for.
    pub fn of(&self, session_id: &str) -> Option<Span> {
        if self.traced.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let spans = self.spans.lock().expect("traced spans lock");
        spans.get(session_id).cloned()
    }
}

/// One `log write` span for each span a session's items in a batch carry (consecutive items of
/// one turn share it), that span's child: entered by no one, ended when dropped, after the
/// write. `parents`: the span of each of the session's events in the batch, if it has one;
/// `batch`: the number of events in the whole batch.
pub(super) fn write_spans<'a>(
    session_id: &str,
    parents: impl Iterator<Item = Option<&'a Span>>,
    batch: usize,
) -> Vec<Span> {
    // Each parent's id, its child and the events the child writes.
    let mut out: Vec<(Option<tracing::Id>, Span, usize)> = Vec::new();
    for parent in parents.flatten() {
        match out.last_mut() {
            Some((id, _, n)) if *id == parent.id() => *n += 1,
            _ => {
                let span = tracing::info_span!(
                    parent: parent,
                    "log write",
                    session_id,
                    events = tracing::field::Empty,
                    batch_events = batch as i64,
                );
                out.push((parent.id(), span, 1));
            }
        }
    }
    // (Integers as `i64`: OpenTelemetry has no unsigned attributes.)
    out.into_iter()
        .map(|(_, span, n)| {
            span.record("events", n as i64);
            span
        })
        .collect()
}
