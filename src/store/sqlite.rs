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

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound, Utc};
use serde_json::Value;
use sqlx::query::Query;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite};

use super::{
    HeldSessions, ListQuery, Listed, LogWriter, NewEvent, NewLifecycleEvent, Origin, SessionList,
    SessionMutation, SessionRecord, Store, StoreError, StoreResult, StoredEvent,
    StoredLifecycleEvent, batch_of, merge_page, numbered,
};

/// Connections in the reader pool of a file database.
const READER_CONNECTIONS: u32 = 4;
/// How long SQLite waits for a lock held by another connection before `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a query waits for a free connection of its pool before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Rows per multi-row `INSERT` (5 parameters each, far below SQLite's 32 766 limit).
const INSERT_CHUNK: usize = 1000;
/// Opens a write transaction holding SQLite's write lock from the start.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";
/// Appends of up to this many events keep their (multi-statement) query prepared.
const PREPARED_BATCH: usize = 4;

/// The `sessions` columns, in the order [`session_from_row`] and [`bind_session`] use.
macro_rules! session_columns {
    () => {
        "session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
         archived, origin, deleted_at, synced_at"
    };
}

const PUT_SESSION: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
     ON CONFLICT (session_id) DO UPDATE SET \
     tenant = excluded.tenant, cwd = excluded.cwd, \
     additional_directories = excluded.additional_directories, title = excluded.title, \
     updated_at = excluded.updated_at, created_at = excluded.created_at, meta = excluded.meta, \
     archived = excluded.archived, origin = excluded.origin, deleted_at = excluded.deleted_at, \
     synced_at = excluded.synced_at \
     WHERE sessions.deleted_at IS NULL"
);

const GET_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = ?"
);

/// Parameters as in [`bind_session`] but with the key (`session_id`) last.
const UPDATE_SESSION: &str = "UPDATE sessions SET tenant = ?, cwd = ?, \
     additional_directories = ?, title = ?, updated_at = ?, created_at = ?, meta = ?, \
     archived = ?, origin = ?, deleted_at = ?, synced_at = ? WHERE session_id = ?";

const TOMBSTONE_LIVE: &str =
    "UPDATE sessions SET deleted_at = ? WHERE session_id = ? AND deleted_at IS NULL";

/// A bare tombstone for an id the cache does not know. Such an id can only have come from the
/// agent, hence `origin = 'upstream'`.
const INSERT_TOMBSTONE: &str = "INSERT INTO sessions \
     (session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
      archived, origin, deleted_at, synced_at) \
     VALUES (?1, ?2, '', '[]', NULL, ?3, ?3, NULL, 0, 'upstream', ?3, NULL) \
     ON CONFLICT (session_id) DO NOTHING";

const BUMP_SEQ: &str = "INSERT INTO session_seqs (session_id, last_seq) VALUES (?, ?) \
     ON CONFLICT (session_id) DO UPDATE SET last_seq = session_seqs.last_seq + excluded.last_seq \
     RETURNING last_seq";

/// Followed by `(ordinal, kind, payload)` rows and [`INSERT_EVENTS_TAIL`]; binds the session id,
/// the batch's event count and `created_at`, then the rows, then the session id again. Row
/// `ordinal` (from 1) gets sequence number `last_seq - count + ordinal`.
const INSERT_EVENTS_HEAD: &str = " INSERT INTO session_events \
     (session_id, seq, kind, payload, created_at) \
     SELECT ?, s.last_seq - ? + v.column1, v.column2, v.column3, ? FROM (VALUES ";
const INSERT_EVENTS_TAIL: &str = ") v, session_seqs s WHERE s.session_id = ?;";
/// Binds `updated_at`, the session id, `updated_at`; a no-op unless it raises `updated_at`.
const TOUCH_SESSION: &str = " UPDATE sessions SET updated_at = ? \
     WHERE session_id = ? AND deleted_at IS NULL AND updated_at < ?;";

