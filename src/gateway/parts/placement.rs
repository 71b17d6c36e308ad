//! Where a session is live: the member a session goes to when it becomes live (the least-loaded
//! ready one, within the caps, waiting a bounded time for a starting one), attaching a saved
//! session (resume, else load; on another member when the request never reached the agent),
//! detaching it, closing idle ones, and which agent client a call about a session goes through.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol_schema::v1::AGENT_METHOD_NAMES;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::live::{Busy, Claim, LiveTable, TurnPhase};
use super::log::Log;
use super::quotas::Quotas;
use super::records::Records;
use super::requests::Requests;
use super::snapshots::States;
use crate::agent_rpc::caps::Capabilities;
use crate::agent_rpc::{CallError, Connection};
use crate::cluster::Cluster;
use crate::gateway::error::Error;
use crate::gateway::event::GatewayLifecycleEvent;
use crate::gateway::output::Status;
use crate::gateway::portable::read_only;
use crate::pool::client::AgentClient;
use crate::pool::{AgentHost, AgentPool, Agents, Pool};
use crate::store::{Claimed, SessionRecord};

/// How many sessions may be live, and how long placing one may take.
#[derive(Debug, Clone, Copy)]
pub(in crate::gateway) struct LiveLimits {
    /// Live sessions in the pool (0: no limit).
    pub(in crate::gateway) max_sessions: usize,
    /// Live sessions per member (0: no limit).
    pub(in crate::gateway) max_sessions_per_member: usize,
    /// How long a request that needs a member waits for a starting or restarting one.
    pub(in crate::gateway) acquire_timeout: Duration,
    /// Bound on every agent control call, and on waiting for a busy session.
    pub(in crate::gateway) control_timeout: Duration,
}

/// The agents' members and the sessions live on them: where a session goes, which client a
/// call about it goes through, and this replica's place among the replicas (`replicas.rs`).
/// Built from what it holds, in this order (`Placement::new`).
#[derive(derive_more::Constructor)]
#[allow(clippy::too_many_arguments)]
pub(in crate::gateway) struct Placement {
    agents: Arc<Agents>,
    live: Arc<LiveTable>,
    records: Arc<Records>,
    log: Log,
    states: Arc<States>,
    requests: Arc<Requests>,
    cluster: Arc<Cluster>,
    limits: LiveLimits,
    /// The tenants' limits, which a session being made live counts against.
    quotas: Arc<Quotas>,
    /// Ends the idle reaper and the heartbeat.
    stop: CancellationToken,
}

impl Placement {
    /// The agents' pools.
    pub(in crate::gateway) fn agents(&self) -> &Arc<Agents> {
        &self.agents
    }

    /// The sessions this replica holds.
    pub(in crate::gateway) fn live(&self) -> &Arc<LiveTable> {
        &self.live
    }

    /// This replica among the replicas.
    pub(in crate::gateway) fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The session records.
    pub(in crate::gateway) fn records(&self) -> &Arc<Records> {
        &self.records
    }

    /// The logs.
    pub(in crate::gateway) fn log(&self) -> &Log {
        &self.log
    }

    /// Cancelled at shutdown: ends the idle reaper and the heartbeat.
    pub(in crate::gateway) fn stopping(&self) -> &CancellationToken {
        &self.stop
    }

    /// The tenants' limits.
    pub(in crate::gateway) fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// The capabilities of agent `agent` (none when this gateway does not run it, or none of
    /// its members has answered `initialize` yet).
    pub(in crate::gateway) fn caps(&self, agent: &str) -> Capabilities {
        self.agents
            .get(agent)
            .map(|a| a.pool().caps())
            .unwrap_or_default()
    }

    /// The typed client of member `member` (of whichever agent), if it is running.
    pub(in crate::gateway) fn client(&self, member: usize) -> Option<AgentClient> {
        let agent = self.agents.of_member(member)?;
        let pool = agent.pool_of(member)?;
        let conn = pool.conn(member)?;
        Some(self.client_of(conn, pool.caps()))
    }

    /// The typed client of an agent connection: the agent's capabilities, the control timeout.
    fn client_of(&self, conn: Arc<Connection>, caps: Capabilities) -> AgentClient {
        AgentClient::new(conn, caps, self.limits.control_timeout)
    }

