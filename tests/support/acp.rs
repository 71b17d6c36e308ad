//! An ACP client for the gateway's `/acp` endpoint, as an editor would be: the official SDK's
//! client over the official HTTP/SSE or WebSocket transport (or any other transport, such as
//! `acp-gateway connect`'s stdio). It keeps what the gateway sends: notifications in order, and
//! requests (permissions, elicitations) with their responders, for the test to answer or not.

use std::time::Duration;

use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, Client, ConnectTo, Error, UntypedMessage, on_receive_notification, on_receive_request,
};
use agent_client_protocol_http::HttpClient;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::PATIENCE;

/// A request the gateway sent the client.
pub struct Asked {
    pub method: String,
    pub params: Value,
    pub responder: Responder<Value>,
}

/// A connected client.
pub struct AcpClient {
    pub cx: ConnectionTo<Agent>,
    pub notes: mpsc::UnboundedReceiver<(String, Value)>,
    pub asked: mpsc::UnboundedReceiver<Asked>,
    close: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// The HTTP (or, with `ws`, WebSocket) transport to `base`'s `/acp`, with `key` as bearer.
pub fn transport(base: &str, key: Option<&str>, ws: bool) -> HttpClient {
    let base = if ws {
        base.replacen("http://", "ws://", 1)
    } else {
        base.to_owned()
    };
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = key {
        headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    HttpClient::builder(base)
        .configure_http(|h| h.default_headers(headers).no_proxy())
        .build()
        .unwrap()
}

impl AcpClient {
    /// Connects over `transport` (not yet initialized).
    pub async fn connect(transport: impl ConnectTo<Client> + 'static) -> AcpClient {
        let (notes_tx, notes) = mpsc::unbounded_channel();
        let (asked_tx, asked) = mpsc::unbounded_channel();
        let (cx_tx, cx_rx) = oneshot::channel();
        let (close, closed) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let result = Client
                .v1()
                .name("acp-test-client")
                .on_receive_request(
                    move |msg: UntypedMessage, responder: Responder<Value>, _cx| {
                        let asked = asked_tx.clone();
                        async move {
                            let _ = asked.send(Asked {
                                method: msg.method,
                                params: msg.params,
                                responder,
                            });
                            Ok(())
                        }
                    },
                    on_receive_request!(),
                )
                .on_receive_notification(
                    move |msg: UntypedMessage, _cx| {
                        let notes = notes_tx.clone();
                        async move {
                            let _ = notes.send((msg.method, msg.params));
                            Ok(())
                        }
                    },
                    on_receive_notification!(),
                )
                .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                    let _ = cx_tx.send(cx);
                    let _ = closed.await;
                    Ok(())
                })
                .await;
            if let Err(e) = result {
                eprintln!("acp test client ended: {e:?}");
            }
        });
        let cx = tokio::time::timeout(PATIENCE, cx_rx)
            .await
            .expect("connected within PATIENCE")
            .expect("the client task gave its connection");
        AcpClient {
            cx,
            notes,
            asked,
            close: Some(close),
            task,
        }
    }

    /// Connects to `base`'s `/acp` and initializes (with the elicitation capability).
    pub async fn start(base: &str, key: Option<&str>, ws: bool) -> AcpClient {
        key.into_iter().for_each(super::secrets::secret);
        let client = AcpClient::connect(transport(base, key, ws)).await;
        let init = client.initialize().await.expect("initialize");
        assert_eq!(init["agentInfo"]["name"], "acp-gateway", "{init}");
        client
    }

    pub async fn initialize(&self) -> Result<Value, Error> {
        self.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"elicitation": {"form": {}}},
                   "clientInfo": {"name": "acp-test-client", "version": "1"}}),
        )
        .await
    }

    /// A request and its answer (bounded by PATIENCE).
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, Error> {
        let sent = self
            .cx
            .send_request(UntypedMessage::new(method, params).unwrap());
        tokio::time::timeout(PATIENCE, sent.block_task())
            .await
            .unwrap_or_else(|_| panic!("{method} answered within PATIENCE"))
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.cx
            .send_notification(UntypedMessage::new(method, params).unwrap())
            .unwrap();
    }

    /// `session/new` in `cwd`: the session id.
    pub async fn new_session(&self, cwd: &str) -> String {
        let answer = self
            .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await
            .expect("session/new");
        answer["sessionId"].as_str().unwrap().to_owned()
    }

    /// `session/prompt` with one text block: the answer.
    pub async fn prompt(&self, session: &str, text: &str) -> Result<Value, Error> {
        self.call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// `session/prompt` with one text block, sent now and answered in a task of its own (for
    /// a turn that asks the client something first).
    pub fn prompt_in_background(
        &self,
        session: &str,
        text: &str,
    ) -> tokio::task::JoinHandle<Result<Value, Error>> {
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        let sent = self
            .cx
            .send_request(UntypedMessage::new("session/prompt", params).unwrap());
        tokio::spawn(async move { sent.block_task().await })
    }

    /// The next notification (bounded by PATIENCE).
    pub async fn next_note(&mut self) -> (String, Value) {
        tokio::time::timeout(PATIENCE, self.notes.recv())
            .await
            .expect("a notification within PATIENCE")
            .expect("the connection is open")
    }

    /// Every notification received so far.
    pub fn drain_notes(&mut self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        while let Ok(n) = self.notes.try_recv() {
            out.push(n);
        }
        out
    }

    /// Notifications up to and including the first whose update is `kind`.
    pub async fn notes_until(&mut self, kind: &str) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        loop {
            let note = self.next_note().await;
            let done = note.1["update"]["sessionUpdate"] == kind;
            out.push(note);
            if done {
                return out;
            }
        }
    }

    /// The next request from the gateway (bounded by PATIENCE).
    pub async fn next_asked(&mut self) -> Asked {
        tokio::time::timeout(PATIENCE, self.asked.recv())
            .await
            .expect("a request within PATIENCE")
            .expect("the connection is open")
    }

    /// No request arrives within `wait`.
    pub async fn nothing_asked(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.asked.recv()).await.is_err()
    }

    /// Ends the connection as a client that goes away.
    pub async fn close(mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, &mut self.task).await;
    }
}

