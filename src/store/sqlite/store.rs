//! [`SqliteStore`] itself: the pools, the connection settings, and the column conversions the files share.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use super::super::rows::{Columns, Native};
use crate::store::error::{StoreError, StoreResult};
use crate::store::event::Payload;

/// Connections in the reader pool of a file database.
pub(super) const READER_CONNECTIONS: u32 = 4;
/// How long SQLite waits for a lock held by another connection before `SQLITE_BUSY`.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a query waits for a free connection of its pool before failing.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Opens a write transaction holding SQLite's write lock from the start.
pub(super) const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// The store on an SQLite database: a single-connection writer pool and a reader pool (see the
/// module documentation).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(super) writer: SqlitePool,
    pub(super) reader: SqlitePool,
    /// One connection serves everything (an in-memory database).
    pub(super) in_memory: bool,
}

impl SqliteStore {
    /// Opens (creating it when missing) the database named by `url` and applies the migrations
    /// in `migrations/sqlite`. Accepted forms: `sqlite:PATH`, `sqlite://PATH` (both may carry
    /// SQLite URI parameters such as `?mode=ro`), `sqlite::memory:` / `:memory:` for a private
    /// in-memory database, or a plain file path (taken literally).
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let (options, in_memory) = parse_url(url)?;
        Self::open(options, in_memory).await
    }

    /// Opens the database `options` name, as [`SqliteStore::connect`] does its URL's.
    pub(crate) async fn open(options: SqliteConnectOptions, in_memory: bool) -> StoreResult<Self> {
        let mut options = options
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let mut writer = pool_options()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT);
        if in_memory {
            // One connection that never closes: the database lives exactly as long as its last
            // connection, and every query must see the same one.
            writer = writer
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        } else {
            options = options
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
        }
        let writer = writer.connect_with(options.clone()).await?;
        super::super::migrations::migrator(super::super::migrations::SQLITE)
            .run(&writer)
            .await?;
        let reader = if in_memory {
            writer.clone()
        } else {
            pool_options()
                .max_connections(READER_CONNECTIONS)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await?
        };
        Ok(Self {
            writer,
            reader,
            in_memory,
        })
    }
}

/// Pool settings shared by every pool. A connection is not pinged before each use: it is a
/// handle on a local file, not a socket that can go stale, and a ping is a round trip to the
/// connection's thread (two thread switches) before every query.
pub(super) fn pool_options() -> SqlitePoolOptions {
    SqlitePoolOptions::new().test_before_acquire(false)
}

/// Connect options for `url`, and whether it names an in-memory database.
pub(crate) fn parse_url(url: &str) -> StoreResult<(SqliteConnectOptions, bool)> {
    if url == ":memory:" {
        return Ok((SqliteConnectOptions::from_str(url)?, true));
    }
    let Some(rest) = url.strip_prefix("sqlite:") else {
        return Ok((SqliteConnectOptions::new().filename(url), false));
    };
    // The same split as sqlx's own parser, which does the actual work.
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    let in_memory = database == ":memory:" || params.split('&').any(|p| p == "mode=memory");
    Ok((SqliteConnectOptions::from_str(url)?, in_memory))
}

pub(super) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub(super) fn from_micros(micros: i64, what: &str) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: timestamp {micros} out of range")))
}

/// A JSON value as stored in a TEXT column (compact; writing a `Value` cannot fail).
pub(super) fn to_json(value: &Value) -> String {
    value.to_string()
}

pub(super) fn from_json(text: &str, what: &str) -> StoreResult<Value> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: bad JSON: {e}")))
}

/// Timestamps are INTEGER unix microseconds; JSON is text.
impl Columns for SqliteRow {
    fn get<T: Native>(&self, name: &str) -> StoreResult<T> {
        Ok(self.try_get(name)?)
    }
    fn time(&self, name: &str) -> StoreResult<DateTime<Utc>> {
        from_micros(self.try_get(name)?, name)
    }
    fn opt_time(&self, name: &str) -> StoreResult<Option<DateTime<Utc>>> {
        let micros: Option<i64> = self.try_get(name)?;
        micros.map(|m| from_micros(m, name)).transpose()
    }
    fn json(&self, name: &str) -> StoreResult<Value> {
        from_json(self.try_get(name)?, name)
    }
    fn opt_json(&self, name: &str) -> StoreResult<Option<Value>> {
        let text: Option<&str> = self.try_get(name)?;
        text.map(|t| from_json(t, name)).transpose()
    }
    fn payload(&self, name: &str) -> StoreResult<Payload> {
        Payload::from_text(self.try_get(name)?)
            .map_err(|e| StoreError::Corrupt(format!("{name}: bad JSON: {e}")))
    }
}