const READ_EVENTS: &str = "SELECT session_id, seq, kind, payload, created_at FROM session_events \
     WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?";

const PRUNE_BY_COUNT: &str = "DELETE FROM session_events WHERE seq <= \
     (SELECT s.last_seq FROM session_seqs s WHERE s.session_id = session_events.session_id) - ?";
const PRUNE_BY_AGE: &str = "DELETE FROM session_events WHERE created_at < ?";
const LAST_EVENT_SEQ: &str =
    "SELECT COALESCE((SELECT last_seq FROM session_seqs WHERE session_id = ?), 0)";

const INSERT_LIFECYCLE: &str = "INSERT INTO lifecycle_events \
     (session_id, tenant, kind, payload, created_at) VALUES (?, ?, ?, ?, ?) RETURNING seq";

const READ_LIFECYCLE_ALL: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE seq > ? ORDER BY seq LIMIT ?";

const READ_LIFECYCLE_TENANT: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE tenant = ? AND seq > ? ORDER BY seq LIMIT ?";

const LAST_LIFECYCLE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM lifecycle_events";

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
            sqlx::migrate!("migrations/sqlite").run(&pool).await?;
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
        sqlx::migrate!("migrations/sqlite").run(&writer).await?;
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

/// The log writer of an SQLite store: a connection of its own beside the writer pool (SQLite's
/// write lock serializes the two; appends and metadata writes are short). An in-memory database
/// has one connection for everything, so there it takes the pool's in turn.
///
/// Its own connection is a `rusqlite` one, used on the calling thread: the event log's writer
/// has a thread to itself (see `events`), and an append there is a few library calls, where an
/// sqlx connection would hand every command to its worker thread and wake the caller for each
/// result (a dozen thread switches per prompt, each tens of microseconds of CPU on a VM).
///
/// It does not checkpoint the WAL when a commit crosses SQLite's threshold of a thousand pages
/// (`wal_autocheckpoint = 0`): copying that much back into the database in one go would land on
/// one append and, on a small machine, take the CPU from a prompt in flight. Instead it runs a
/// passive checkpoint itself every [`CHECKPOINT_EVERY`] appends, right after a commit, copying
/// a dozen pages or so each time; being the only writer, it always copies everything, and its
/// next transaction starts the WAL file over, so the file stays small.
struct SqliteLogWriter {
    pool: SqlitePool,
    /// Use the pool's connection (an in-memory database).
    shared: bool,
    own: Option<rusqlite::Connection>,
    /// Appends since the last checkpoint.
    appends: u32,
}

/// Appends between two checkpoints of the log writer's connection.
///
/// Each checkpoint syncs the WAL and the database file, and what a sync has to write grows with
/// the appends since the last one; a sync's pause fell on about one prompt in ten at 32, which
/// showed in the prompt's p99 (0.9–1.4 ms added with the agent alone on a core, 0.45–0.6 ms at 8;
/// `bench/latency.sh`).
const CHECKPOINT_EVERY: u32 = 8;

/// One event of an append, numbered by the caller (see [`append_here`]).
const INSERT_EVENT: &str = "INSERT INTO session_events \
     (session_id, seq, kind, payload, created_at) VALUES (?, ?, ?, ?, ?)";

#[async_trait]
impl LogWriter for SqliteLogWriter {
    async fn append(
        &mut self,
        session_id: &str,
        events: &[NewEvent],
        touch: Option<DateTime<Utc>>,
    ) -> StoreResult<Vec<StoredEvent>> {
        if self.shared {
            let mut conn = self.pool.acquire().await?;
            return append_on(&mut conn, session_id, events, touch).await;
        }
        let conn = match &mut self.own {
            Some(conn) => conn,
            own => own.insert(open_log_connection(
                self.pool.connect_options().get_filename(),
            )?),
        };
        let appended = append_here(conn, session_id, events, touch);
        self.appends += 1;
        if appended.is_ok() && self.appends >= CHECKPOINT_EVERY {
            self.appends = 0;
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::warn!(error = %e, "WAL checkpoint failed");
            }
        }
        if appended.is_err() {
            self.own = None;
        }
        appended
    }
}

