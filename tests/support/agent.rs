//! The echo agent (`examples/echo_agent.rs`) as tests and benches run it: where its binary is,
//! the command that starts it on a state directory, the JSON-RPC lines a client writes to it,
//! and [`AgentPipes`], a client on its stdio that tests and the benches' bare proxy share.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::PATIENCE;

/// The directory holding the gateway binary under test, and the examples beside it: Cargo's
/// `target/debug` for tests, `target/release` for benches.
fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The built echo agent beside the gateway binary. Panics, saying how to build it, when it is
/// missing or older than its source: Cargo builds examples for `cargo test`, but not for
/// `cargo test --test integration NAME::` or `cargo bench`.
pub fn echo_agent() -> PathBuf {
    example("echo_agent")
}

/// The built bench agent (`examples/bench_agent.rs`, the cheapest agent that streams a turn),
/// checked as [`echo_agent`] is.
pub fn bench_agent() -> PathBuf {
    example("bench_agent")
}

fn example(name: &str) -> PathBuf {
    let p = bin_dir().join("examples").join(name);
    // Tests build without optimisation, benches with it (the bench profile is release's).
    let hint = if cfg!(debug_assertions) {
        "run the whole suite with `cargo test` (it builds examples) or `cargo build --examples` first".to_owned()
    } else {
        format!("run the bench/ script, which builds it (`cargo build --release --example {name}`)")
    };
    let built = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {hint}", p.display()));
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    let source = std::fs::metadata(source)
        .and_then(|m| m.modified())
        .unwrap();
    assert!(
        built >= source,
        "{} is older than examples/{name}.rs: {hint}",
        p.display()
    );
    p
}

/// The echo agent on state directory `state`, its stdin and stdout piped, its stderr dropped.
pub fn echo_agent_command(state: &Path) -> Command {
    agent_command(&echo_agent(), state)
}

/// The agent `binary` (the echo agent or the bench agent) as [`echo_agent_command`] starts it.
pub fn agent_command(binary: &Path, state: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .env("ECHO_AGENT_DIR", state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    command
}

/// A JSON-RPC request for the agent, as the line to write to its stdin.
pub fn request_line(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string() + "\n"
}

/// Whether a line from the agent is a `session/update` notification (found without parsing it).
pub fn is_update(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"session/update\"").is_some()
}

/// `initialize` as a client without capabilities sends it.
pub fn initialize() -> (&'static str, Value) {
    (
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
}

/// The requests that make a fresh echo agent ready for prompts: the handshake, then one session
/// in `/tmp` (its id is in the last response's `result.sessionId`).
pub fn handshake() -> [(&'static str, Value); 2] {
    [
        initialize(),
        ("session/new", json!({"cwd": "/tmp", "mcpServers": []})),
    ]
}

/// A client on an agent's stdio, one request at a time: it writes a request line and reads
/// lines until the response with the same id, skipping update lines unparsed. The agent is
/// killed when this is dropped.
pub struct AgentPipes {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
}

impl AgentPipes {
    /// Starts `command` (see [`echo_agent_command`]); sends nothing yet.
    pub fn spawn(command: Command) -> AgentPipes {
        let mut child = tokio::process::Command::from(command)
            .kill_on_drop(true)
            .spawn()
            .expect("start the agent");
        AgentPipes {
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            next_id: 1,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the agent is running")
    }

    /// Sends a request and returns the whole response (`result` or `error`). Panics when the
    /// agent closes its stdout first.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let line = request_line(id, method, params);
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .unwrap()
                .expect("agent still running");
            if is_update(line.as_bytes()) {
                continue;
            }
            let msg: Value = serde_json::from_str(&line).unwrap();
            if msg["id"] == id {
                return msg;
            }
        }
    }

    /// Kills the agent and reaps it (one that already exited is fine).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// Another client of the same agent (an editor on the same machine, say): its own echo agent
/// process on a gateway's agent state directory, spoken to directly over stdio.
pub struct DirectClient {
    pipes: AgentPipes,
}

impl DirectClient {
    /// Starts the agent on `state` with capabilities `caps` (as `ECHO_AGENT_CAPS`) and
    /// initializes it.
    pub async fn start(state: &Path, caps: &str) -> DirectClient {
        let mut command = echo_agent_command(state);
        command.env("ECHO_AGENT_CAPS", caps);
        let mut client = DirectClient {
            pipes: AgentPipes::spawn(command),
        };
        let (method, params) = initialize();
        client.call(method, params).await;
        client
    }

    /// `session/new` in `cwd`; returns the new session's id.
    pub async fn new_session(&mut self, cwd: &str) -> String {
        let created = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        created["sessionId"].as_str().unwrap().to_owned()
    }

    /// Sends a request and returns its result (panics on an error response or after PATIENCE).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let msg = tokio::time::timeout(PATIENCE, self.pipes.call(method, params))
            .await
            .expect("agent answers in time");
        assert!(msg.get("error").is_none(), "{method} failed: {msg}");
        msg["result"].clone()
    }

    pub async fn stop(mut self) {
        self.pipes.kill().await;
    }
}
