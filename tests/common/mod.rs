//! Test harness: a real gateway binary on an ephemeral loopback port, in front of the real echo
//! agent (examples/echo_agent.rs) as child processes, on a fresh SQLite file or a fresh
//! PostgreSQL database; plus a small SSE client.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates `sqlite_NAME` and `postgres_NAME` tests from `async fn NAME(backend: Backend)`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::common::Backend::Sqlite).await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() {
            if $crate::common::postgres_admin_url().is_none() { eprintln!("SKIPPED postgres::{}: DATABASE_URL is not set", stringify!($name)); return; }
            super::$name($crate::common::Backend::Postgres).await
        } )* }
    };
}

/// The admin URL of the PostgreSQL server for tests, from `DATABASE_URL`.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty())
}

/// Upper bound for anything a test waits for: a hang fails the test instead of blocking CI.
pub const PATIENCE: Duration = Duration::from_secs(60);

fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Path of the built echo agent example.
pub fn echo_agent() -> PathBuf {
    let p = bin_dir().join("examples/echo_agent");
    let hint = "run the whole suite with `cargo test` (it builds examples) or `cargo build --examples` first";
    let built = std::fs::metadata(&p)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {hint}", p.display()));
    let source = std::fs::metadata(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/echo_agent.rs"
    ))
    .and_then(|m| m.modified())
    .unwrap();
    assert!(
        built >= source,
        "{} is older than examples/echo_agent.rs: {hint}",
        p.display()
    );
    p
}

/// A database for one test: a temp SQLite file, or a fresh PostgreSQL database dropped at the end.
pub struct Database {
    pub url: String,
    pg_name: Option<String>,
}

impl Database {
    pub async fn new(backend: Backend, dir: &Path) -> Self {
        match backend {
            Backend::Sqlite => Database {
                url: format!("sqlite:{}", dir.join("gateway.db").display()),
                pg_name: None,
            },
            Backend::Postgres => {
                let admin = postgres_admin_url().expect("DATABASE_URL");
                let name = format!("acpgw_it_{}", uuid::Uuid::new_v4().simple());
                let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
                    .await
                    .unwrap_or_else(|e| panic!("PostgreSQL at DATABASE_URL is unreachable: {e}"));
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                let base = admin.rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap();
                Database {
                    url: format!("{base}/{name}"),
                    pg_name: Some(name),
                }
            }
        }
    }

    pub async fn drop_db(&self) {
        if let Some(name) = &self.pg_name {
            let admin = postgres_admin_url().unwrap();
            if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await;
            }
        }
    }
}

/// How to start a gateway.
#[derive(Clone)]
pub struct Options {
    pub pool_size: usize,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    pub wait_ready: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pool_size: 1,
            env: vec![],
            args: vec![],
            wait_ready: true,
        }
    }
}

impl Options {
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn pool(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }
    pub fn no_wait(mut self) -> Self {
        self.wait_ready = false;
        self
    }
}

/// A test's world: temp dir (agent state, call log, SQLite file), database, one gateway.
pub struct World {
    pub dir: tempfile::TempDir,
    pub db: Database,
    pub gw: Option<Gateway>,
    pub opts: Options,
}

impl World {
    pub async fn start(backend: Backend, opts: Options) -> World {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::new(backend, dir.path()).await;
        let gw = Gateway::spawn(&db.url, dir.path(), &opts).await;
        World {
            dir,
            db,
            gw: Some(gw),
            opts,
        }
    }

    pub fn gw(&self) -> &Gateway {
        self.gw.as_ref().unwrap()
    }

    /// Stops the gateway (SIGTERM) and starts it again on the same database and agent state.
    pub async fn restart(&mut self) {
        if let Some(mut gw) = self.gw.take() {
            gw.stop();
        }
        self.gw = Some(Gateway::spawn(&self.db.url, self.dir.path(), &self.opts).await);
    }

    /// Lines of the agent's call log that start with `method`.
    pub fn calls(&self, method: &str) -> usize {
        let log = std::fs::read_to_string(self.dir.path().join("calls.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.split(' ').next() == Some(method))
            .count()
    }

    /// The gateway's log (stderr) so far, over all restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    pub async fn finish(mut self) {
        if let Some(mut gw) = self.gw.take() {
            gw.stop();
        }
        self.db.drop_db().await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- gateway log -----\n{}----- end of gateway log -----",
                self.log()
            );
        }
    }
}

