//! The service the HTTP handlers call, in two layers. The parts own the state: `records`
//! (session rows, list cache, the sync's guards), `log` (appends), `state` (a session's state),
//! `pending` (requests waiting for a client), `live` (the sessions held here), `views` (a record
//! as clients see it), `placement` (agents, where a session is live; `replicas` its cluster
//! side) and `callbacks` (what the agents send). The use cases are structs holding the parts they
//! need: `sessions`, `create`, `controls`, `turns`, `history`, `sync`, `system` (each declared
//! with `parts`' `use_case!` by the names of its parts, and made from the one `Parts`),
//! `webhooks` (with `delivery`), and `pending`'s `Requests` for the answers. This file defines
//! [`Gateway`], which builds both, hands the use cases out and owns shutdown.

mod caller;
mod changes;
mod clock;
mod controls;
mod create;
pub mod cursor;
mod error;
pub mod event;
mod event_schema;
mod files;
mod history;
mod idempotency;
pub mod input;
mod installs;
mod markdown;
pub mod output;
mod parts;
pub mod portable;
pub mod problem;
mod queue;
mod sessions;
mod shares;
mod state;
mod sync;
mod system;
mod transcripts;
mod turns;
mod usage;
mod webhooks;

pub use crate::store::EventKind;
pub use caller::{ADMIN_TENANT, Author, Caller, DEFAULT_TENANT, RESERVED_TENANTS, User};
pub use changes::{Changes, Checkpoint, CheckpointsView, DiffView, FileChange};
pub use controls::{Controls, InitialSettings};
pub use create::{Create, Fork, NewSession, NewWorkspace};
pub use error::Error;
pub use event_schema::{LifecycleEvent, SessionEvent};
pub use files::{FileEntryView, FileView, Files, FolderView, Found, OpenFile};
pub use history::{History, HistoryEvent, HistoryPage};
pub use idempotency::{Idempotency, Keyed, StoredResponse};
pub use input::{Prompt, SessionId};
pub use installs::{Installs, RegistryAgentView, RegistryView, SignInView, install_offline};
pub use output::QueuedView;
pub use output::{AgentView, TurnResult, WorkspaceView};
pub use parts::counters::Counters;
pub use parts::elicitations::{ElicitationReply, ElicitationView};
pub use parts::installs::{AgentTemplate, InstallConfig, InstallPhase, InstallView};
pub use parts::permissions::PermissionView;
pub use parts::requests::Requests;
pub use problem::Problem;
pub use queue::Queue;
pub use sessions::{SessionFilter, Sessions};
pub use shares::{MadeShare, NewShare, ShareView, SharedSession, Shares};
pub use state::{SessionState, StateAt};
pub use sync::{ListSync, SyncReport};
pub use system::{NamedAgentView, Stats, System};
pub use transcripts::{ExportFormat, Transcripts};
pub use turns::Turns;
pub use usage::{
    CostView, SessionUsageView, SpendView, TotalsView, TurnUsageView, Usage, UsageAsk, UsageReport,
    UsageRow, UsageRowKey,
};
pub use webhooks::reach;
pub use webhooks::{
    DeliveryPage, DeliveryView, NewWebhook, WebhookConfig, WebhookPatch, WebhookView, Webhooks,
};

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::Cluster;
use crate::config::PermissionPolicy;
use crate::events::EventHub;
use crate::pool::{AgentSetup, Agents, MemberAgents};
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
    /// Requests of one session waiting for a client at once (0: no limit).
    pub max_pending_requests: usize,
    /// Updates one session's agent may send per turn (0: no limit).
    pub max_updates_per_turn: u64,
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
    /// Where the gateway makes sessions' workspaces (absolute).
    pub workspace_dir: std::path::PathBuf,
    /// Whether a deleted session's workspace stays on disk.
    pub keep_workspaces: bool,
    /// The host's git (worktrees, diffs, checkpoints), or why there is none.
    pub git: Result<crate::workspace::git::Git, String>,
    /// The tenant that owns sessions discovered through `session/list` (the admin's).
    pub upstream_tenant: String,
    /// How often the cache is synced with `session/list` after the first sync at start
    /// (`None`: only at start and on `GET /sessions?refresh=true`).
    pub sync_interval: Option<Duration>,
    /// How webhook deliveries are sent.
    pub webhooks: WebhookConfig,
    /// Which `mcpServers` a client may hand the agent.
    pub mcp_servers: crate::config::McpServers,
    /// How long an idempotency key and its response are kept.
    pub idempotency_ttl: Duration,
    /// Per-tenant limits (`--tenant-*`, `[tenants.NAME]`).
    pub tenants: crate::config::TenantFlags,
    /// Prompts waiting in one session's queue at most.
    pub max_queued_prompts: usize,
    /// Where agents are installed from and to, and how an installed one is started.
    pub installs: parts::installs::InstallConfig,
}

