//! Fetched rows as the store's records, mapped once for both backends: [`Columns`] reads a row
//! by column name in the backend's own representation (PostgreSQL: `timestamptz` and `jsonb`;
//! SQLite: INTEGER unix microseconds and JSON text), and the mappers here build the records
//! from it; and a new session's record, as the gateway first writes it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Decode, Postgres, Sqlite, Type};

use super::error::{StoreError, StoreResult};
use super::event::{Payload, StoredEvent};
use super::records::{
    DeliveryRecord, Origin, People, SessionRecord, StoredLifecycleEvent, ToSync, WebhookRecord,
};

impl SessionRecord {
    /// A session as first recorded at `at`: no extra directories, title or `_meta`; not
    /// archived, deleted, synced or listed.
    pub fn new(
        session_id: String,
        tenant: String,
        cwd: String,
        agent: String,
        origin: Origin,
        at: DateTime<Utc>,
    ) -> Self {
        SessionRecord {
            session_id,
            tenant,
            cwd,
            additional_directories: Vec::new(),
            title: None,
            updated_at: at,
            created_at: at,
            meta: None,
            archived: false,
            origin,
            deleted_at: None,
            synced_at: None,
            listed: None,
            agent,
            people: People::default(),
        }
    }
}

/// A column type both backends store as the Rust type itself: text, integers, booleans, and
/// their `Option`s for nullable columns.
pub(crate) trait Native:
    for<'r> Decode<'r, Postgres> + Type<Postgres> + for<'r> Decode<'r, Sqlite> + Type<Sqlite>
{
}

impl<T> Native for T where
    T: for<'r> Decode<'r, Postgres> + Type<Postgres> + for<'r> Decode<'r, Sqlite> + Type<Sqlite>
{
}

/// A fetched row, read by column name; a value the backend cannot map is
/// [`StoreError::Corrupt`], naming the column.
pub(crate) trait Columns {
    fn get<T: Native>(&self, name: &str) -> StoreResult<T>;
    fn time(&self, name: &str) -> StoreResult<DateTime<Utc>>;
    fn opt_time(&self, name: &str) -> StoreResult<Option<DateTime<Utc>>>;
    fn json(&self, name: &str) -> StoreResult<Value>;
    fn opt_json(&self, name: &str) -> StoreResult<Option<Value>>;
    /// A JSON column as its text, unparsed where the backend allows.
    fn payload(&self, name: &str) -> StoreResult<Payload>;
    /// A text column holding what came from outside (a title, an event's kind), which a
    /// backend may have had to escape (PostgreSQL: U+0000).
    fn text(&self, name: &str) -> StoreResult<String> {
        self.get(name)
    }
    fn opt_text(&self, name: &str) -> StoreResult<Option<String>> {
        self.get(name)
    }
}

impl StoreError {
    /// `self`, a corrupt value's message saying which row it was read from.
    fn in_row(self, row: std::fmt::Arguments<'_>) -> Self {
        match self {
            StoreError::Corrupt(message) => StoreError::Corrupt(format!("{row}: {message}")),
            other => other,
        }
    }
}

/// A row of `sessions` (its [`session_columns!`]).
pub(crate) fn session_from(row: &impl Columns) -> StoreResult<SessionRecord> {
    let session_id: String = row.get("session_id")?;
    let at = |e: StoreError| e.in_row(format_args!("session {session_id:?}"));
    let dirs = row.json("additional_directories").map_err(at)?;
    let additional_directories = serde_json::from_value(dirs).map_err(|e| {
        at(StoreError::Corrupt(format!(
            "additional_directories is not an array of strings: {e}"
        )))
    })?;
    let origin: String = row.get("origin")?;
    Ok(SessionRecord {
        tenant: row.get("tenant")?,
        cwd: row.get("cwd")?,
        additional_directories,
        title: row.opt_text("title").map_err(at)?,
        updated_at: row.time("updated_at").map_err(at)?,
        created_at: row.time("created_at").map_err(at)?,
        meta: row.opt_json("meta").map_err(at)?,
        archived: row.get("archived")?,
        origin: Origin::parse(&origin)?,
        deleted_at: row.opt_time("deleted_at").map_err(at)?,
        synced_at: row.opt_time("synced_at").map_err(at)?,
        listed: row.get("listed")?,
        agent: row.get("agent")?,
        people: People {
            owner: row.get("owner")?,
            owner_name: row.opt_text("owner_name").map_err(at)?,
            who_answers: row.get("who_answers")?,
        },
        session_id,
    })
}

