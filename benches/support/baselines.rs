//! The baselines the gateway is measured against, in the same run: a direct ACP client on an
//! echo agent's stdio ([`DirectAgent`]), a bare axum route serving fixed bytes
//! ([`bare_server`]) and a bare proxy relaying prompts to an agent ([`BareProxy`]).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use super::shared::agent::{AgentPipes, echo_agent_command, handshake, is_update, request_line};

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
