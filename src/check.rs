//! `acp-gateway check-agent`: starts each configured agent once (or the one `--only` names),
//! initializes it (and authenticates it when it has an auth method, with its `_meta`), tries a
//! session (`session/new` in the temporary directory, deleted or closed again where the agent
//! can), and describes it as a table under a `[NAME]` heading; or says in one line why the
//! gateway could not use it — an agent that answers `session/new` with `auth_required` cannot
//! be used until it is signed in. The first thing to run when wiring a new agent.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use std::sync::Arc;

use crate::agent_rpc::caps::{AgentInit, initialize_params};
use crate::agent_rpc::{AgentProcess, CallError, Connection, ExitInfo, Inbound, RpcError};
use crate::config::{AgentSpec, Config};
use crate::pool::client::{AgentClient, SessionSetup};

/// ACP's "authentication required" error.
const AUTH_REQUIRED: i64 = -32000;

/// What `check-agent` found.
pub struct Checked {
    /// One section per agent checked, headed by `[NAME]`: its table, or why it is unusable.
    pub report: String,
    /// The agents that cannot be used, each with the reason.
    pub unusable: Vec<(String, anyhow::Error)>,
}

impl Checked {
    /// `Err` naming every unusable agent with its reason, in one line.
    pub fn result(&self) -> anyhow::Result<()> {
        match self.unusable.as_slice() {
            [] => Ok(()),
            [(name, why)] => Err(anyhow::anyhow!("agent {name:?} cannot be used: {why:#}")),
            many => Err(anyhow::anyhow!(
                "{} agents cannot be used: {}",
                many.len(),
                many.iter()
                    .map(|(name, why)| format!("{name:?}: {why:#}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        }
    }
}

/// Checks every configured agent in turn, default first (or only the one named `only`). `Err`
/// when the configuration is wrong; an agent that cannot be used is in [`Checked::unusable`].
pub async fn check_agents(config: &Config, only: Option<&str>) -> anyhow::Result<Checked> {
    let (mut agents, default) = config.agents()?;
    if let Some(name) = only {
        let names: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
        let at = agents
            .iter()
            .position(|a| a.name == name)
            .with_context(|| {
                format!(
                    "--only {name:?}: no such agent; the agents are: {}",
                    names.join(", ")
                )
            })?;
        agents = vec![agents.swap_remove(at)];
    }
    let mut checked = Checked {
        report: String::new(),
        unusable: Vec::new(),
    };
    for (i, agent) in agents.iter().enumerate() {
        if i > 0 {
            checked.report.push('\n');
        }
        let tag = if agent.name == default {
            " (default)"
        } else {
            ""
        };
        checked.report += &format!("[{}]{tag}\n", agent.name);
        match check_agent(agent, config.init_timeout()).await {
            Ok(table) => checked.report += &table,
            Err(why) => {
                checked.report += &format!("unusable  {why:#}\n");
                checked.unusable.push((agent.name.clone(), why));
            }
        }
    }
    Ok(checked)
}

/// Checks one agent; `Ok` is the description to print, `Err` the reason it is unusable.
pub async fn check_agent(agent: &AgentSpec, timeout: Duration) -> anyhow::Result<String> {
    let command = &agent.command;
    let (mut process, conn, stdout) = AgentProcess::spawn(command, "check")
        .with_context(|| format!("cannot start the agent {:?}", command.program))?;
    // Answers arrive on stdout, read by a task of their own; the agent's own requests are
    // refused.
    let stop = tokio_util::sync::CancellationToken::new();
    let answers = {
        let (conn, mut stdout) = (conn.clone(), stdout.until(stop.clone()));
        tokio::spawn(async move {
            while let Some(msg) = stdout.next().await {
                match msg {
                    Inbound::Response { id, result } => {
                        conn.resolve(id, result);
                    }
                    Inbound::Request { id, method, .. } => {
                        let refused = RpcError::method_not_found(&method);
                        let _ = conn.respond::<serde_json::Value>(&id, Err(&refused)).await;
                    }
                    Inbound::Notification { .. } => {}
                }
            }
            conn.fail_all("the agent closed stdout");
        })
    };
    let outcome = describe(agent, &conn, timeout).await;
    let exit = process.terminate(Duration::from_secs(2)).await;
    stop.cancel();
    let _ = answers.await;
    outcome.map_err(|e| match e {
        Failure::Call(step, CallError::Closed(_) | CallError::NotSent(_)) => {
            anyhow::anyhow!("the agent exited before answering {step}{}", how(&exit))
        }
        Failure::Call(step, CallError::Timeout(_)) => anyhow::anyhow!(
            "the agent did not answer {step} within {} s: is it an ACP agent speaking JSON-RPC on stdio (some need a flag, e.g. --acp)?{}",
            timeout.as_secs(),
            last_stderr(&exit)
        ),
        Failure::Call(step, CallError::Rpc(e)) => {
            anyhow::anyhow!("{step} failed: agent error {}: {}", e.code, e.message)
        }
        Failure::Call(step, e @ CallError::Unsupported(_)) => anyhow::anyhow!("{step}: {e}"),
        Failure::Other(e) => e,
    })
}

enum Failure {
    Call(&'static str, CallError),
    Other(anyhow::Error),
}

async fn describe(
    agent: &AgentSpec,
    conn: &Arc<Connection>,
    timeout: Duration,
) -> Result<String, Failure> {
    let result = conn
        .call("initialize", &initialize_params(), Some(timeout))
        .await
        .map_err(|e| Failure::Call("initialize", e))?;
    let init = AgentInit::from_result(&result);
    if let Some(method) = &agent.auth_method {
        crate::pool::authenticate(conn, &init, method, agent.auth_meta.as_ref(), timeout)
            .await
            .map_err(|why| Failure::Other(anyhow::anyhow!(why)))?;
    }
    let session = try_session(
        &AgentClient::new(conn.clone(), init.capabilities, timeout),
        &init,
    )
    .await?;
    Ok(table(&init, agent.auth_method.as_deref(), &session))
}

/// `session/new` in the temporary directory: how it went (and what became of the session), or
/// why the agent cannot be used.
async fn try_session(client: &AgentClient, init: &AgentInit) -> Result<String, Failure> {
    let cwd = std::env::temp_dir().display().to_string();
    let setup = SessionSetup {
        cwd: &cwd,
        additional_directories: &[],
        mcp_servers: &[],
        meta: None,
    };
    let id = match client.new_session(setup).await {
        Ok((id, _)) => id,
        Err(CallError::Rpc(e)) if e.code == AUTH_REQUIRED => {
            let offered = auth_method_ids(init);
            return Err(Failure::Other(anyhow::anyhow!(
                "session/new answered auth_required ({}): the agent needs a sign-in; it offers auth methods {offered:?}: give it its key in its environment (env), or configure its auth-method and auth-meta",
                e.message
            )));
        }
        Err(e) => return Err(Failure::Call("session/new", e)),
    };
    // Leave nothing behind where the agent can help it.
    let caps = client.caps();
    let after = if caps.delete {
        client.delete_session(&id).await.map(|()| "deleted again")
    } else if caps.close {
        client.close_session(&id).await.map(|()| "closed again")
    } else {
        Ok("left to the agent")
    };
    after
        .map(|done| format!("ok (a session in {cwd}, {done})"))
        .map_err(|e| Failure::Call("cleaning up the session made", e))
}

fn auth_method_ids(init: &AgentInit) -> Vec<String> {
    init.auth_methods
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

fn table(init: &AgentInit, authenticated: Option<&str>, session: &str) -> String {
    let auth = auth_method_ids(init);
    let info = &init.agent_info;
    let text = |k: &str| info.get(k).and_then(Value::as_str).unwrap_or("-");
    let c = &init.capabilities;
    let mut rows: Vec<(&str, String)> = vec![
        ("agent", text("name").to_owned()),
        ("title", text("title").to_owned()),
        ("version", text("version").to_owned()),
        ("protocol version", init.protocol_version.to_string()),
        (
            "auth methods",
            if auth.is_empty() {
                "none".into()
            } else {
                auth.join(", ")
            },
        ),
    ];
    if let Some(m) = authenticated {
        rows.push(("authenticated with", m.to_owned()));
    }
    rows.push(("session/new", session.to_owned()));
    let yes = |b: bool| if b { "yes" } else { "no" }.to_owned();
    rows.extend([
        ("session/load", yes(c.load)),
        ("session/list", yes(c.list)),
        ("session/resume", yes(c.resume)),
        ("session/close", yes(c.close)),
        ("session/delete", yes(c.delete)),
        ("session/status", yes(c.status)),
        ("session/set_title", yes(c.set_title)),
        ("session/archive", yes(c.archive)),
    ]);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

fn how(exit: &ExitInfo) -> String {
    let status = match (exit.code, exit.signal) {
        (Some(c), _) => format!(" (exit code {c})"),
        (_, Some(s)) => format!(" (signal {s})"),
        _ => String::new(),
    };
    status + &last_stderr(exit)
}

/// The agent's last stderr line: on the operator's own terminal it usually names the cause.
fn last_stderr(exit: &ExitInfo) -> String {
    match exit.stderr_tail.iter().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!("; its last stderr line: {}", line.trim()),
        None => String::new(),
    }
}
