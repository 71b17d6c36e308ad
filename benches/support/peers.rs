//! The peers the gateway is measured against under concurrent load, installed pinned from their
//! registries by `bench/peers.sh` and found through `ACP_HTTP_ADAPTER` and `SANDBOX_AGENT`:
//! acp-http-adapter (crates.io) and sandbox-agent (npm). Both relay JSON-RPC envelopes between
//! HTTP and one agent process's stdio: a `POST` carries a request and answers with its
//! response, and one SSE stream carries every line the agent writes (every session's updates,
//! and the responses too), numbered. Neither keeps a log or knows about sessions.
//!
//! [`Peer::start`] runs one on an ephemeral loopback port with the echo agent as its agent:
//! - acp-http-adapter: `--registry-json` names the agent as a `binary` distribution whose
//!   `cmd` is the echo agent; `POST /v1/rpc`, stream `GET /v1/rpc`.
//! - sandbox-agent: `server --no-token --no-telemetry`; its agent processes are launched from
//!   `$XDG_DATA_HOME/sandbox-agent/bin/agent_processes/<agent>-acp` when that file exists, so a
//!   script there named for the `pi` agent (which needs no native binary) execs the echo agent,
//!   and `SANDBOX_AGENT_REQUIRE_PREINSTALL=1` forbids any download. The first
//!   `POST /v1/acp/{server}?agent=pi` starts the agent process of server `{server}`; stream
//!   `GET /v1/acp/{server}`.
//!
//! Neither says which port it got when told port 0, so it is read from `/proc`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::shared::PATIENCE;
use super::shared::process::{children, listening_port, pid_alive};

/// Which peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    AcpHttpAdapter,
    SandboxAgent,
}

impl PeerKind {
    /// The installed binary, from the variable `bench/peers.sh` prints; panics, saying how to
    /// install it, when it is unset or missing.
    fn binary(self) -> PathBuf {
        let var = match self {
            PeerKind::AcpHttpAdapter => "ACP_HTTP_ADAPTER",
            PeerKind::SandboxAgent => "SANDBOX_AGENT",
        };
        let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
            panic!("{var} is not set: run `bash bench/concurrent.sh`, which installs the peers")
        });
        assert!(
            path.is_file(),
            "{var}={} does not exist: run `bash bench/peers.sh`",
            path.display()
        );
        path
    }
}

/// The sandbox-agent server id (one agent process) every session of the bench goes to.
const SERVER_ID: &str = "bench";

/// A running peer, killed (with its agent) when dropped.
pub struct Peer {
    /// Name and version, as its `--version` says.
    pub name: String,
    /// Where requests are posted.
    rpc: String,
    /// The first request's URL (sandbox-agent starts the agent process then).
    first_rpc: String,
    /// Its SSE stream of everything the agent writes.
    pub stream: String,
    pub http: reqwest::Client,
    next_id: AtomicU64,
    agent_pid: Option<u32>,
    child: tokio::process::Child,
}

