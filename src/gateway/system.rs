//! What the system routes read of the service: readiness, the agents (`/agents`: this
//! replica's pools, and which live replicas run each agent), the agent and the pool (`/agent`),
//! and the numbers `/metrics` publishes.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::Error;
use super::output::AgentView;
use super::parts::installs::{InstallPhase, InstallView};
use super::parts::use_case;
use crate::agent_rpc::caps::Capabilities;
use crate::pool::{AgentPool, MemberView};
use crate::store::Ping;

/// One agent, as `GET /agents` shows it: one this replica runs, or one only other live
/// replicas run (then without members, `agentInfo` or capabilities: `replicas` says which
/// run it, and its sessions' requests go there).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"name": "claude", "default": true, "ready": true, "agentInfo": {"name": "claude-agent-acp", "version": "0.100.0"}, "capabilities": {"load": true, "list": true, "resume": true, "close": true, "delete": true, "status": false, "setTitle": false, "archive": false, "fork": true, "logout": false}, "authMethods": [], "members": [{"index": 0, "pid": 9830, "state": "ready", "sessions": 1, "restarts": 0, "lastExit": null, "lastError": null}], "replicas": ["5b0c1f0e-7d2a-4c55-9a43-0c9f2b61d1a7"]}))]
pub struct NamedAgentView {
    /// What sessions name it by (`POST /sessions {agent}`).
    pub name: String,
    /// Whether a request to this replica that names no agent gets this one.
    pub default: bool,
    /// Whether a member of this replica is ready.
    pub ready: bool,
    /// Why not, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unready_reason: Option<String>,
    /// `agentInfo` from its `initialize` (`null` until a member has answered).
    #[schema(value_type = Object)]
    pub agent_info: Value,
    pub capabilities: Capabilities,
    /// `authMethods` from its `initialize`.
    #[schema(value_type = Vec<Object>)]
    pub auth_methods: Value,
    /// This replica's members of it.
    pub members: Vec<MemberView>,
    /// The ids of the live replicas that run it (as of this replica's last heartbeat; see
    /// `GET /agent`'s `replicas`), oldest first.
    pub replicas: Vec<String>,
    /// For an agent installed from the registry: what this replica installed, or is
    /// installing (`phase`, `progress`), or why its install failed here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installed: Option<InstallView>,
}

impl NamedAgentView {
    fn of(agent: &AgentPool, default: bool, replicas: Vec<String>) -> Self {
        let init = agent.pool().init();
        let unready_reason = agent.pool().unready_reason();
        NamedAgentView {
            name: agent.name().to_owned(),
            default,
            ready: unready_reason.is_none(),
            unready_reason,
            agent_info: init.as_ref().map_or(Value::Null, |i| i.agent_info.clone()),
            capabilities: init.as_ref().map(|i| i.capabilities).unwrap_or_default(),
            auth_methods: init.map_or(Value::Array(Vec::new()), |i| i.auth_methods),
            members: agent.members(),
            replicas,
            installed: None,
        }
    }

    /// An agent this replica is installing, or failed to install, that runs nowhere.
    fn installing(name: String, install: InstallView) -> Self {
        let reason = match install.phase {
            InstallPhase::Failed => format!(
                "its install failed: {}",
                install.error.as_deref().unwrap_or("no reason given")
            ),
            _ => format!(
                "being installed: {}",
                install.progress.last().map_or("starting", String::as_str)
            ),
        };
        let mut view = NamedAgentView::elsewhere(name, Vec::new());
        view.unready_reason = Some(reason);
        view.installed = Some(install);
        view
    }

    /// An agent that only the other live `replicas` run.
    fn elsewhere(name: String, replicas: Vec<String>) -> Self {
        NamedAgentView {
            name,
            default: false,
            ready: false,
            unready_reason: Some(
                "this gateway replica does not run the agent: the replicas that do serve its sessions"
                    .to_owned(),
            ),
            agent_info: Value::Null,
            capabilities: Capabilities::default(),
            auth_methods: Value::Array(Vec::new()),
            members: Vec::new(),
            replicas,
            installed: None,
        }
    }
}

