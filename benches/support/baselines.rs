//! The baselines the gateway is measured against, in the same run: a direct ACP client on an
//! echo agent's stdio ([`DirectAgent`], and [`MultiplexedAgent`] for many callers at once), a
//! bare axum route serving fixed bytes ([`bare_server`]) and a bare proxy relaying prompts to
//! an agent ([`BareProxy`]).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde_json::{Value, json};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::shared::agent::{
    AgentPipes, agent_command, echo_agent_command, handshake, initialize, is_update, request_line,
};

/// The baseline: an ACP client on the echo agent's stdio that reads stdout in large blocks and
/// only counts update lines — the least work any client can do.
pub struct DirectAgent {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    buf: Vec<u8>,
    pending: Vec<u8>,
    next_id: u64,
    pub session: String,
}

impl DirectAgent {
    /// Starts the agent, initializes it and creates one session.
    pub fn start(state: &Path) -> DirectAgent {
        let mut child = echo_agent_command(state).spawn().unwrap();
        let mut agent = DirectAgent {
            stdin: child.stdin.take().unwrap(),
            stdout: child.stdout.take().unwrap(),
            child,
            buf: vec![0u8; 1 << 20],
            pending: Vec::new(),
            next_id: 1,
            session: String::new(),
        };
        let mut created = Value::Null;
        for (method, params) in handshake() {
            created = agent.call(method, params).0;
        }
        agent.session = created["result"]["sessionId"].as_str().unwrap().to_owned();
        agent
    }

