//! Every configured agent, each with a pool of its own: a crash loop in one agent's pool never
//! touches another's. A tenant that brings its own agent environment (a provider's key) has a
//! pool of its own of each local agent, started with it, which runs only that tenant's
//! sessions. Members are numbered across the agents (the first agent's `0..n`, then its
//! tenants' pools', then the next agent's), so that a member index alone says which agent and
//! process a live session is on.

use std::sync::{Arc, RwLock};

use super::members::{AgentCallbacks, MemberView, Pool, PoolConfig};
use crate::agent_rpc::{AgentCommand, Connection};

/// What an agent is started as: its name, its pool's settings, its most live sessions (0: no
/// limit), and the settings of the pools of tenants with their own environment (tenant, pool).
pub struct AgentSetup {
    pub name: String,
    pub config: PoolConfig,
    pub max_sessions: usize,
    pub tenants: Vec<(String, PoolConfig)>,
}

/// One agent: its name, its pools and its limits.
pub struct AgentPool {
    name: String,
    pool: Arc<Pool>,
    /// The pools of the tenants with an environment of their own, by tenant.
    tenants: Vec<(String, Arc<Pool>)>,
    /// Most live sessions the agent holds at once (0: no limit).
    max_sessions: usize,
    /// The URLs it is reached at over the network ([`PoolConfig::remote`]; empty for a local
    /// agent): its sessions' directories are on its host, not this one.
    remote: Vec<String>,
    /// The bearer token its host takes.
    remote_token: Option<String>,
    /// The global index of its first member.
    first: usize,
    /// The command its members run (a remote agent's members bridge to its host).
    command: AgentCommand,
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

    /// The pool `tenant`'s sessions run on: its own, if it has one, else the agent's.
    pub fn pool_for(&self, tenant: &str) -> &Pool {
        (self.tenants.iter())
            .find(|(t, _)| t == tenant)
            .map_or(&self.pool, |(_, p)| p)
    }

    /// The pool with member `member`, of the agent's or a tenant's.
    pub fn pool_of(&self, member: usize) -> Option<&Pool> {
        std::iter::once(&self.pool)
            .chain(self.tenants.iter().map(|(_, p)| p))
            .find(|p| p.has(member))
            .map(|p| &**p)
    }

    /// Whether member `member` is one of its pools'.
    pub fn has(&self, member: usize) -> bool {
        self.pool_of(member).is_some()
    }

    /// Every member of its pools, a tenant's naming the tenant.
    pub fn members(&self) -> Vec<MemberView> {
        let mut members = self.pool.members();
        for (tenant, pool) in &self.tenants {
            members.extend(pool.members().into_iter().map(|mut m| {
                m.tenant = Some(tenant.clone());
                m
            }));
        }
        members
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

    /// Its pool and its tenants' pools.
    fn pools(&self) -> impl Iterator<Item = &Arc<Pool>> {
        std::iter::once(&self.pool).chain(self.tenants.iter().map(|(_, p)| p))
    }

    /// Stops the members of its pools and waits for them.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.pools().map(|p| p.shutdown())).await;
    }

    /// Signs every pool of the agent in with `method` ([`Pool::sign_in`]), its tenants' with
    /// their own environment; `Err` names the first that failed.
    pub async fn sign_in(&self, method: &str, timeout: std::time::Duration) -> Result<(), String> {
        self.pool.sign_in(method, timeout).await?;
        for (tenant, pool) in &self.tenants {
            (pool.sign_in(method, timeout).await)
                .map_err(|e| format!("tenant {tenant}'s pool: {e}"))?;
        }
        Ok(())
    }

    /// Signs every pool of the agent out ([`Pool::sign_out`]), each one even when another
    /// failed; `Err` is the first failure.
    pub async fn sign_out(
        &self,
        timeout: std::time::Duration,
    ) -> Result<(), crate::agent_rpc::CallError> {
        let mut first = Ok(());
        for pool in self.pools() {
            first = first.and(pool.sign_out(timeout).await);
        }
        first
    }

    /// The command its members run: what a terminal login runs too, with the method's
    /// arguments. `None` for an agent reached over the network.
    pub fn command(&self) -> Option<&AgentCommand> {
        (!self.is_remote()).then_some(&self.command)
    }

    /// Restarts every member of its pools (after a sign-in outside ACP, such as a terminal
    /// login, so that each starts signed in).
    pub fn restart_all(&self, why: &str) {
        for pool in self.pools() {
            for member in pool.members() {
                pool.restart_member(member.index + pool.first_index(), why);
            }
        }
    }

    /// Stops its pools while the gateway goes on ([`Pool::retire`]): the sessions live on
    /// them are let go.
    pub async fn retire(&self) {
        futures::future::join_all(self.pools().map(|p| p.retire())).await;
    }

