//! The pool of one agent's processes ([`Pool`]): its [`Member`]s, each with the slot its
//! supervisor keeps (state, process, connection, restarts), the settings it starts them with
//! ([`PoolConfig`]) and what it tells the gateway of their traffic ([`AgentCallbacks`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::futures::Notified;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;
use utoipa::ToSchema;

use super::client::Incoming;
use crate::agent_rpc::caps::{AgentInit, Capabilities};
use crate::agent_rpc::{AgentCommand, Connection, ExitInfo, NotificationHead};

/// What the pool tells the gateway of what its agents send. Implementations must return quickly:
/// they run on the member's dispatch loop, which preserves the agent's message order.
#[async_trait]
pub trait AgentCallbacks: Send + Sync + 'static {
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
    /// The bearer token the remote agent's host takes (its members have it already).
    pub remote_token: Option<String>,
    /// The params of a `providers/set` every member is sent after `initialize` (a tenant's
    /// own LLM provider; the agent must advertise `providers`).
    pub provider: Option<ProviderParams>,
}

/// `providers/set` params, whose headers hold a key: shown as the provider's id only.
#[derive(Clone)]
pub struct ProviderParams(pub Value);

impl std::fmt::Debug for ProviderParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProviderParams({})", self.0["providerId"])
    }
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

/// What a member's supervisor keeps of it; changed only through its transitions, each applied
/// with [`Pool::set`] so that the requests waiting for a member wake.
#[derive(Debug)]
pub(super) struct Slot {
    state: MemberState,
    pid: Option<u32>,
    conn: Option<Arc<Connection>>,
    restarts: u32,
    last_exit: Option<ExitInfo>,
    last_error: Option<String>,
    /// Failed starts (or short runs) in a row: [`CRASH_LOOP_AFTER`] of them is a crash loop.
    failures: u32,
    /// While the member waits out its restart backoff: when it starts again.
    next_attempt: Option<Instant>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: MemberState::Starting,
            pid: None,
            conn: None,
            restarts: 0,
            last_exit: None,
            last_error: None,
            failures: 0,
            next_attempt: None,
        }
    }

    /// A process is about to be started: the first one, or a restart.
    pub(super) fn starting(&mut self) {
        self.state = if self.restarts == 0 {
            MemberState::Starting
        } else {
            MemberState::Restarting
        };
        self.next_attempt = None;
    }

    /// The process runs as `pid`.
    pub(super) fn spawned(&mut self, pid: u32) {
        self.pid = Some(pid);
    }

    /// Why the member is not (or no longer) ready, for `/agent` and for requests that find
    /// no member.
    pub(super) fn record_error(&mut self, why: String) {
        self.last_error = Some(why);
    }

    /// Initialized (and authenticated): placement may send to `conn`.
    pub(super) fn ready(&mut self, conn: Arc<Connection>) {
        self.state = MemberState::Ready;
        self.conn = Some(conn);
        self.last_error = None;
    }

    /// Out of placement: its connection is gone or it is being stopped, its exit not yet known.
    pub(super) fn lost(&mut self) {
        self.conn = None;
        self.state = MemberState::Restarting;
    }

    /// The process exited.
    pub(super) fn exited(&mut self, exit: ExitInfo) {
        self.conn = None;
        self.pid = None;
        self.last_exit = Some(exit);
        self.state = MemberState::Restarting;
    }

    /// Waits `backoff` before its next start, after `failures` failed starts (or short runs)
    /// in a row: a crash loop from [`CRASH_LOOP_AFTER`] of them.
    pub(super) fn backing_off(&mut self, failures: u32, backoff: Duration) {
        self.state = if failures >= CRASH_LOOP_AFTER {
            MemberState::CrashLoop
        } else {
            MemberState::Restarting
        };
        self.restarts += 1;
        self.failures = failures;
        self.next_attempt = Some(Instant::now() + backoff);
    }

    /// The pool shut down; the member is not started again.
    pub(super) fn stopped(&mut self) {
        self.state = MemberState::Stopped;
    }
}