/// How long `/readyz` waits for the database to answer a ping.
const READY_PING: std::time::Duration = std::time::Duration::from_secs(2);

/// What `/metrics` shows of the service, read at once.
#[derive(Debug)]
pub struct Stats {
    pub members: Vec<MemberView>,
    pub members_ready: usize,
    /// Each agent's name and its members ready.
    pub agents_ready: Vec<(String, usize)>,
    pub sessions_live: usize,
    pub replicas: usize,
    pub replicas_live: usize,
    pub events_appended: u64,
    pub event_commits: u64,
    pub sse_open: u64,
    pub sse_lagged: u64,
    pub sse_closed: u64,
    pub turns_started: u64,
    pub turns_failed: u64,
    pub member_exits: u64,
    pub sessions_vanished: u64,
    pub sessions_revived: u64,
    pub permissions_pending: usize,
    pub elicitations_pending: usize,
    /// How long events spent at each stage on their way to subscribers, by stage.
    pub event_stages: Vec<(&'static str, crate::events::LatencyCounts)>,
}

use_case! {
    /// The use case of readiness, the agents and the numbers of `/metrics`, with the parts it
    /// needs.
    pub struct System {
        parts: [placement, log, requests, counters, installs],
        /// What readiness asks whether the database answers.
        database: Arc<dyn Ping>,
    }
}

impl System {
    /// Ready = the store answers, the event log is written (not retrying a failed append) and
    /// at least one agent has a ready member (an agent that crash-loops does not stop the
    /// others). Answers which agents are ready.
    pub async fn ready(&self) -> Result<String, Error> {
        if let Some(why) = self.unready_reason().await {
            return Err(Error::NoCapacity(why));
        }
        let (ready, not): (Vec<Arc<AgentPool>>, Vec<Arc<AgentPool>>) = self
            .placement
            .agents()
            .all()
            .into_iter()
            .partition(|a| a.pool().ready_count() > 0);
        let names = |agents: Vec<Arc<AgentPool>>| -> Vec<String> {
            agents.iter().map(|a| a.name().to_owned()).collect()
        };
        let mut answer = format!("ready: {}", names(ready).join(", "));
        if !not.is_empty() {
            answer.push_str(&format!("; not ready: {}", names(not).join(", ")));
        }
        Ok(answer)
    }

    /// Why the gateway is not ready, if it is not.
    async fn unready_reason(&self) -> Option<String> {
        // Bounded: while the server is down the pool waits for a connection (its acquire
        // timeout), longer than a probe should.
        match tokio::time::timeout(READY_PING, self.database.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness: the database does not answer");
                return Some("the database does not answer".to_owned());
            }
            Err(_) => {
                tracing::warn!(timeout = ?READY_PING, "readiness: the database does not answer");
                return Some("the database does not answer in time".to_owned());
            }
        }
        if self.log.hub().log_failing() {
            return Some("the event log cannot be written; appends are retried".to_owned());
        }
        if self
            .placement
            .agents()
            .all()
            .iter()
            .any(|a| a.pool().ready_count() > 0)
        {
            return None;
        }
        let why: Vec<String> = self
            .placement
            .agents()
            .all()
            .iter()
            .map(|a| {
                let reason = a.pool().unready_reason().unwrap_or_default();
                match self.placement.agents().all().len() {
                    1 => reason,
                    _ => format!("{}: {reason}", a.name()),
                }
            })
            .collect();
        Some(why.join("; "))
    }