    /// Live sessions on its members (its tenants' pools' included).
    pub fn live_sessions(&self) -> usize {
        self.members().iter().map(|m| m.sessions).sum()
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

/// Each member's agent, by member index: shared with whoever handles what the members send,
/// which is built before the agents start.
#[derive(Default)]
pub struct MemberAgents(RwLock<Vec<String>>);

impl MemberAgents {
    /// The agent of member `member`.
    pub fn get(&self, member: usize) -> Option<String> {
        self.0
            .read()
            .expect("member agents lock")
            .get(member)
            .cloned()
    }
}

/// The agents, the default one first: those configured, started with the gateway, then those
/// installed while it runs ([`Agents::add`], [`Agents::remove`]).
pub struct Agents {
    agents: RwLock<Vec<Arc<AgentPool>>>,
    handler: Arc<dyn AgentCallbacks>,
    /// Each member's agent; its length is the next member's index.
    names: Arc<MemberAgents>,
}

impl Agents {
    /// Starts every agent's pool (the default agent first, as `setups` are given), noting each
    /// member's agent in `names`.
    pub fn start(
        setups: Vec<AgentSetup>,
        handler: Arc<dyn AgentCallbacks>,
        names: Arc<MemberAgents>,
    ) -> Arc<Agents> {
        let agents = Agents {
            agents: RwLock::default(),
            handler,
            names,
        };
        for setup in setups {
            agents.put(setup);
        }
        Arc::new(agents)
    }

    /// Starts `setup`'s pools, numbering their members after every member so far.
    fn build(&self, setup: AgentSetup) -> Arc<AgentPool> {
        let mut names = self.names.0.write().expect("member agents lock");
        let mut start = |config: PoolConfig| {
            let (first, size) = (names.len(), config.size.max(1));
            names.extend(std::iter::repeat_n(setup.name.clone(), size));
            (first, Pool::start(config, first, self.handler.clone()))
        };
        let (remote, remote_token) = (
            setup.config.remote.clone(),
            setup.config.remote_token.clone(),
        );
        let command = setup.config.command.clone();
        let (first, pool) = start(setup.config);
        let tenants = (setup.tenants.into_iter())
            .map(|(tenant, config)| (tenant, start(config).1))
            .collect();
        Arc::new(AgentPool {
            name: setup.name,
            pool,
            tenants,
            max_sessions: setup.max_sessions,
            remote,
            remote_token,
            first,
            command,
        })
    }

    /// Starts an agent installed while the gateway runs: in place of the running one of that
    /// name, which is returned for the caller to stop ([`AgentPool::shutdown`]), else after
    /// the others. Nothing is ever without an agent of that name in between.
    pub fn put(&self, setup: AgentSetup) -> Option<Arc<AgentPool>> {
        let agent = self.build(setup);
        let mut list = self.list_mut();
        match list.iter().position(|a| a.name == agent.name) {
            Some(at) => Some(std::mem::replace(&mut list[at], agent)),
            None => {
                list.push(agent);
                None
            }
        }
    }

    /// Takes the agent `name` out, so that nothing new is placed on it; the caller stops its
    /// pools ([`AgentPool::shutdown`]). Its members' numbers are never given again.
    pub fn remove(&self, name: &str) -> Option<Arc<AgentPool>> {
        let mut list = self.list_mut();
        let at = list.iter().position(|a| a.name == name)?;
        Some(list.remove(at))
    }

    fn list(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<AgentPool>>> {
        self.agents.read().expect("agents lock")
    }

    fn list_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<AgentPool>>> {
        self.agents.write().expect("agents lock")
    }

    /// The agent used when a request names none.
    pub fn default_agent(&self) -> Arc<AgentPool> {
        self.list()[0].clone()
    }

    /// The agent named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<AgentPool>> {
        self.list().iter().find(|a| a.name == name).cloned()
    }

    /// Every agent, the default first.
    pub fn all(&self) -> Vec<Arc<AgentPool>> {
        self.list().clone()
    }

    /// The names of the agents, the default first.
    pub fn names(&self) -> Vec<String> {
        self.list().iter().map(|a| a.name.clone()).collect()
    }

    /// The agent whose pool has member `index`.
    pub fn of_member(&self, index: usize) -> Option<Arc<AgentPool>> {
        self.list().iter().find(|a| a.has(index)).cloned()
    }

    /// The connection of member `index`, if it is ready.
    pub fn conn(&self, index: usize) -> Option<Arc<Connection>> {
        self.of_member(index)?.pool_of(index)?.conn(index)
    }

    /// Kills member `index`; its supervisor restarts it.
    pub fn restart_member(&self, index: usize, why: &str) {
        if let Some(pool) = self
            .of_member(index)
            .as_deref()
            .and_then(|a| a.pool_of(index))
        {
            pool.restart_member(index, why);
        }
    }

    /// Counts a live session on member `index` (+1 or -1).
    pub fn adjust_sessions(&self, index: usize, attach: bool) {
        if let Some(pool) = self
            .of_member(index)
            .as_deref()
            .and_then(|a| a.pool_of(index))
        {
            pool.adjust_sessions(index, attach);
        }
    }

    /// Stops every agent's members and waits for them.
    pub async fn shutdown(&self) {
        let agents = self.all();
        futures::future::join_all(agents.iter().map(|a| a.shutdown())).await;
    }
}
