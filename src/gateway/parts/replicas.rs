//! This replica's place among the replicas sharing the database: its heartbeat, the sessions
//! it holds (recorded so that the others forward to it), taking over the sessions of replicas
//! that died, and where a request goes that another replica must serve (a session held there,
//! or one of an agent only others run; a new session placed by load or by agent).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::live::Busy;
use super::placement::Placement;
use crate::cluster::{Cluster, Holder};
use crate::gateway::error::Error;
use crate::gateway::event::{AgentExited, GatewayEvent, TurnEnded};
use crate::store::Claimed;

/// How long a take-over waits before asking the log again whether a turn was left open.
const ASK_AGAIN: std::time::Duration = std::time::Duration::from_millis(250);

impl Placement {
    /// Sessions held by a replica whose lease expired are `saved` now: this replica claims each
    /// (one replica wins it; a prompt making it live elsewhere may win first and closes it
    /// itself), closes what the dead one left open ([`Placement::close_orphan`]) and lets it go.
    /// The next prompt resumes it on whichever replica receives it.
    async fn take_over_orphans(&self) {
        if !self.cluster().may_take_orphans() {
            return;
        }
        let orphans = match self.cluster().orphans().await {
            Ok(orphans) => orphans,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for sessions of replicas that died");
                return;
            }
        };
        for id in orphans {
            // Busy here: a request for it is making it live, and closes it if it must.
            let Ok(_busy) = self.claim(&id, Busy::Attaching) else {
                continue;
            };
            if self.live().member(&id).is_some() {
                continue;
            }
            match self.cluster().claim(&id).await {
                Ok(Claimed::Orphan) => {
                    self.close_orphan(&id).await;
                    self.release(&id).await;
                }
                Ok(Claimed::Taken) => self.release(&id).await,
                Ok(Claimed::Refused) => {}
                Err(e) => {
                    tracing::warn!(session = id, error = %e, "cannot take over the session of a replica that died")
                }
            }
        }
    }

    /// After this replica could not beat for a while (stalled, or cut off from the database),
    /// the sessions it holds live whose lease the registry no longer gives it — another
    /// replica took them over meanwhile — are let go of here: closed at the agent and
    /// forgotten, without a word to the log (the new holder has said what happened), so that
    /// a session never runs on two replicas.
    async fn let_go_of_taken(&self) {
        // Read before the registry: a session attached since was claimed before it was.
        let held = self.live().held();
        let ours = match self.cluster().held_here().await {
            Ok(Some(ours)) => ours,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell which sessions this replica still holds");
                return;
            }
        };
        for (id, member) in held {
            if ours.contains(&id) {
                continue;
            }
            tracing::warn!(
                session = id,
                member,
                "another replica took the session over while this one could not beat; letting go of it"
            );
            if let Some(agent) = self.client(member).filter(|a| a.caps().close)
                && let Err(e) = agent.close_session(&id).await
            {
                tracing::warn!(session = id, error = %e, "closing a session taken over failed");
            }
            self.live().detach(&id, self.agents());
        }
    }

    /// Beats in the cluster every heartbeat interval until shutdown, then leaves it; beside
    /// the beats, takes over the sessions of replicas that died, and after a beat that came
    /// late lets go of the sessions others took meanwhile. The two run apart: closing an
    /// orphan waits for its log's commit (through a database outage, for as long as that
    /// lasts), and a beat held up behind it would let this replica's own lease run out while
    /// it holds sessions live, for another replica to take them from under it.
    pub(in crate::gateway) async fn heartbeat_forever(&self) {
        let cluster = &self.cluster();
        let late = AtomicBool::new(false);
        let beats = async {
            loop {
                let live = i64::try_from(self.live().live_count()).unwrap_or(i64::MAX);
                match cluster.beat(live).await {
                    Ok(beat) if beat.after_a_gap => late.store(true, Ordering::Relaxed),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "replica heartbeat failed"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(cluster.interval()) => {}
                    _ = self.stopping().cancelled() => break,
                }
            }
        };
        let take_overs = async {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(cluster.interval()) => {}
                    _ = self.stopping().cancelled() => break,
                }
                if late.swap(false, Ordering::Relaxed) {
                    self.let_go_of_taken().await;
                }
                self.take_over_orphans().await;
            }
        };
        tokio::join!(beats, take_overs);
        if let Err(e) = cluster.leave().await {
            tracing::warn!(error = %e, "could not unregister this replica");
        }
    }

    /// The address of the other replica a request about `session_id` goes to: the live one
    /// holding it, else, when this replica does not run the session's agent, the least loaded
    /// live one that does. `None`: here (where a session of an agent no live replica runs
    /// answers 503). A session this replica [holds surely](Placement::holds_surely) is served
    /// here without asking the registry.
    pub(in crate::gateway) async fn replica_for_session(
        &self,
        session_id: &str,
    ) -> Result<Option<String>, Error> {
        if self.holds_surely(session_id) {
            return Ok(None);
        }
        let asked = Instant::now();
        match self.cluster().holder(session_id).await {
            Ok(Some(Holder::Other(owner))) => return Ok(Some(owner)),
            Ok(Some(Holder::This)) => self.live().confirm(session_id, asked),
            Ok(None) => {}
            // The registry cannot be read (the database is down): what this replica works on
            // is served from its memory, as through any store outage.
            Err(e) if !self.live().here(session_id) => return Err(e.into()),
            Err(_) => {}
        }
        if self.live().here(session_id) {
            return Ok(None);
        }
        // Read the record only when some live replica runs an agent this one does not.
        if !self.cluster().runs_agents_elsewhere() {
            return Ok(None);
        }
        let record = self.records().rows().get_session(session_id).await?;
        Ok(record
            .filter(|r| r.deleted_at.is_none())
            .and_then(|r| self.cluster().runner_elsewhere(&r.agent)))
    }

    /// Whether this replica holds the session live and no other can have taken it over: it
    /// has beaten without a break since it last knew the hold was its own. After a stall past
    /// its lease, another replica may have taken the session and be running turns on it while
    /// this one still holds it (until it lets go, [`Placement::let_go_of_taken`]): served here
    /// from memory, a prompt would run a second turn beside that replica's, or be refused
    /// (409) for a turn this one still runs for a client that has given up on it.
    fn holds_surely(&self, session_id: &str) -> bool {
        match (
            self.live().held_since(session_id),
            self.cluster().beating_since(),
        ) {
            (Some(held), Some(beating)) => held >= beating,
            _ => false,
        }
    }

    /// The other replica a new session of `agent` (`None`: the default) is created on: one
    /// that holds fewer sessions, or, when this replica does not run the agent, one that does
    /// (see [`Cluster::place_elsewhere`]).
    pub(in crate::gateway) fn replica_for_new(&self, agent: Option<&str>) -> Option<String> {
        let here = i64::try_from(self.live().live_count()).unwrap_or(i64::MAX);
        self.cluster().place_elsewhere(agent, here)
    }

    /// Closes what a replica that died holding `session_id` left open, for the replica that
    /// claimed it from the dead one ([`Claimed::Orphan`]), before anything else happens in it:
    /// its log gets `agent_exited` (without a member, which was the dead replica's), and a turn
    /// the log shows started and not ended gets its `turn_ended`, with an error, as a member's
    /// crash ends one.
    pub(in crate::gateway) async fn close_orphan(&self, session_id: &str) {
        tracing::warn!(
            session = session_id,
            "the replica holding the session stopped beating; the session is saved"
        );
        let exited = AgentExited {
            session_id: session_id.to_owned(),
            member: None,
            code: None,
            signal: None,
        };
        self.log()
            .append(session_id, GatewayEvent::AgentExited(exited))
            .await;
        // Asked until the log answers (a take-over often follows a database outage): a turn
        // left open would have the next one logged inside it.
        let open = loop {
            match self.log().events().turn_open(session_id).await {
                Ok(open) => break open,
                Err(e) => {
                    tracing::warn!(session = session_id, error = %e, "cannot tell yet whether a turn was left running; asking again");
                    tokio::select! {
                        _ = tokio::time::sleep(ASK_AGAIN) => {}
                        _ = self.stopping().cancelled() => return,
                    }
                }
            }
        };
        if open {
            let gone = Error::AgentGone(
                "the gateway replica running the turn stopped before it ended".into(),
            );
            let ended = TurnEnded {
                session_id: session_id.to_owned(),
                error: Some(gone.problem()),
                ..TurnEnded::default()
            };
            self.log()
                .append(session_id, GatewayEvent::TurnEnded(ended))
                .await;
        }
    }

    /// After a turn: when its member exited while it ran (the session is held by no member
    /// here any more), lets the session go once the turn's end is stored, unless a request has
    /// made it live here again meanwhile. Until then the other replicas forward its requests
    /// here, so no turn of theirs is logged before this one's `turn_ended`.
    pub(in crate::gateway) async fn release_after_turn(&self, session_id: &str) {
        if self.live().member(session_id).is_some() {
            return;
        }
        self.log().hub().stored().await;
        // Busy here: a request is making it live again, and holds it.
        let Ok(_busy) = self.claim(session_id, Busy::Attaching) else {
            return;
        };
        if self.live().member(session_id).is_none() {
            self.release(session_id).await;
        }
    }

    /// Records that this replica holds a session it made live.
    pub(in crate::gateway) async fn hold(&self, session_id: &str) {
        if let Err(e) = self.cluster().claim(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot record that this replica holds the session");
        }
    }

    /// Records that this replica no longer holds a session.
    pub(in crate::gateway) async fn release(&self, session_id: &str) {
        release(self.cluster(), session_id).await;
    }
}

/// Records in `cluster` that this replica no longer holds a session.
pub(in crate::gateway) async fn release(cluster: &Cluster, session_id: &str) {
    if let Err(e) = cluster.release(session_id).await {
        tracing::warn!(session = session_id, error = %e, "cannot record that this replica gave the session up");
    }
}
