//! The durable store: session metadata cache and the per-session event log.
//!
//! One [`Store`] trait at the level of the gateway's use cases, with a PostgreSQL and an SQLite
//! implementation (`postgres/`, `sqlite/`) that pass the same contract suite
//! (`tests/store_contract/`); beside it, how each records the gateway replicas using it
//! (`replicas.rs`). What the two run alike is written once: the shared SQL and the `impl Store`
//! of both (`common.rs`), the mapping of rows to records (`rows.rs`) and the session list's
//! statement and pages (`listing.rs`); webhooks and their outbox (`webhooks.rs`). This module depends on nothing else in the crate: the
//! replica id it tags notifications with is given to [`connect`].

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound, Utc};
use futures::stream::BoxStream;
use serde_json::Value;

/// The `sessions` columns, in the order `rows::session_from`, the session binds and the shared
/// statements use (declared before the modules that use it, so that they all see it).
macro_rules! session_columns {
    () => {
        "session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
         archived, origin, deleted_at, synced_at, listed, agent"
    };
}

#[macro_use]
mod common;
mod database;
#[macro_use]
mod webhooks;
mod event;
mod listing;
mod migrations;
mod postgres;
mod replicas;
mod rows;
mod sqlite;

pub use database::{Database, DatabaseUrl, connect, lock_single_replica, open};
pub use event::{Batch, BatchesStored, LogWriter, NewEvent, Payload, StoredEvent};
pub use postgres::{PG_LOG_WRITER_NAME, PgStore};
pub use replicas::{Claimed, HeldSessions, Replica, ReplicaRegistry, Replicas};
pub use sqlite::{ReplicaLock, SqliteStore};
pub use webhooks::{Attempt, DeliveryRecord, WebhookRecord};

/// What can go wrong in the store. Callers log it and answer 500/503; it never reaches a body.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// From the SQLite event log's own connection (see `sqlite`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// The connection was found closed or shut down by the server (SQLSTATE classes 08 and
    /// 57P, or an I/O error). The statement may or may not have run: an I/O error while its
    /// answer was on the way leaves a commit unknown.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Io(_))) || self.is_shut_down_by_server()
    }

    /// The server reported the connection shut down (SQLSTATE classes 08 and 57P) in answer to
    /// a statement: it did not commit.
    pub fn is_shut_down_by_server(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => e
                .code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
            _ => false,
        }
    }

    /// The database cannot be reached or cannot write now, and may again later: a lost
    /// connection, no connection from the pool in time, or an SQLite file that is busy,
    /// read-only, full or failing I/O. A request failing so answers 503 with `Retry-After`.
    pub fn is_unavailable(&self) -> bool {
        self.is_connection_lost()
            || match self {
                StoreError::Db(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => true,
                StoreError::Db(sqlx::Error::Database(e)) => {
                    sqlite_code(e.as_ref()).is_some_and(|c| SQLITE_UNAVAILABLE.contains(&c))
                }
                StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                    SQLITE_UNAVAILABLE.contains(&(e.extended_code & 0xff))
                }
                _ => false,
            }
    }

    /// The data itself was refused (PostgreSQL's SQLSTATE classes 22 and 23, SQLite's
    /// constraint, too-big and mismatch codes, a value that does not encode): writing it
    /// again fails again.
    pub fn is_about_the_data(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => match sqlite_code(e.as_ref()) {
                Some(c) => SQLITE_DATA.contains(&c),
                None => e
                    .code()
                    .is_some_and(|c| c.starts_with("22") || c.starts_with("23")),
            },
            StoreError::Db(sqlx::Error::Encode(_)) => true,
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                SQLITE_DATA.contains(&(e.extended_code & 0xff))
            }
            StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(_)) => true,
            _ => false,
        }
    }
}

/// The primary result code of an SQLite error; `None` for another database's.
fn sqlite_code(e: &dyn sqlx::error::DatabaseError) -> Option<i32> {
    e.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    e.code()?.parse::<i32>().ok().map(|c| c & 0xff)
}

