//! [`PgStore`] itself: the pool, how a row's columns read, and how text without U+0000
//! crosses to PostgreSQL.

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::Row;
use std::str::FromStr;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};

use super::super::rows::{Columns, Native};
use crate::store::error::StoreResult;
use crate::store::event::Payload;

/// Connections in the pool.
pub(super) const MAX_CONNECTIONS: u32 = 10;
/// How long a query waits for a free connection before failing.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The store on a PostgreSQL database (a pool of [`MAX_CONNECTIONS`] connections).
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(super) pool: PgPool,
    /// The id of the replica this store serves: the tag of the notifications its appends send,
    /// by which it knows its own among those it receives.
    pub(super) replica: String,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`) and applies the migrations in `migrations/postgres`.
    /// `replica` tags the notifications of this store's appends (see
    /// [`EventLog::appended_elsewhere`](crate::store::contract::EventLog::appended_elsewhere)).
    pub async fn connect(url: &str, replica: &str) -> StoreResult<Self> {
        // One connection first: the pool would retry a refused one until its timeout, and then
        // say only that it timed out.
        let options = PgConnectOptions::from_str(url)?;
        let first = tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))
            .map_err(sqlx::Error::Io)??;
        let _ = first.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        super::super::migrations::migrator(super::super::migrations::POSTGRES)
            .run(&pool)
            .await?;
        Ok(Self {
            pool,
            replica: replica.to_owned(),
        })
    }
}

/// Timestamps come back as stored (`timestamptz`); JSON comes back as `jsonb`.
impl Columns for PgRow {
    fn get<T: Native>(&self, name: &str) -> StoreResult<T> {
        Ok(self.try_get(name)?)
    }
    fn time(&self, name: &str) -> StoreResult<DateTime<Utc>> {
        Ok(self.try_get(name)?)
    }
    fn opt_time(&self, name: &str) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(self.try_get(name)?)
    }
    fn json(&self, name: &str) -> StoreResult<Value> {
        unwrap_nul(self.try_get(name)?)
    }
    fn opt_json(&self, name: &str) -> StoreResult<Option<Value>> {
        self.try_get::<Option<Value>, _>(name)?
            .map(unwrap_nul)
            .transpose()
    }
    fn payload(&self, name: &str) -> StoreResult<Payload> {
        let raw: sqlx::types::Json<Box<RawValue>> = self.try_get(name)?;
        if raw.get().contains(NUL_SAFE) {
            let wrapped = serde_json::from_str(raw.get())
                .map_err(|e| crate::store::error::StoreError::Corrupt(format!("{name}: {e}")))?;
            return Ok(Payload::from_value(&unwrap_nul(wrapped)?));
        }
        Ok(Payload::from_raw(raw.0))
    }
    fn text(&self, name: &str) -> StoreResult<String> {
        Ok(text_out(self.try_get(name)?))
    }
    fn opt_text(&self, name: &str) -> StoreResult<Option<String>> {
        Ok(self.try_get::<Option<String>, _>(name)?.map(text_out))
    }
}

/// The escape mark in `text` columns: U+10FFFF, a noncharacter (reserved by Unicode for such
/// internal use). [`text_in`] writes U+0000 as the mark and `0`, and the mark itself twice.
pub(super) const TEXT_MARK: char = '\u{10FFFF}';

/// `text` as a `text` column takes it (see [`TEXT_MARK`]); borrowed when it holds neither
/// U+0000 nor the mark.
pub(in crate::store) fn text_in(text: &str) -> Cow<'_, str> {
    if !text.contains(['\0', TEXT_MARK]) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => out.extend([TEXT_MARK, '0']),
            TEXT_MARK => out.extend([TEXT_MARK, TEXT_MARK]),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// What [`text_in`] wrote, read back. A mark followed by anything else (a value stored before
/// there was an escape) is kept as it is.
pub(in crate::store) fn text_out(text: String) -> String {
    if !text.contains(TEXT_MARK) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (TEXT_MARK, Some('0')) => {
                chars.next();
                out.push('\0');
            }
            (TEXT_MARK, Some(&TEXT_MARK)) => {
                chars.next();
                out.push(TEXT_MARK);
            }
            (c, _) => out.push(c),
        }
    }
    out
}

/// The key of the wrapper that carries, as its JSON text, a value holding U+0000, which `jsonb`
/// refuses. Reserved: a stored value that is exactly such an object is read as its text.
pub(in crate::store) const NUL_SAFE: &str = "acp-gateway:json-with-nul";

/// `text` (a value's JSON) wrapped under [`NUL_SAFE`] when it holds U+0000; `None` otherwise. A
/// false positive (a literal `\u0000` in a string) is wrapped too, which is harmless: reading
/// unwraps it exactly.
pub(super) fn wrap_nul(text: &str) -> Option<Value> {
    text.contains("\\u0000")
        .then(|| serde_json::json!({ NUL_SAFE: text }))
}

/// `value` as `jsonb` takes it: itself, or wrapped as its JSON text ([`wrap_nul`]).
pub(super) fn nul_safe(value: &Value) -> std::borrow::Cow<'_, Value> {
    match wrap_nul(&value.to_string()) {
        Some(wrapped) => std::borrow::Cow::Owned(wrapped),
        None => std::borrow::Cow::Borrowed(value),
    }
}

/// A list of strings as `jsonb` takes it: itself, or its JSON text wrapped ([`wrap_nul`]) when
/// one holds U+0000.
pub(super) fn nul_safe_strings(list: &[String]) -> sqlx::types::Json<NulSafeStrings<'_>> {
    let wrapped = list
        .iter()
        .any(|s| s.contains('\0'))
        .then(|| wrap_nul(&serde_json::to_string(list).expect("strings serialize")))
        .flatten();
    sqlx::types::Json(match wrapped {
        Some(wrapped) => NulSafeStrings::Wrapped(wrapped),
        None => NulSafeStrings::List(list),
    })
}

/// See [`nul_safe_strings`].
#[derive(serde::Serialize)]
#[serde(untagged)]
pub(super) enum NulSafeStrings<'a> {
    List(&'a [String]),
    Wrapped(Value),
}

/// The JSON text of `value` for a `::jsonb` cast, wrapped as [`wrap_nul`] says.
pub(in crate::store) fn nul_safe_text(text: &str) -> Cow<'_, str> {
    match wrap_nul(text) {
        Some(wrapped) => Cow::Owned(wrapped.to_string()),
        None => Cow::Borrowed(text),
    }
}

pub(super) fn unwrap_nul(value: Value) -> StoreResult<Value> {
    match &value {
        Value::Object(o) if o.len() == 1 => match o.get(NUL_SAFE) {
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                crate::store::error::StoreError::Corrupt(format!("a wrapped JSON value: {e}"))
            }),
            _ => Ok(value),
        },
        _ => Ok(value),
    }
}