/// A row of `sessions_to_sync`: the listed id, and its row unless all NULL (an unknown id).
pub(crate) fn to_sync_from(row: &impl Columns) -> StoreResult<ToSync> {
    let known: Option<String> = row.get("session_id")?;
    Ok(ToSync {
        session_id: row.get("listed_id")?,
        cached: known.map(|_| session_from(row)).transpose()?,
    })
}

/// A row of `session_events`.
pub(crate) fn event_from(row: &impl Columns) -> StoreResult<StoredEvent> {
    let session_id: String = row.get("session_id")?;
    let seq: i64 = row.get("seq")?;
    let at = |e: StoreError| e.in_row(format_args!("event {seq} of session {session_id:?}"));
    Ok(StoredEvent {
        kind: row.text("kind").map_err(at)?,
        payload: row.payload("payload").map_err(at)?,
        created_at: row.time("created_at").map_err(at)?,
        session_id,
        seq,
    })
}

/// A row of `lifecycle_events`.
pub(crate) fn lifecycle_from(row: &impl Columns) -> StoreResult<StoredLifecycleEvent> {
    let seq: i64 = row.get("seq")?;
    let at = |e: StoreError| e.in_row(format_args!("lifecycle event {seq}"));
    Ok(StoredLifecycleEvent {
        seq,
        session_id: row.get("session_id")?,
        tenant: row.get("tenant")?,
        kind: row.get("kind")?,
        payload: row.json("payload").map_err(at)?,
        created_at: row.time("created_at").map_err(at)?,
    })
}

/// A row of `webhooks`, its columns named `prefix` and the column's name (a query that returns
/// a webhook beside another row names them apart).
pub(crate) fn webhook_from(row: &impl Columns, prefix: &str) -> StoreResult<WebhookRecord> {
    let name = |column: &str| format!("{prefix}{column}");
    let id: String = row.get(&name("id"))?;
    let at = |e: StoreError| e.in_row(format_args!("webhook {id:?}"));
    let events = row.json(&name("events")).map_err(at)?;
    let events = serde_json::from_value(events).map_err(|e| {
        at(StoreError::Corrupt(format!(
            "events is not an array of strings: {e}"
        )))
    })?;
    Ok(WebhookRecord {
        tenant: row.get(&name("tenant"))?,
        admin: row.get(&name("admin"))?,
        url: row.get(&name("url"))?,
        events,
        session_id: row.get(&name("session_id"))?,
        description: row.get(&name("description"))?,
        secret: row.get(&name("secret"))?,
        enabled: row.get(&name("enabled"))?,
        disabled_reason: row.get(&name("disabled_reason"))?,
        created_at: row.time(&name("created_at")).map_err(at)?,
        updated_at: row.time(&name("updated_at")).map_err(at)?,
        id,
    })
}

/// A row of `webhook_deliveries`.
pub(crate) fn delivery_from(row: &impl Columns) -> StoreResult<DeliveryRecord> {
    let id: i64 = row.get("id")?;
    let at = |e: StoreError| e.in_row(format_args!("webhook delivery {id}"));
    Ok(DeliveryRecord {
        id,
        webhook_id: row.get("webhook_id")?,
        message_id: row.get("message_id")?,
        session_id: row.get("session_id")?,
        tenant: row.get("tenant")?,
        seq: row.get("seq")?,
        kind: row.text("kind").map_err(at)?,
        payload: row.json("payload").map_err(at)?,
        event_at: row.time("event_at").map_err(at)?,
        status: row.get("status")?,
        attempts: row.get("attempts")?,
        next_attempt_at: row.time("next_attempt_at").map_err(at)?,
        retry_from: row.time("retry_from").map_err(at)?,
        last_status: row.get("last_status")?,
        last_body: row.get("last_body")?,
        last_error: row.get("last_error")?,
        created_at: row.time("created_at").map_err(at)?,
        updated_at: row.time("updated_at").map_err(at)?,
    })
}
