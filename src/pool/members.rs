//! The pool of one agent's processes ([`Pool`]): its [`Member`]s, each with the slot its
//! supervisor keeps (state, process, connection, restarts), the settings it starts them with
//! ([`PoolConfig`]) and what it tells the gateway of their traffic ([`UpstreamHandler`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::ToSchema;

use super::client::Incoming;
use crate::agent_rpc::caps::{AgentInit, Capabilities};
use crate::agent_rpc::{AgentCommand, Connection, ExitInfo, NotificationHead};

/// What the pool tells the gateway about upstream traffic. Implementations must return quickly:
/// they run on the member's dispatch loop, which preserves the agent's message order.
#[async_trait]
pub trait UpstreamHandler: Send + Sync + 'static {
    /// A notification (e.g. `session/update`), its params as the agent wrote them and what
    /// was read of them while they were checked.
    async fn on_notification(
        &self,
        member: usize,
        method: &str,
        params: Box<serde_json::value::RawValue>,
        head: NotificationHead,
    );
    /// A `session/request_permission` request; answer it later through `request`.
    async fn on_permission_request(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        params: Value,
    );
    /// An `elicitation/create` request; answer it later through `request`.
    async fn on_elicitation_request(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        params: Value,
    );
    /// The member's process exited; its pending calls fail right after this returns.
    async fn on_member_exit(&self, member: usize, exit: &ExitInfo);
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub command: AgentCommand,
    pub size: usize,
    /// Bound on `initialize` (and `authenticate`).
    pub init_timeout: Duration,
    /// `authMethods[].id` to authenticate every member with after `initialize`.
    pub auth_method: Option<String>,
    /// `_meta` of that `authenticate` call (where agents such as Codex and Gemini take a key).
    pub auth_meta: Option<Value>,
    /// The URLs of an agent reached over ACP's network transport; empty for a local agent.
    /// Each member runs the gateway's own bridge, `command`, whose last argument is the URL:
    /// members take the URLs in turn ([`PoolConfig::for_member`]).
    pub remote: Vec<String>,
}

impl PoolConfig {
    /// The settings of the pool's `n`th member: for an agent at several URLs, its command
    /// bridges to the `n`th in turn.
    fn for_member(&self, n: usize) -> PoolConfig {
        let mut config = self.clone();
        if let (Some(last), false) = (config.command.args.last_mut(), self.remote.is_empty()) {
            last.clone_from(&self.remote[n % self.remote.len()]);
        }
        config
    }
}

/// Consecutive failed starts after which a member is reported as crash-looping.
pub(super) const CRASH_LOOP_AFTER: u32 = 5;
/// A member that stayed up this long is considered healthy again.
pub(super) const HEALTHY_AFTER: Duration = Duration::from_secs(30);

/// Lifecycle state of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    Starting,
    Ready,
    Restarting,
    /// Failed to start or crashed several times in a row; still retried, at the longest backoff.
    CrashLoop,
    Stopped,
}

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) state: MemberState,
    pub(super) pid: Option<u32>,
    pub(super) conn: Option<Arc<Connection>>,
    pub(super) restarts: u32,
    pub(super) last_exit: Option<ExitInfo>,
    pub(super) last_error: Option<String>,
    /// Failed starts (or short runs) in a row: [`CRASH_LOOP_AFTER`] of them is a crash loop.
    pub(super) failures: u32,
    /// While the member waits out its restart backoff: when it starts again.
    pub(super) next_attempt: Option<std::time::Instant>,
}

/// One agent process slot.
#[derive(Debug)]
pub struct Member {
    /// Its index among every agent's members (see [`Agents`](super::Agents)).
    pub index: usize,
    pub(super) slot: Mutex<Slot>,
    /// Live sessions pinned here (maintained by the gateway).
    pub sessions: AtomicUsize,
    /// Asks the supervisor to kill and restart the process.
    pub(super) restart: tokio::sync::Notify,
}

/// A member as `/agent` shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub index: usize,
    pub pid: Option<u32>,
    pub state: MemberState,
    pub sessions: usize,
    pub restarts: u32,
    pub last_exit: Option<ExitInfo>,
    pub last_error: Option<String>,
}

/// The pool of agent processes.
pub struct Pool {
    pub(super) members: Vec<Arc<Member>>,
    /// The global index of the first member (see [`Agents`](super::Agents)).
    pub(super) first: usize,
    pub(super) init: std::sync::OnceLock<AgentInit>,
    /// Notified whenever a member's state changes: requests waiting for a member wake on it.
    pub(super) changed: tokio::sync::Notify,
    pub(super) shutdown: CancellationToken,
    pub(super) tasks: TaskTracker,
}

