//! Every configured agent, each with a pool of its own: a crash loop in one agent's pool never
//! touches another's. Members are numbered across the agents (the first agent's `0..n`, the
//! next agent's from `n`), so that a member index alone says which agent and process a live
//! session is on.

use std::sync::Arc;

use super::members::{AgentCallbacks, Pool, PoolConfig};
use crate::agent_rpc::Connection;

/// One agent: its name, its pool and its limits.
pub struct AgentPool {
    name: String,
    pool: Arc<Pool>,
    /// Most live sessions the agent holds at once (0: no limit).
    max_sessions: usize,
    /// The URLs it is reached at over the network ([`PoolConfig::remote`]; empty for a local
    /// agent): its sessions' directories are on its host, not this one.
    remote: Vec<String>,
    /// The bearer token its host takes.
    remote_token: Option<String>,
    /// The global index of its first member.
    first: usize,
}

/// The host of an agent reached over the network, as a session's member reaches it.
#[derive(Debug, Clone)]
pub struct AgentHost {
    /// The URL the member bridges to (another gateway's is its `/acp`).
    pub url: String,
    /// The bearer token the host takes.
    pub token: Option<String>,
}

impl AgentPool {
    /// The agent's name, as configured.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pool of processes: where its sessions are placed, and what its members say.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Most live sessions the agent holds at once (0: no limit).
    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// Whether it is reached over the network ([`PoolConfig::remote`]): its sessions'
    /// directories are on its host, not this one.
    pub fn is_remote(&self) -> bool {
        !self.remote.is_empty()
    }

    /// The host that member `member` (a global index; `None`: any member) bridges to, for a
    /// remote agent: its URLs are the replicas of one host, taken in turn by the members.
    pub fn host(&self, member: Option<usize>) -> Option<AgentHost> {
        let n = member.and_then(|m| m.checked_sub(self.first)).unwrap_or(0);
        let url = self.remote.get(n % self.remote.len().max(1))?;
        Some(AgentHost {
            url: url.clone(),
            token: self.remote_token.clone(),
        })
    }
}

/// The agents, the default one first.
pub struct Agents {
    agents: Vec<AgentPool>,
}

impl Agents {
    /// Starts every agent's pool (the default agent first, as `configs` are given).
    pub fn start(
        configs: Vec<(String, PoolConfig, usize)>,
        handler: Arc<dyn AgentCallbacks>,
    ) -> Arc<Agents> {
        let mut first = 0;
        let agents = configs
            .into_iter()
            .map(|(name, config, max_sessions)| {
                let size = config.size.max(1);
                let (remote, remote_token) = (config.remote.clone(), config.remote_token.clone());
                let pool = Pool::start(config, first, handler.clone());
                let agent = AgentPool {
                    name,
                    pool,
                    max_sessions,
                    remote,
                    remote_token,
                    first,
                };
                first += size;
                agent
            })
            .collect();
        Arc::new(Agents { agents })
    }

    /// The agent used when a request names none.
    pub fn default_agent(&self) -> &AgentPool {
        &self.agents[0]
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<&AgentPool> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// Every agent, the default first.
    pub fn all(&self) -> &[AgentPool] {
        &self.agents
    }

    /// The names of the agents, the default first.
    pub fn names(&self) -> Vec<&str> {
        self.agents.iter().map(|a| a.name.as_str()).collect()
    }

    /// The agent whose pool has member `index`.
    pub fn of_member(&self, index: usize) -> Option<&AgentPool> {
        self.agents.iter().find(|a| a.pool.has(index))
    }

    /// The connection of member `index`, if it is ready.
    pub fn conn(&self, index: usize) -> Option<Arc<Connection>> {
        self.of_member(index)?.pool.conn(index)
    }

    /// Kills member `index`; its supervisor restarts it.
    pub fn restart_member(&self, index: usize, why: &str) {
        if let Some(a) = self.of_member(index) {
            a.pool.restart_member(index, why);
        }
    }

    /// Counts a live session on member `index` (+1 or -1).
    pub fn adjust_sessions(&self, index: usize, attach: bool) {
        if let Some(a) = self.of_member(index) {
            a.pool.adjust_sessions(index, attach);
        }
    }

    /// Stops every agent's members and waits for them.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.agents.iter().map(|a| a.pool.shutdown())).await;
    }
}
