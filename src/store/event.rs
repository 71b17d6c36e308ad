//! A session log's events, and their payload as the JSON text it is stored and streamed as:
//! written once, from the agent's line or a gateway value, then shared (not copied, not
//! re-serialised) by the log writer's insert, every live subscriber's frame and the history;
//! and how a backend's log writer appends them ([`LogWriter`], [`Batch`]).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound, Utc};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::error::{StoreError, StoreResult};

/// An event to append to a session's log.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The SSE event name: the ACP `sessionUpdate` tag or a gateway event name.
    pub kind: String,
    pub payload: Payload,
}

/// An event as stored, with its per-session sequence number (1, 2, 3… without gaps).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub session_id: String,
    pub seq: i64,
    pub kind: String,
    pub payload: Payload,
    pub created_at: DateTime<Utc>,
}

/// A stretch of a session's log, `(after, upto)`: the events with `after < seq <= upto`.
pub type SeqRange = (i64, i64);

/// A JSON value held as its text. Cloning shares it. Two payloads are equal when their values
/// are (the text of one read back from PostgreSQL's `jsonb` is spaced and ordered differently).
#[derive(Clone)]
pub struct Payload(Arc<RawValue>);

impl Payload {
    /// The text of `value`.
    pub fn from_value(value: &Value) -> Self {
        Payload(
            serde_json::value::to_raw_value(value)
                .expect("a Value serialises")
                .into(),
        )
    }

    /// `text` if it is one JSON value.
    pub fn from_text(text: String) -> serde_json::Result<Self> {
        Ok(Payload(RawValue::from_string(text)?.into()))
    }

    /// A piece of JSON already parsed (a value inside an agent's line).
    pub fn from_raw(raw: Box<RawValue>) -> Self {
        Payload(raw.into())
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The value, parsed.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).expect("a payload holds JSON")
    }
}

impl From<Value> for Payload {
    fn from(value: Value) -> Self {
        Payload::from_value(&value)
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str() || self.to_value() == other.to_value()
    }
}

impl PartialEq<Value> for Payload {
    fn eq(&self, other: &Value) -> bool {
        &self.to_value() == other
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Written as the JSON it holds.
impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(|raw| Payload(raw.into()))
    }
}

/// One append to a session's log, as every backend starts it: its events (never none), their
/// count (as the databases' integer), the `created_at` they share, at the microsecond precision
/// both backends store, and the `touch` of [`LogWriter::append`].
pub struct Batch<'a> {
    pub(super) session_id: &'a str,
    pub(super) events: &'a [NewEvent],
    pub(super) count: i64,
    pub(super) created_at: DateTime<Utc>,
    pub(super) touch: Option<DateTime<Utc>>,
}

impl<'a> Batch<'a> {
    /// `None` for no events: nothing to append.
    pub(super) fn new(
        session_id: &'a str,
        events: &'a [NewEvent],
        touch: Option<DateTime<Utc>>,
    ) -> StoreResult<Option<Self>> {
        if events.is_empty() {
            return Ok(None);
        }
        let count = i64::try_from(events.len())
            .map_err(|_| StoreError::Corrupt("too many events in one append".into()))?;
        Ok(Some(Batch {
            session_id,
            events,
            count,
            created_at: Utc::now().trunc_subsecs(6),
            touch,
        }))
    }

    /// The sequence number of the first event when the log's counter, raised by the batch,
    /// reads `last`.
    pub(super) fn first(&self, last: i64) -> i64 {
        last - self.count + 1
    }

    /// The events as stored, once the log's counter, raised by the batch, reads `last`.
    pub(super) fn stored(&self, last: i64) -> Vec<StoredEvent> {
        self.events
            .iter()
            .zip(self.first(last)..)
            .map(|(event, seq)| StoredEvent {
                session_id: self.session_id.to_owned(),
                seq,
                kind: event.kind.clone(),
                payload: event.payload.clone(),
                created_at: self.created_at,
            })
            .collect()
    }
}

/// What [`LogWriter::append_all`] stored: each group's events, in the groups' order.
pub type BatchesStored = Vec<Vec<StoredEvent>>;

/// See [`EventLog::log_writer`](crate::store::contract::EventLog::log_writer).
#[async_trait]
pub trait LogWriter: Send {
    /// As [`EventLog::append_events`](crate::store::contract::EventLog::append_events). With
    /// `touch`, the session's `updated_at` is also raised to at least `touch` in the same
    /// transaction (a prompt's activity, recorded with its `turn_started`); a tombstoned or unknown
    /// session is left alone.
    async fn append(
        &mut self,
        session_id: &str,
        events: &[NewEvent],
        touch: Option<DateTime<Utc>>,
    ) -> StoreResult<Vec<StoredEvent>> {
        match Batch::new(session_id, events, touch)? {
            Some(batch) => self.append_batch(&batch).await,
            None => Ok(Vec::new()),
        }
    }

    /// Appends a batch (see [`LogWriter::append`]), which only the store can make.
    async fn append_batch(&mut self, batch: &Batch<'_>) -> StoreResult<Vec<StoredEvent>>;

    /// Appends several sessions' events, each as [`LogWriter::append`], in one transaction (all
    /// or none). `None`: this writer cannot (or a group is empty); each goes alone then.
    async fn append_all(
        &mut self,
        groups: &[(&str, &[NewEvent], Option<DateTime<Utc>>)],
    ) -> Option<StoreResult<BatchesStored>> {
        let mut batches = Vec::with_capacity(groups.len());
        for &(session_id, events, touch) in groups {
            match Batch::new(session_id, events, touch) {
                Ok(batch) => batches.push(batch?),
                Err(e) => return Some(Err(e)),
            }
        }
        self.append_batches(&batches).await
    }

    /// [`LogWriter::append_all`] of batches; `None` by default (a writer that cannot).
    async fn append_batches(&mut self, _: &[Batch<'_>]) -> Option<StoreResult<BatchesStored>> {
        None
    }
}
