//! The replicas sharing one database. Each gateway registers itself under a fresh id with the
//! URL other replicas reach it at, beats every heartbeat interval (stamped with the database's
//! clock, with the number of sessions it holds live and the agents it runs), and unregisters at
//! a clean shutdown. Its latest reading of the table is the cluster view of `GET /agent`,
//! `GET /agents` and `/metrics`; a replica silent for three intervals is shown as not live. The
//! view also says where a new session goes (the least loaded live replica that runs its agent)
//! and where the requests about a session of an agent this replica does not run go. On
//! PostgreSQL every append to a log also notifies the other replicas, so that their subscribers
//! follow sessions written elsewhere.
//!
//! On SQLite, which one gateway serves at a time, there is no registry: the view is this
//! replica alone, every claim succeeds, and the sessions it holds live are recorded only so
//! that, after a crash, the next gateway on the file can tell their clients the agent is gone.

use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::{Claimed, Heartbeat, Replica, Replicas, StoreResult};

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
    /// The agents it runs (`--agent`), its default first.
    pub agents: Vec<String>,
    /// Whether it beat within the last three heartbeat intervals.
    pub live: bool,
    /// Whether it is the replica answering.
    pub this: bool,
}

impl ReplicaView {
    /// A replica as it said at its heartbeat of `heartbeat_at`.
    fn of(beat: Heartbeat, heartbeat_at: DateTime<Utc>, live: bool) -> Self {
        ReplicaView {
            this: beat.id == replica_id(),
            live,
            id: beat.id,
            address: beat.address,
            started_at: beat.started_at,
            heartbeat_at,
            sessions_live: beat.sessions_live,
            agents: beat.agents,
        }
    }
}

/// This replica's membership of the cluster.
pub struct Cluster {
    /// The registry where other replicas may share the database (PostgreSQL), so that sessions
    /// may be held elsewhere; else the record of the sessions held here (SQLite).
    replicas: Replicas,
    address: String,
    /// The agents this replica runs, its default first (those installed from the registry
    /// added and removed as they come and go: [`Cluster::set_agents`]).
    agents: Mutex<Vec<String>>,
    started_at: DateTime<Utc>,
    interval: Duration,
    view: Mutex<Vec<ReplicaView>>,
    /// What the replicas sharing the database sign the requests they forward to each other
    /// with (see [`Cluster::secret`]).
    secret: std::sync::Arc<[u8]>,
    /// This replica's unbroken run of heartbeats: when it began and the latest (see
    /// [`Cluster::may_take_orphans`]).
    streak: Mutex<Option<(Instant, Instant)>>,
}

/// Who holds a session, by the registry (see [`Cluster::holder`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// This replica.
    This,
    /// Another live replica, at this address.
    Other(String),
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// It began a new run of heartbeats (the last one failed, came late or waited for the
    /// database): the others may have found this replica silent past its lease and taken
    /// sessions it holds (see [`Cluster::held_here`]).
    pub after_a_gap: bool,
}

impl Cluster {
    /// The agents this replica runs now, its default first.
    pub fn agents(&self) -> Vec<String> {
        self.agents.lock().expect("agents lock").clone()
    }

    /// Says which agents this replica runs from now on (its next heartbeat tells the others).
    pub fn set_agents(&self, agents: Vec<String>) {
        *self.agents.lock().expect("agents lock") = agents;
    }

    /// This replica's membership, reached at `address`, running `agents` (the default first),
    /// sharing `secret` with the other replicas.
    pub fn new(
        replicas: Replicas,
        (address, secret): (String, Vec<u8>),
        agents: Vec<String>,
        interval: Duration,
    ) -> Self {
        Cluster {
            secret: secret.into(),
            replicas,
            address,
            agents: Mutex::new(agents),
            // As a database stores it, to the microsecond.
            started_at: Utc::now().trunc_subsecs(6),
            interval,
            view: Mutex::default(),
            streak: Mutex::default(),
        }
    }