/// SQLite's primary result codes for "cannot write now": BUSY, LOCKED, READONLY, IOERR, FULL,
/// CANTOPEN.
const SQLITE_UNAVAILABLE: [i32; 6] = [5, 6, 8, 10, 13, 14];
/// SQLite's primary result codes for refused data: TOOBIG, CONSTRAINT, MISMATCH.
const SQLITE_DATA: [i32; 3] = [18, 19, 20];

pub type StoreResult<T> = Result<T, StoreError>;

/// Where a cached session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Created through this gateway.
    Gateway,
    /// Discovered through the agent's `session/list`.
    Upstream,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Gateway => "gateway",
            Origin::Upstream => "upstream",
        }
    }
    pub fn parse(s: &str) -> StoreResult<Self> {
        match s {
            "gateway" => Ok(Origin::Gateway),
            "upstream" => Ok(Origin::Upstream),
            other => Err(StoreError::Corrupt(format!("unknown origin {other:?}"))),
        }
    }
}

/// One row of the session cache. Timestamps are kept with microsecond precision.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub session_id: String,
    pub tenant: String,
    pub cwd: String,
    pub additional_directories: Vec<String>,
    pub title: Option<String>,
    pub updated_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// The session's `_meta` object, if any.
    pub meta: Option<Value>,
    pub archived: bool,
    pub origin: Origin,
    /// Set when the session was deleted: a tombstone that keeps a sync from resurrecting it.
    pub deleted_at: Option<DateTime<Utc>>,
    pub synced_at: Option<DateTime<Utc>>,
    /// The digest of the agent's `SessionInfo` that a sync last made the row from, as long as
    /// nothing else has changed the row since (see [`Store::sessions_to_sync`]); `None` then.
    pub listed: Option<i64>,
    /// The name of the agent the session lives in (empty in rows written before agents had
    /// names, until [`Store::adopt_sessions`] gives them the default one).
    pub agent: String,
}

/// A session on a page of the agent's list: its id and the digest of its `SessionInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSession {
    pub session_id: String,
    pub digest: i64,
}

/// What [`Store::visit_synced`] hands each synced session to: its id and its digest.
pub type SyncedVisitor<'v> = dyn FnMut(&str, Option<i64>) + Send + 'v;

/// A listed session a sync has to look at (see [`Store::sessions_to_sync`]): its id and its
/// live row, `None` when the cache does not know it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToSync {
    pub session_id: String,
    pub cached: Option<SessionRecord>,
}

/// A page request for [`Store::list_sessions`]; newest `updated_at` first, ties by `session_id` descending.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `None` lists every tenant (admin).
    pub tenant: Option<String>,
    /// Exact match on `cwd`.
    pub cwd: Option<String>,
    /// Only the sessions of this agent.
    pub agent: Option<String>,
    /// `None` = only non-archived, `Some(true)` = only archived, `Some(false)` = only non-archived.
    pub archived: Option<bool>,
    /// The position after which the page starts; `None` for the first page.
    pub after: Option<ListCursor>,
    pub limit: i64,
}

/// Where a page of the session list ends: the list as it was when its first page was read
/// (`snapshot`, the newest recorded move of an `updated_at` then) and the keyset position
/// `(updated_at, session_id)` of the last row in that list. A session whose `updated_at` changes
/// between pages keeps its first-page position, so paging never skips or repeats a session;
/// sessions created since may appear on later pages when they sort after the cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    pub snapshot: i64,
    pub updated_at: DateTime<Utc>,
    pub session_id: String,
}

/// One page of [`Store::list_sessions`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionList {
    pub sessions: Vec<SessionRecord>,
    /// Set when more rows follow.
    pub next: Option<ListCursor>,
}

/// How long list cursors stay stable: the age at which recorded moves are pruned.
pub const STABLE_CURSOR_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// A session lifecycle event (created, info updated, status changed, deleted) for `GET /events`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLifecycleEvent {
    pub session_id: String,
    pub tenant: String,
    pub kind: String,
    pub payload: Value,
}

