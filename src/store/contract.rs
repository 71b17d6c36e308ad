//! The store's contract, one trait per concern of the gateway's database: [`SessionRecords`],
//! [`EventLog`], [`StateSnapshots`], [`WebhookOutbox`] and [`Ping`] here, [`IdempotencyKeys`]
//! and [`TenantQuotas`] beside their records (`idempotency.rs`, `quotas.rs`); [`Store`], all of
//! them in the one object each backend is; and [`Appended`], the appends another replica
//! commits. A use case or part holds only the traits it uses (an `Arc<dyn Store>` coerces to any
//! of them).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use serde_json::Value;

use super::error::StoreResult;
use super::event::{LogWriter, NewEvent, SeqRange, StoredEvent};
use super::idempotency::IdempotencyKeys;
use super::installs::InstalledAgents;
use super::queue::PromptQueue;
use super::quotas::TenantQuotas;
use super::records::{
    Attempt, DeliveryRecord, ListQuery, ListedSession, NewLifecycleEvent, SessionList,
    SessionMutation, SessionRecord, StoredLifecycleEvent, SyncedVisitor, ToSync, WebhookRecord,
};
use super::shares::SessionShares;
use super::usage::UsageLedger;
use super::watchers::SessionWatchers;
use super::workspaces::SessionWorkspaces;

/// The gateway's database: every concern's use cases in one object, which each backend is (and
/// which [`connect`](super::connect) opens), and the secret of the replicas sharing it.
#[async_trait]
pub trait Store:
    SessionRecords
    + EventLog
    + StateSnapshots
    + WebhookOutbox
    + IdempotencyKeys
    + TenantQuotas
    + SessionWorkspaces
    + PromptQueue
    + SessionWatchers
    + UsageLedger
    + InstalledAgents
    + SessionImports
    + SessionShares
    + Ping
{
    /// The secret the replicas sharing the database prove forwarded requests with: the one
    /// stored, else `fresh`, stored now.
    async fn cluster_secret(&self, fresh: &[u8]) -> StoreResult<Vec<u8>>;
}

/// The sessions the gateway knows: their rows (each a session's metadata, tombstoned once
/// deleted), the pages of the session list, and what the list sync reads and marks.
#[async_trait]
pub trait SessionRecords: Send + Sync + 'static {
    /// Writes sessions, each inserted or, if its id exists, is not tombstoned and has the same
    /// tenant, agent and origin, replacing its row; another row of the id is left as it is. Returns the
    /// ids written, in no particular order. The ids must differ. A list sync writes the changes
    /// of a page in one statement (PostgreSQL: any number of rows; SQLite: one per 1,927, its
    /// limit on bound parameters).
    async fn put_sessions(&self, records: &[SessionRecord]) -> StoreResult<Vec<String>>;

    /// Inserts a new session's row; `false` (and nothing changed) when a row of that id exists,
    /// tombstoned or not, whoever's it is.
    async fn insert_session(&self, record: &SessionRecord) -> StoreResult<bool>;

    /// The row for `session_id`, tombstoned or not.
    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>>;

    /// Reads the row, applies `mutate`, writes it back, in one transaction (row locked on
    /// PostgreSQL). Returns the new row; `None` when the id is unknown or tombstoned. The row
    /// is no longer what a listing made it: its [`SessionRecord::listed`] is cleared.
    async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>>;

    /// One page of non-tombstoned sessions, newest `updated_at` first, see [`ListQuery`] and
    /// [`ListCursor`](super::ListCursor). `limit` must be at least 1.
    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList>;

    /// Marks the session deleted at `at`. Returns `true` when a live (non-tombstoned) row was
    /// tombstoned now, `false` when it was unknown or already deleted. An unknown id still gets a
    /// tombstone row (tenant `tenant`, empty cwd) so that a later sync cannot bring it back.
    async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool>;

    /// Gives the sessions recorded before agents had names to `agent`; returns how many.
    async fn adopt_sessions(&self, agent: &str) -> StoreResult<u64>;

    /// Of a page of the agent's list, the sessions a sync has to look at, in one query: those
    /// the cache does not know (with no row) and those whose live row is not what this very
    /// listing made it ([`SessionRecord::listed`] differs), with their row. Tombstoned ids are
    /// left out, but those the list sync tombstoned ([`SessionRecords::vanish_session`]), whose row
    /// comes with its `deleted_at`: listed again, they come back. The ids must differ.
    async fn sessions_to_sync(&self, listed: &[ListedSession]) -> StoreResult<Vec<ToSync>>;

    /// Hands `visit` each live (non-tombstoned) session of `agent` a sync has seen in its list,
    /// with its [`SessionRecord::listed`] digest: one query, nothing collected (a large agent
    /// lists a million).
    async fn visit_synced(&self, agent: &str, visit: &mut SyncedVisitor<'_>) -> StoreResult<()>;

    /// Tombstones a live session that the list sync found its agent no longer knows: as
    /// [`SessionRecords::tombstone_session`] does, marked as vanished so that [`SessionRecords::revive_session`]
    /// may undo it. Returns `true` when a live row was tombstoned now.
    async fn vanish_session(&self, session_id: &str, at: DateTime<Utc>) -> StoreResult<bool>;

    /// Brings back a session [`SessionRecords::vanish_session`] tombstoned (and no other tombstone),
    /// with its log; its `listed` digest is cleared, so the next sync writes its row. Returns
    /// `true` when it did.
    async fn revive_session(&self, session_id: &str) -> StoreResult<bool>;

    /// Whether the session is tombstoned by [`SessionRecords::vanish_session`] (and not revived).
    async fn vanished(&self, session_id: &str) -> StoreResult<bool>;

    /// Forgets recorded list moves older than `before` (see [`ListCursor`](super::ListCursor));
    /// returns how many.
    async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64>;
}