/// The log writer's own connection to the database file the pool was opened on (it exists:
/// the pool has run the migrations), with the pool's busy timeout and durability.
fn open_log_connection(path: &std::path::Path) -> StoreResult<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

/// Appends `events` (and applies `touch`, see [`LogWriter::append`]) on `conn`, on this thread,
/// in one `BEGIN IMMEDIATE` transaction (rolled back when dropped on an error): the bump
/// returns the new last sequence number, from which the events are numbered.
fn append_here(
    conn: &mut rusqlite::Connection,
    session_id: &str,
    events: &[NewEvent],
    touch: Option<DateTime<Utc>>,
) -> StoreResult<Vec<StoredEvent>> {
    let Some((count, created_at)) = batch_of(events)? else {
        return Ok(Vec::new());
    };
    let created_micros = micros(created_at);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let last: i64 = tx
        .prepare_cached(BUMP_SEQ)?
        .query_row((session_id, count), |row| row.get(0))?;
    let first = last - count + 1;
    {
        let mut insert = tx.prepare_cached(INSERT_EVENT)?;
        for (seq, event) in (first..).zip(events) {
            let payload = to_json(&event.payload);
            insert.execute((session_id, seq, &event.kind, payload, created_micros))?;
        }
    }
    if let Some(at) = touch {
        let at = micros(at);
        tx.prepare_cached(TOUCH_SESSION)?
            .execute((at, session_id, at))?;
    }
    tx.commit()?;
    Ok(numbered(session_id, events, first, created_at))
}

/// Appends `events` (and applies `touch`, see [`LogWriter::append`]) on `conn`, in one
/// transaction sent as one command: the connection's thread runs it without coming back
/// between statements (a round trip costs two thread wake-ups), and SQLite's write lock is
/// never held while a task waits to be polled, so a `rusqlite` log writer blocking a runtime
/// thread on that lock cannot stall it. The inserts number their rows from the counter the bump
/// has just raised.
async fn append_on(
    conn: &mut SqliteConnection,
    session_id: &str,
    events: &[NewEvent],
    touch: Option<DateTime<Utc>>,
) -> StoreResult<Vec<StoredEvent>> {
    let Some((count, created_at)) = batch_of(events)? else {
        return Ok(Vec::new());
    };
    let payloads: Vec<String> = events.iter().map(|event| to_json(&event.payload)).collect();
    let created_micros = micros(created_at);

    let mut sql = format!("{BEGIN_IMMEDIATE}; {BUMP_SEQ};");
    for chunk in events.chunks(INSERT_CHUNK) {
        sql.push_str(INSERT_EVENTS_HEAD);
        sql.push_str(&vec!["(?, ?, ?)"; chunk.len()].join(", "));
        sql.push_str(INSERT_EVENTS_TAIL);
    }
    if touch.is_some() {
        sql.push_str(TOUCH_SESSION);
    }
    sql.push_str(" COMMIT");
    let mut query = sqlx::query(&sql)
        .persistent(events.len() <= PREPARED_BATCH)
        .bind(session_id)
        .bind(count);
    for (start, chunk) in (0..).step_by(INSERT_CHUNK).zip(events.chunks(INSERT_CHUNK)) {
        query = query.bind(session_id).bind(count).bind(created_micros);
        for (k, (event, payload)) in chunk.iter().zip(&payloads[start..]).enumerate() {
            query = query
                .bind(i64::try_from(start + k + 1).unwrap_or(i64::MAX))
                .bind(&event.kind)
                .bind(payload);
        }
        query = query.bind(session_id);
    }
    if let Some(at) = touch {
        let at = micros(at);
        query = query.bind(at).bind(session_id).bind(at);
    }
    let rows = match query.fetch_all(&mut *conn).await {
        Ok(rows) => rows,
        Err(e) => {
            // Whichever statement failed, the transaction must not stay open on the connection.
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            return Err(e.into());
        }
    };
    let last: i64 = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("the sequence bump returned no row".into()))?
        .try_get(0)?;
    Ok(numbered(session_id, events, last - count + 1, created_at))
}