/// The gateway service: its use cases, each with the parts it needs. Cheap to clone (one
/// `Arc`: a request's handler and layers clone it).
#[derive(Clone)]
pub struct Gateway(Arc<Service>);

/// What [`Gateway`] shares.
struct Service {
    sessions: Sessions,
    create: Create,
    controls: Controls,
    turns: Turns,
    queue: Queue,
    usage: Usage,
    history: History,
    transcripts: Transcripts,
    shares: Shares,
    files: Files,
    changes: Changes,
    system: System,
    installs: Installs,
    requests: Arc<Requests>,
    webhooks: Arc<Webhooks>,
    idempotency: Idempotency,
    /// What shutdown ends: the agents, the sessions live on them.
    placement: Arc<parts::placement::Placement>,
    /// Turns, permission and elicitation timers, the idle reaper, the heartbeat and the syncs.
    tasks: TaskTracker,
    /// Stops the permission and elicitation timers, the idle reaper and the list sync.
    stop: CancellationToken,
    /// Stops the usage meter's worker, once the turns have ended.
    stop_meter: CancellationToken,
    /// What shutdown gives turns and sessions to cancel and close.
    shutdown_timeout: Duration,
}

impl Gateway {
    /// Starts every agent's pools (the default agent first); members become ready in the
    /// background.
    pub fn start(
        store: Arc<dyn Store>,
        hub: Arc<EventHub>,
        cluster: Cluster,
        agents: Vec<AgentSetup>,
        config: GatewayConfig,
    ) -> Self {
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let cluster = Arc::new(cluster);
        let records = Arc::new(parts::records::Records::new(store.clone(), hub.clone()));
        let log = parts::log::Log::new(hub.clone(), records.clone(), store.clone());
        let rules = parts::requests::Rules {
            policy: config.permission_policy,
            timeout: config.permission_timeout,
            max_pending: config.max_pending_requests,
            tenants: config.tenants.clone(),
        };
        let requests = Arc::new(parts::requests::Requests::new(
            rules,
            log.clone(),
            records.clone(),
            tasks.clone(),
            stop.clone(),
        ));
        let states = Arc::new(parts::snapshots::States::new(
            log.clone(),
            store.clone(),
            tasks.clone(),
        ));
        let live = Arc::new(parts::live::LiveTable::default());
        let counters = Arc::new(Counters::default());
        let workspaces = Arc::new(parts::workspaces::Workspaces::new(
            store.clone(),
            config.workspace_dir.clone(),
            config.keep_workspaces,
            config.git.clone(),
        ));
        let views = Arc::new(parts::views::Views::new(
            live.clone(),
            requests.clone(),
            records.clone(),
            log.clone(),
            states.clone(),
            counters.clone(),
            workspaces.clone(),
        ));
        // The meter records until the turns have ended, after `stop`.
        let stop_meter = CancellationToken::new();
        let meter = parts::meter::Meter::start(
            store.clone(),
            states.clone(),
            log.clone(),
            config.tenants.clone(),
            &tasks,
            stop_meter.clone(),
        );
        // Each member's agent, noted as the agents start (and as others are installed).
        let member_agents = Arc::new(MemberAgents::default());
        let callbacks = Arc::new(parts::callbacks::Callbacks::new(
            live.clone(),
            log.clone(),
            views.clone(),
            states.clone(),
            meter.clone(),
            requests.clone(),
            cluster.clone(),
            counters.clone(),
            member_agents.clone(),
            records.clone(),
            config.max_updates_per_turn,
        ));
        let agents = Agents::start(agents, callbacks, member_agents);
        let limits = parts::placement::LiveLimits {
            max_sessions: config.max_sessions,
            max_sessions_per_member: config.max_sessions_per_member,
            acquire_timeout: config.acquire_timeout,
            control_timeout: config.control_timeout,
        };
        let quotas = Arc::new(parts::quotas::Quotas::new(
            config.tenants.clone(),
            store.clone(),
            cluster.clone(),
        ));
        let placement = Arc::new(parts::placement::Placement::new(
            agents,
            live,
            records.clone(),
            log.clone(),
            states.clone(),
            requests.clone(),
            cluster.clone(),
            limits,
            quotas,
            stop.clone(),
        ));
        let webhooks = Arc::new(Webhooks::new(
            records.clone(),
            store.clone(),
            hub,
            config.webhooks.clone(),
            stop.clone(),
        ));
        let watchers = Arc::new(parts::watchers::Watchers::new(
            store.clone(),
            log.clone(),
            cluster.clone(),
            tasks.clone(),
        ));
        let installs = Arc::new(parts::installs::AgentInstalls::new(
            store.clone(),
            placement.clone(),
            config.installs.clone(),
            stop.clone(),
        ));
        tasks.spawn(installs.clone().apply_forever());
        let parts = parts::Parts::new(
            placement.clone(),
            records,
            log,
            states,
            views,
            requests.clone(),
            counters,
            workspaces,
            watchers,
            meter,
            installs,
            tasks.clone(),
            stop.clone(),
        );
        let sync = ListSync::new(&parts, config.upstream_tenant.clone(), Arc::default());
        let sessions = Sessions::new(&parts, sync.clone());
        let controls = Controls::new(&parts);
        let roots = config.workspace_roots.clone().into();
        let create = Create::new(
            &parts,
            sessions.clone(),
            controls.clone(),
            roots,
            config.mcp_servers,
        );
        let changes = Changes::new(&parts);
        let kicks = Arc::new(parts::kicks::Kicks::default());
        let turns = Turns::new(
            &parts,
            changes.clone(),
            config.cancel_grace,
            config.control_timeout,
            store.clone(),
            kicks.clone(),
        );
        let queue = Queue::new(
            &parts,
            turns.clone(),
            store.clone(),
            kicks,
            config.max_queued_prompts,
        );
        tasks.spawn(queue.clone().run_forever());
        let usage = Usage::new(&parts, store.clone());
        let history = History::new(&parts);
        let transcripts = Transcripts::new(&parts, store.clone());
        let shares = Shares::new(&parts, store.clone(), history.clone());
        let files = Files::new(&parts);
        let system = System::new(&parts, store.clone());
        let installs = Installs::new(&parts);
        let idempotency = Idempotency::new(&parts, store, config.idempotency_ttl);
        tasks.spawn(idempotency.clone().prune_forever());
        let every = config.sync_interval;
        tasks.spawn(async move { sync.sync_forever(every).await });
        let p = placement.clone();
        tasks.spawn(async move { p.heartbeat_forever().await });
        tasks.spawn(webhooks.clone().deliver_forever());
        if let Some(idle) = config.idle_timeout {
            let p = placement.clone();
            tasks.spawn(async move { p.reap_idle(idle).await });
        }
        Gateway(Arc::new(Service {
            sessions,
            create,
            controls,
            turns,
            queue,
            usage,
            history,
            transcripts,
            shares,
            files,
            changes,
            system,
            installs,
            requests,
            webhooks,
            idempotency,
            placement,
            tasks,
            stop,
            stop_meter,
            shutdown_timeout: config.shutdown_timeout,
        }))
    }

