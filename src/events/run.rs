//! What the hub carries to subscribers: a [`Run`] of a session's consecutive events (one per
//! commit, shared by every live subscriber and encoded once), the lifecycle events, and what
//! both are to a stream following a log ([`Sequenced`]), wake-ups from other replicas included.

use std::sync::OnceLock;
use std::time::Instant;

use bytes::Bytes;

use crate::store::{StoredEvent, StoredLifecycleEvent};

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

/// Consecutive session events, shared by every live subscriber: the writer broadcasts one per
/// committed batch, so a thousand subscribers are woken once per batch rather than once per
/// event, and the run keeps one encoding of its events, made by the first subscriber that
/// asks ([`Run::encoded`]), which the others share.
pub struct Run {
    first: i64,
    seq: i64,
    events: Events,
    encoded: OnceLock<Bytes>,
    /// When the writer committed it (a run read from the log or made up has none).
    committed_at: Option<Instant>,
}

/// A run's events: one read from the log (held inline, no allocation of its own), a committed
/// batch, or none (a wake-up).
enum Events {
    One(StoredEvent),
    Many(Vec<StoredEvent>),
}

impl Run {
    /// One event: read from the log, or made up for one stream (such as a state snapshot).
    pub fn one(event: StoredEvent) -> Self {
        Run {
            first: event.seq,
            seq: event.seq,
            events: Events::One(event),
            encoded: OnceLock::new(),
            committed_at: None,
        }
    }

    /// Another replica appended up to `seq`: subscribers read the log.
    pub(super) fn wake(seq: i64) -> Self {
        Run {
            first: seq,
            seq,
            events: Events::Many(Vec::new()),
            encoded: OnceLock::new(),
            committed_at: None,
        }
    }

    /// `events` must be consecutive and non-empty.
    pub(super) fn committed(events: Vec<StoredEvent>) -> Self {
        Run {
            first: events[0].seq,
            seq: events[events.len() - 1].seq,
            events: Events::Many(events),
            encoded: OnceLock::new(),
            committed_at: Some(Instant::now()),
        }
    }

    /// When the writer committed it, if it did (not a run read from the log).
    pub fn committed_at(&self) -> Option<Instant> {
        self.committed_at
    }

    /// The events, in order.
    pub fn events(&self) -> &[StoredEvent] {
        match &self.events {
            Events::One(event) => std::slice::from_ref(event),
            Events::Many(events) => events,
        }
    }

    /// The events' encoding: `encode` of them the first time, the same bytes (shared, not
    /// copied) every time after. There is one encoding per run, whoever asks: every caller
    /// passes the same `encode`.
    pub fn encoded(&self, encode: impl FnOnce(&[StoredEvent]) -> Bytes) -> Bytes {
        self.encoded.get_or_init(|| encode(self.events())).clone()
    }
}

impl Sequenced for Run {
    fn seq(&self) -> i64 {
        self.seq
    }
    fn first_seq(&self) -> i64 {
        self.first
    }
    fn is_wake(&self) -> bool {
        self.events().is_empty()
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn a_run_is_encoded_once_and_the_encoding_is_shared() {
        let event = |seq| StoredEvent {
            session_id: "s".into(),
            seq,
            kind: "k".into(),
            payload: serde_json::json!({}).into(),
            created_at: chrono::Utc::now(),
        };
        let run = Run::committed(vec![event(3), event(4)]);
        assert_eq!((run.first_seq(), run.seq(), run.is_wake()), (3, 4, false));
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let encode = |events: &[StoredEvent]| {
            calls.fetch_add(1, Ordering::Relaxed);
            Bytes::from(format!("{} events", events.len()))
        };
        let (a, b) = (run.encoded(encode), run.encoded(encode));
        assert_eq!(a, "2 events");
        assert_eq!(a.as_ptr(), b.as_ptr(), "the same bytes, not a copy");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert!(Run::wake(9).is_wake());
        assert_eq!(Run::one(event(5)).events().len(), 1);
    }
}
