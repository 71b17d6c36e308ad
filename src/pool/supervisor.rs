//! A member's supervisor: it starts the agent process, initializes (and authenticates) it,
//! dispatches what it writes in order, takes the member out of placement the moment its
//! connection is gone, reports the exit, and restarts it with backoff.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_client_protocol_schema::v1::{
    AGENT_METHOD_NAMES, AuthenticateRequest, CLIENT_METHOD_NAMES, LogoutRequest,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::client::Incoming;
use super::members::{AgentCallbacks, Member, Pool, PoolConfig, SignIn};
use super::members::{CRASH_LOOP_AFTER, HEALTHY_AFTER};
use crate::agent_rpc::caps::{AgentInit, initialize_params};
use crate::agent_rpc::{
    AgentProcess, AgentStdout, CallError, Connection, ExitInfo, Inbound, RpcError,
};

impl Pool {
    /// Signs the pool in with `method`: `authenticate` on every ready member now (each must
    /// succeed), and on every member that starts from now on. The pool stays as it was when
    /// one fails; `Err` says which and why.
    pub async fn sign_in(&self, method: &str, timeout: std::time::Duration) -> Result<(), String> {
        let init = self
            .init()
            .ok_or("no member of the agent has started yet")?;
        for conn in self.ready_conns() {
            authenticate(&conn, &init, method, None, timeout).await?;
        }
        self.set_signed_in(SignIn::With(method.to_owned()));
        Ok(())
    }

    /// Signs the pool out: from now on no member that starts authenticates, whatever it was
    /// configured with (noted first, so that a member starting meanwhile does not sign itself
    /// back in); then ACP `logout` on every ready member. `Err` is the first refusal; the
    /// others are still asked.
    pub async fn sign_out(&self, timeout: std::time::Duration) -> Result<(), CallError> {
        self.set_signed_in(SignIn::Out);
        let (logout, mut first) = (LogoutRequest::new(), Ok(()));
        for conn in self.ready_conns() {
            let done = conn.call(AGENT_METHOD_NAMES.logout, &logout, Some(timeout));
            first = first.and(done.await.map(|_| ()));
        }
        first
    }

    /// The connections of its ready members.
    fn ready_conns(&self) -> Vec<Arc<Connection>> {
        let members = self.every_member().iter();
        members.filter_map(|m| m.ready_conn()).collect()
    }