/// A running gateway process.
pub struct Gateway {
    pub base: String,
    pub http: reqwest::Client,
    child: Child,
}

impl Gateway {
    pub async fn spawn(db_url: &str, dir: &Path, opts: &Options) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_acp-gateway"));
        cmd.arg("--agent")
            .arg(echo_agent())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database-url")
            .arg(db_url)
            .arg("--pool-size")
            .arg(opts.pool_size.to_string())
            .args(&opts.args)
            .env("ECHO_AGENT_DIR", dir.join("agent"))
            .env("ECHO_AGENT_CALL_LOG", dir.join("calls.log"))
            .env("RUST_LOG", "info,acp_gateway=debug")
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("gateway.log"))
                    .unwrap(),
            ));
        let mut child = cmd.spawn().expect("start acp-gateway");
        let stdout = child.stdout.take().unwrap();
        let base = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().expect("gateway printed nothing").unwrap();
            // keep draining stdout so the gateway never blocks on it
            std::thread::spawn(move || for _ in lines {});
            first
                .strip_prefix("listening on ")
                .expect("listening line")
                .to_owned()
        })
        .await
        .unwrap();
        let gw = Gateway {
            base,
            http: reqwest::Client::new(),
            child,
        };
        if opts.wait_ready {
            gw.wait_until(|g| async move { g.get("/readyz").await.status() == 200 })
                .await;
        }
        gw
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the gateway dies without any cleanup (its agents exit when their stdin closes).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait (bounded) for the gateway to exit; returns how it exited.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the gateway did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.unwrap()
    }
    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }
    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.http.delete(self.url(path)).send().await.unwrap()
    }
    pub async fn patch(&self, path: &str, body: Value) -> reqwest::Response {
        self.http
            .patch(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }
    pub async fn json(&self, path: &str) -> Value {
        let r = self.get(path).await;
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// Creates a session in `cwd` and returns its id.
    pub async fn create(&self, cwd: &str) -> String {
        let r = self.post("/sessions", json!({"cwd": cwd})).await;
        assert_eq!(r.status(), 201);
        let v: Value = r.json().await.unwrap();
        v["sessionId"].as_str().unwrap().to_owned()
    }

    /// Prompts and waits for the turn; returns (status, body).
    pub async fn prompt(&self, id: &str, text: &str) -> (u16, Value) {
        let r = self
            .post(&format!("/sessions/{id}/prompt"), json!({"text": text}))
            .await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Starts a turn without waiting (`Prefer: respond-async`).
    pub async fn prompt_async(&self, id: &str, text: &str) {
        let r = self
            .http
            .post(self.url(&format!("/sessions/{id}/prompt")))
            .header("prefer", "respond-async")
            .json(&json!({"text": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }

    pub async fn status(&self, id: &str) -> String {
        self.json(&format!("/sessions/{id}/status")).await["status"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The session's whole log as `/history` pages it: (seq, event) pairs.
    pub async fn logged(&self, id: &str) -> Vec<(i64, String)> {
        self.json(&format!("/sessions/{id}/history?limit=1000"))
            .await["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["seq"].as_i64().unwrap(),
                    e["event"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// Polls `cond` until it holds (bounded by [`PATIENCE`]).
    pub async fn wait_until<'a, F, Fut>(&'a self, cond: F)
    where
        F: Fn(&'a Gateway) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + PATIENCE;
        while !cond(self).await {
            assert!(
                Instant::now() < deadline,
                "condition not reached within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every pool member is ready.
    pub async fn wait_members_ready(&self) {
        self.wait_until(|g| async move {
            g.json("/agent").await["members"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["state"] == "ready")
        })
        .await;
    }

    /// Waits until member 0 has been restarted at least `n` times.
    pub async fn wait_restarts(&self, n: u64) {
        self.wait_until(|g| async move {
            g.json("/agent").await["members"][0]["restarts"]
                .as_u64()
                .unwrap()
                >= n
        })
        .await;
    }

    /// Member 0's `lastError` from `/agent` (empty when none).
    pub async fn member_error(&self) -> String {
        self.json("/agent").await["members"][0]["lastError"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Opens an SSE stream.
    pub async fn sse(&self, path: &str, last_event_id: Option<i64>) -> Sse {
        let mut req = self
            .http
            .get(self.url(path))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 200, "GET {path}");
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        assert_eq!(res.headers()["cache-control"], "no-cache");
        assert_eq!(res.headers()["x-accel-buffering"], "no");
        Sse {
            body: Box::pin(res.bytes_stream()),
            buf: String::new(),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One SSE event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: i64,
    pub event: String,
    pub data: Value,
}

/// A minimal SSE client over a reqwest body.
pub struct Sse {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

impl Sse {
    /// Wraps a response whose body is an event stream.
    pub fn from_response(res: reqwest::Response) -> Sse {
        Sse {
            body: Box::pin(res.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event (skipping comments), or `None` if the stream ended. Panics after PATIENCE.
    pub async fn next(&mut self) -> Option<SseEvent> {
        tokio::time::timeout(PATIENCE, self.next_inner())
            .await
            .expect("no SSE event within PATIENCE")
    }

    async fn next_inner(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let frame: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::from("message"), String::new());
                for line in frame.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().parse().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if let Some(id) = id {
                    return Some(SseEvent {
                        id,
                        event,
                        data: serde_json::from_str(&data).unwrap(),
                    });
                }
                continue; // keep-alive comment
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return None,
            }
        }
    }

    /// Reads events until one named `event` arrives; returns all read, that one included.
    pub async fn until(&mut self, event: &str) -> Vec<SseEvent> {
        let mut out = vec![];
        loop {
            let e = self
                .next()
                .await
                .unwrap_or_else(|| panic!("stream ended before {event}; got {out:?}"));
            let done = e.event == event;
            out.push(e);
            if done {
                return out;
            }
        }
    }
}

/// The last event of a `/history` page.
pub fn last_event(history: &Value) -> &Value {
    history["events"]
        .as_array()
        .and_then(|events| events.last())
        .unwrap_or_else(|| panic!("no events in {history}"))
}

/// The text of agent_message_chunk events, concatenated.
/// Streamed events as (id, event) pairs, to compare with [`Gateway::logged`].
pub fn positions(events: &[SseEvent]) -> Vec<(i64, String)> {
    events.iter().map(|e| (e.id, e.event.clone())).collect()
}

pub fn chunk_text(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "agent_message_chunk")
        .map(|e| {
            e.data["update"]["content"]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

/// Pids of live processes whose environment contains `needle` (e.g. a test's unique agent
/// directory): every process a test's gateway started, children and grandchildren alike.
pub fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if pid_alive(pid) && String::from_utf8_lossy(&env).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// True if a process with this pid is running (a zombie waiting for a reaper is not).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Another client of the same agent (an editor on the same machine, say): its own echo agent
/// process on the test's agent state directory, spoken to directly over stdio.
pub struct DirectClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
}

impl DirectClient {
    /// Starts the agent with capabilities `caps` (as `ECHO_AGENT_CAPS`) and initializes it.
    pub async fn start(w: &World, caps: &str) -> DirectClient {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(echo_agent())
            .env("ECHO_AGENT_DIR", w.dir.path().join("agent"))
            .env("ECHO_AGENT_CAPS", caps)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut c = DirectClient {
            child,
            stdin,
            lines,
            next_id: 0,
        };
        c.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await;
        c
    }

    /// Sends a request and returns its result (panics on an error response).
    /// `session/new` in `cwd`; returns the new session's id.
    pub async fn new_session(&mut self, cwd: &str) -> String {
        let created = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        created["sessionId"].as_str().unwrap().to_owned()
    }

    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        use tokio::io::AsyncWriteExt;
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
                .await
                .expect("agent answers in time")
                .unwrap()
                .expect("agent still running");
            let msg: Value = serde_json::from_str(&line).unwrap();
            if msg["id"] == json!(id) {
                assert!(msg.get("error").is_none(), "{method} failed: {msg}");
                return msg["result"].clone();
            }
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