/// A lifecycle event as stored, with its global sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredLifecycleEvent {
    pub seq: i64,
    pub session_id: String,
    pub tenant: String,
    pub kind: String,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

impl NewLifecycleEvent {
    /// This event as stored with number `seq` at `created_at`.
    fn stored(&self, seq: i64, created_at: DateTime<Utc>) -> StoredLifecycleEvent {
        StoredLifecycleEvent {
            seq,
            session_id: self.session_id.clone(),
            tenant: self.tenant.clone(),
            kind: self.kind.clone(),
            payload: self.payload.clone(),
            created_at,
        }
    }

    /// `events` as stored at `created_at` by one insert that answered `seqs`: the numbers the
    /// database handed out in the order the rows were inserted, ascending, which a backend's
    /// `RETURNING` need not answer in that order.
    fn stored_all(
        events: &[Self],
        mut seqs: Vec<i64>,
        created_at: DateTime<Utc>,
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        if seqs.len() != events.len() {
            return Err(StoreError::Corrupt(format!(
                "{} lifecycle events inserted, {} numbers returned",
                events.len(),
                seqs.len()
            )));
        }
        seqs.sort_unstable();
        Ok(events
            .iter()
            .zip(seqs)
            .map(|(e, seq)| e.stored(seq, created_at))
            .collect())
    }
}

/// A mutation applied to one session row inside a transaction (see [`Store::update_session`]).
pub type SessionMutation<'a> = &'a (dyn Fn(&mut SessionRecord) + Send + Sync);

/// Truncates every timestamp of `record` to the microsecond, the precision both backends store.
fn truncate_timestamps(record: &mut SessionRecord) {
    record.updated_at = record.updated_at.trunc_subsecs(6);
    record.created_at = record.created_at.trunc_subsecs(6);
    record.deleted_at = record.deleted_at.map(|at| at.trunc_subsecs(6));
    record.synced_at = record.synced_at.map(|at| at.trunc_subsecs(6));
}

/// What [`Store::update_session`] writes back over `current`, the row read for `session_id`:
/// `current` changed by `mutate`; `None` when there is no live row.
fn apply_mutation(
    current: Option<SessionRecord>,
    session_id: &str,
    mutate: SessionMutation<'_>,
) -> Option<SessionRecord> {
    let mut record = current.filter(|record| record.deleted_at.is_none())?;
    mutate(&mut record);
    // The id is the row's key: a mutation cannot move the row to another id.
    record.session_id = session_id.to_owned();
    record.listed = None;
    truncate_timestamps(&mut record);
    Some(record)
}

