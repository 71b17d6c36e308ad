//! The durable store: session metadata cache and the per-session event log.
//!
//! One trait per concern at the level of the gateway's use cases (`contract.rs`: the session
//! rows, the event logs, state snapshots, webhooks and their outbox; `idempotency.rs`: the
//! idempotency keys; `quotas.rs`: per-tenant quotas; `workspaces.rs`: the sessions' workspaces; `queue.rs`: their prompt queues; `watchers.rs`: their open streams; `usage.rs`: what turns spent; `installs.rs`: the agents installed from a registry; `imports.rs`: sessions written whole; `shares.rs`: read-only links), all combined in [`Store`], the one object a
//! backend is; they speak in the records of `records.rs` and the events of `event.rs` (the kinds
//! the gateway knows by name in `kind.rs`), failing with the [`StoreError`] of `error.rs`. A
//! PostgreSQL and an SQLite implementation (`postgres/`, `sqlite/`) pass the same contract suite
//! (`tests/store_contract/`), opened by `database.rs` (what is wrong with one that cannot be, said by `diagnosis.rs`); beside it, how each records the gateway replicas using it (`replicas.rs`). What the two run
//! alike is written once: the shared SQL and the trait impls of both (`common.rs`, with one macro
//! per concern in `event_log.rs`, `webhook_outbox.rs`, `idempotency.rs`, `quotas.rs`, `workspaces.rs`, `queue.rs`, `watchers.rs`, `usage.rs`, `installs.rs`, `imports.rs` and `shares.rs`), the mapping
//! of rows to records (`rows.rs`) and the session list's statement and pages (`listing.rs`). This
//! file only declares the parts and re-exports their names. This module depends on nothing else
//! in the crate: the replica id it tags notifications with is given to [`connect`].

/// The `sessions` columns, in the order `rows::session_from`, the session binds and the shared
/// statements use (declared before the modules that use it, so that they all see it).
macro_rules! session_columns {
    () => {
        "session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
         archived, origin, deleted_at, synced_at, listed, agent, owner, owner_name, who_answers"
    };
}

#[macro_use]
mod common;
mod backup;
mod contract;
mod copy;
mod database;
mod diagnosis;
mod error;
#[macro_use]
mod webhook_outbox;
#[macro_use]
mod idempotency;
#[macro_use]
mod quotas;
#[macro_use]
mod workspaces;
#[macro_use]
mod queue;
#[macro_use]
mod watchers;
#[macro_use]
mod usage;
#[macro_use]
mod installs;
#[macro_use]
mod imports;
#[macro_use]
mod shares;
#[macro_use]
mod event_log;
mod event;
mod kind;
mod listing;
mod migrations;
mod postgres;
mod records;
mod replicas;
mod rows;
mod sqlite;

pub use backup::backup_sqlite;
pub use contract::{
    Appended, EventLog, Ping, SessionImports, SessionRecords, StateSnapshots, Store, WebhookOutbox,
};
pub use copy::tables::{COPIED, LEFT};
pub use copy::{CopyProgress, CopyReport, copy_store};
pub use database::{Database, DatabaseUrl, connect, lock_single_replica, open};
pub use error::{StoreError, StoreResult};
pub use event::{Batch, BatchesStored, LogWriter, NewEvent, Payload, SeqRange, StoredEvent};
pub use idempotency::{IdempotencyKeys, KeyClaim, KeyRecord, KeyRequest, KeyTerm, StoredResponse};
pub use installs::{InstallRecord, InstalledAgents};
pub use kind::EventKind;
pub use postgres::PgStore;
pub use postgres::events::PG_LOG_WRITER_NAME;
pub use queue::{PromptQueue, QueuedPrompt};
pub use quotas::{SESSION_SLOT_MAX, SlotKind, TenantQuotas, TenantSlot};
pub use records::{
    Attempt, DeliveryRecord, ListCursor, ListQuery, ListedSession, NewLifecycleEvent, Origin,
    People, STABLE_CURSOR_FOR, SessionList, SessionMutation, SessionRecord, StoredLifecycleEvent,
    SyncedVisitor, ToSync, WebhookRecord,
};
pub use replicas::{Claimed, Heartbeat, HeldSessions, Replica, ReplicaRegistry, Replicas};
pub use shares::{SessionShares, ShareRecord};
pub use sqlite::SqliteStore;
pub use sqlite::replica::ReplicaLock;
pub use usage::{
    Cost, Tokens, TurnUsage, UsageGroup, UsageKey, UsageLedger, UsageQuery, UsageSums,
};
pub use watchers::{SessionWatchers, WatcherRecord};
pub use workspaces::{SessionWorkspaces, WorkspaceRecord};