/// Pool settings shared by every pool. A connection is not pinged before each use: it is a
/// handle on a local file, not a socket that can go stale, and a ping is a round trip to the
/// connection's thread (two thread switches) before every query.
fn pool_options() -> SqlitePoolOptions {
    SqlitePoolOptions::new().test_before_acquire(false)
}

/// Held for as long as one gateway serves an SQLite database file: a second gateway on the same
/// file is refused, since each gateway assumes it is its database's only writer (the
/// list-page cache, the event writer). Released when dropped, or when the process ends.
#[derive(Debug)]
pub struct ReplicaLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Takes the [`ReplicaLock`] of the SQLite database `url` names (`None` for an in-memory
/// database, which no other process can open): an advisory lock on `<database>.gateway-lock`.
pub fn lock_single_replica(url: &str) -> anyhow::Result<Option<ReplicaLock>> {
    let (options, in_memory) = parse_url(url)?;
    if in_memory {
        return Ok(None);
    }
    let mut path = options.get_filename().as_os_str().to_owned();
    path.push(".gateway-lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(ReplicaLock { _lock: lock })),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => anyhow::bail!(
            "another gateway is already serving the SQLite database {}: SQLite allows one \
             gateway replica; use PostgreSQL to run several",
            options.get_filename().display()
        ),
        Err((_, e)) => anyhow::bail!("cannot lock {}: {e}", path.display()),
    }
}

/// Connect options for `url`, and whether it names an in-memory database.
fn parse_url(url: &str) -> StoreResult<(SqliteConnectOptions, bool)> {
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

fn opt_from_micros(micros: Option<i64>, what: &str) -> StoreResult<Option<DateTime<Utc>>> {
    micros.map(|m| from_micros(m, what)).transpose()
}

/// A JSON value as stored in a TEXT column (compact; writing a `Value` cannot fail).
fn to_json(value: &Value) -> String {
    value.to_string()
}

fn from_json(text: &str, what: &str) -> StoreResult<Value> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: bad JSON: {e}")))
}

fn dirs_to_json(dirs: &[String]) -> String {
    to_json(&Value::from(dirs))
}

fn dirs_from_json(text: &str, what: &str) -> StoreResult<Vec<String>> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "{what}: additional_directories is not an array of strings: {e}"
        ))
    })
}

/// A session row in its column representation.
struct SessionParams {
    session_id: String,
    tenant: String,
    cwd: String,
    additional_directories: String,
    title: Option<String>,
    updated_at: i64,
    created_at: i64,
    meta: Option<String>,
    archived: bool,
    origin: &'static str,
    deleted_at: Option<i64>,
    synced_at: Option<i64>,
}

impl SessionParams {
    fn new(record: &SessionRecord) -> Self {
        Self {
            session_id: record.session_id.clone(),
            tenant: record.tenant.clone(),
            cwd: record.cwd.clone(),
            additional_directories: dirs_to_json(&record.additional_directories),
            title: record.title.clone(),
            updated_at: micros(record.updated_at),
            created_at: micros(record.created_at),
            meta: record.meta.as_ref().map(to_json),
            archived: record.archived,
            origin: record.origin.as_str(),
            deleted_at: record.deleted_at.map(micros),
            synced_at: record.synced_at.map(micros),
        }
    }
}

/// Binds every column but `session_id`, in [`session_columns!`] order.
fn bind_session_fields<'q>(
    query: Query<'q, Sqlite, SqliteArguments<'q>>,
    p: &'q SessionParams,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    query
        .bind(&p.tenant)
        .bind(&p.cwd)
        .bind(&p.additional_directories)
        .bind(&p.title)
        .bind(p.updated_at)
        .bind(p.created_at)
        .bind(&p.meta)
        .bind(p.archived)
        .bind(p.origin)
        .bind(p.deleted_at)
        .bind(p.synced_at)
}