/// The agent's text in `session/update` notifications of kind `agent_message_chunk`.
pub fn agent_text(notes: &[(String, Value)]) -> String {
    notes
        .iter()
        .filter(|(_, p)| p["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|(_, p)| p["update"]["content"]["text"].as_str())
        .collect()
}

/// `acp-gateway connect URL` (with `key` as `--api-key`) started as an editor starts an agent
/// command, its log in `log`, and the editor: a client on the bridge's stdio, initialized
/// (with `initialize`'s answer).
pub async fn bridge(
    url: &str,
    key: Option<&str>,
    log: &std::path::Path,
) -> (tokio::process::Child, AcpClient, Value) {
    use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"));
    command.args(["connect", url]);
    if let Some(key) = key {
        super::secrets::secret(key);
        command.args(["--api-key", key]);
    }
    let mut bridge = command
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdio = agent_client_protocol::ByteStreams::new(
        bridge.stdin.take().unwrap().compat_write(),
        bridge.stdout.take().unwrap().compat(),
    );
    let editor = AcpClient::connect(stdio).await;
    let init = editor.initialize().await.unwrap();
    (bridge, editor, init)
}

impl AcpClient {
    /// A prompt through a bridge that is connecting again: sent every 200 ms until answered,
    /// within PATIENCE; `log` is the bridge's. Meanwhile it may be refused only as a reconnect
    /// refuses it: the bridge's answer to a request its lost connection held, or the
    /// gateway's while the replica that held the session is gone ([`replica_away`]); any other
    /// error fails at once.
    pub async fn prompt_through_reconnect(
        &self,
        session: &str,
        text: &str,
        log: &std::path::Path,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match self.prompt(session, text).await {
                Ok(answer) => return answer,
                Err(e) => {
                    let bridge_log = || std::fs::read_to_string(log).unwrap_or_default();
                    assert!(
                        e.message
                            .starts_with("the connection to the gateway was lost")
                            || replica_away(&e),
                        "{text:?} refused, not as a reconnect refuses it: {e:?}\n{}",
                        bridge_log()
                    );
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "no answer to {text:?}: {e:?}\n{}",
                        bridge_log()
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Whether `e` is the gateway's answer while the replica that held the session is gone and its
/// lease runs: the session is live on another replica, or that replica cannot be reached.
pub fn replica_away(e: &Error) -> bool {
    e.message.contains("is live on another gateway replica")
        || e.message.contains("cannot be reached")
}
