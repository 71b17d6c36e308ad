//! Who holds what across gateway processes: the [`ReplicaRegistry`] of a database several
//! replicas share (PostgreSQL), and the [`HeldSessions`] of a database one gateway serves alone
//! (SQLite, behind its file lock), which [`connect`](super::connect) hands out as [`Replicas`].

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::error::StoreResult;

/// What a replica says of itself at each heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    pub id: String,
    /// Where other replicas reach it (`--advertise-url`).
    pub address: String,
    pub started_at: DateTime<Utc>,
    /// Sessions it holds live.
    pub sessions_live: i64,
    /// The agents it runs (`--agent`), its default first.
    pub agents: Vec<String>,
}

/// A gateway replica as the shared database knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// What it said at its last heartbeat.
    pub beat: Heartbeat,
    /// That heartbeat's time, by the database's clock.
    pub heartbeat_at: DateTime<Utc>,
    /// How long ago that heartbeat was, by the database's clock (never negative).
    pub silent_for: std::time::Duration,
}

/// The registry of the replicas sharing a database: their heartbeats, and which of them holds
/// each live session, as a lease on its heartbeat. Only a database several gateways can share
/// has one (PostgreSQL).
#[async_trait]
pub trait ReplicaRegistry: Send + Sync + 'static {
    /// Records `beat` of its replica (registering it on the first) stamped with the database's
    /// clock, and forgets replicas silent for longer than `forget_after`.
    async fn heartbeat_replica(
        &self,
        beat: &Heartbeat,
        forget_after: std::time::Duration,
    ) -> StoreResult<()>;

    /// Every registered replica, oldest first.
    async fn replicas(&self) -> StoreResult<Vec<Replica>>;

    /// Unregisters replica `id` and ends its ownerships (at its clean shutdown); false if it
    /// was not registered.
    async fn remove_replica(&self, id: &str) -> StoreResult<bool>;

    /// Makes `replica` the owner of live session `session_id`, unless another replica owns it
    /// and beat within `lease`. Of concurrent claims of a dead replica's session, one only gets
    /// [`Claimed::Orphan`].
    async fn claim_session(
        &self,
        session_id: &str,
        replica: &str,
        lease: std::time::Duration,
    ) -> StoreResult<Claimed>;

    /// Ends `replica`'s ownership of `session_id` (nothing if another replica owns it).
    async fn release_session(&self, session_id: &str, replica: &str) -> StoreResult<()>;

    /// The owner of `session_id` if it beat within `lease`: its id and address.
    async fn session_owner(
        &self,
        session_id: &str,
        lease: std::time::Duration,
    ) -> StoreResult<Option<(String, String)>>;

    /// Those of `session_ids` owned by a replica that beat within `lease`.
    async fn owned_among(
        &self,
        session_ids: &[&str],
        lease: std::time::Duration,
    ) -> StoreResult<Vec<String>>;

    /// The sessions `replica` owns, whether or not it beat lately.
    async fn sessions_held_by(&self, replica: &str) -> StoreResult<Vec<String>>;

    /// The sessions owned by replicas silent for longer than `lease` (they have died).
    async fn orphans(&self, lease: std::time::Duration) -> StoreResult<Vec<String>>;
}

/// What a claim of a session found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// Another replica holds it, alive.
    Refused,
    /// The claimer holds it now; nobody else did (or it already did).
    Taken,
    /// The claimer holds it now, taken from a replica that died holding it: whatever that one
    /// left unfinished in the session (a turn's end) is the claimer's to close.
    Orphan,
}

/// The sessions a gateway that is its database's only replica holds live, recorded so that
/// the next gateway on the database, after a crash, finds those the dead one left live (and
/// tells their clients that their agent has gone). There is no lease: while a gateway serves
/// the database no other one can, so any holder but the caller is dead.
#[async_trait]
pub trait HeldSessions: Send + Sync + 'static {
    /// Records that `replica` holds live session `session_id`, whoever held it before: true
    /// when another replica did (it has died).
    async fn hold(&self, session_id: &str, replica: &str) -> StoreResult<bool>;

    /// Forgets that `replica` holds `session_id` (nothing if another replica holds it).
    async fn release(&self, session_id: &str, replica: &str) -> StoreResult<()>;

    /// Forgets every session `replica` holds (at its clean shutdown).
    async fn release_all(&self, replica: &str) -> StoreResult<()>;

    /// The sessions held by replicas other than `replica`, which have died.
    async fn left(&self, replica: &str) -> StoreResult<Vec<String>>;
}

/// How a database records the gateway processes that use it.
#[derive(Clone)]
pub enum Replicas {
    /// Several replicas may share the database (PostgreSQL).
    Shared(Arc<dyn ReplicaRegistry>),
    /// One gateway serves the database at a time (SQLite).
    Alone(Arc<dyn HeldSessions>),
}