/// A listed row that has not moved: its position is its `updated_at`.
fn listed_at_updated(row: &SqliteRow) -> StoreResult<Listed> {
    let record = session_from_row(row)?;
    Ok(Listed {
        key: record.updated_at,
        record,
    })
}

/// `WHERE` for the list queries over `sessions s`: live rows of the query's archive state,
/// tenant and cwd.
fn push_list_filters(qb: &mut QueryBuilder<'_, Sqlite>, query: &ListQuery) {
    qb.push(" WHERE s.deleted_at IS NULL AND s.archived = ")
        .push_bind(query.archived.unwrap_or(false));
    if let Some(tenant) = &query.tenant {
        qb.push(" AND s.tenant = ").push_bind(tenant.clone());
    }
    if let Some(cwd) = &query.cwd {
        qb.push(" AND s.cwd = ").push_bind(cwd.clone());
    }
}

fn session_from_row(row: &SqliteRow) -> StoreResult<SessionRecord> {
    let session_id: String = row.try_get("session_id")?;
    let what = format!("session {session_id:?}");
    let dirs: String = row.try_get("additional_directories")?;
    let meta: Option<String> = row.try_get("meta")?;
    let origin: String = row.try_get("origin")?;
    Ok(SessionRecord {
        tenant: row.try_get("tenant")?,
        cwd: row.try_get("cwd")?,
        additional_directories: dirs_from_json(&dirs, &what)?,
        title: row.try_get("title")?,
        updated_at: from_micros(row.try_get("updated_at")?, &what)?,
        created_at: from_micros(row.try_get("created_at")?, &what)?,
        meta: meta.as_deref().map(|m| from_json(m, &what)).transpose()?,
        archived: row.try_get("archived")?,
        origin: Origin::parse(&origin)?,
        deleted_at: opt_from_micros(row.try_get("deleted_at")?, &what)?,
        synced_at: opt_from_micros(row.try_get("synced_at")?, &what)?,
        session_id,
    })
}

fn event_from_row(row: &SqliteRow) -> StoreResult<StoredEvent> {
    let session_id: String = row.try_get("session_id")?;
    let seq: i64 = row.try_get("seq")?;
    let what = format!("event {seq} of session {session_id:?}");
    let payload: String = row.try_get("payload")?;
    Ok(StoredEvent {
        kind: row.try_get("kind")?,
        payload: from_json(&payload, &what)?,
        created_at: from_micros(row.try_get("created_at")?, &what)?,
        session_id,
        seq,
    })
}

