//! The agent pool: N identical agent processes ("members"), each run by a supervisor task that
//! starts it, initializes it, dispatches what it writes, and restarts it with backoff when it
//! exits. Placement picks the least-loaded ready member; the gateway pins live sessions to it.

pub mod client;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::ToSchema;

use crate::acp::caps::{AgentInit, Capabilities, initialize_params};
use crate::acp::{
    AgentCommand, AgentProcess, AgentStdout, Connection, ExitInfo, Inbound, RpcError,
};
use client::Incoming;

/// What the pool tells the gateway about upstream traffic. Implementations must return quickly:
/// they run on the member's dispatch loop, which preserves the agent's message order.
#[async_trait]
pub trait UpstreamHandler: Send + Sync + 'static {
    /// A notification (e.g. `session/update`), raw.
    async fn on_notification(&self, member: usize, method: &str, params: Value);
    /// A `session/request_permission` request; answer it later through `request`.
    async fn on_permission_request(
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
}

/// Consecutive failed starts after which a member is reported as crash-looping.
const CRASH_LOOP_AFTER: u32 = 5;
/// A member that stayed up this long is considered healthy again.
const HEALTHY_AFTER: Duration = Duration::from_secs(30);

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
struct Slot {
    state: MemberState,
    pid: Option<u32>,
    conn: Option<Arc<Connection>>,
    restarts: u32,
    last_exit: Option<ExitInfo>,
    last_error: Option<String>,
}