impl Peer {
    /// Starts `kind` in front of the agent `agent` (the echo agent or the bench agent) on state
    /// directory `dir/agent` (`dir` is its own), waits until it listens, and initializes it.
    pub async fn start(kind: PeerKind, agent: &Path, dir: &Path) -> Peer {
        let binary = kind.binary();
        std::fs::create_dir_all(dir).unwrap();
        let version = std::process::Command::new(&binary)
            .arg("--version")
            .output()
            .expect("the peer runs");
        let name = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        let mut cmd = tokio::process::Command::new(&binary);
        match kind {
            PeerKind::AcpHttpAdapter => {
                let registry = json!({"binary": {platform(): {"cmd": agent}}});
                cmd.args(["--host", "127.0.0.1", "--port", "0", "--registry-json"])
                    .arg(registry.to_string());
            }
            PeerKind::SandboxAgent => {
                let data = dir.join("xdg");
                let launchers = data.join("sandbox-agent/bin/agent_processes");
                std::fs::create_dir_all(&launchers).unwrap();
                let launcher = launchers.join("pi-acp");
                let script = format!("#!/bin/sh\nexec '{}' \"$@\"\n", agent.display());
                std::fs::write(&launcher, script).unwrap();
                std::fs::set_permissions(
                    &launcher,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )
                .unwrap();
                cmd.args(["server", "--no-token", "--no-telemetry"])
                    .args(["--host", "127.0.0.1", "--port", "0"])
                    .env("XDG_DATA_HOME", &data)
                    .env("HOME", dir)
                    .env("SANDBOX_AGENT_REQUIRE_PREINSTALL", "1");
            }
        }
        // Warnings only, like the gateway's bench runs: both log every request at `info`.
        cmd.env("RUST_LOG", "warn")
            .env("ECHO_AGENT_DIR", dir.join("agent"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("start the peer");
        let pid = child.id().unwrap();
        let deadline = Instant::now() + PATIENCE;
        let port = loop {
            if let Some(port) = listening_port(pid) {
                break port;
            }
            assert!(pid_alive(pid), "{name} exited before listening");
            assert!(Instant::now() < deadline, "{name} not listening in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let base = format!("http://127.0.0.1:{port}");
        let (rpc, first_rpc) = match kind {
            PeerKind::AcpHttpAdapter => (format!("{base}/v1/rpc"), format!("{base}/v1/rpc")),
            PeerKind::SandboxAgent => (
                format!("{base}/v1/acp/{SERVER_ID}"),
                format!("{base}/v1/acp/{SERVER_ID}?agent=pi"),
            ),
        };
        let mut peer = Peer {
            name,
            stream: rpc.clone(),
            rpc,
            first_rpc,
            http: reqwest::Client::new(),
            next_id: AtomicU64::new(1),
            agent_pid: None,
            child,
        };
        let agent_name = agent.file_name().unwrap();
        let first = peer.first_rpc.clone();
        let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
        peer.call_at(&first, "initialize", init).await;
        let agents: Vec<u32> = children(pid)
            .into_iter()
            .filter(|(_, comm)| Some(comm.as_str()) == agent_name.to_str())
            .map(|(pid, _)| pid)
            .collect();
        assert_eq!(agents.len(), 1, "{} runs one agent", peer.name);
        peer.agent_pid = Some(agents[0]);
        peer
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the peer is running")
    }

    pub fn agent_pid(&self) -> u32 {
        self.agent_pid.unwrap()
    }

    /// Posts a JSON-RPC request to `url` and returns its `result` (panics on an error).
    async fn call_at(&self, url: &str, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let r = self.http.post(url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{} {method}", self.name);
        let response: Value = r.json().await.unwrap();
        assert!(response.get("error").is_none(), "{method}: {response}");
        response["result"].clone()
    }

    /// `session/new` in `/tmp`; returns the session's id.
    pub async fn new_session(&self) -> String {
        let params = json!({"cwd": "/tmp", "mcpServers": []});
        let created = self.call_at(&self.rpc, "session/new", params).await;
        created["sessionId"].as_str().unwrap().to_owned()
    }

    /// One prompt with `text` on `session`, through `http`; checks that it ended the turn
    /// without parsing the answer.
    pub async fn prompt(&self, http: &reqwest::Client, session: &str, text: &str) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {
            "sessionId": session, "prompt": [{"type": "text", "text": text}]}});
        let r = http.post(&self.rpc).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{} session/prompt", self.name);
        let answer = r.bytes().await.unwrap();
        assert!(
            memchr::memmem::find(&answer, b"\"stopReason\":\"end_turn\"").is_some(),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }

    /// SIGINT (both shut their agent down on it), bounded; then SIGKILL to the peer and to its
    /// agent, by pid, for whichever is still running.
    pub async fn stop(mut self) {
        let pid = self.pid();
        let signal = |pid: u32, signal| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        };
        signal(pid, nix::sys::signal::Signal::SIGINT);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        let agent = self.agent_pid();
        let deadline = Instant::now() + Duration::from_secs(5);
        while pid_alive(agent) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if pid_alive(agent) {
            signal(agent, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// acp-http-adapter's key for this machine in a `binary` distribution.
fn platform() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "linux-aarch64",
        _ => "linux-x86_64",
    }
}
