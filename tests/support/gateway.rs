//! The gateway binary as tests and benches run it: [`Gateway::spawn`] starts it on an
//! ephemeral loopback port in front of the echo agent, on a [`Database`] of its own, and waits
//! until it is ready; it is stopped by SIGTERM or killed, and spoken to with the HTTP helpers
//! here; [`Options`] (`world.rs`) hold what differs. A recorded log is checked for the test's
//! secrets when its gateway stops or is dropped (`secrets.rs`): no line may hold one.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::postgres::{Collation, FreshDatabase};
use super::process::listening_or_ended;
use super::secrets;
use super::sse::{Sse, SseEvent};
use super::world::Options;
use super::{Backend, PATIENCE, echo_agent};

/// A running gateway process, killed when dropped.
pub struct Gateway {
    pub base: String,
    pub http: reqwest::Client,
    /// Spawn to `/readyz` 200 (zero when not waited for).
    pub ready_after: Duration,
    /// The database it serves.
    db_url: String,
    child: tokio::process::Child,
    /// The log this gateway writes to (with `record`), checked for secrets when it ends, and
    /// the files its flags name whose keys and tokens are secrets too.
    log: Option<(PathBuf, Vec<String>)>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some((log, files)) = &self.log
            && !std::thread::panicking()
        {
            secrets::check_log(log, files);
        }
    }
}

