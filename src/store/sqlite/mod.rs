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
//! their writer, `checkpoint.rs` the thread that checkpoints the writer's WAL, `lifecycle.rs` the lifecycle log, `replica.rs` the one gateway a file has (its
//! lock and the sessions it holds), `webhook_outbox.rs` the webhook outbox's insert (which the appends
//! run) and claim; `store.rs` the pools and the column conversions they share; here the
//! [`Store`] implementation they make up. What
//! runs alike on PostgreSQL (reads, retention, the list's statement, the row mapping) is written
//! once in `store/common.rs`, `store/listing.rs` and `store/rows.rs`.

#[macro_use]
mod webhook_outbox;
mod checkpoint;
mod events;
mod lifecycle;
mod quotas;
pub(super) mod replica;
mod sessions;
mod store;

pub use store::SqliteStore;
pub(crate) use store::parse_url;

use store::{BEGIN_IMMEDIATE, micros};

impl_store!(SqliteStore {
    reads: reader,
    writes: writer,
    begin_write: begin_with(BEGIN_IMMEDIATE),
    time: micros,
    bind_session: sessions::bind_session,
    lock_session: sessions::LOCK_SESSION,
    prune_events_by_count: events::PRUNE_BY_COUNT,
    watcher_streams: quotas::WATCHER_STREAMS,
    first_moves: sessions::FIRST_MOVES,
    to_sync_query: sessions::to_sync_query,
    synced_sessions: synced_sessions!("json_group_array(session_id)", "json_group_array(listed)"),
} {});
