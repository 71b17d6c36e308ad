//! The service the HTTP handlers call: one file per use case on top of the pool, the store and
//! the event hub. This file defines [`Gateway`], its settings, its start and its shutdown; the
//! use cases are `sessions` (metadata and lifecycle), `turns` (prompt and cancel),
//! `permissions` and `elicitations` (requests from the agent that wait for a client; `form`
//! checks an elicitation's answer), `history` (the streams and the history), `sync` (the agent's
//! own list), `system` (readiness, the agent, the numbers of `/metrics`) and `webhooks`;
//! `upstream` handles what the agent sends. The parts they share own their state: `records`
//! (session rows, list cache, the sync's guards), `log` (appends), `pending` (the requests
//! waiting for a client), `live` (the sessions held by this replica); `placement` decides where
//! a session becomes live and `replicas` keeps this replica's place in the cluster.

mod caller;
mod controls;
mod create;
mod cursor;
mod delivery;
mod elicitations;
mod error;
mod form;
mod history;
mod listed;
mod live;
mod log;
pub mod model;
mod pending;
mod permissions;
mod placement;
pub mod problem;
pub mod reach;
mod records;
mod replicas;
mod sessions;
mod state;
mod sync;
mod system;
mod turns;
mod upstream;
mod webhooks;

pub use caller::{ADMIN_TENANT, Caller, DEFAULT_TENANT};
pub use controls::Settings;
pub use create::{Fork, NewSession};
pub use delivery::WebhookConfig;
pub use elicitations::{ElicitationReply, ElicitationView};
pub use error::Error;
pub use history::{HistoryEvent, HistoryPage};
pub use model::{AgentView, Prompt, TurnResult};
pub use permissions::PermissionView;
pub use problem::Problem;
pub use sessions::SessionFilter;
pub use state::{SessionState, StateAt};
pub use sync::SyncReport;
pub use system::{NamedAgentView, Stats};
pub use webhooks::{DeliveryPage, DeliveryView, NewWebhook, WebhookPatch, WebhookView, Webhooks};

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acp::caps::Capabilities;
use crate::cluster::Cluster;
use crate::config::PermissionPolicy;
use crate::events::EventHub;
use crate::pool::client::AgentClient;
use crate::pool::{AgentPool, Agents, PoolConfig};
use crate::store::Store;

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Bound on every upstream control call (new, load, resume, list, delete, status, close…).
    pub control_timeout: Duration,
    /// How long a request that needs a member waits for a starting or restarting one.
    pub acquire_timeout: Duration,
    /// How long a cancelled turn may take to end before its member is restarted.
    pub cancel_grace: Duration,
    /// How long a permission request or an elicitation waits for an answer (`None`: forever).
    pub permission_timeout: Option<Duration>,
    pub permission_policy: PermissionPolicy,
    /// Live sessions per member (0: no limit).
    pub max_sessions_per_member: usize,
    /// Live sessions in the pool (0: no limit).
    pub max_sessions: usize,
    /// Idle live sessions are closed after this (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// What shutdown gives turns and sessions to cancel and close.
    pub shutdown_timeout: Duration,
    /// Canonical directories sessions must work in (empty: anywhere).
    pub workspace_roots: Vec<std::path::PathBuf>,
    /// The tenant that owns sessions discovered through `session/list` (the admin's).
    pub upstream_tenant: String,
    /// How often the cache is synced with `session/list` after the first sync at start
    /// (`None`: only at start and on `GET /sessions?refresh=true`).
    pub sync_interval: Option<Duration>,
    /// How webhook deliveries are sent.
    pub webhooks: WebhookConfig,
    /// Which `mcpServers` a client may hand the agent.
    pub mcp_servers: crate::config::McpServers,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub turns_started: AtomicU64,
    pub turns_failed: AtomicU64,
    pub member_exits: AtomicU64,
}

/// The parts the use cases share, and what the pool calls back into (see `upstream`).
pub(crate) struct Inner {
    /// The session records, the list cache and the sync's guards.
    records: Arc<records::Records>,
    /// Appends to the logs.
    log: log::Log,
    cluster: Cluster,
    /// The sessions this replica holds live or is working on.
    live: live::LiveTable,
    /// Sessions being loaded, and whether their log was empty (then replayed updates are kept).
    replaying: std::sync::Mutex<std::collections::HashMap<String, bool>>,
    /// Sessions whose log got a state event since their state snapshot was last stored here
    /// (see `state::refresh_after_turn`).
    state_dirty: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Permission requests and elicitations waiting for a client.
    requests: Arc<pending::Requests>,
    pub counters: Counters,
    config: GatewayConfig,
    /// Turns, permission and elicitation timers and the idle reaper.
    tasks: TaskTracker,
    /// Stops the permission and elicitation timers, the idle reaper and the list sync.
    stop: CancellationToken,
}

/// The gateway service. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
    agents: Arc<Agents>,
    webhooks: Arc<Webhooks>,
}

