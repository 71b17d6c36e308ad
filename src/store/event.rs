//! A session log's events, and their payload as the JSON text it is stored and streamed as:
//! written once, from the agent's line or a gateway value, then shared (not copied, not
//! re-serialised) by the log writer's insert, every live subscriber's frame and the history.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

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