    pub(super) async fn supervise(
        &self,
        member: Arc<Member>,
        config: PoolConfig,
        handler: Arc<dyn AgentCallbacks>,
    ) {
        let index = member.index();
        let label = format!("member-{index}");
        let mut failures: u32 = 0;
        while !self.is_shutting_down() {
            self.set(&member, |s| s.starting());
            let started = Instant::now();
            match AgentProcess::spawn(&config.command, &label) {
                Err(e) => {
                    tracing::error!(member = index, error = %e, program = %config.command.program, "cannot start the agent");
                    self.set(&member, |s| {
                        s.record_error(format!("cannot start {}: {e}", config.command.program))
                    });
                }
                Ok((mut process, conn, stdout)) => {
                    self.set(&member, |s| s.spawned(process.pid));
                    tracing::info!(member = index, pid = process.pid, "agent started");
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
                    self.set(&member, |s| s.exited(exit.clone()));
                    if self.is_shutting_down() {
                        if self.is_retiring() {
                            member.forget_sessions();
                            handler.on_member_exit(index, &exit).await;
                        }
                        conn.fail_all(&exit_reason(&exit));
                        break;
                    }
                    tracing::warn!(member = index, code = ?exit.code, signal = ?exit.signal, stderr = ?exit.stderr_tail, "agent exited");
                    member.forget_sessions();
                    // Sessions learn of the exit before their waiting calls fail, so a stream
                    // shows `agent_exited` before the `turn_ended` it causes.
                    handler.on_member_exit(index, &exit).await;
                    conn.fail_all(&exit_reason(&exit));
                }
            }
            if started.elapsed() > HEALTHY_AFTER {
                failures = 0;
            }
            failures = failures.saturating_add(1);
            let backoff =
                Duration::from_millis(100u64 << failures.min(9)).min(Duration::from_secs(30));
            self.set(&member, |s| s.backing_off(failures, backoff));
            if failures == CRASH_LOOP_AFTER {
                tracing::error!(
                    member = index,
                    failures,
                    "agent member is crash-looping; retrying with backoff up to 30 s"
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutting_down() => break,
            }
        }
        self.set(&member, |s| s.stopped());
    }

    /// Runs one process from `initialize` to exit; returns how it ended. Everything the agent
    /// wrote has been dispatched by then, so sessions hear of the exit after its last message.
    async fn run_member(
        &self,
        member: &Member,
        config: &PoolConfig,
        handler: &Arc<dyn AgentCallbacks>,
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
            let (index, conn, handler) = (member.index(), conn.clone(), handler.clone());
            let mut stdout = stdout.until(stop.clone());
            tokio::spawn(tokio::task::unconstrained(async move {
                while let Some(msg) = stdout.next().await {
                    let answer = matches!(msg, Inbound::Response { .. });
                    dispatch(index, &conn, &handler, msg).await;
                    if answer {
                        tokio::task::yield_now().await;
                    }
                }
                // No answer can come any more: out of placement now, not once the exit is known.
                conn.set_gone();
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

    /// `initialize` (and `authenticate`), then waits for the connection to go (stdout ended or
    /// stdin broke), a restart or the shutdown.
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
            _ = self.shutting_down() => return process.terminate(Duration::from_secs(2)).await,
        };
        match outcome {
            Some(Ok(result)) => {
                let init = AgentInit::from_result(&result);
                let prepared = prepare(&conn, &init, config, self.signed_in());
                let outcome = tokio::select! {
                    r = prepared => Some(r),
                    _ = &mut *dispatch => None,
                    _ = self.shutting_down() => return process.terminate(Duration::from_secs(2)).await,
                };
                match outcome {
                    Some(Ok(())) => {}
                    Some(Err(why)) => {
                        tracing::error!(
                            member = member.index(),
                            why,
                            "the agent was not made ready"
                        );
                        self.set(member, |s| s.record_error(why));
                        self.keep_init(init);
                        return process.terminate(Duration::from_secs(2)).await;
                    }
                    None => {
                        self.set(member, |s| {
                            s.record_error("the agent closed stdout before it was ready".into())
                        });
                        return process.terminate(Duration::from_secs(2)).await;
                    }
                }
                self.keep_init(init);
                self.set(member, |s| s.ready(conn.clone()));
                tracing::info!(member = member.index(), "agent ready");
            }
            Some(Err(e)) => {
                tracing::error!(member = member.index(), error = %e, "initialize failed");
                self.set(member, |s| {
                    s.record_error(format!("initialize failed: {e}"))
                });
                return process.terminate(Duration::from_secs(2)).await;
            }
            None => {
                let exit = process.terminate(Duration::from_secs(2)).await;
                // Its last words say why (a remote agent's bridge: why it could not connect).
                let said = match exit.stderr_tail.last() {
                    Some(line) => format!(": {line}"),
                    None => String::new(),
                };
                self.set(member, |s| {
                    s.record_error(format!("the agent closed stdout before initialize{said}"))
                });
                return exit;
            }
        }
        let end = tokio::select! {
            _ = &mut *dispatch => End::Gone,
            _ = conn.gone() => End::Gone,
            _ = member.restart_asked() => End::Stop,
            _ = self.shutting_down() => End::Stop,
        };
        // Out of placement at once, before the exit is known: a write found stdin broken, or
        // stdout ended, and nothing sent now could be answered.
        conn.set_gone();
        self.set(member, |s| s.lost());
        match end {
            End::Gone => {
                // Give the process a moment to exit on its own, then make sure.
                let exit = match tokio::time::timeout(Duration::from_secs(2), process.wait()).await
                {
                    Ok(exit) => exit,
                    Err(_) => process.terminate(Duration::from_secs(1)).await,
                };
                // What it wrote before it went is dispatched before anyone hears of the exit
                // (stdout is still open when the break was found on stdin). A JoinHandle that
                // has finished must not be polled again.
                if !dispatch.is_finished() {
                    let _ = tokio::time::timeout(Duration::from_secs(1), &mut *dispatch).await;
                }
                exit
            }
            End::Stop => process.terminate(Duration::from_secs(2)).await,
        }
    }
}

/// Why a ready member's process is ending.
enum End {
    /// Its connection is gone: stdin broke or stdout ended (usually it exited).
    Gone,
    /// The gateway restarts it, or shuts down.
    Stop,
}

/// What a member is sent after `initialize`: `authenticate`, when the agent has an auth
/// method (the one it was signed in with through the API, else its configured one); `providers/set`, when its pool has a provider of its own (refused when the agent
/// does not advertise `providers`: its sessions must not run on the gateway's provider).
async fn prepare(
    conn: &Connection,
    init: &AgentInit,
    config: &PoolConfig,
    signed_in: Option<SignIn>,
) -> Result<(), String> {
    match (signed_in, &config.auth_method) {
        (Some(SignIn::With(method)), _) => {
            authenticate(conn, init, &method, None, config.init_timeout).await?
        }
        (Some(SignIn::Out), _) | (None, None) => {}
        (None, Some(method)) => {
            let meta = config.auth_meta.as_ref();
            authenticate(conn, init, method, meta, config.init_timeout).await?;
        }
    }
    if let Some(provider) = &config.provider {
        if init
            .raw_capabilities
            .get("providers")
            .is_none_or(Value::is_null)
        {
            return Err(format!(
                "the agent does not advertise ACP's LLM providers, so the provider {} cannot be set: give the tenant an env instead",
                provider.0["providerId"]
            ));
        }
        conn.call("providers/set", &provider.0, Some(config.init_timeout))
            .await
            .map_err(|e| format!("providers/set failed: {e}"))?;
    }
    Ok(())
}

/// `authenticate {methodId, _meta}` (`_meta` only when given), after checking that the agent
/// offers that method.
pub(crate) async fn authenticate(
    conn: &Connection,
    init: &AgentInit,
    method: &str,
    meta: Option<&Value>,
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
    let meta = meta.and_then(Value::as_object).cloned();
    let params = AuthenticateRequest::new(method.to_owned()).meta(meta);
    conn.call(AGENT_METHOD_NAMES.authenticate, &params, Some(timeout))
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
    handler: &Arc<dyn AgentCallbacks>,
    msg: Inbound,
) {
    match msg {
        Inbound::Response { id, result } => {
            if !conn.resolve(id, result) {
                crate::agent_rpc::count_garbage();
                tracing::warn!(member, id, "response to an unknown request id; ignored");
            }
        }
        Inbound::Notification {
            method,
            params,
            head,
        } => handler.on_notification(member, &method, params, head).await,
        Inbound::Request { id, method, params } => {
            let request = Incoming::new(conn.clone(), id);
            let handler = handler.clone();
            let names = &CLIENT_METHOD_NAMES;
            match method.as_str() {
                m if m == names.session_request_permission => {
                    handler.on_permission_request(member, request, params).await
                }
                m if m == names.elicitation_create => {
                    handler
                        .on_elicitation_request(member, request, params)
                        .await
                }
                _ => {
                    tracing::warn!(
                        member,
                        method,
                        "unexpected request from the agent; answering -32601"
                    );
                    let err = RpcError::method_not_found(&method);
                    let _ = request.refuse(err).await;
                }
            }
        }
    }
}
