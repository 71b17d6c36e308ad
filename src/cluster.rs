//! The replicas sharing one database. Each gateway registers itself under a fresh id with the
//! URL other replicas reach it at, beats every heartbeat interval (stamped with the database's
//! clock, with the number of sessions it holds live), and unregisters at a clean shutdown. Its
//! latest reading of the table is the cluster view of `GET /agent` and `/metrics`; a replica
//! silent for three intervals is shown as not live. On PostgreSQL every append to a log also
//! notifies the other replicas, so that their subscribers follow sessions written elsewhere.
//!
//! On SQLite, which one gateway serves at a time, there is no registry: the view is this
//! replica alone, every claim succeeds, and the sessions it holds live are recorded only so
//! that, after a crash, the next gateway on the file can tell their clients the agent is gone.

use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::{Claimed, Replica, Replicas, StoreResult};

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
    /// The registry where other replicas may share the database (PostgreSQL), so that sessions
    /// may be held elsewhere; else the record of the sessions held here (SQLite).
    replicas: Replicas,
    address: String,
    started_at: DateTime<Utc>,
    interval: Duration,
    view: Mutex<Vec<ReplicaView>>,
    /// This replica's unbroken run of heartbeats: when it began and the latest (see
    /// [`Cluster::may_take_orphans`]).
    streak: Mutex<Option<(Instant, Instant)>>,
}

impl Cluster {
    pub fn new(replicas: Replicas, address: String, interval: Duration) -> Self {
        Cluster {
            replicas,
            address,
            // As a database stores it, to the microsecond.
            started_at: Utc::now().trunc_subsecs(6),
            interval,
            view: Mutex::default(),
            streak: Mutex::default(),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Records a heartbeat and refreshes the view. A replica alone on its database is the
    /// whole view, live, beating now.
    pub async fn beat(&self, sessions_live: i64) -> StoreResult<()> {
        let started = Instant::now();
        let beat = self.beat_once(sessions_live).await;
        let now = Instant::now();
        // A beat that waited for the database (through an outage) breaks the run as a failed
        // one does; so does a long gap since the last.
        let prompt = now - started <= self.interval;
        let mut streak = self.streak.lock().expect("streak lock");
        *streak = match (*streak, &beat) {
            (_, Err(_)) => None,
            (Some((first, last)), Ok(())) if prompt && now - last <= 2 * self.interval => {
                Some((first, now))
            }
            (_, Ok(())) => Some((now, now)),
        };
        beat
    }

    /// Whether this replica may take the sessions of replicas whose lease has expired: only
    /// once its own heartbeats have gone through, unbroken, for a whole lease. A replica that
    /// could not beat (the database restarting, or this process stalled) cannot tell a dead
    /// replica from one that could not beat either; so after a database outage every replica
    /// first beats again for a lease, and none takes a live one's sessions. Alone on its
    /// database, a replica may always: any other holder is dead.
    pub fn may_take_orphans(&self) -> bool {
        if matches!(self.replicas, Replicas::Alone(_)) {
            return true;
        }
        let now = Instant::now();
        self.streak
            .lock()
            .expect("streak lock")
            .is_some_and(|(first, last)| {
                now - last <= 2 * self.interval && now - first >= self.lease()
            })
    }

    async fn beat_once(&self, sessions_live: i64) -> StoreResult<()> {
        let registry = match &self.replicas {
            Replicas::Shared(registry) => registry,
            Replicas::Alone(_) => {
                *self.view.lock().expect("view lock") = vec![ReplicaView {
                    id: replica_id().to_owned(),
                    address: self.address.clone(),
                    started_at: self.started_at,
                    heartbeat_at: Utc::now().trunc_subsecs(6),
                    sessions_live,
                    live: true,
                    this: true,
                }];
                return Ok(());
            }
        };
        registry
            .heartbeat_replica(
                replica_id(),
                &self.address,
                self.started_at,
                sessions_live,
                FORGET_AFTER,
            )
            .await?;
        let replicas = registry.replicas().await?;
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

    /// Takes ownership of a session made live here, unless a live replica owns it (or, while
    /// this replica [may not take orphans](Cluster::may_take_orphans), any replica it has not
    /// forgotten).
    pub async fn claim(&self, session_id: &str) -> StoreResult<Claimed> {
        match &self.replicas {
            Replicas::Shared(registry) => {
                let lease = if self.may_take_orphans() {
                    self.lease()
                } else {
                    FORGET_AFTER
                };
                registry
                    .claim_session(session_id, replica_id(), lease)
                    .await
            }
            Replicas::Alone(held) => Ok(if held.hold(session_id, replica_id()).await? {
                Claimed::Orphan
            } else {
                Claimed::Taken
            }),
        }
    }

    /// Gives up ownership of a session no longer live here.
    pub async fn release(&self, session_id: &str) -> StoreResult<()> {
        match &self.replicas {
            Replicas::Shared(registry) => registry.release_session(session_id, replica_id()).await,
            Replicas::Alone(held) => held.release(session_id, replica_id()).await,
        }
    }

    /// The address of the live replica other than this one that owns `session_id`, if any.
    pub async fn owner_elsewhere(&self, session_id: &str) -> StoreResult<Option<String>> {
        let Replicas::Shared(registry) = &self.replicas else {
            return Ok(None);
        };
        let owner = registry.session_owner(session_id, self.lease()).await?;
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

    /// The sessions of replicas whose lease expired (to be claimed, as [`Claimed::Orphan`], by
    /// one replica). Alone on its database, a replica finds those a gateway that died before
    /// it left live.
    pub async fn orphans(&self) -> StoreResult<Vec<String>> {
        match &self.replicas {
            Replicas::Shared(registry) => registry.orphans(self.lease()).await,
            Replicas::Alone(held) => held.left(replica_id()).await,
        }
    }

    /// Unregisters this replica (at a clean shutdown).
    pub async fn leave(&self) -> StoreResult<bool> {
        match &self.replicas {
            Replicas::Shared(registry) => registry.remove_replica(replica_id()).await,
            Replicas::Alone(held) => {
                held.release_all(replica_id()).await?;
                Ok(true)
            }
        }
    }

    /// The replicas as of the last heartbeat, oldest first.
    pub fn view(&self) -> Vec<ReplicaView> {
        self.view.lock().expect("view lock").clone()
    }
}