impl Gateway {
    /// Starts a gateway on `db_url` with its agent state in `dir/agent` (`dir` is created);
    /// returns once it listens, and with `opts.wait_ready` once `/readyz` answers 200.
    ///
    /// On port 0 unless `opts` fix an address (a restart that keeps its origin): that port may
    /// be held for a moment by another process (as a connection's ephemeral port), so a start
    /// that fails because the address is in use, and only that, is tried again (within
    /// [`PATIENCE`]).
    pub async fn spawn(db_url: &str, dir: &Path, opts: &Options) -> Gateway {
        std::fs::create_dir_all(dir).unwrap();
        let started = Instant::now();
        let log = dir.join("gateway.log");
        let (child, base) = loop {
            let logged = std::fs::metadata(&log).map_or(0, |m| m.len());
            let mut child = Self::command(db_url, dir, opts)
                .spawn()
                .expect("start acp-gateway");
            let stdout = child.stdout.take().unwrap();
            if let Some(base) = listening_or_ended(stdout, "the gateway").await {
                break (child, base);
            }
            let status = child.wait().await.unwrap();
            let said = std::fs::read(&log)
                .map(|all| String::from_utf8_lossy(&all[logged as usize..]).into_owned())
                .unwrap_or_default();
            let in_use = said.contains("Address already in use");
            assert!(
                in_use && opts.listening().is_some() && started.elapsed() < PATIENCE,
                "the gateway exited ({status}) before it listened (see its stderr):\n{said}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut gw = Gateway {
            base,
            http: reqwest::Client::new(),
            ready_after: Duration::ZERO,
            db_url: db_url.to_owned(),
            child,
            log: opts.record.then(|| {
                let files = secrets::secrets_of_command(&opts.args, &opts.env);
                (log, files)
            }),
        };
        if opts.wait_ready {
            gw.wait_ready(started + PATIENCE, opts.ready_poll).await;
            gw.ready_after = started.elapsed();
        }
        gw
    }

    /// The gateway's command: `--listen 127.0.0.1:0` unless `opts` name an address.
    fn command(db_url: &str, dir: &Path, opts: &Options) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&opts.binary);
        cmd.arg("--agent").arg(&opts.agent);
        if opts.listening().is_none() {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        cmd.args(["--database-url", db_url])
            .arg("--pool-size")
            .arg(opts.pool_size.to_string())
            .args(&opts.args)
            .env("ECHO_AGENT_DIR", dir.join("agent"))
            .env("ACP_GATEWAY_WORKSPACE_DIR", dir.join("workspaces"))
            .env("RUST_LOG", &opts.rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if opts.record {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("gateway.log"))
                .unwrap();
            cmd.env("ECHO_AGENT_CALL_LOG", dir.join("calls.log"))
                .stderr(log);
        } else {
            cmd.stderr(Stdio::inherit());
        }
        cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Polls `/readyz` every `poll` until it answers 200; it answers 503 meanwhile (not ready
    /// yet), and anything else fails the test at once.
    async fn wait_ready(&self, deadline: Instant, poll: Duration) {
        loop {
            let answer = self.http.get(self.url("/readyz")).send().await;
            let status = match &answer {
                Ok(r) => r.status().as_u16(),
                Err(e) => panic!("/readyz of a gateway that listens: {e}"),
            };
            match status {
                200 => return,
                503 => assert!(Instant::now() < deadline, "not ready within {PATIENCE:?}"),
                other => panic!("/readyz answers 200 or 503, not {other}"),
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Where it listens: `127.0.0.1:PORT` (for `--listen`, to start again where it was).
    pub fn address(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the gateway is running")
    }

    /// SIGKILL: the gateway dies without any cleanup (its agents exit when their stdin closes).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then wait (bounded) for the gateway to exit; returns how it exited.
    pub async fn stop(mut self) -> ExitStatus {
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                let _ = self.child.kill().await;
                panic!("the gateway did not stop within 30 s of SIGTERM");
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.unwrap()
    }
    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.send_json(Method::POST, path, body).await
    }
    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.http.delete(self.url(path)).send().await.unwrap()
    }
    pub async fn patch(&self, path: &str, body: Value) -> reqwest::Response {
        self.send_json(Method::PATCH, path, body).await
    }
    /// `method path` with a JSON body.
    pub async fn send_json(&self, method: Method, path: &str, body: Value) -> reqwest::Response {
        secrets::secrets_in_json(&body);
        self.http
            .request(method, self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }
    /// `method path` with a JSON body and no key, asserting the answer's status; answers its
    /// body (see [`Keyed::send_expecting`]).
    pub async fn send_expecting(
        &self,
        method: Method,
        path: &str,
        body: Value,
        want: u16,
    ) -> Value {
        self.with_key(None)
            .send_expecting(method, path, Some(body), want)
            .await
    }
    /// Requests made with `key` as bearer (none: no `Authorization`).
    pub fn with_key<'g>(&'g self, key: Option<&'g str>) -> Keyed<'g> {
        Keyed { gw: self, key }
    }
    /// `POST /sessions/{id}/{action}` with an empty object: cancel, close, resume, archive, ….
    pub async fn session_action(&self, id: &str, action: &str) -> reqwest::Response {
        self.post(&format!("/sessions/{id}/{action}"), json!({}))
            .await
    }
    pub async fn json(&self, path: &str) -> Value {
        let r = self.get(path).await;
        assert_eq!(r.status(), 200, "GET {path}");
        let body = r.json().await.unwrap();
        secrets::secrets_in_json(&body);
        body
    }

    /// The paths `GET /sessions/{id}/diff` names, in its order.
    pub async fn changed_paths(&self, id: &str) -> Vec<String> {
        let diff = self.json(&format!("/sessions/{id}/diff")).await;
        let files = diff["files"].as_array().unwrap_or_else(|| panic!("{diff}"));
        let path = |f: &Value| f["path"].as_str().unwrap().to_owned();
        files.iter().map(path).collect()
    }

    /// The mark of a request to `target` that another replica forwards here, signed as the
    /// replicas sign it, with the secret they keep in the database.
    pub async fn forwarding_mark(&self, method: &reqwest::Method, target: &str) -> String {
        use sqlx::Connection;
        let query = "SELECT secret FROM cluster_secret WHERE id = 1";
        let secret: Vec<u8> = if self.db_url.starts_with("postgres") {
            let mut c = sqlx::PgConnection::connect(&self.db_url).await.unwrap();
            sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
        } else {
            let mut c = sqlx::SqliteConnection::connect(&self.db_url).await.unwrap();
            sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
        };
        let proof = acp_gateway::api::proof::Proof::with_secret(secret.into(), "a-test");
        let mark = proof.mark(method, target);
        mark.to_str().unwrap().to_owned()
    }

    /// A session in `cwd` created on this replica (marked as forwarded already, the request is
    /// not placed on another replica): its id.
    pub async fn create_here(&self, cwd: &str) -> String {
        let mark = self
            .forwarding_mark(&reqwest::Method::POST, "/sessions")
            .await;
        let r = self
            .http
            .post(self.url("/sessions"))
            .header("acp-gateway-forwarded", mark)
            .json(&json!({"cwd": cwd}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        r.json::<Value>().await.unwrap()["sessionId"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub async fn create(&self, cwd: &str) -> String {
        // The gateway accepts only an existing directory.
        std::fs::create_dir_all(cwd).unwrap();
        let r = self.post("/sessions", json!({"cwd": cwd})).await;
        assert_eq!(r.status(), 201);
        let v: Value = r.json().await.unwrap();
        v["sessionId"].as_str().unwrap().to_owned()
    }

    /// The URL of a session's prompt route.
    pub fn prompt_url(&self, id: &str) -> String {
        self.url(&format!("/sessions/{id}/prompt"))
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
        self.with_key(None).prompt_async(id, text).await;
    }

    /// Sends a prompt from a task of its own, so that the test can act while the turn runs;
    /// the handle yields the answer once the turn has ended (or the gateway has gone).
    pub fn prompt_in_background(
        &self,
        id: &str,
        text: &str,
    ) -> JoinHandle<reqwest::Result<reqwest::Response>> {
        let request = self
            .http
            .post(self.prompt_url(id))
            .json(&json!({"text": text}));
        tokio::spawn(request.send())
    }

    /// Waits (up to [`PATIENCE`]) for a permission request of the session; its request id.
    pub async fn pending_permission(&self, id: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let pending = self.json(&format!("/sessions/{id}/permissions")).await;
            if let Some(request) = pending[0]["requestId"].as_str() {
                return request.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no permission request within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

    /// The session's whole log, every page of `/history`: the events as JSON.
    pub async fn history(&self, id: &str) -> Vec<Value> {
        self.with_key(None).history(id).await
    }

    /// How many events `/history` returns on its first page.
    /// What the agent says in a turn prompted with `text` (directives only): its chunks,
    /// joined, without the reply to the empty rest (`(empty)`).
    pub async fn said(&self, id: &str, text: &str) -> String {
        self.with_key(None).said(id, text).await
    }

    pub async fn history_len(&self, id: &str) -> usize {
        self.json(&format!("/sessions/{id}/history")).await["events"]
            .as_array()
            .unwrap()
            .len()
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

    /// Waits until member 0 is in `state` (`ready`, `crash_loop`, …).
    pub async fn wait_member_state(&self, state: &str) {
        self.wait_until(|g| async move { g.json("/agent").await["members"][0]["state"] == state })
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

    /// The pid of member 0's agent process.
    pub async fn agent_pid(&self) -> u32 {
        self.json("/agent").await["members"][0]["pid"]
            .as_u64()
            .expect("a running agent") as u32
    }

    /// A value of `/metrics` (an unlabelled series).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }

    /// Opens an SSE stream, checking the status and the headers every stream has.
    pub async fn sse(&self, path: &str, last_event_id: Option<i64>) -> Sse {
        let res = Sse::request(&self.http, &self.url(path), last_event_id)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "GET {path}");
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        assert_eq!(res.headers()["cache-control"], "no-cache");
        assert_eq!(res.headers()["x-accel-buffering"], "no");
        Sse::from_response(res)
    }

    /// Opens session `id`'s event stream ([`Gateway::sse`]): from the live tail, or after
    /// `last_event_id`.
    pub async fn events(&self, id: &str, last_event_id: Option<i64>) -> Sse {
        self.sse(&format!("/sessions/{id}/events"), last_event_id)
            .await
    }

    /// Session `id`'s events from its first one through its first `turn_ended`.
    pub async fn first_turn(&self, id: &str) -> Vec<SseEvent> {
        self.events(id, Some(0)).await.until("turn_ended").await
    }
}

/// A caller with a key (see [`Gateway::with_key`]): each request answers its status and its
/// body, as JSON when it is JSON, else as a JSON string.
pub struct Keyed<'g> {
    gw: &'g Gateway,
    key: Option<&'g str>,
}

impl Keyed<'_> {
    /// [`Gateway::history`] with this caller's key.
    pub async fn history(&self, id: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let path = format!("/sessions/{id}/history?after={after}&limit=1000");
            let page = self.send_expecting(Method::GET, &path, None, 200).await;
            events.extend(page["events"].as_array().unwrap().iter().cloned());
            match page["nextAfter"].as_i64() {
                Some(next) => after = next,
                None => return events,
            }
        }
    }

    /// [`Gateway::said`] with this caller's key.
    pub async fn said(&self, id: &str, text: &str) -> String {
        let path = format!("/sessions/{id}/prompt");
        (self.send_expecting(Method::POST, &path, Some(json!({"text": text})), 200)).await;
        let history = self.history(id).await;
        let start = history
            .iter()
            .rposition(|e| e["event"] == "turn_started")
            .unwrap();
        history[start..]
            .iter()
            .filter(|e| e["event"] == "agent_message_chunk")
            .filter_map(|e| e["data"]["update"]["content"]["text"].as_str())
            .collect::<String>()
            .trim_end_matches("(empty)")
            .to_owned()
    }
    pub async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.gw.http.request(method, self.gw.url(path));
        if let Some(key) = self.key {
            secrets::secret(key);
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            secrets::secrets_in_json(&body);
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        secrets::secrets_in_json(&body);
        (status, body)
    }
    /// [`Keyed::send`], asserting that the status is `want`; answers the body.
    pub async fn send_expecting(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        want: u16,
    ) -> Value {
        let (status, answer) = self.send(method.clone(), path, body).await;
        assert_eq!(status, want, "{method} {path}: {answer}");
        answer
    }
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(Method::GET, path, None).await
    }
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(Method::POST, path, Some(body)).await
    }
    /// The `data` of the session's logged events of `kind` (its first 1000 events), in order.
    pub async fn logged(&self, id: &str, kind: &str) -> Vec<Value> {
        let path = format!("/sessions/{id}/history?limit=1000");
        let history = self.send_expecting(Method::GET, &path, None, 200).await;
        let events = history["events"].as_array().unwrap().iter();
        events
            .filter(|e| e["event"] == kind)
            .map(|e| e["data"].clone())
            .collect()
    }
    /// Starts a turn without waiting (`Prefer: respond-async`).
    pub async fn prompt_async(&self, id: &str, text: &str) {
        let mut req = self.gw.http.post(self.gw.prompt_url(id));
        if let Some(key) = self.key {
            req = req.bearer_auth(key);
        }
        let r = req
            .header("prefer", "respond-async")
            .json(&json!({"text": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
}
