//! The SQLite implementation of [`Store`] and [`HeldSessions`]: [`SqliteStore`].
//!
//! Schema: `migrations/sqlite`. Timestamps are stored as INTEGER unix microseconds (exact
//! ordering and keyset comparisons, lossless microsecond round trip), JSON as TEXT.
//!
//! Concurrency: a file database runs in WAL mode with two pools. All writes go through a
//! *writer* pool of exactly one connection, so writers of this process queue fairly inside sqlx
//! instead of racing for SQLite's write lock and polling it through the busy handler; reads use a
//! separate *reader* pool, which WAL lets run alongside the writer. Multi-statement writes still
//! open their transaction with `BEGIN IMMEDIATE`: the write lock is taken up front (waiting up to
//! the busy timeout if another process holds it) rather than on the first write, where a
//! deferred transaction would fail at once with `SQLITE_BUSY` if another process had written in
//! between. An in-memory database uses a single connection for everything, since a second
//! connection would not see the same database reliably.
//!
//! Files by use case: `sessions.rs` the session cache, `events.rs` the session event logs and
//! their writer, `lifecycle.rs` the lifecycle log, `replica.rs` the one gateway a file has (its
//! lock and the sessions it holds), `webhooks.rs` the webhook outbox's insert (which the appends
//! run) and claim; here the pools and the column conversions they share. What
//! runs alike on PostgreSQL (reads, retention, the list's statement, the row mapping) is written
//! once in `store/common.rs`, `store/listing.rs` and `store/rows.rs`.

#[macro_use]
mod webhooks;
mod events;
mod lifecycle;
pub(super) mod replica;
mod sessions;

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use super::rows::{Columns, Native};
use super::{Payload, StoreError, StoreResult};

/// Connections in the reader pool of a file database.
const READER_CONNECTIONS: u32 = 4;
/// How long SQLite waits for a lock held by another connection before `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a query waits for a free connection of its pool before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Opens a write transaction holding SQLite's write lock from the start.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// The store on an SQLite database: a single-connection writer pool and a reader pool (see the
/// module documentation).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    /// One connection serves everything (an in-memory database).
    in_memory: bool,
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
        let options = options
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);

        if in_memory {
            // One connection that never closes: the database lives exactly as long as its last
            // connection, and every query must see the same one.
            let pool = pool_options()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_with(options)
                .await?;
            super::migrations::migrator(super::migrations::SQLITE)
                .run(&pool)
                .await?;
            return Ok(Self {
                writer: pool.clone(),
                reader: pool,
                in_memory: true,
            });
        }

        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        let writer = pool_options()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        super::migrations::migrator(super::migrations::SQLITE)
            .run(&writer)
            .await?;
        let reader = pool_options()
            .max_connections(READER_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        Ok(Self {
            writer,
            reader,
            in_memory: false,
        })
    }
}

/// Pool settings shared by every pool. A connection is not pinged before each use: it is a
/// handle on a local file, not a socket that can go stale, and a ping is a round trip to the
/// connection's thread (two thread switches) before every query.
fn pool_options() -> SqlitePoolOptions {
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

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(micros: i64, what: &str) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: timestamp {micros} out of range")))
}

/// A JSON value as stored in a TEXT column (compact; writing a `Value` cannot fail).
fn to_json(value: &Value) -> String {
    value.to_string()
}

fn from_json(text: &str, what: &str) -> StoreResult<Value> {
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

impl_store!(SqliteStore {
    reads: reader,
    writes: writer,
    begin_write: begin_with(BEGIN_IMMEDIATE),
    time: micros,
    bind_session: sessions::bind_session,
    lock_session: sessions::LOCK_SESSION,
    prune_events_by_count: events::PRUNE_BY_COUNT,
    first_moves: sessions::FIRST_MOVES,
    synced_sessions: synced_sessions!("json_group_array(session_id)", "json_group_array(listed)"),
} {});
