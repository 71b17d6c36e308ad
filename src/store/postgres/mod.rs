//! The PostgreSQL implementation of [`Store`] and [`ReplicaRegistry`]: [`PgStore`].
//!
//! Schema: `migrations/postgres`. Timestamps are `timestamptz` (microsecond resolution), JSON is
//! `jsonb`. All queries are checked at run time (no `DATABASE_URL` is needed to build).
//! PostgreSQL refuses U+0000 in `text` and `jsonb`, which SQLite stores: a JSON value holding
//! one is kept as its JSON text ([`store::nul_safe`]), a title or an event's kind escaped
//! ([`store::text_in`]), so that both backends keep whatever they are given. (A cwd never holds one:
//! paths are checked before they are stored.)
//!
//! Files by use case: `sessions.rs` the session cache, `events.rs` the session event logs and
//! their writer, `lifecycle.rs` the lifecycle log, `replicas.rs` what crosses replicas (the
//! registry, and the notifications of each other's appends), `webhook_outbox.rs` the webhook outbox's
//! insert (which the appends run) and claim; `store.rs` the pool and how its rows
//! read; here the [`Store`] implementation they make up. What runs alike on SQLite (reads, retention, the list's statement, the row mapping) is
//! written once in `store/common.rs`, `store/listing.rs` and `store/rows.rs`.

#[macro_use]
mod webhook_outbox;
pub(super) mod events;
mod lifecycle;
mod quotas;
mod replicas;
mod sessions;
pub(super) mod store;

pub use store::PgStore;

use futures::stream::BoxStream;

use crate::store::contract::Appended;
use crate::store::error::StoreResult;

impl_store!(PgStore {
    reads: pool,
    writes: pool,
    begin_write: begin(),
    time: std::convert::identity,
    bind_session: sessions::bind_session,
    lock_session: sessions::LOCK_SESSION,
    prune_events_by_count: events::PRUNE_BY_COUNT,
    watcher_streams: quotas::WATCHER_STREAMS,
    first_moves: sessions::FIRST_MOVES,
    to_sync_query: sessions::to_sync_query,
    synced_sessions: synced_sessions!(
        "COALESCE(json_agg(session_id), '[]')::text",
        "COALESCE(json_agg(listed), '[]')::text"
    ),
} {
    async fn appended_elsewhere(&self) -> StoreResult<Option<BoxStream<'static, Appended>>> {
        self.appended_elsewhere().await
    }
});