fn lifecycle_from_row(row: &SqliteRow) -> StoreResult<StoredLifecycleEvent> {
    let seq: i64 = row.try_get("seq")?;
    let what = format!("lifecycle event {seq}");
    let payload: String = row.try_get("payload")?;
    Ok(StoredLifecycleEvent {
        seq,
        session_id: row.try_get("session_id")?,
        tenant: row.try_get("tenant")?,
        kind: row.try_get("kind")?,
        payload: from_json(&payload, &what)?,
        created_at: from_micros(row.try_get("created_at")?, &what)?,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        let params = SessionParams::new(record);
        // One statement: the upsert's `WHERE` leaves a tombstoned row untouched (0 changes).
        let query = sqlx::query(PUT_SESSION).bind(&params.session_id);
        let done = bind_session_fields(query, &params)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(GET_SESSION)
            .bind(session_id)
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        // The immediate transaction holds the write lock from the read to the commit, so no
        // other write can slip in between (the SQLite counterpart of `SELECT … FOR UPDATE`).
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let row = sqlx::query(GET_SESSION)
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut record = session_from_row(&row)?;
        if record.deleted_at.is_some() {
            return Ok(None);
        }
        mutate(&mut record);
        // The id is the row's key: a mutation cannot move the row to another id.
        record.session_id = session_id.to_owned();
        record.updated_at = record.updated_at.trunc_subsecs(6);
        record.created_at = record.created_at.trunc_subsecs(6);
        record.deleted_at = record.deleted_at.map(|at| at.trunc_subsecs(6));
        record.synced_at = record.synced_at.map(|at| at.trunc_subsecs(6));
        let params = SessionParams::new(&record);
        bind_session_fields(sqlx::query(UPDATE_SESSION), &params)
            .bind(&params.session_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList> {
        let limit = query.limit.max(1) + 1;
        let Some(after) = &query.after else {
            // First page: the rows and the newest move, read by one statement (one snapshot).
            let mut qb = QueryBuilder::<Sqlite>::new(concat!(
                "SELECT ",
                session_columns!(),
                ", (SELECT COALESCE(MAX(id), 0) FROM session_moves) AS snapshot FROM sessions s"
            ));
            push_list_filters(&mut qb, query);
            qb.push(" ORDER BY updated_at DESC, session_id DESC LIMIT ")
                .push_bind(limit);
            let rows = qb.build().fetch_all(&self.reader).await?;
            let snapshot = match rows.first() {
                Some(row) => row.try_get("snapshot")?,
                None => 0,
            };
            let rows = rows
                .iter()
                .map(listed_at_updated)
                .collect::<StoreResult<_>>()?;
            return Ok(merge_page(query, snapshot, rows));
        };
        let at = micros(after.updated_at);
        // One statement, so that both parts see the same database: rows that have not moved
        // since the snapshot, at their current position, and rows that moved since, at the
        // position they had then.
        // (SQLite returns the bare column `from_updated_at` of the row that has the `MIN(id)`.)
        let mut qb = QueryBuilder::<Sqlite>::new(concat!(
            "SELECT * FROM (SELECT ",
            session_columns!(),
            ", s.updated_at AS list_key FROM sessions s"
        ));
        push_list_filters(&mut qb, query);
        qb.push(" AND (updated_at, session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(
                ") AND NOT EXISTS (SELECT 1 FROM session_moves m \
                 WHERE m.session_id = s.session_id AND m.id > ",
            )
            .push_bind(after.snapshot)
            .push(") ORDER BY updated_at DESC, session_id DESC LIMIT ")
            .push_bind(limit)
            .push(concat!(
                ") AS kept UNION ALL SELECT * FROM (SELECT ",
                session_columns!(),
                ", m.from_updated_at AS list_key FROM (SELECT session_id, from_updated_at, MIN(id) \
                 FROM session_moves WHERE id > "
            ))
            .push_bind(after.snapshot)
            .push(" GROUP BY session_id) m JOIN sessions s USING (session_id)");
        push_list_filters(&mut qb, query);
        qb.push(" AND (m.from_updated_at, s.session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(") ORDER BY m.from_updated_at DESC, s.session_id DESC LIMIT ")
            .push_bind(limit)
            .push(") AS moved");
        let rows = qb.build().fetch_all(&self.reader).await?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok(Listed {
                    key: from_micros(row.try_get("list_key")?, "list_key")?,
                    record: session_from_row(row)?,
                })
            })
            .collect::<StoreResult<_>>()?;
        Ok(merge_page(query, after.snapshot, rows))
    }

    async fn synced_session_ids(&self) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT session_id FROM sessions WHERE deleted_at IS NULL AND synced_at IS NOT NULL",
        )
        .fetch_all(&self.reader)
        .await?)
    }

    async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        Ok(sqlx::query("DELETE FROM session_moves WHERE moved_at < ?")
            .bind(micros(before))
            .execute(&self.writer)
            .await?
            .rows_affected())
    }

    async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let at = micros(at);
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let updated = sqlx::query(TOMBSTONE_LIVE)
            .bind(at)
            .bind(session_id)
            .execute(&mut *tx)
            .await?;
        let tombstoned_live = updated.rows_affected() == 1;
        if !tombstoned_live {
            // Unknown (insert a bare tombstone) or already deleted (nothing to do). No other
            // write can run inside this transaction, so there is no race between the two.
            sqlx::query(INSERT_TOMBSTONE)
                .bind(session_id)
                .bind(tenant)
                .bind(at)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(tombstoned_live)
    }

    async fn append_events(
        &self,
        session_id: &str,
        events: &[NewEvent],
    ) -> StoreResult<Vec<StoredEvent>> {
        let mut conn = self.writer.acquire().await?;
        append_on(&mut conn, session_id, events, None).await
    }

    fn log_writer(&self) -> Box<dyn LogWriter> {
        Box::new(SqliteLogWriter {
            pool: self.writer.clone(),
            shared: self.in_memory,
            own: None,
            appends: 0,
        })
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredEvent>> {
        let rows = sqlx::query(READ_EVENTS)
            .bind(session_id)
            .bind(after)
            .bind(limit.max(0))
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    async fn prune_events(
        &self,
        max_events: Option<i64>,
        before: Option<DateTime<Utc>>,
    ) -> StoreResult<u64> {
        let mut deleted = 0;
        if let Some(keep) = max_events {
            deleted += sqlx::query(PRUNE_BY_COUNT)
                .bind(keep.max(0))
                .execute(&self.writer)
                .await?
                .rows_affected();
        }
        if let Some(before) = before {
            deleted += sqlx::query(PRUNE_BY_AGE)
                .bind(micros(before))
                .execute(&self.writer)
                .await?
                .rows_affected();
        }
        Ok(deleted)
    }

    async fn last_event_seq(&self, session_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(LAST_EVENT_SEQ)
            .bind(session_id)
            .fetch_one(&self.reader)
            .await?)
    }

    async fn append_lifecycle(
        &self,
        event: &NewLifecycleEvent,
    ) -> StoreResult<StoredLifecycleEvent> {
        let payload = to_json(&event.payload);
        let created_at = Utc::now().trunc_subsecs(6);
        // A single statement on the single writer connection: numbers are handed out in commit
        // order, so readers polling `seq > after` never skip one.
        let seq: i64 = sqlx::query_scalar(INSERT_LIFECYCLE)
            .bind(&event.session_id)
            .bind(&event.tenant)
            .bind(&event.kind)
            .bind(&payload)
            .bind(micros(created_at))
            .fetch_one(&self.writer)
            .await?;
        Ok(StoredLifecycleEvent {
            seq,
            session_id: event.session_id.clone(),
            tenant: event.tenant.clone(),
            kind: event.kind.clone(),
            payload: event.payload.clone(),
            created_at,
        })
    }

    async fn read_lifecycle(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        let query = match tenant {
            None => sqlx::query(READ_LIFECYCLE_ALL),
            Some(tenant) => sqlx::query(READ_LIFECYCLE_TENANT).bind(tenant),
        };
        let rows = query
            .bind(after)
            .bind(limit.max(0))
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(lifecycle_from_row).collect()
    }

    async fn last_lifecycle_seq(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(LAST_LIFECYCLE_SEQ)
            .fetch_one(&self.reader)
            .await?)
    }
}

/// One gateway serves an SQLite database at a time (see [`ReplicaLock`]): its live sessions are
/// rows of `session_owners`, without the registry's leases.
#[async_trait]
impl HeldSessions for SqliteStore {
    async fn hold(&self, session_id: &str, replica: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO session_owners (session_id, replica_id) VALUES (?, ?) \
             ON CONFLICT (session_id) DO UPDATE SET replica_id = excluded.replica_id",
        )
        .bind(session_id)
        .bind(replica)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn release(&self, session_id: &str, replica: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM session_owners WHERE session_id = ? AND replica_id = ?")
            .bind(session_id)
            .bind(replica)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn release_all(&self, replica: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM session_owners WHERE replica_id = ?")
            .bind(replica)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn release_left(&self, replica: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "DELETE FROM session_owners WHERE replica_id <> ? RETURNING session_id",
        )
        .bind(replica)
        .fetch_all(&self.writer)
        .await?)
    }
}