    /// Sends a request and reads until its response; returns it and the update lines before it.
    pub fn call(&mut self, method: &str, params: Value) -> (Value, usize) {
        let id = self.next_id;
        self.next_id += 1;
        let line = request_line(id, method, params);
        self.stdin.write_all(line.as_bytes()).unwrap();
        let mut updates = 0;
        loop {
            let mut start = 0;
            while let Some(nl) = memchr::memchr(b'\n', &self.pending[start..]) {
                let line = &self.pending[start..start + nl];
                start += nl + 1;
                if is_update(line) {
                    updates += 1;
                } else if let Ok(v) = serde_json::from_slice::<Value>(line)
                    && v["id"] == id
                {
                    self.pending.drain(..start);
                    return (v, updates);
                }
            }
            self.pending.drain(..start);
            let n = self.stdout.read(&mut self.buf).unwrap();
            assert!(n > 0, "the agent closed stdout");
            self.pending.extend_from_slice(&self.buf[..n]);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One prompt with `text`; returns the update lines it produced.
    pub fn prompt(&mut self, text: &str) -> usize {
        let params = json!({"sessionId": self.session, "prompt": [{"type": "text", "text": text}]});
        let (response, updates) = self.call("session/prompt", params);
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        updates
    }
}

impl Drop for DirectAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Waiting = Arc<std::sync::Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Value>>>>;

/// The concurrent baseline: one echo agent whose stdio is shared by every caller, as an ACP
/// client multiplexes requests on one connection. Requests are written whole under a lock; one
/// task reads stdout, counts update lines without parsing them and hands each response to the
/// caller waiting for its id. The agent is killed when this is dropped.
pub struct MultiplexedAgent {
    stdin: tokio::sync::Mutex<tokio::process::ChildStdin>,
    waiting: Waiting,
    next_id: AtomicU64,
    updates: Arc<AtomicU64>,
    pid: u32,
    _child: tokio::process::Child,
}

impl MultiplexedAgent {
    /// Starts the agent `binary` on `state` and initializes it.
    pub async fn start(binary: &Path, state: &Path) -> MultiplexedAgent {
        let mut child = tokio::process::Command::from(agent_command(binary, state))
            .kill_on_drop(true)
            .spawn()
            .expect("start the agent");
        let waiting = Waiting::default();
        let updates = Arc::new(AtomicU64::new(0));
        let stdout = tokio::io::BufReader::with_capacity(1 << 16, child.stdout.take().unwrap());
        tokio::spawn(read_responses(stdout, waiting.clone(), updates.clone()));
        let agent = MultiplexedAgent {
            stdin: tokio::sync::Mutex::new(child.stdin.take().unwrap()),
            waiting,
            next_id: AtomicU64::new(1),
            updates,
            pid: child.id().expect("the agent is running"),
            _child: child,
        };
        let (method, params) = initialize();
        agent.call(method, params).await;
        agent
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Update lines read so far.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Sends a request and waits for its response; returns its `result` (panics on an error).
    pub async fn call(&self, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiting.lock().unwrap().insert(id, tx);
        let line = request_line(id, method, params);
        self.stdin
            .lock()
            .await
            .write_all(line.as_bytes())
            .await
            .unwrap();
        let response = rx.await.expect("the agent answers before closing stdout");
        assert!(response.get("error").is_none(), "{method}: {response}");
        response["result"].clone()
    }

    /// `session/new` in `/tmp`; returns the session's id.
    pub async fn new_session(&self) -> String {
        let created = self
            .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
            .await;
        created["sessionId"].as_str().unwrap().to_owned()
    }

    /// One prompt with `text` on `session`, answered `end_turn`.
    pub async fn prompt(&self, session: &str, text: &str) {
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let result = self.call("session/prompt", params).await;
        assert_eq!(result["stopReason"], "end_turn", "{result}");
    }
}

async fn read_responses(
    mut stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    waiting: Waiting,
    updates: Arc<AtomicU64>,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        if stdout.read_until(b'\n', &mut line).await.unwrap_or(0) == 0 {
            return;
        }
        if is_update(&line) {
            updates.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let Ok(message) = serde_json::from_slice::<Value>(&line) else {
            continue;
        };
        let waiter = message["id"]
            .as_u64()
            .and_then(|id| waiting.lock().unwrap().remove(&id));
        if let Some(waiter) = waiter {
            let _ = waiter.send(message);
        }
    }
}

/// A bare axum route answering `path` (any method) with `body` as JSON, on its own multi-threaded tokio
/// runtime (on its own thread, alive until the process exits).
pub fn bare_server(path: &'static str, body: Bytes) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().route(
                path,
                axum::routing::any(move || {
                    let body = body.clone();
                    async move {
                        (
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            body,
                        )
                    }
                }),
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// The floor of any HTTP front for a stdio agent, measured beside the gateway: an axum route,
/// in this process on a runtime of its own, that writes a prompt line to its own echo agent's
/// stdin and answers with the `result` of the matching response line, skipping update lines
/// unread. No log, no validation, no state beyond the next request id: what is left is HTTP,
/// two pipes and the wake-ups between the processes. Stopped, its agent with it, when dropped.
pub struct BareProxy {
    pub addr: SocketAddr,
    pub agent_pid: u32,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BareProxy {
    pub fn start(state: &Path) -> BareProxy {
        let state = state.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut agent = AgentPipes::spawn(echo_agent_command(&state));
                let mut created = Value::Null;
                for (method, params) in handshake() {
                    created = agent.call(method, params).await;
                }
                let session = created["result"]["sessionId"].clone();
                let agent_pid = agent.pid();
                let agent = Arc::new(tokio::sync::Mutex::new(agent));
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                ready_tx.send((addr, agent_pid)).unwrap();
                let served = agent.clone();
                let app = axum::Router::new().route(
                    "/prompt",
                    axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                        let (agent, session) = (served.clone(), session.clone());
                        async move {
                            let params = json!({
                                "sessionId": session,
                                "prompt": [{"type": "text", "text": body["text"]}],
                            });
                            let answer = agent.lock().await.call("session/prompt", params).await;
                            axum::Json(answer["result"].clone())
                        }
                    }),
                );
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
                agent.lock().await.kill().await;
            });
        });
        let (addr, agent_pid) = ready_rx.recv().unwrap();
        BareProxy {
            addr,
            agent_pid,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for BareProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