impl Pool {
    /// Starts `config.size` supervisors, whose members are numbered from `first`. Returns at
    /// once; members become ready asynchronously.
    pub fn start(config: PoolConfig, first: usize, handler: Arc<dyn UpstreamHandler>) -> Arc<Pool> {
        let members = (first..first + config.size.max(1))
            .map(|index| {
                Arc::new(Member {
                    index,
                    slot: Mutex::new(Slot {
                        state: MemberState::Starting,
                        pid: None,
                        conn: None,
                        restarts: 0,
                        last_exit: None,
                        last_error: None,
                        failures: 0,
                        next_attempt: None,
                    }),
                    sessions: AtomicUsize::new(0),
                    restart: tokio::sync::Notify::new(),
                })
            })
            .collect();
        let pool = Arc::new(Pool {
            members,
            first,
            init: std::sync::OnceLock::new(),
            changed: tokio::sync::Notify::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        for m in &pool.members {
            let (pool2, member, handler, config) = (
                pool.clone(),
                m.clone(),
                handler.clone(),
                config.for_member(m.index - first),
            );
            pool.tasks
                .spawn(async move { pool2.supervise(member, config, handler).await });
        }
        pool
    }

    /// How many members the pool has.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Member `index` (a global index), if it is one of this pool's.
    pub(super) fn member(&self, index: usize) -> Option<&Arc<Member>> {
        self.members.get(index.checked_sub(self.first)?)
    }

    /// Whether member `index` (a global index) is one of this pool's.
    pub fn has(&self, index: usize) -> bool {
        self.member(index).is_some()
    }

    /// What the agent said in `initialize` (from the first member that answered).
    pub fn init(&self) -> Option<AgentInit> {
        self.init.get().cloned()
    }

    /// The agent's normalised capabilities (none until a member has answered `initialize`),
    /// without copying the rest of its `initialize` result.
    pub fn caps(&self) -> Capabilities {
        self.init.get().map(|i| i.capabilities).unwrap_or_default()
    }

    /// The connection of member `index` if it is ready: not once its connection is gone
    /// (stdin broken, stdout ended), even before the supervisor has heard of it.
    pub fn conn(&self, index: usize) -> Option<Arc<Connection>> {
        let slot = self.member(index)?.slot.lock().expect("slot lock");
        (slot.state == MemberState::Ready)
            .then(|| slot.conn.clone())
            .flatten()
            .filter(|c| !c.is_gone())
    }

    /// Kills member `index` (its whole process group); the supervisor restarts it.
    pub fn restart_member(&self, index: usize, why: &str) {
        if let Some(m) = self.member(index) {
            tracing::warn!(member = index, why, "restarting member");
            self.set(m, |s| {
                s.last_error = Some(format!("restarted by the gateway: {why}"))
            });
            // No stored permit: a later process must not be killed for an old request.
            m.restart.notify_waiters();
        }
    }

    /// Counts a live session on member `index` (+1 or -1).
    pub fn adjust_sessions(&self, index: usize, attach: bool) {
        if let Some(m) = self.member(index) {
            if attach {
                m.sessions.fetch_add(1, Ordering::Relaxed);
            } else {
                let _ = m
                    .sessions
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            }
        }
    }

    /// How many members are ready.
    pub fn ready_count(&self) -> usize {
        self.members
            .iter()
            .filter(|m| self.conn(m.index).is_some())
            .count()
    }

    /// A snapshot for `/agent`.
    pub fn members(&self) -> Vec<MemberView> {
        self.members
            .iter()
            .map(|m| {
                let s = m.slot.lock().expect("slot lock");
                MemberView {
                    index: m.index - self.first,
                    pid: s.pid,
                    state: s.state,
                    sessions: m.sessions.load(Ordering::Relaxed),
                    restarts: s.restarts,
                    last_exit: s.last_exit.clone(),
                    last_error: s.last_error.clone(),
                }
            })
            .collect()
    }

    /// Stops every member (terminating each process group) and waits for the supervisors.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Changes a member's slot and wakes the requests waiting for a member.
    pub(super) fn set(&self, member: &Member, f: impl FnOnce(&mut Slot)) {
        f(&mut member.slot.lock().expect("slot lock"));
        self.changed.notify_waiters();
    }
}