    /// `GET /agents`: the agents this replica runs, the default first, then those only other
    /// live replicas run, by name.
    pub fn agents(&self) -> Vec<NamedAgentView> {
        let cluster = self.placement.cluster();
        let here = self.placement.agents().all().into_iter().enumerate();
        let installs = self.installs.views();
        let here = here.map(|(i, a)| {
            let mut view = NamedAgentView::of(&a, i == 0, cluster.runners(a.name()));
            view.installed = installs.get(a.name()).cloned();
            view
        });
        let here: Vec<NamedAgentView> = here.collect();
        let running = self.placement.agents().names();
        let elsewhere = cluster.agents_elsewhere().into_iter().map(|name| {
            let replicas = cluster.runners(&name);
            let mut view = NamedAgentView::elsewhere(name, replicas);
            view.installed = installs.get(&view.name).cloned();
            view
        });
        let elsewhere: Vec<NamedAgentView> = elsewhere.collect();
        // Being installed here (or failed), running nowhere yet.
        let pending = (installs.into_iter())
            .filter(|(n, _)| !running.contains(n))
            .filter(|(n, _)| cluster.runners(n).is_empty())
            .map(|(name, install)| NamedAgentView::installing(name, install));
        here.into_iter().chain(elsewhere).chain(pending).collect()
    }

    /// `GET /agents/{name}`.
    pub fn named_agent(&self, name: &str) -> Result<NamedAgentView, Error> {
        let cluster = self.placement.cluster();
        let default = self.placement.agents().default_agent().name() == name;
        let installed = self.installs.view(name);
        if let Some(a) = self.placement.agents().get(name) {
            let mut view = NamedAgentView::of(&a, default, cluster.runners(name));
            view.installed = installed;
            return Ok(view);
        }
        let elsewhere = cluster.agents_elsewhere();
        if elsewhere.iter().any(|a| a == name) {
            let mut view = NamedAgentView::elsewhere(name.to_owned(), cluster.runners(name));
            view.installed = installed;
            return Ok(view);
        }
        if let Some(install) = installed {
            return Ok(NamedAgentView::installing(name.to_owned(), install));
        }
        let here = self.placement.agents().names();
        Err(Error::NotFound(if elsewhere.is_empty() {
            format!("no agent {name:?}; this gateway runs {here:?}")
        } else {
            format!(
                "no agent {name:?}; this gateway runs {here:?}, other live replicas {elsewhere:?}"
            )
        }))
    }

    /// `GET /agent`: the default agent.
    pub fn agent(&self) -> AgentView {
        let agent = self.placement.agents().default_agent();
        let pool = agent.pool();
        AgentView {
            initialize: pool.init(),
            members: pool.members(),
            replicas: self.placement.cluster().view(),
        }
    }

    /// The numbers `/metrics` publishes.
    pub fn stats(&self) -> Stats {
        let c = self.counters.read();
        let (permissions_pending, elicitations_pending) = self.requests.pending_counts();
        let replicas = self.placement.cluster().view();
        let streams = self.log.hub().streams().read();
        let pools = self.placement.agents().all();
        let members: Vec<MemberView> = pools.iter().flat_map(|a| a.members()).collect();
        Stats {
            members_ready: (members.iter())
                .filter(|m| m.state == crate::pool::MemberState::Ready)
                .count(),
            members,
            agents_ready: pools
                .iter()
                .map(|a| (a.name().to_owned(), a.pool().ready_count()))
                .collect(),
            sessions_live: self.placement.live().live_count(),
            replicas: replicas.len(),
            replicas_live: replicas.iter().filter(|r| r.live).count(),
            events_appended: self.log.hub().appended(),
            event_commits: self.log.hub().commits(),
            sse_open: streams.open,
            sse_lagged: streams.lagged,
            sse_closed: streams.closed,
            event_stages: self.log.hub().stages().read(),
            turns_started: c.turns_started,
            turns_failed: c.turns_failed,
            member_exits: c.member_exits,
            sessions_vanished: c.sessions_vanished,
            sessions_revived: c.sessions_revived,
            permissions_pending,
            elicitations_pending,
        }
    }
}
