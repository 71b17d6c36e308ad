//! The PostgreSQL implementation of [`Store`] and [`ReplicaRegistry`]: [`PgStore`].
//!
//! Schema: `migrations/postgres`. Timestamps are `timestamptz` (microsecond resolution), JSON is
//! `jsonb`. All queries are checked at run time (no `DATABASE_URL` is needed to build).
//!
//! Files by use case: `sessions.rs` the session cache and its list, `events.rs` the session
//! event logs and their writer, `lifecycle.rs` the lifecycle log, `replicas.rs` what crosses
//! replicas (the registry, and the notifications of each other's appends); here the pool.

mod events;
mod lifecycle;
mod replicas;
mod sessions;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::{
    Appended, ListQuery, LogWriter, NewEvent, NewLifecycleEvent, SessionList, SessionMutation,
    SessionRecord, Store, StoreResult, StoredEvent, StoredLifecycleEvent,
};

pub use events::PG_LOG_WRITER_NAME;

/// Connections in the pool.
const MAX_CONNECTIONS: u32 = 10;
/// How long a query waits for a free connection before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The store on a PostgreSQL database (a pool of [`MAX_CONNECTIONS`] connections).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The id of the replica this store serves: the tag of the notifications its appends send,
    /// by which it knows its own among those it receives.
    replica: String,
}

impl PgStore {
    /// Connects to `url` (`postgres://…`) and applies the migrations in `migrations/postgres`.
    /// `replica` tags the notifications of this store's appends (see [`Store::appended_elsewhere`]).
    pub async fn connect(url: &str, replica: &str) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        Ok(Self {
            pool,
            replica: replica.to_owned(),
        })
    }
}

/// Each method is the inherent one of the same name in the file of its use case (an inherent
/// method is found before a trait's, so none of these calls itself).
#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        self.put_session(record).await
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        self.get_session(session_id).await
    }

    async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        self.update_session(session_id, mutate).await
    }

    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList> {
        self.list_sessions(query).await
    }

    async fn synced_session_ids(&self) -> StoreResult<Vec<String>> {
        self.synced_session_ids().await
    }

    async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        self.prune_moves(before).await
    }

    async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        self.tombstone_session(session_id, tenant, at).await
    }

    async fn append_events(
        &self,
        session_id: &str,
        events: &[NewEvent],
    ) -> StoreResult<Vec<StoredEvent>> {
        self.append_events(session_id, events).await
    }

    fn log_writer(&self) -> Box<dyn LogWriter> {
        self.log_writer()
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredEvent>> {
        self.read_events(session_id, after, limit).await
    }

    async fn prune_events(
        &self,
        max_events: Option<i64>,
        before: Option<DateTime<Utc>>,
    ) -> StoreResult<u64> {
        self.prune_events(max_events, before).await
    }

    async fn last_event_seq(&self, session_id: &str) -> StoreResult<i64> {
        self.last_event_seq(session_id).await
    }

    async fn append_lifecycle(
        &self,
        event: &NewLifecycleEvent,
    ) -> StoreResult<StoredLifecycleEvent> {
        self.append_lifecycle(event).await
    }

    async fn read_lifecycle(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        self.read_lifecycle(tenant, after, limit).await
    }

    async fn last_lifecycle_seq(&self) -> StoreResult<i64> {
        self.last_lifecycle_seq().await
    }

    async fn appended_elsewhere(&self) -> StoreResult<Option<BoxStream<'static, Appended>>> {
        self.appended_elsewhere().await
    }
}