    /// Stops background turns and every pool member.
    pub async fn shutdown(&self) {
        self.0.stop.cancel();
        let deadline = self.0.shutdown_timeout;
        if tokio::time::timeout(deadline, self.wind_down())
            .await
            .is_err()
        {
            tracing::warn!("turns or sessions did not end within the shutdown timeout");
        }
        self.0.placement.agents().shutdown().await;
        self.0.stop_meter.cancel();
        self.0.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.0.tasks.wait()).await;
    }

    /// Cancels every running turn and closes every live session (when the agent can close).
    async fn wind_down(&self) {
        let placement = &self.0.placement;
        let live = placement.live().active();
        futures::future::join_all(live.into_iter().map(|id| async move {
            self.0.requests.cancel_session(&id).await;
            if let Some((member, mut done)) = placement.running_turn(&id).await {
                if let Some(agent) = placement.client(member) {
                    let _ = agent.cancel(&id).await;
                }
                let _ = done.changed().await;
            }
            let live = placement.client_if_live(&id);
            if let Some(agent) = live.filter(|a| a.caps().close) {
                let _ = agent.close_session(&id).await;
            }
        }))
        .await;
    }

    /// The address of the other replica a request about `session_id` must go to, if one: the
    /// live replica holding it, else the least loaded live one running its agent when this
    /// replica does not.
    pub async fn replica_for_session(&self, session_id: &str) -> Result<Option<String>, Error> {
        self.0.placement.replica_for_session(session_id).await
    }

    /// The other replica a new session of `agent` (`None`: this replica's default) should be
    /// created on, if one: a live replica running it that holds fewer sessions, or any live
    /// one running it when this replica does not.
    pub fn replica_for_new(&self, agent: Option<&str>) -> Option<String> {
        self.0.placement.replica_for_new(agent)
    }

    /// The live replica a session of `agent` (`None`: this replica's default) must be made on
    /// when this replica does not run that agent.
    pub fn runner_elsewhere(&self, agent: Option<&str>) -> Option<String> {
        self.0.placement.cluster().runner_elsewhere(agent?)
    }

    /// This replica's id in the registry.
    pub fn replica_id(&self) -> &'static str {
        crate::cluster::replica_id()
    }

    /// The secret this replica shares with the others on its database, which sign the
    /// requests they forward to each other with it.
    pub fn cluster_secret(&self) -> Arc<[u8]> {
        self.0.placement.cluster().secret()
    }

    /// The address of the live replica other than this one whose id is `id`: as of the last
    /// heartbeat, or, for a replica started since, as the registry has it now.
    pub async fn replica_address(&self, id: &str) -> Result<Option<String>, Error> {
        Ok(self.0.placement.cluster().address_of_now(id).await?)
    }

    /// A session's metadata and lifecycle.
    pub fn sessions(&self) -> &Sessions {
        &self.0.sessions
    }

    /// New sessions and forks.
    pub fn create(&self) -> &Create {
        &self.0.create
    }

    /// A session's mode, model and config options.
    pub fn controls(&self) -> &Controls {
        &self.0.controls
    }

    /// Prompts and cancels.
    pub fn turns(&self) -> &Turns {
        &self.0.turns
    }

    pub fn queue(&self) -> &Queue {
        &self.0.queue
    }

    pub fn usage(&self) -> &Usage {
        &self.0.usage
    }

    /// Permission requests and elicitations, and their answers.
    pub fn requests(&self) -> &Requests {
        &self.0.requests
    }

    /// The event streams and the history.
    pub fn history(&self) -> &History {
        &self.0.history
    }

    /// Exports and imports.
    pub fn transcripts(&self) -> &Transcripts {
        &self.0.transcripts
    }

    /// Share links.
    pub fn shares(&self) -> &Shares {
        &self.0.shares
    }

    pub fn files(&self) -> &Files {
        &self.0.files
    }

    /// What changed in sessions' workspaces: diffs, checkpoints, revert.
    pub fn changes(&self) -> &Changes {
        &self.0.changes
    }

    /// Readiness, the agents, the numbers of `/metrics`.
    pub fn system(&self) -> &System {
        &self.0.system
    }

    /// The agents installed from a registry.
    pub fn installs(&self) -> &Installs {
        &self.0.installs
    }

    /// The webhook subscriptions.
    pub fn webhooks(&self) -> &Webhooks {
        &self.0.webhooks
    }

    /// Idempotency keys.
    pub fn idempotency(&self) -> &Idempotency {
        &self.0.idempotency
    }
}