/// One agent process slot.
#[derive(Debug)]
pub struct Member {
    /// Its index among every agent's members (see [`Agents`](super::Agents)).
    index: usize,
    slot: Mutex<Slot>,
    /// Live sessions pinned here (maintained by the gateway).
    sessions: AtomicUsize,
    /// Asks the supervisor to kill and restart the process.
    restart: tokio::sync::Notify,
}

impl Member {
    fn new(index: usize) -> Member {
        Member {
            index,
            slot: Mutex::new(Slot::new()),
            sessions: AtomicUsize::new(0),
            restart: tokio::sync::Notify::new(),
        }
    }

    /// Its index among every agent's members (see [`Agents`](super::Agents)).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Live sessions pinned here.
    pub fn sessions(&self) -> usize {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Its process exited: no session is live on it any more.
    pub(super) fn forget_sessions(&self) {
        self.sessions.store(0, Ordering::Relaxed);
    }

    /// Counts a live session here (+1 or -1).
    fn adjust_sessions(&self, attach: bool) {
        if attach {
            self.sessions.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .sessions
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Resolves when the gateway asks for this member's process to be restarted.
    pub(super) fn restart_asked(&self) -> Notified<'_> {
        self.restart.notified()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().expect("slot lock")
    }

    /// Its connection if it is ready: not once the connection is gone (stdin broken, stdout
    /// ended), even before the supervisor has heard of it.
    pub(super) fn ready_conn(&self) -> Option<Arc<Connection>> {
        let slot = self.slot();
        (slot.state == MemberState::Ready)
            .then(|| slot.conn.clone())
            .flatten()
            .filter(|c| !c.is_gone())
    }

    /// The earliest moment it may become ready, seen at `now`: now when it is being started
    /// (or its connection just went), the end of its backoff when it restarts. Not while a
    /// crash-looping member backs off: its next start is as likely to fail.
    pub(super) fn next_chance(&self, now: Instant) -> Option<Instant> {
        let s = self.slot();
        match (s.state, s.next_attempt) {
            (MemberState::Starting | MemberState::Restarting, None) => Some(now),
            // Gone, and its supervisor about to hear of it: it restarts next.
            (MemberState::Ready, _) if s.conn.as_ref().is_some_and(|c| c.is_gone()) => Some(now),
            (MemberState::Restarting, Some(at)) if s.failures < CRASH_LOOP_AFTER => Some(at),
            _ => None,
        }
    }

    /// When it starts again, while it waits out its restart backoff.
    pub(super) fn next_attempt(&self) -> Option<Instant> {
        self.slot().next_attempt
    }

    /// Whether it has failed [`CRASH_LOOP_AFTER`] times in a row.
    pub(super) fn crash_looping(&self) -> bool {
        self.slot().failures >= CRASH_LOOP_AFTER
    }

    /// As `/agent` shows it, numbered within its pool, whose first member is `first`.
    fn view(&self, first: usize) -> MemberView {
        let s = self.slot();
        MemberView {
            index: self.index - first,
            pid: s.pid,
            state: s.state,
            sessions: self.sessions(),
            restarts: s.restarts,
            last_exit: s.last_exit.clone(),
            last_error: s.last_error.clone(),
            tenant: None,
        }
    }
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
    /// The tenant whose own pool it is in (with that tenant's agent environment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// The pool of agent processes.
pub struct Pool {
    members: Vec<Arc<Member>>,
    /// The global index of the first member (see [`Agents`](super::Agents)).
    first: usize,
    init: OnceLock<AgentInit>,
    /// Notified whenever a member's state changes: requests waiting for a member wake on it.
    changed: tokio::sync::Notify,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// How it was signed in or out through the API ([`Pool::sign_in`], [`Pool::sign_out`]),
    /// which every member that starts from now on follows; `None`: as configured.
    signed_in: std::sync::Mutex<Option<SignIn>>,
    /// Set by [`Pool::retire`].
    retiring: std::sync::atomic::AtomicBool,
}

/// How a pool's members sign in, as an admin last said through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignIn {
    /// `authenticate` with this method.
    With(String),
    /// Not at all: the agent was logged out (ACP `logout`).
    Out,
}

impl Pool {
    /// Starts `config.size` supervisors, whose members are numbered from `first`. Returns at
    /// once; members become ready asynchronously.
    pub fn start(config: PoolConfig, first: usize, handler: Arc<dyn AgentCallbacks>) -> Arc<Pool> {
        let members = (first..first + config.size.max(1))
            .map(|index| Arc::new(Member::new(index)))
            .collect();
        let pool = Arc::new(Pool {
            members,
            first,
            init: OnceLock::new(),
            changed: tokio::sync::Notify::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            signed_in: std::sync::Mutex::default(),
            retiring: std::sync::atomic::AtomicBool::new(false),
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

    /// How the pool was signed in or out through the API, if it was.
    pub fn signed_in(&self) -> Option<SignIn> {
        self.signed_in.lock().expect("signed-in lock").clone()
    }

    /// Notes how the pool's members sign in from now on.
    pub(super) fn set_signed_in(&self, how: SignIn) {
        *self.signed_in.lock().expect("signed-in lock") = Some(how);
    }

    /// The global index of its first member.
    pub fn first_index(&self) -> usize {
        self.first
    }

    /// How many members the pool has.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Every member, the first first.
    pub(super) fn every_member(&self) -> &[Arc<Member>] {
        &self.members
    }

    /// Member `index` (a global index), if it is one of this pool's.
    fn member(&self, index: usize) -> Option<&Arc<Member>> {
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

    /// Keeps what a member's agent said in `initialize`, unless another member said it first.
    pub(super) fn keep_init(&self, init: AgentInit) {
        let _ = self.init.set(init);
    }

    /// The agent's normalised capabilities (none until a member has answered `initialize`),
    /// without copying the rest of its `initialize` result.
    pub fn caps(&self) -> Capabilities {
        self.init.get().map(|i| i.capabilities).unwrap_or_default()
    }

    /// The connection of member `index` if it is ready: not once its connection is gone
    /// (stdin broken, stdout ended), even before the supervisor has heard of it.
    pub fn conn(&self, index: usize) -> Option<Arc<Connection>> {
        self.member(index)?.ready_conn()
    }

    /// Kills member `index` (its whole process group); the supervisor restarts it.
    pub fn restart_member(&self, index: usize, why: &str) {
        if let Some(m) = self.member(index) {
            tracing::warn!(member = index, why, "restarting member");
            self.set(m, |s| {
                s.record_error(format!("restarted by the gateway: {why}"))
            });
            // No stored permit: a later process must not be killed for an old request.
            m.restart.notify_waiters();
        }
    }

    /// Counts a live session on member `index` (+1 or -1).
    pub fn adjust_sessions(&self, index: usize, attach: bool) {
        if let Some(m) = self.member(index) {
            m.adjust_sessions(attach);
        }
    }

    /// How many members are ready.
    pub fn ready_count(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.ready_conn().is_some())
            .count()
    }

    /// A snapshot for `/agent`.
    pub fn members(&self) -> Vec<MemberView> {
        self.members.iter().map(|m| m.view(self.first)).collect()
    }

    /// Stops every member (terminating each process group) and waits for the supervisors.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Stops every member while the gateway goes on (the agent removed, or replaced by
    /// another version): unlike [`Pool::shutdown`], each member's end is reported as an exit,
    /// so that the sessions live on it are let go and placed again when next used.
    pub async fn retire(&self) {
        self.retiring
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shutdown().await;
    }

    /// Whether the pool is being retired ([`Pool::retire`]).
    pub(super) fn is_retiring(&self) -> bool {
        self.retiring.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the pool is shutting down.
    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Resolves once the pool shuts down.
    pub(super) fn shutting_down(&self) -> WaitForCancellationFuture<'_> {
        self.shutdown.cancelled()
    }

    /// Resolves at the next change of a member's state (register it before looking, so that
    /// a change in between is not missed).
    pub(super) fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// Changes a member's slot and wakes the requests waiting for a member.
    pub(super) fn set(&self, member: &Member, f: impl FnOnce(&mut Slot)) {
        f(&mut member.slot());
        self.changed.notify_waiters();
    }
}