impl Gateway {
    /// Starts every agent's pool (`agents`: name, pool, most live sessions; the default
    /// agent first); members become ready in the background.
    pub fn start(
        store: Arc<dyn Store>,
        hub: Arc<EventHub>,
        cluster: Cluster,
        agents: Vec<(String, PoolConfig, usize)>,
        config: GatewayConfig,
    ) -> Self {
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let records = Arc::new(records::Records::new(store, hub.clone()));
        let log = log::Log::new(hub.clone(), records.clone());
        let requests = Arc::new(pending::Requests::new(
            config.permission_policy,
            config.permission_timeout,
            log.clone(),
            tasks.clone(),
            stop.clone(),
        ));
        let webhooks = Arc::new(Webhooks::new(
            records.clone(),
            hub,
            config.webhooks.clone(),
            stop.clone(),
        ));
        let inner = Arc::new(Inner {
            records,
            log,
            cluster,
            live: live::LiveTable::default(),
            replaying: Default::default(),
            state_dirty: Default::default(),
            requests,
            counters: Counters::default(),
            config,
            tasks,
            stop,
        });
        let agents = Agents::start(agents, inner.clone());
        let gateway = Gateway {
            inner,
            agents,
            webhooks,
        };
        let tasks = &gateway.inner.tasks;
        let g = gateway.clone();
        let every = gateway.inner.config.sync_interval;
        tasks.spawn(async move { g.sync_forever(every).await });
        let g = gateway.clone();
        tasks.spawn(async move { g.heartbeat_forever().await });
        tasks.spawn(gateway.webhooks.clone().deliver_forever());
        if let Some(idle) = gateway.inner.config.idle_timeout {
            let g = gateway.clone();
            tasks.spawn(async move { g.reap_idle(idle).await });
        }
        gateway
    }

    /// Stops background turns and every pool member.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let deadline = self.inner.config.shutdown_timeout;
        if tokio::time::timeout(deadline, self.wind_down())
            .await
            .is_err()
        {
            tracing::warn!("turns or sessions did not end within the shutdown timeout");
        }
        self.agents.shutdown().await;
        self.inner.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.inner.tasks.wait()).await;
    }

    /// Cancels every running turn and closes every live session (when the agent can close).
    async fn wind_down(&self) {
        let live = self.inner.live.active();
        futures::future::join_all(live.into_iter().map(|id| async move {
            self.inner.requests.cancel_session(&id).await;
            if let Some((member, mut done)) = self.running_turn(&id).await {
                if let Some(agent) = self.client(member) {
                    let _ = agent.cancel(&id).await;
                }
                let _ = done.changed().await;
            }
            let live = self.client_if_live(&id);
            if let Some(agent) = live.filter(|a| a.caps().close) {
                let _ = agent.close_session(&id).await;
            }
        }))
        .await;
    }

    /// The capabilities of agent `agent` (none when this gateway does not run it, or none of
    /// its members has answered `initialize` yet).
    fn caps(&self, agent: &str) -> Capabilities {
        self.agents
            .get(agent)
            .map(|a| a.pool.caps())
            .unwrap_or_default()
    }

    /// The typed client of member `member` (of whichever agent), if it is running.
    fn client(&self, member: usize) -> Option<AgentClient> {
        let agent = self.agents.of_member(member)?;
        let conn = agent.pool.conn(member)?;
        Some(self.client_of(conn, agent.pool.caps()))
    }

    /// The typed client of an agent connection: the agent's capabilities, the control timeout.
    fn client_of(&self, conn: Arc<crate::acp::Connection>, caps: Capabilities) -> AgentClient {
        AgentClient::new(conn, caps, self.inner.config.control_timeout)
    }

    /// The agent `name` this gateway runs, for a session recorded with it: 503 when this
    /// replica does not run it (replicas must run the same agents; another may).
    fn agent_named(&self, name: &str) -> Result<&AgentPool, Error> {
        self.agents.get(name).ok_or_else(|| Error::NoMember {
            reason: format!("this gateway replica does not run the agent {name:?}"),
            retry_after: Duration::from_secs(5),
        })
    }

    /// An agent's "authentication required", completed with what it offers: the client (an
    /// operator, really) learns which `auth-method` to configure.
    pub(super) fn auth_hint(&self, agent: &str, e: Error) -> Error {
        let Error::AgentAuthRequired(message) = e else {
            return e;
        };
        let offered: Vec<String> = self
            .agents
            .get(agent)
            .and_then(|a| a.pool.init())
            .and_then(|i| i.auth_methods.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|m| {
                m.get("id")
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
            })
            .collect();
        Error::AgentAuthRequired(format!(
            "{message}: the agent {agent:?} needs a login; it offers authMethods {offered:?} (configure its auth-method and auth-meta)"
        ))
    }

    /// The agent a request names (the default one when it names none): 422 for a name not
    /// configured, naming those that are.
    pub(super) fn requested_agent(&self, name: Option<&str>) -> Result<&AgentPool, Error> {
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

    fn store(&self) -> &dyn Store {
        self.inner.records.store()
    }

    /// The webhook subscriptions.
    pub fn webhooks(&self) -> &Webhooks {
        &self.webhooks
    }
}