    /// The agent `name` this gateway runs, for a session recorded with it: 503 when this
    /// replica does not run it (a request about such a session reaches this replica only when
    /// no live replica runs the agent: `api::forward` sends it to one that does).
    pub(in crate::gateway) fn agent_named(&self, name: &str) -> Result<Arc<AgentPool>, Error> {
        self.agents.get(name).ok_or_else(|| Error::NoMember {
            reason: format!("this gateway replica does not run the agent {name:?}"),
            retry_after: Duration::from_secs(5),
        })
    }

    /// The host of the session's agent, when it runs on another: where its member (or, not
    /// live here, any member) bridges to.
    pub(in crate::gateway) fn host_of(&self, record: &SessionRecord) -> Option<AgentHost> {
        let agent = self.agents.get(&record.agent).filter(|a| a.is_remote())?;
        agent.host(self.live.member(&record.session_id))
    }

    /// Whether the agent `name` runs on another host: its sessions' workspaces are the
    /// host's to keep.
    pub(in crate::gateway) fn is_remote(&self, name: &str) -> bool {
        self.agents.get(name).is_some_and(|a| a.is_remote())
    }

    /// Whether any agent runs on another host.
    pub(in crate::gateway) fn any_remote(&self) -> bool {
        self.agents.all().iter().any(|a| a.is_remote())
    }

    /// Whether `session_id` is live here on a member of an agent on another host.
    pub(in crate::gateway) fn live_elsewhere(&self, session_id: &str) -> bool {
        let member = self.live.member(session_id);
        member
            .and_then(|m| self.agents.of_member(m))
            .is_some_and(|a| a.is_remote())
    }

    /// 501 when the session's agent runs on another host: its files are there, not here.
    pub(in crate::gateway) fn files_here(&self, record: &SessionRecord) -> Result<(), Error> {
        if !self.is_remote(&record.agent) {
            return Ok(());
        }
        Err(Error::NotSupported(format!(
            "agent {:?} runs on another host, which is no acp-gateway: this session's files are there, out of this gateway's reach",
            record.agent
        )))
    }

    /// An agent's "authentication required", completed with what it offers: the client (an
    /// operator, really) learns which `auth-method` to configure.
    pub(in crate::gateway) fn auth_hint(&self, agent: &str, e: Error) -> Error {
        let Error::AgentAuthRequired { message, .. } = e else {
            return e;
        };
        let offered: Vec<String> = self
            .agents
            .get(agent)
            .and_then(|a| a.pool().init())
            .and_then(|i| i.auth_methods.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|m| {
                m.get("id")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
            })
            .collect();
        Error::AgentAuthRequired {
            message: format!(
                "{message}: the agent {agent:?} needs a sign-in; it offers authMethods {offered:?} (give it its key in its env, or configure its auth-method and auth-meta)"
            ),
            methods: offered,
        }
    }