/// The gateway's use cases against its database.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Cheap round trip, for `/readyz`.
    async fn ping(&self) -> StoreResult<()>;

    /// Writes sessions, each inserted or, if its id exists, is not tombstoned and has the same
    /// tenant and agent, replacing its row; another row of the id is left as it is. Returns the
    /// ids written, in no particular order. The ids must differ. A list sync writes the changes
    /// of a page in one statement (PostgreSQL: any number of rows; SQLite: one per 2,520, its
    /// limit on bound parameters).
    async fn put_sessions(&self, records: &[SessionRecord]) -> StoreResult<Vec<String>>;

    /// Inserts a new session's row; `false` (and nothing changed) when a row of that id exists,
    /// tombstoned or not, whoever's it is.
    async fn insert_session(&self, record: &SessionRecord) -> StoreResult<bool>;

    /// The row for `session_id`, tombstoned or not.
    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>>;

    /// Of a page of the agent's list, the sessions a sync has to look at, in one query: those
    /// the cache does not know (with no row) and those whose live row is not what this very
    /// listing made it ([`SessionRecord::listed`] differs), with their row. Tombstoned ids are
    /// left out: nothing brings them back. The ids must differ.
    async fn sessions_to_sync(&self, listed: &[ListedSession]) -> StoreResult<Vec<ToSync>>;

    /// Reads the row, applies `mutate`, writes it back, in one transaction (row locked on
    /// PostgreSQL). Returns the new row; `None` when the id is unknown or tombstoned. The row
    /// is no longer what a listing made it: its [`SessionRecord::listed`] is cleared.
    async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>>;

    /// One page of non-tombstoned sessions, newest `updated_at` first, see [`ListQuery`] and
    /// [`ListCursor`]. `limit` must be at least 1.
    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList>;

    /// Hands `visit` each live (non-tombstoned) session of `agent` a sync has seen in its list,
    /// with its [`SessionRecord::listed`] digest: one query, nothing collected (a large agent
    /// lists a million).
    async fn visit_synced(&self, agent: &str, visit: &mut SyncedVisitor<'_>) -> StoreResult<()>;

    /// Gives the sessions recorded before agents had names to `agent`; returns how many.
    async fn adopt_sessions(&self, agent: &str) -> StoreResult<u64>;

    /// Forgets recorded list moves older than `before` (see [`ListCursor`]); returns how many.
    async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64>;

    /// Marks the session deleted at `at`. Returns `true` when a live (non-tombstoned) row was
    /// tombstoned now, `false` when it was unknown or already deleted. An unknown id still gets a
    /// tombstone row (tenant `tenant`, empty cwd) so that a later sync cannot bring it back.
    async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Appends events to a session's log, assigning consecutive sequence numbers after the
    /// current last one, atomically: concurrent appenders never produce gaps or duplicates. The
    /// same statement or transaction inserts each event's deliveries to the enabled webhooks it
    /// matches (every append of session events does, the log writer's too).
    async fn append_events(
        &self,
        session_id: &str,
        events: &[NewEvent],
    ) -> StoreResult<Vec<StoredEvent>>;

    /// A writer of the event log with a database connection of its own (opened on first use,
    /// opened again after an error), for the one task that appends everything the gateway logs:
    /// an append is then one round trip, with no pool checkout before it or check after it.
    /// SQLite's runs on the calling thread and blocks it for the append: call it from a thread
    /// of its own (the event hub's writer has one).
    fn log_writer(&self) -> Box<dyn LogWriter>;

    /// Events with `seq > after`, ascending, at most `limit`.
    async fn read_events(
        &self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredEvent>>;

    /// Events with `after < seq <= upto` of one of `kinds`, ascending.
    async fn read_events_of_kinds(
        &self,
        session_id: &str,
        after: i64,
        upto: i64,
        kinds: &[&str],
    ) -> StoreResult<Vec<StoredEvent>>;

    /// The session's state snapshot, if one was stored: the log position it was made at and
    /// its JSON (see [`Store::put_session_state`]).
    async fn session_state(&self, session_id: &str) -> StoreResult<Option<(i64, Value)>>;

    /// Stores the session's state as made from its log up to `seq`, unless a snapshot made
    /// further along is stored already (replicas and requests may race to store one).
    async fn put_session_state(&self, session_id: &str, seq: i64, state: &Value)
    -> StoreResult<()>;

    /// Retention: deletes, in every session, the events beyond the latest `max_events` and those
    /// created before `before`. Sequence counters are kept, so numbering continues after the
    /// pruned events. Returns how many events were deleted.
    async fn prune_events(
        &self,
        max_events: Option<i64>,
        before: Option<DateTime<Utc>>,
    ) -> StoreResult<u64>;

    /// The last sequence number ever assigned in a session's log (0 when none), whether or not
    /// that event is still retained.
    async fn last_event_seq(&self, session_id: &str) -> StoreResult<i64>;

    /// Whether the session's log shows a turn that started and has not ended (its latest
    /// `turn_started` has no `turn_ended` after it).
    async fn turn_open(&self, session_id: &str) -> StoreResult<bool>;

    /// Appends lifecycle events, in one transaction, numbered in their order with the next
    /// global sequence numbers; returns them as stored, in the same order. The transaction
    /// inserts their deliveries to the enabled webhooks they match, but `session_deleted`'s
    /// (the session's own log has it too).
    async fn append_lifecycle(
        &self,
        events: &[NewLifecycleEvent],
    ) -> StoreResult<Vec<StoredLifecycleEvent>>;

    /// Lifecycle events with `seq > after`, ascending, at most `limit`; `tenant = None` = all.
    async fn read_lifecycle(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredLifecycleEvent>>;

    /// The last lifecycle sequence number (0 when empty).
    async fn last_lifecycle_seq(&self) -> StoreResult<i64>;

    /// Inserts a webhook (each append then inserts the deliveries of the events it matches:
    /// see `webhooks.rs`). Timestamps are kept to the microsecond.
    async fn put_webhook(&self, w: &WebhookRecord) -> StoreResult<()>;

    async fn get_webhook(&self, id: &str) -> StoreResult<Option<WebhookRecord>>;

    /// The webhooks of `tenant` (`None`: all, for an admin), newest first.
    async fn list_webhooks(&self, tenant: Option<&str>) -> StoreResult<Vec<WebhookRecord>>;

    /// Writes `w`'s url, events, session_id, description, secret, enabled, disabled_reason and
    /// updated_at over the row of its id; `false` when there is none.
    async fn update_webhook(&self, w: &WebhookRecord) -> StoreResult<bool>;

    /// Deletes the webhook and its deliveries; `false` when there was none.
    async fn delete_webhook(&self, id: &str) -> StoreResult<bool>;

    /// Newest first (id DESC), at most `limit`, with id < `before` when given.
    async fn list_deliveries(
        &self,
        webhook_id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<DeliveryRecord>>;

    async fn get_delivery(&self, webhook_id: &str, id: i64) -> StoreResult<Option<DeliveryRecord>>;

    /// Manual retry: status 'pending', next_attempt_at = retry_from = now, lease cleared.
    /// `false` if unknown.
    async fn retry_delivery(
        &self,
        webhook_id: &str,
        id: i64,
        now: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Claims up to `limit` due deliveries for `owner` until `lease_until`, lowest id first,
    /// each with its webhook: deliveries of enabled webhooks, status 'pending', next_attempt_at
    /// <= now, lease free or expired (lease_until < now), each the lowest id among the pending
    /// deliveries of its (webhook_id, session_id), so that a session's deliveries go out one
    /// at a time in log order. Two replicas never claim the same row at once.
    async fn claim_deliveries(
        &self,
        owner: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<(DeliveryRecord, WebhookRecord)>>;

    /// Records an attempt of a delivery claimed by `owner` (attempts + 1, last_* set, lease
    /// cleared, status and next_attempt_at per `attempt`). `false` when the lease is no longer
    /// `owner`'s (taken by another, or the delivery retried or deleted): nothing is written.
    async fn finish_delivery(
        &self,
        id: i64,
        owner: &str,
        attempt: &Attempt,
        now: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Appends that other replicas commit to this database, as they commit (`None` where no
    /// other replica can write: SQLite). `Appended::Lost` after a lost connection: anything
    /// may have been missed.
    async fn appended_elsewhere(&self) -> StoreResult<Option<BoxStream<'static, Appended>>> {
        Ok(None)
    }
}

impl dyn Store {
    /// Inserts a session, or, if the id exists, is not tombstoned and has the same tenant and
    /// agent, replaces its row. Returns `false` (and changes nothing) otherwise.
    pub async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        let written = self.put_sessions(std::slice::from_ref(record)).await?;
        Ok(!written.is_empty())
    }
}

/// An append by another replica (see [`Store::appended_elsewhere`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Appended {
    /// A session's log now reaches `seq`.
    Session { session_id: String, seq: i64 },
    /// The lifecycle log now reaches `seq`.
    Lifecycle { seq: i64 },
    /// Notifications may have been missed.
    Lost,
}