    /// The secret the replicas sharing the database hold (stored there; no client reads it):
    /// a request one forwards to another is signed with it.
    pub fn secret(&self) -> std::sync::Arc<[u8]> {
        self.secret.clone()
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Records a heartbeat and refreshes the view. A replica alone on its database is the
    /// whole view, live, beating now.
    pub async fn beat(&self, sessions_live: i64) -> StoreResult<Beat> {
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
        let after_a_gap = matches!(*streak, Some((first, last)) if first == last);
        beat.map(|()| Beat { after_a_gap })
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

    /// Since when this replica has beaten without a break (the run
    /// [`Cluster::may_take_orphans`] counts): no other replica can have taken a session it held
    /// since then. `None` while its latest beat is more than two intervals old, or failed.
    pub fn beating_since(&self) -> Option<Instant> {
        let now = Instant::now();
        let streak = *self.streak.lock().expect("streak lock");
        streak.and_then(|(first, last)| (now - last <= 2 * self.interval).then_some(first))
    }

    async fn beat_once(&self, sessions_live: i64) -> StoreResult<()> {
        let beat = Heartbeat {
            id: replica_id().to_owned(),
            address: self.address.clone(),
            started_at: self.started_at,
            sessions_live,
            agents: self.agents(),
        };
        let registry = match &self.replicas {
            Replicas::Shared(registry) => registry,
            Replicas::Alone(_) => {
                let now = Utc::now().trunc_subsecs(6);
                *self.view.lock().expect("view lock") = vec![ReplicaView::of(beat, now, true)];
                return Ok(());
            }
        };
        registry.heartbeat_replica(&beat, FORGET_AFTER).await?;
        let replicas = registry.replicas().await?;
        let lease = self.lease();
        let view = replicas
            .into_iter()
            .map(|r: Replica| ReplicaView::of(r.beat, r.heartbeat_at, r.silent_for <= lease))
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

    /// The live replica that owns `session_id` in the registry, if one does. Alone on its
    /// database a replica has no registry to ask: what it holds is in its own memory.
    pub async fn holder(&self, session_id: &str) -> StoreResult<Option<Holder>> {
        let Replicas::Shared(registry) = &self.replicas else {
            return Ok(None);
        };
        let owner = registry.session_owner(session_id, self.lease()).await?;
        Ok(owner.map(|(id, address)| {
            if id == replica_id() {
                Holder::This
            } else {
                Holder::Other(address)
            }
        }))
    }

    /// The address of the live replica other than this one that owns `session_id`, if any.
    pub async fn owner_elsewhere(&self, session_id: &str) -> StoreResult<Option<String>> {
        Ok(match self.holder(session_id).await? {
            Some(Holder::Other(address)) => Some(address),
            _ => None,
        })
    }

    /// Those of `session_ids` another live replica holds, by the registry; none without
    /// another live replica.
    pub async fn held_elsewhere_among(
        &self,
        session_ids: &[&str],
    ) -> StoreResult<std::collections::HashSet<String>> {
        let Replicas::Shared(registry) = &self.replicas else {
            return Ok(Default::default());
        };
        let others = self.view().iter().any(|r| r.live && !r.this);
        if !others || session_ids.is_empty() {
            return Ok(Default::default());
        }
        let owned = registry.owned_among(session_ids, self.lease()).await?;
        Ok(owned.into_iter().collect())
    }

    /// Those of `session_ids` a live replica holds, this one included, by the registry as it is
    /// now (not as of the last heartbeat); `None` alone on its database.
    pub async fn held_among(
        &self,
        session_ids: &[&str],
    ) -> StoreResult<Option<std::collections::HashSet<String>>> {
        let Replicas::Shared(registry) = &self.replicas else {
            return Ok(None);
        };
        if session_ids.is_empty() {
            return Ok(Some(Default::default()));
        }
        let owned = registry.owned_among(session_ids, self.lease()).await?;
        Ok(Some(owned.into_iter().collect()))
    }

    /// Where a new session of `agent` (`None`: this replica's default) should go, among the
    /// other live replicas that can start it: those that run the agent named, or, when none is
    /// named, those whose default agent is this one's (the request, forwarded as it is, gets
    /// the default of the replica that serves it). When this replica runs the agent, the one
    /// holding the fewest sessions, if that is fewer than `live_here` (this replica's count
    /// now; the others' are as of their last heartbeat, raised here for each session sent
    /// their way since); when it does not, the one holding the fewest. `None`: here (where a
    /// create for an agent no live replica runs fails).
    pub fn place_elsewhere(&self, agent: Option<&str>, live_here: i64) -> Option<String> {
        let here = self.agents();
        let default = here.first().map(String::as_str);
        let wanted = agent.or(default)?;
        let can_start = |r: &ReplicaView| match agent {
            Some(_) => r.agents.iter().any(|a| a == wanted),
            None => r.agents.first().is_some_and(|a| a == wanted),
        };
        let runs_here = here.iter().any(|a| a == wanted);
        let mut view = self.view.lock().expect("view lock");
        let least = view
            .iter_mut()
            .filter(|r| r.live && !r.this && can_start(r))
            .min_by_key(|r| r.sessions_live)?;
        if runs_here && least.sessions_live >= live_here {
            return None;
        }
        least.sessions_live += 1;
        Some(least.address.clone())
    }

    /// Where the requests about a session of `agent` go when no replica holds it live: `None`
    /// when this replica runs the agent (or no live one does), else the address of the live
    /// replica running it that holds the fewest sessions.
    pub fn runner_elsewhere(&self, agent: &str) -> Option<String> {
        if self.agents().iter().any(|a| a == agent) {
            return None;
        }
        let view = self.view.lock().expect("view lock");
        view.iter()
            .filter(|r| r.live && !r.this && r.agents.iter().any(|a| a == agent))
            .min_by_key(|r| r.sessions_live)
            .map(|r| r.address.clone())
    }

    /// The ids of the live replicas (this one included) that run `agent`, oldest first.
    pub fn runners(&self, agent: &str) -> Vec<String> {
        let here = self.agents();
        let view = self.view.lock().expect("view lock");
        let runs = |r: &&ReplicaView| match r.this {
            // This replica's agents as they are now, not as of its last heartbeat.
            true => here.iter().any(|a| a == agent),
            false => r.agents.iter().any(|a| a == agent),
        };
        view.iter()
            .filter(|r| r.live)
            .filter(runs)
            .map(|r| r.id.clone())
            .collect()
    }

    /// Whether a live replica runs an agent this one does not (what [`Cluster::agents_elsewhere`]
    /// lists, without listing it).
    pub fn runs_agents_elsewhere(&self) -> bool {
        let here = self.agents();
        let view = self.view.lock().expect("view lock");
        view.iter()
            .filter(|r| r.live && !r.this)
            .flat_map(|r| &r.agents)
            .any(|a| !here.contains(a))
    }

    /// The address of the live replica other than this one whose id is `id`, as of the view.
    pub fn address_of(&self, id: &str) -> Option<String> {
        let view = self.view.lock().expect("view lock");
        view.iter()
            .find(|r| r.id == id && r.live && !r.this)
            .map(|r| r.address.clone())
    }

    /// [`Cluster::address_of`], or, for a replica the view does not have (one that started
    /// since this replica's last heartbeat), as the registry has it now.
    pub async fn address_of_now(&self, id: &str) -> StoreResult<Option<String>> {
        if let Some(address) = self.address_of(id) {
            return Ok(Some(address));
        }
        let Replicas::Shared(registry) = &self.replicas else {
            return Ok(None);
        };
        if id == replica_id() {
            return Ok(None);
        }
        let lease = self.lease();
        Ok(registry
            .replicas()
            .await?
            .into_iter()
            .find(|r| r.beat.id == id && r.silent_for <= lease)
            .map(|r| r.beat.address))
    }

    /// Whether the replica `id` is gone: not this one, and (by the registry now) silent past its
    /// lease or unregistered, as this replica may tell ([`Cluster::may_take_orphans`]). Alone on
    /// its database, every replica but this one is gone (the file's lock keeps out a second
    /// while this one runs).
    pub async fn gone(&self, id: &str) -> StoreResult<bool> {
        if id == replica_id() || !self.may_take_orphans() {
            return Ok(false);
        }
        Ok(self.address_of_now(id).await?.is_none())
    }

    /// The agents that live replicas run and this one does not, by name.
    pub fn agents_elsewhere(&self) -> Vec<String> {
        let here = self.agents();
        let view = self.view.lock().expect("view lock");
        let mut names: Vec<String> = view
            .iter()
            .filter(|r| r.live && !r.this)
            .flat_map(|r| &r.agents)
            .filter(|a| !here.contains(a))
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The sessions the registry says this replica holds; `None` alone on its database, where
    /// no other replica can take one.
    pub async fn held_here(&self) -> StoreResult<Option<std::collections::HashSet<String>>> {
        let Replicas::Shared(registry) = &self.replicas else {
            return Ok(None);
        };
        let held = registry.sessions_held_by(replica_id()).await?;
        Ok(Some(held.into_iter().collect()))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::HeldSessions;

    /// Holds nothing: these tests read only the view.
    struct NothingHeld;

    #[async_trait::async_trait]
    impl HeldSessions for NothingHeld {
        async fn hold(&self, _: &str, _: &str) -> StoreResult<bool> {
            Ok(false)
        }
        async fn release(&self, _: &str, _: &str) -> StoreResult<()> {
            Ok(())
        }
        async fn release_all(&self, _: &str) -> StoreResult<()> {
            Ok(())
        }
        async fn left(&self, _: &str) -> StoreResult<Vec<String>> {
            Ok(Vec::new())
        }
    }

    fn replica(id: &str, agents: &[&str], sessions_live: i64, live: bool) -> ReplicaView {
        ReplicaView {
            id: id.to_owned(),
            address: format!("http://{id}"),
            started_at: DateTime::UNIX_EPOCH,
            heartbeat_at: DateTime::UNIX_EPOCH,
            sessions_live,
            agents: agents.iter().map(|a| a.to_string()).collect(),
            live,
            this: id == "here",
        }
    }

    /// This replica ("here") runs `a` only; r2 runs `a` and `b`, holding 5 sessions; r3 runs
    /// `b` (its default) and `a`, holding none; r4, not live, runs `b` and `c`.
    fn cluster() -> Cluster {
        let cluster = Cluster::new(
            Replicas::Alone(Arc::new(NothingHeld)),
            ("http://here".into(), vec![0; 32]),
            vec!["a".into()],
            Duration::from_secs(1),
        );
        *cluster.view.lock().unwrap() = vec![
            replica("here", &["a"], 0, true),
            replica("r2", &["a", "b"], 5, true),
            replica("r3", &["b", "a"], 0, true),
            replica("r4", &["b", "c"], 0, false),
        ];
        cluster
    }

    #[test]
    fn a_new_session_goes_to_a_live_replica_that_can_start_it() {
        let c = cluster();
        let elsewhere = |agent, here| c.place_elsewhere(agent, here);
        // Not run here: the least loaded live replica running it, whatever this one holds.
        assert_eq!(elsewhere(Some("b"), 0).as_deref(), Some("http://r3"));
        // Run here: elsewhere only to a replica holding fewer (r3 holds 1 since the last).
        assert_eq!(elsewhere(Some("a"), 1), None);
        assert_eq!(elsewhere(Some("a"), 2).as_deref(), Some("http://r3"));
        // Named by nobody: only to a replica whose default is this one's (r3's is b).
        assert_eq!(elsewhere(None, 9).as_deref(), Some("http://r2"));
        // Run by no live replica (r4 is not): here, where the create fails.
        assert_eq!(elsewhere(Some("c"), 9), None);
    }

    #[test]
    fn the_view_says_which_live_replicas_run_an_agent() {
        let c = cluster();
        assert_eq!(c.runners("a"), ["here", "r2", "r3"]);
        assert_eq!(c.runners("b"), ["r2", "r3"]);
        assert!(c.runners("c").is_empty(), "r4 is not live");
        assert_eq!(c.agents_elsewhere(), ["b"]);
        assert!(c.runs_agents_elsewhere());
        assert_eq!(c.address_of("r2").as_deref(), Some("http://r2"));
        assert_eq!(c.address_of("r4"), None, "not live");
        assert_eq!(c.runner_elsewhere("a"), None, "run here");
        assert_eq!(c.runner_elsewhere("b").as_deref(), Some("http://r3"));
        assert_eq!(c.runner_elsewhere("c"), None);
    }
}