    /// The agent a request names (the default one when it names none): 422 for a name not
    /// configured, naming those that are.
    pub(in crate::gateway) fn requested_agent(
        &self,
        name: Option<&str>,
    ) -> Result<Arc<AgentPool>, Error> {
        match name {
            None => Ok(self.agents.default_agent()),
            Some(name) => self.agents.get(name).ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown agent {name:?}; this gateway runs {:?}",
                    self.agents.names()
                ))
            }),
        }
    }

    /// Marks the session busy (409 if it already is); the guard frees it on drop.
    pub(in crate::gateway) fn claim(&self, session_id: &str, what: Busy) -> Result<Claim, Error> {
        self.live.busy(session_id, what)
    }

    /// [`Placement::claim`] for a request: waits (bounded) for a session being attached.
    pub(in crate::gateway) async fn claim_waiting(
        &self,
        session_id: &str,
        what: Busy,
    ) -> Result<Claim, Error> {
        let bound = self.limits.control_timeout;
        self.live.busy_waiting(session_id, what, bound).await
    }

    /// For a running turn: its member once its prompt is sent, and a receiver that closes when
    /// it ends.
    pub(in crate::gateway) async fn running_turn(
        &self,
        session_id: &str,
    ) -> Option<(usize, watch::Receiver<TurnPhase>)> {
        let bound = self.limits.control_timeout;
        self.live.running_turn(session_id, bound).await
    }

    /// Where a session of `tenant` that becomes live goes: the least-loaded ready member of the
    /// agent's pool for the tenant (its own, if it has one) below the per-member cap, if the
    /// global cap allows another live session. While members start or restart, waits up to
    /// `--acquire-timeout` for one of them.
    pub(in crate::gateway) async fn place(
        &self,
        agent: &str,
        tenant: &str,
    ) -> Result<(usize, AgentClient), Error> {
        let cfg = &self.limits;
        if cfg.max_sessions > 0 && self.live.live_count() >= cfg.max_sessions {
            return Err(Error::NoCapacity(format!(
                "the gateway already holds its maximum of {} live sessions; close some or try again later",
                cfg.max_sessions
            )));
        }
        let of_agent = self.agent_named(agent)?;
        if of_agent.max_sessions() > 0 {
            let live = self.live.live_count_where(|m| of_agent.has(m));
            if live >= of_agent.max_sessions() {
                return Err(Error::NoCapacity(format!(
                    "the agent {agent:?} already holds its maximum of {} live sessions; close some or try again later",
                    of_agent.max_sessions()
                )));
            }
        }
        let cap = match cfg.max_sessions_per_member {
            0 => usize::MAX,
            n => n,
        };
        let pool = of_agent.pool_for(tenant);
        let (member, conn) = self.acquire(agent, pool, cap).await?;
        Ok((member, self.client_of(conn, pool.caps())))
    }

    /// A ready member below `cap` (see [`crate::pool::Pool::acquire`]); 503 when none: a
    /// capacity cap (`NoCapacity`), or no member ready in time (`NoMember`, with the time to
    /// the next restart attempt).
    async fn acquire(
        &self,
        agent: &str,
        pool: &Pool,
        cap: usize,
    ) -> Result<(usize, Arc<Connection>), Error> {
        let wait = self.limits.acquire_timeout;
        // A wait of its own in the request's trace (short when a member is ready).
        let span = tracing::info_span!("acquire member", agent, member = tracing::field::Empty);
        let acquired = pool.acquire(cap, wait).instrument(span.clone()).await;
        if let Ok((member, _)) = &acquired {
            // (Integers as `i64`: OpenTelemetry has no unsigned attributes.)
            span.record("member", *member as i64);
        }
        acquired.map_err(|no| {
            if no.full {
                Error::NoCapacity(no.reason)
            } else {
                Error::NoMember {
                    reason: no.reason,
                    retry_after: no.retry_after,
                }
            }
        })
    }

    /// Whether a create or an attach that failed with `error` is tried again on another member;
    /// counts the retry. Only when its member's connection ended before it answered: the
    /// request never reached the agent (`CallError::NotSent`), or it did and the process died
    /// with it (`CallError::Closed`): a create or an attach that died with its member had no
    /// effect a client saw. That connection
    /// is never picked again, so each retry goes to another member's process, or to a
    /// restarted one; at most one per member. A request the agent answered, even with an
    /// error, is never repeated.
    pub(in crate::gateway) fn retry_elsewhere(
        &self,
        agent: &str,
        error: &CallError,
        retries: &mut usize,
    ) -> bool {
        if !matches!(error, CallError::NotSent(_) | CallError::Closed(_)) {
            return false;
        }
        *retries += 1;
        *retries <= self.agents.get(agent).map_or(0, |a| a.pool().size())
    }

    /// Records that `member` holds the session, unless the process that answered for it
    /// (`agent`) has exited meanwhile: then (false) the session is held nowhere. Checked after
    /// the record, since the member's exit may have been handled (its sessions let go) between
    /// the answer and now; a process exit marks its connection gone before that.
    pub(in crate::gateway) fn attach_if_alive(
        &self,
        record: &SessionRecord,
        member: usize,
        agent: &AgentClient,
    ) -> bool {
        self.live.attach(record, member, &self.agents);
        if agent.is_gone() {
            self.live.detach(&record.session_id, &self.agents);
            return false;
        }
        true
    }

    /// 503 for a session whose member is gone: why its agent has none ready.
    pub(in crate::gateway) fn no_member(&self, agent: &str) -> Error {
        Error::NoCapacity(
            self.agents
                .get(agent)
                .and_then(|a| a.pool().unready_reason())
                .unwrap_or_else(|| format!("no member of the agent {agent:?} is ready")),
        )
    }

    /// [`Placement::no_member`] for the agent of member `member`.
    pub(in crate::gateway) fn no_member_at(&self, member: usize) -> Error {
        match self.agents.of_member(member) {
            Some(agent) => self.no_member(agent.name()),
            None => Error::NoCapacity("no agent member is ready".into()),
        }
    }

    /// Any ready member's client of `agent` (for calls about sessions no member holds),
    /// waiting like [`Placement::place`] for a starting one.
    pub(in crate::gateway) async fn any_client(&self, agent: &str) -> Result<AgentClient, Error> {
        let named = self.agent_named(agent)?;
        let (_, conn) = self.acquire(agent, named.pool(), usize::MAX).await?;
        Ok(self.client_of(conn, self.caps(agent)))
    }

    /// A ready member's client of `agent` now, if one is (for answers that must not wait).
    pub(in crate::gateway) fn ready_client(&self, agent: &str) -> Option<AgentClient> {
        let (_, conn) = self.agents.get(agent)?.pool().pick()?;
        Some(self.client_of(conn, self.caps(agent)))
    }

    /// The client of the member holding the session live, if one does.
    pub(in crate::gateway) fn client_if_live(&self, session_id: &str) -> Option<AgentClient> {
        self.client(self.live.member(session_id)?)
    }

    /// The member holding the session, or any ready member of its agent.
    pub(in crate::gateway) async fn client_for(
        &self,
        record: &SessionRecord,
    ) -> Result<AgentClient, Error> {
        match self.client_if_live(&record.session_id) {
            Some(agent) => Ok(agent),
            None => self.any_client(&record.agent).await,
        }
    }

    /// Returns the member holding the session, attaching it (resume, else load) if needed.
    /// The caller holds a [`super::live::Claim`].
    pub(in crate::gateway) async fn ensure_live(
        &self,
        record: &SessionRecord,
    ) -> Result<usize, Error> {
        let id = record.session_id.as_str();
        let held = self.live.member(id);
        // Before the live shortcut: an agent that can neither archive nor close keeps an
        // archived session in memory, and it still must not be prompted.
        if record.archived {
            return Err(Error::Conflict(format!(
                "session {id} is archived: unarchive it (POST /sessions/{id}/unarchive) first"
            )));
        }
        if let Some(why) = read_only(record) {
            return Err(Error::Conflict(why));
        }
        if let Some(m) = held {
            return Ok(m);
        }
        // Counted among its tenant's live sessions from here: by its slot until this replica
        // holds it, then as one it holds.
        let attach = self.claim_and_attach(record);
        self.quotas.making_live(&record.tenant, id, attach).await
    }

    /// [`Placement::ensure_live`] once the session may be made live here.
    async fn claim_and_attach(&self, record: &SessionRecord) -> Result<usize, Error> {
        let id = record.session_id.as_str();
        match self.cluster.claim(id).await? {
            Claimed::Refused => {
                return Err(Error::HeldElsewhere(format!(
                    "session {id} is live on another gateway replica; retry"
                )));
            }
            Claimed::Orphan => self.close_orphan(id).await,
            Claimed::Taken => {}
        }
        let attached = self.attach_here(record).await;
        if attached.is_err() {
            self.release(id).await;
        }
        attached
    }

    /// Resumes (else loads) the session on a member of this replica's pool; again, on another
    /// ready process, when its member died before answering (see [`Placement::retry_elsewhere`]).
    async fn attach_here(&self, record: &SessionRecord) -> Result<usize, Error> {
        let id = record.session_id.as_str();
        let mut retries = 0;
        let (member, (method, result)) = loop {
            let (member, agent) = self.place(&record.agent, &record.tenant).await?;
            let answered = match self.resume_or_load(&agent, record).await? {
                Err(e) if self.retry_elsewhere(&record.agent, &e, &mut retries) => {
                    tracing::warn!(
                        session = id,
                        member,
                        error = %e,
                        "the member died before the attach was answered; trying another member"
                    );
                    continue;
                }
                answered => answered.map_err(|e| self.auth_hint(&record.agent, e.into()))?,
            };
            if self.attach_if_alive(record, member, &agent) {
                break (member, answered);
            }
            let gone = CallError::Closed("the member exited right after the attach".into());
            if !self.retry_elsewhere(&record.agent, &gone, &mut retries) {
                return Err(self.no_member(&record.agent));
            }
        };
        let live = GatewayLifecycleEvent::status(record, Status::Live, None);
        self.log.lifecycle(record, live).await;
        // A fresh process may say otherwise of its modes and options than the log does.
        if let Err(e) = self.states.note_state(id, method, &result).await {
            tracing::warn!(session = id, error = %e, "cannot record the attached session's state");
        }
        Ok(member)
    }

    /// `session/resume`, else `session/load`, through `agent`. The outer error is the gateway's
    /// own (the store, a missing capability), the inner one the agent call's.
    async fn resume_or_load(
        &self,
        agent: &AgentClient,
        record: &SessionRecord,
    ) -> Result<Result<(&'static str, Value), CallError>, Error> {
        let id = record.session_id.as_str();
        let caps = agent.caps();
        if caps.resume {
            let method = AGENT_METHOD_NAMES.session_resume;
            Ok(agent
                .resume_session(id, &record.cwd)
                .await
                .map(|r| (method, r)))
        } else if caps.load {
            let log_empty = self.log.events().last_event_seq(id).await? == 0;
            self.live.loading(id, log_empty);
            let r = agent.load_session(id, &record.cwd).await;
            self.live.loaded(id);
            Ok(r.map(|r| (AGENT_METHOD_NAMES.session_load, r)))
        } else {
            Err(Error::NotSupported(
                "the session is not live and the agent supports neither session/resume nor session/load".into(),
            ))
        }
    }

    /// Whether the agent still knows a session no replica holds, asked about that session
    /// alone: `session/status` where it is offered, else a `session/resume` closed again at
    /// once (this replica holds the session meanwhile, so that nothing else attaches it).
    /// `None` when the agent cannot be asked (it offers neither) or did not say: an error other
    /// than "not found", no member ready, or the session busy here.
    pub(in crate::gateway) async fn agent_knows(&self, record: &SessionRecord) -> Option<bool> {
        let id = record.session_id.as_str();
        let agent = self.any_client(&record.agent).await.ok()?;
        let caps = agent.caps();
        let answered = if caps.status {
            agent.session_open(id).await.map(drop)
        } else if caps.resume && caps.close {
            let _busy = self.claim(id, Busy::Attaching).ok()?;
            match self.cluster.claim(id).await.ok()? {
                Claimed::Refused => return Some(true),
                Claimed::Orphan => self.close_orphan(id).await,
                Claimed::Taken => {}
            }
            let resumed = agent.resume_session(id, &record.cwd).await.map(drop);
            if resumed.is_ok()
                && let Err(e) = agent.close_session(id).await
            {
                tracing::warn!(session = id, error = %e, "closing a session resumed to ask about it failed");
            }
            self.release(id).await;
            resumed
        } else {
            return None;
        };
        match answered.map_err(Error::from) {
            Ok(()) => Some(true),
            Err(Error::NotFound(_)) => Some(false),
            Err(e) => {
                tracing::warn!(session = id, error = %e, "the agent did not say whether it knows the session");
                None
            }
        }
    }

    /// Forgets where the session is live and that this replica holds it, before answering:
    /// another replica asked next may take it at once (and a release left to run later could
    /// undo a hold taken again meanwhile). Returns the member it was on.
    pub(in crate::gateway) async fn detach(&self, session_id: &str) -> Option<usize> {
        let member = self.live.detach(session_id, &self.agents);
        if member.is_some() {
            self.release(session_id).await;
        }
        member
    }

    /// Closes live sessions that have been idle longer than `idle`, when the agent can close.
    pub(in crate::gateway) async fn reap_idle(&self, idle: Duration) {
        let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = self.stop.cancelled() => return,
            }
            for (id, member) in self.live.idle_for(idle) {
                if !self.client(member).is_some_and(|a| a.caps().close) {
                    continue;
                }
                if self.requests.awaits_client(&id) {
                    continue;
                }
                let Ok(_claim) = self.claim(&id, Busy::Attaching) else {
                    continue;
                };
                if let Some(agent) = self.client(member)
                    && let Err(e) = agent.close_session(&id).await
                {
                    tracing::warn!(session = id, error = %e, "closing an idle session failed");
                    continue;
                }
                self.detach(&id).await;
                tracing::info!(session = id, "closed an idle session");
                if let Ok(Some(record)) = self.records.rows().get_session(&id).await {
                    let saved = GatewayLifecycleEvent::status(&record, Status::Saved, Some("idle"));
                    self.log.lifecycle(&record, saved).await;
                }
            }
        }
    }
}