/// The event logs: each session's, numbered per session, and the lifecycle log, numbered
/// across the database; their appends, reads, retention, and the appends of other replicas.
#[async_trait]
pub trait EventLog: Send + Sync + 'static {
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

    /// The events of `range` of one of `kinds`, ascending.
    async fn read_events_of_kinds(
        &self,
        session_id: &str,
        range: SeqRange,
        kinds: &[&str],
    ) -> StoreResult<Vec<StoredEvent>>;

    /// The last sequence number ever assigned in a session's log (0 when none), whether or not
    /// that event is still retained.
    async fn last_event_seq(&self, session_id: &str) -> StoreResult<i64>;

    /// When the session's log last got an event (by the appending replica's clock), whether
    /// or not the session is tombstoned; `None` for an empty log.
    async fn last_event_at(&self, session_id: &str) -> StoreResult<Option<DateTime<Utc>>>;

    /// Whether the session's log shows a turn that started and has not ended (its latest
    /// `turn_started` has no `turn_ended` after it).
    async fn turn_open(&self, session_id: &str) -> StoreResult<bool>;

    /// Retention: deletes, in every session, the events beyond the latest `max_events` and those
    /// created before `before`. Sequence counters are kept, so numbering continues after the
    /// pruned events. Returns how many events were deleted.
    async fn prune_events(
        &self,
        max_events: Option<i64>,
        before: Option<DateTime<Utc>>,
    ) -> StoreResult<u64>;

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

    /// Appends that other replicas commit to this database, as they commit (`None` where no
    /// other replica can write: SQLite). `Appended::Lost` after a lost connection: anything
    /// may have been missed.
    async fn appended_elsewhere(&self) -> StoreResult<Option<BoxStream<'static, Appended>>> {
        Ok(None)
    }
}

/// Snapshots of sessions' states, each made from a session's log up to a position, so that a
/// state is folded from there rather than from the log's start.
#[async_trait]
pub trait StateSnapshots: Send + Sync + 'static {
    /// The session's state snapshot, if one was stored: the log position it was made at and
    /// its JSON (see [`StateSnapshots::put_session_state`]).
    async fn session_state(&self, session_id: &str) -> StoreResult<Option<(i64, Value)>>;

    /// Stores the session's state as made from its log up to `seq`, unless a snapshot made
    /// further along is stored already (replicas and requests may race to store one).
    async fn put_session_state(&self, session_id: &str, seq: i64, state: &Value)
    -> StoreResult<()>;
}

/// The webhooks tenants subscribe, and the outbox of their deliveries: inserted by the appends
/// of the events they match (see `webhook_outbox.rs`), claimed and sent by the replicas, retried.
#[async_trait]
pub trait WebhookOutbox: Send + Sync + 'static {
    /// Inserts a webhook (each append then inserts the deliveries of the events it matches:
    /// see `webhook_outbox.rs`). Timestamps are kept to the microsecond.
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
}

/// Whether the database answers (the readiness probe asks).
#[async_trait]
pub trait Ping: Send + Sync + 'static {
    /// Cheap round trip, for `/readyz`.
    async fn ping(&self) -> StoreResult<()>;
}

impl dyn Store {
    /// Inserts a session, or, if the id exists, is not tombstoned and has the same tenant and
    /// agent, replaces its row. Returns `false` (and changes nothing) otherwise.
    pub async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        let written = self.put_sessions(std::slice::from_ref(record)).await?;
        Ok(!written.is_empty())
    }
}

/// An append by another replica (see [`EventLog::appended_elsewhere`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Appended {
    /// A session's log now reaches `seq`.
    Session { session_id: String, seq: i64 },
    /// The lifecycle log now reaches `seq`.
    Lifecycle { seq: i64 },
    /// Notifications may have been missed.
    Lost,
}

/// Sessions written whole (`POST /sessions/import`; the SQL and the impls in `imports.rs`).
#[async_trait]
pub trait SessionImports: Send + Sync + 'static {
    /// Writes `record`, `events` (their `seq` and `created_at` kept, their `session_id` taken
    /// from `record`; `seq` increasing) and the state snapshot made at `state.0`, all in one
    /// transaction; the session's counter is the later of the last event and the snapshot. A row of the id is replaced only with `adopt`, and only when it is a
    /// session found in the agent's list (`upstream`), not deleted, whose log is empty;
    /// otherwise nothing is written and the answer is `false`.
    async fn import_session(
        &self,
        record: &SessionRecord,
        events: &[StoredEvent],
        state: Option<(i64, &Value)>,
        adopt: bool,
    ) -> StoreResult<bool>;
}
