//! The replicas sharing one database. Each gateway registers itself under a fresh id with the
//! URL other replicas reach it at, beats every heartbeat interval (stamped with the database's
//! clock, with the number of sessions it holds live), and unregisters at a clean shutdown. Its
//! latest reading of the table is the cluster view of `GET /agent` and `/metrics`; a replica
//! silent for three intervals is shown as not live. On PostgreSQL every append to a log also
//! notifies the other replicas, so that their subscribers follow sessions written elsewhere.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::{Replica, Store, StoreResult};

/// This process's replica id: fresh at every start, shared by its registry row and the
/// notifications its appends send to the other replicas.
pub fn replica_id() -> &'static str {
    static ID: LazyLock<String> = LazyLock::new(|| uuid::Uuid::new_v4().to_string());
    &ID
}

/// Heartbeats missed before a replica is shown as not live.
const LEASE_INTERVALS: u32 = 3;
/// Silent replicas are forgotten after this.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// One replica in `GET /agent`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaView {
    pub id: String,
    /// The URL other replicas reach it at (`--advertise-url`).
    pub address: String,
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat, by the database's clock.
    pub heartbeat_at: DateTime<Utc>,
    /// Sessions it held live at that heartbeat.
    pub sessions_live: i64,
    /// Whether it beat within the last three heartbeat intervals.
    pub live: bool,
    /// Whether it is the replica answering.
    pub this: bool,
}

/// This replica's membership of the cluster.
pub struct Cluster {
    store: Arc<dyn Store>,
    /// Whether other replicas may use the database (PostgreSQL), so that sessions may be held
    /// elsewhere.
    shared: bool,
    address: String,
    started_at: DateTime<Utc>,
    interval: Duration,
    view: Mutex<Vec<ReplicaView>>,
}

impl Cluster {
    pub fn new(store: Arc<dyn Store>, address: String, interval: Duration) -> Self {
        Cluster {
            shared: store.is_shared(),
            store,
            address,
            started_at: Utc::now(),
            interval,
            view: Mutex::default(),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Records a heartbeat and refreshes the view.
    pub async fn beat(&self, sessions_live: i64) -> StoreResult<()> {
        self.store
            .heartbeat_replica(
                replica_id(),
                &self.address,
                self.started_at,
                sessions_live,
                FORGET_AFTER,
            )
            .await?;
        let replicas = self.store.replicas().await?;
        let lease = self.lease();
        let view = replicas
            .into_iter()
            .map(|r: Replica| ReplicaView {
                this: r.id == replica_id(),
                live: r.silent_for <= lease,
                id: r.id,
                address: r.address,
                started_at: r.started_at,
                heartbeat_at: r.heartbeat_at,
                sessions_live: r.sessions_live,
            })
            .collect();
        *self.view.lock().expect("view lock") = view;
        Ok(())
    }

    /// How long a replica's claims hold after its last heartbeat.
    pub fn lease(&self) -> Duration {
        self.interval * LEASE_INTERVALS
    }

    /// Takes ownership of a session made live here; false if a live replica owns it.
    pub async fn claim(&self, session_id: &str) -> StoreResult<bool> {
        self.store
            .claim_session(session_id, replica_id(), self.lease())
            .await
    }

    /// Gives up ownership of a session no longer live here.
    pub async fn release(&self, session_id: &str) -> StoreResult<()> {
        self.store.release_session(session_id, replica_id()).await
    }

    /// The address of the live replica other than this one that owns `session_id`, if any.
    pub async fn owner_elsewhere(&self, session_id: &str) -> StoreResult<Option<String>> {
        if !self.shared {
            return Ok(None);
        }
        let owner = self.store.session_owner(session_id, self.lease()).await?;
        Ok(owner.and_then(|(id, address)| (id != replica_id()).then_some(address)))
    }

    /// Where a new session should go: the live replica holding the fewest sessions, when that
    /// is fewer than `live_here` (this replica's count now; the others' are as of their last
    /// heartbeat, raised here for each session sent their way since). `None`: here.
    pub fn place_elsewhere(&self, live_here: i64) -> Option<String> {
        let mut view = self.view.lock().expect("view lock");
        let least = view
            .iter_mut()
            .filter(|r| r.live && !r.this)
            .min_by_key(|r| r.sessions_live)?;
        if least.sessions_live >= live_here {
            return None;
        }
        least.sessions_live += 1;
        Some(least.address.clone())
    }

    /// Ends the ownerships of replicas whose lease expired; returns their sessions.
    pub async fn release_orphans(&self) -> StoreResult<Vec<String>> {
        self.store.release_orphans(self.lease()).await
    }

    /// Unregisters this replica (at a clean shutdown).
    pub async fn leave(&self) -> StoreResult<bool> {
        self.store.remove_replica(replica_id()).await
    }

    /// The replicas as of the last heartbeat, oldest first.
    pub fn view(&self) -> Vec<ReplicaView> {
        self.view.lock().expect("view lock").clone()
    }
}