/// One agent process slot.
#[derive(Debug)]
pub struct Member {
    pub index: usize,
    slot: Mutex<Slot>,
    /// Live sessions pinned here (maintained by the gateway).
    pub sessions: AtomicUsize,
    /// Asks the supervisor to kill and restart the process.
    restart: tokio::sync::Notify,
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
    members: Vec<Arc<Member>>,
    init: Mutex<Option<AgentInit>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Pool {
    /// Starts `config.size` supervisors. Returns at once; members become ready asynchronously.
    pub fn start(config: PoolConfig, handler: Arc<dyn UpstreamHandler>) -> Arc<Pool> {
        let members = (0..config.size.max(1))
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
                    }),
                    sessions: AtomicUsize::new(0),
                    restart: tokio::sync::Notify::new(),
                })
            })
            .collect();
        let pool = Arc::new(Pool {
            members,
            init: Mutex::new(None),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        for m in &pool.members {
            let (pool2, member, handler, config) =
                (pool.clone(), m.clone(), handler.clone(), config.clone());
            pool.tasks
                .spawn(async move { pool2.supervise(member, config, handler).await });
        }
        pool
    }

    /// What the agent said in `initialize` (from the first member that answered).
    pub fn init(&self) -> Option<AgentInit> {
        self.init.lock().expect("init lock").clone()
    }

    /// The agent's normalised capabilities (none until a member has answered `initialize`),
    /// without copying the rest of its `initialize` result.
    pub fn caps(&self) -> Capabilities {
        let init = self.init.lock().expect("init lock");
        init.as_ref().map(|i| i.capabilities).unwrap_or_default()
    }

    /// The connection of member `index` if it is ready.
    pub fn conn(&self, index: usize) -> Option<Arc<Connection>> {
        let slot = self.members.get(index)?.slot.lock().expect("slot lock");
        (slot.state == MemberState::Ready)
            .then(|| slot.conn.clone())
            .flatten()
    }

    /// The least-loaded ready member.
    pub fn pick(&self) -> Option<(usize, Arc<Connection>)> {
        self.pick_below(usize::MAX)
    }

    /// The least-loaded ready member holding fewer than `cap` live sessions.
    pub fn pick_below(&self, cap: usize) -> Option<(usize, Arc<Connection>)> {
        self.members
            .iter()
            .filter_map(|m| {
                let load = m.sessions.load(Ordering::Relaxed);
                (load < cap)
                    .then(|| self.conn(m.index))
                    .flatten()
                    .map(|c| (load, m.index, c))
            })
            .min_by_key(|(load, index, _)| (*load, *index))
            .map(|(_, index, c)| (index, c))
    }

    /// Kills member `index` (its whole process group); the supervisor restarts it.
    pub fn restart_member(&self, index: usize, why: &str) {
        if let Some(m) = self.members.get(index) {
            tracing::warn!(member = index, why, "restarting member");
            self.set(m, |s| {
                s.last_error = Some(format!("restarted by the gateway: {why}"))
            });
            // No stored permit: a later process must not be killed for an old request.
            m.restart.notify_waiters();
        }
    }

    /// Why the pool is not ready, when no member is.
    pub fn unready_reason(&self) -> Option<String> {
        if self.ready_count() > 0 {
            return None;
        }
        let members = self.members();
        let looping = members
            .iter()
            .filter(|m| m.state == MemberState::CrashLoop)
            .count();
        let last = members.iter().find_map(|m| {
            m.last_error.clone().or_else(|| {
                m.last_exit
                    .as_ref()
                    .map(|e| format!("last exit: code {:?}, signal {:?}", e.code, e.signal))
            })
        });
        Some(match (looping, last) {
            (0, None) => "no agent member is ready yet".to_owned(),
            (0, Some(l)) => format!("no agent member is ready ({l})"),
            (n, l) => format!(
                "{n} of {} agent members are crash-looping ({}); see /agent",
                members.len(),
                l.unwrap_or_default()
            ),
        })
    }

    /// Counts a live session on member `index` (+1 or -1).
    pub fn adjust_sessions(&self, index: usize, attach: bool) {
        if let Some(m) = self.members.get(index) {
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
                    index: m.index,
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

    fn set(&self, member: &Member, f: impl FnOnce(&mut Slot)) {
        f(&mut member.slot.lock().expect("slot lock"));
    }

    async fn supervise(
        &self,
        member: Arc<Member>,
        config: PoolConfig,
        handler: Arc<dyn UpstreamHandler>,
    ) {
        let label = format!("member-{}", member.index);
        let mut failures: u32 = 0;
        while !self.shutdown.is_cancelled() {
            self.set(&member, |s| {
                s.state = if s.restarts == 0 {
                    MemberState::Starting
                } else {
                    MemberState::Restarting
                }
            });
            let started = Instant::now();
            match AgentProcess::spawn(&config.command, &label) {
                Err(e) => {
                    tracing::error!(member = member.index, error = %e, program = %config.command.program, "cannot start the agent");
                    self.set(&member, |s| {
                        s.last_error = Some(format!("cannot start {}: {e}", config.command.program))
                    });
                }
                Ok((mut process, conn, stdout)) => {
                    self.set(&member, |s| s.pid = Some(process.pid));
                    tracing::info!(member = member.index, pid = process.pid, "agent started");
                    let exit = self
                        .run_member(
                            &member,
                            &config,
                            &handler,
                            &mut process,
                            conn.clone(),
                            stdout,
                        )
                        .await;
                    // The member stops reporting `ready` before anyone hears of the exit, so a
                    // client that saw `agent_exited` and then waits for `ready` waits for the
                    // restarted process.
                    self.set(&member, |s| {
                        s.conn = None;
                        s.pid = None;
                        s.last_exit = Some(exit.clone());
                        s.state = MemberState::Restarting;
                    });
                    if self.shutdown.is_cancelled() {
                        conn.fail_all(&exit_reason(&exit));
                        break;
                    }
                    tracing::warn!(member = member.index, code = ?exit.code, signal = ?exit.signal, stderr = ?exit.stderr_tail, "agent exited");
                    member.sessions.store(0, Ordering::Relaxed);
                    // Sessions learn of the exit before their waiting calls fail, so a stream
                    // shows `agent_exited` before the `turn_ended` it causes.
                    handler.on_member_exit(member.index, &exit).await;
                    conn.fail_all(&exit_reason(&exit));
                }
            }
            if started.elapsed() > HEALTHY_AFTER {
                failures = 0;
            }
            failures = failures.saturating_add(1);
            let backoff =
                Duration::from_millis(100u64 << failures.min(9)).min(Duration::from_secs(30));
            self.set(&member, |s| {
                s.state = if failures >= CRASH_LOOP_AFTER {
                    MemberState::CrashLoop
                } else {
                    MemberState::Restarting
                };
                s.restarts += 1;
            });
            if failures == CRASH_LOOP_AFTER {
                tracing::error!(
                    member = member.index,
                    failures,
                    "agent member is crash-looping; retrying with backoff up to 30 s"
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => break,
            }
        }
        self.set(&member, |s| s.state = MemberState::Stopped);
    }

    /// Runs one process from `initialize` to exit; returns how it ended. Everything the agent
    /// wrote has been dispatched by then, so sessions hear of the exit after its last message.
    async fn run_member(
        &self,
        member: &Member,
        config: &PoolConfig,
        handler: &Arc<dyn UpstreamHandler>,
        process: &mut AgentProcess,
        conn: Arc<Connection>,
        stdout: AgentStdout,
    ) -> ExitInfo {
        // Reading and dispatch run in one task, so that an answer wakes its request on the same
        // worker. The task is exempt from tokio's cooperative budget: a budgeted reader is sent
        // to the back of the run queue whenever it has spent 128 units (a message costs at
        // least one), behind a thousand SSE subscribers' writes, and the agent's pipe fills. It
        // yields once after each answer instead, so the request it woke runs even while the
        // agent keeps writing.
        let stop = CancellationToken::new();
        let _stop_dispatch = stop.clone().drop_guard();
        let mut dispatch = {
            let (index, conn, handler) = (member.index, conn.clone(), handler.clone());
            let mut stdout = stdout.until(stop.clone());
            tokio::spawn(tokio::task::unconstrained(async move {
                while let Some(msg) = stdout.next().await {
                    let answer = matches!(msg, Inbound::Response { .. });
                    dispatch(index, &conn, &handler, msg).await;
                    if answer {
                        tokio::task::yield_now().await;
                    }
                }
            }))
        };
        let exit = self
            .drive(member, config, process, conn, &mut dispatch)
            .await;
        stop.cancel();
        // Already awaited to its end when stdout closed (a JoinHandle must not be polled again).
        if !dispatch.is_finished() {
            let _ = dispatch.await;
        }
        exit
    }

    /// `initialize` (and `authenticate`), then waits for the end of stdout, a restart or the
    /// shutdown.
    async fn drive(
        &self,
        member: &Member,
        config: &PoolConfig,
        process: &mut AgentProcess,
        conn: Arc<Connection>,
        dispatch: &mut tokio::task::JoinHandle<()>,
    ) -> ExitInfo {
        let params = initialize_params();
        let init = conn.call("initialize", &params, Some(config.init_timeout));
        let outcome = tokio::select! {
            r = init => Some(r),
            _ = &mut *dispatch => None,
            _ = self.shutdown.cancelled() => return process.terminate(Duration::from_secs(2)).await,
        };
        match outcome {
            Some(Ok(result)) => {
                let init = AgentInit::from_result(&result);
                if let Some(method) = &config.auth_method {
                    let auth = authenticate(&conn, &init, method, config.init_timeout);
                    let outcome = tokio::select! {
                        r = auth => Some(r),
                        _ = &mut *dispatch => None,
                        _ = self.shutdown.cancelled() => return process.terminate(Duration::from_secs(2)).await,
                    };
                    match outcome {
                        Some(Ok(())) => {}
                        Some(Err(why)) => {
                            tracing::error!(member = member.index, why, "authenticate failed");
                            self.set(member, |s| s.last_error = Some(why));
                            self.init.lock().expect("init lock").get_or_insert(init);
                            return process.terminate(Duration::from_secs(2)).await;
                        }
                        None => {
                            self.set(member, |s| {
                                s.last_error =
                                    Some("the agent closed stdout during authenticate".into())
                            });
                            return process.terminate(Duration::from_secs(2)).await;
                        }
                    }
                }
                self.init.lock().expect("init lock").get_or_insert(init);
                self.set(member, |s| {
                    s.state = MemberState::Ready;
                    s.conn = Some(conn.clone());
                    s.last_error = None;
                });
                tracing::info!(member = member.index, "agent ready");
            }
            Some(Err(e)) => {
                tracing::error!(member = member.index, error = %e, "initialize failed");
                self.set(member, |s| {
                    s.last_error = Some(format!("initialize failed: {e}"))
                });
                return process.terminate(Duration::from_secs(2)).await;
            }
            None => {
                self.set(member, |s| {
                    s.last_error = Some("the agent closed stdout before initialize".into())
                });
                return process.terminate(Duration::from_secs(2)).await;
            }
        }
        tokio::select! {
            _ = &mut *dispatch => {
                // stdout closed: give the process a moment to exit on its own, then make sure.
                match tokio::time::timeout(Duration::from_secs(2), process.wait()).await {
                    Ok(exit) => exit,
                    Err(_) => process.terminate(Duration::from_secs(1)).await,
                }
            }
            _ = member.restart.notified() => process.terminate(Duration::from_secs(2)).await,
            _ = self.shutdown.cancelled() => process.terminate(Duration::from_secs(2)).await,
        }
    }
}

/// `authenticate {methodId}`, after checking that the agent offers that method.
pub(crate) async fn authenticate(
    conn: &Connection,
    init: &AgentInit,
    method: &str,
    timeout: Duration,
) -> Result<(), String> {
    let offered: Vec<&str> = init
        .auth_methods
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    if !offered.contains(&method) {
        return Err(format!(
            "the agent does not offer auth method {method:?}; it offers {offered:?}"
        ));
    }
    conn.call(
        "authenticate",
        &serde_json::json!({"methodId": method}),
        Some(timeout),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("authenticate with {method:?} failed: {e}"))
}

fn exit_reason(exit: &ExitInfo) -> String {
    let how = match (exit.code, exit.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    };
    // stderr stays in the log and in /agent: it can hold paths or secrets, so never in a body.
    format!("the agent exited ({how})")
}

/// Delivers one message the agent wrote: a response to its waiter, a notification or request
/// to the handler.
async fn dispatch(
    member: usize,
    conn: &Arc<Connection>,
    handler: &Arc<dyn UpstreamHandler>,
    msg: Inbound,
) {
    match msg {
        Inbound::Response { id, result } => {
            if !conn.resolve(id, result) {
                crate::acp::count_garbage();
                tracing::warn!(member, id, "response to an unknown request id; ignored");
            }
        }
        Inbound::Notification { method, params } => {
            handler.on_notification(member, &method, params).await
        }
        Inbound::Request { id, method, params } => {
            if method == "session/request_permission" {
                handler
                    .clone()
                    .on_permission_request(member, Incoming::new(conn.clone(), id), params)
                    .await;
            } else {
                tracing::warn!(
                    member,
                    method,
                    "unexpected request from the agent; answering -32601"
                );
                let err = RpcError::method_not_found(&method);
                let _ = Incoming::new(conn.clone(), id).refuse(err).await;
            }
        }
    }
}
