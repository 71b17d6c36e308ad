//! `acp-gateway check-agent`: starts the configured agent once, initializes it (and
//! authenticates when `--agent-auth-method` is set), and describes it as a table; or says in
//! one line why the gateway could not use it. The first thing to run when wiring a new agent.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use crate::acp::caps::{AgentInit, initialize_params};
use crate::acp::{AgentProcess, CallError, ExitInfo, Inbound, RpcError};
use crate::config::Config;

/// Runs the check; `Ok` is the description to print, `Err` the reason the agent is unusable.
pub async fn check_agent(config: &Config) -> anyhow::Result<String> {
    let command = crate::agent_command(config)?;
    let (mut process, conn, stdout) = AgentProcess::spawn(&command, "check")
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
    let timeout = config.init_timeout();
    let outcome = describe(config, &conn, timeout).await;
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
    config: &Config,
    conn: &crate::acp::Connection,
    timeout: Duration,
) -> Result<String, Failure> {
    let result = conn
        .call("initialize", &initialize_params(), Some(timeout))
        .await
        .map_err(|e| Failure::Call("initialize", e))?;
    let init = AgentInit::from_result(&result);
    if let Some(method) = &config.agent_auth_method {
        crate::pool::authenticate(conn, &init, method, timeout)
            .await
            .map_err(|why| Failure::Other(anyhow::anyhow!(why)))?;
    }
    Ok(table(&init, config.agent_auth_method.as_deref()))
}

fn auth_method_ids(init: &AgentInit) -> Vec<String> {
    init.auth_methods
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

fn table(init: &AgentInit, authenticated: Option<&str>) -> String {
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
