//! `acp-gateway connect URL`: a stdio ↔ `/acp` bridge, so that an editor that launches agents as
//! commands uses a remote gateway as its agent. JSON-RPC lines from stdin go to the gateway over
//! the official HTTP/SSE or WebSocket transport (by the URL's scheme) and the gateway's messages
//! come back as lines on stdout. When the connection drops, the bridge connects again on its
//! own: it sends the editor's `initialize` again and resumes every session the editor had open
//! (`session/resume`), so the editor keeps its sessions; requests that were in flight are
//! answered with an error (a turn goes on in the gateway, whose updates follow once resumed).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use agent_client_protocol::TransportFrame;
use anyhow::Context;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use transport::{HostConnection, Target};

mod transport;

/// The ids of the bridge's own requests (answers to them are not the editor's).
const OWN_ID: &str = "acp-gateway-connect/";

/// Waits between attempts to connect again: doubled from the first up to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// What the bridge knows of the editor's side of the conversation.
#[derive(Default)]
struct Editor {
    /// The editor's `initialize` params, sent again on each new connection.
    initialize: Option<Value>,
    /// The editor's requests not yet answered: id → (method, params).
    pending: HashMap<String, (String, Value)>,
    /// The sessions the editor has open.
    sessions: HashSet<String>,
}

impl Editor {
    /// A message from the editor, on its way to the gateway.
    fn sent(&mut self, msg: &Value) {
        let (Some(method), Some(id)) = (msg["method"].as_str(), msg.get("id")) else {
            return;
        };
        if method == "initialize" {
            self.initialize = Some(msg["params"].clone());
        }
        self.pending
            .insert(id.to_string(), (method.to_owned(), msg["params"].clone()));
    }

    /// A message from the gateway: `false` when it answers the bridge and not the editor.
    fn received(&mut self, msg: &Value) -> bool {
        let Some(id) = msg.get("id").filter(|_| msg.get("method").is_none()) else {
            return true; // a request or a notification for the editor
        };
        if id.as_str().is_some_and(|id| id.starts_with(OWN_ID)) {
            return false;
        }
        let Some((method, params)) = self.pending.remove(&id.to_string()) else {
            return true;
        };
        if msg.get("result").is_some() {
            let session = params["sessionId"]
                .as_str()
                .or(msg["result"]["sessionId"].as_str());
            match (method.as_str(), session) {
                ("session/new" | "session/load" | "session/resume", Some(s)) => {
                    self.sessions.insert(s.to_owned());
                }
                ("session/close" | "session/delete", Some(s)) => {
                    self.sessions.remove(s);
                }
                _ => {}
            }
        }
        true
    }

    /// The connection dropped: an error for each request in flight but the editor's
    /// `initialize`, which the next connection answers.
    fn lost(&mut self) -> Vec<Value> {
        let lost: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, (method, _))| method != "initialize")
            .map(|(id, _)| id.clone())
            .collect();
        lost.into_iter()
            .filter_map(|id| self.pending.remove(&id).map(|_| id))
            .filter_map(|id| serde_json::from_str::<Value>(&id).ok())
            .map(|id| {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603,
                    "message": "the connection to the gateway was lost; it is being restored (a prompt's turn goes on in the gateway)"}})
            })
            .collect()
    }

    /// What a new connection starts with: the editor's `initialize` if it is still waiting
    /// for its answer, else the bridge's own and a resume of each open session.
    fn restore(&self, attempt: u64) -> Vec<Value> {
        let waiting = self
            .pending
            .iter()
            .find(|(_, (method, _))| method == "initialize");
        if let Some((id, (_, params))) = waiting {
            let id: Value = serde_json::from_str(id).unwrap_or(Value::Null);
            return vec![
                json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params}),
            ];
        }
        let Some(params) = &self.initialize else {
            return Vec::new();
        };
        let id = |what: &str| format!("{OWN_ID}{attempt}/{what}");
        let mut out = vec![
            json!({"jsonrpc": "2.0", "id": id("initialize"), "method": "initialize", "params": params}),
        ];
        out.extend(self.sessions.iter().map(|s| {
            json!({"jsonrpc": "2.0", "id": id(s), "method": "session/resume", "params": {"sessionId": s, "cwd": "/", "mcpServers": []}})
        }));
        out
    }
}

/// How the bridge holds its connection.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Exit (with an error) when the connection drops instead of connecting again: for a pool
    /// member of another gateway, whose supervisor restarts it and resumes its sessions.
    pub once: bool,
    /// When nothing has come from the other side for this long, it is asked something (an
    /// unknown method, which any JSON-RPC peer answers with an error); when nothing has come
    /// for this long again, the connection counts as dropped: a silent host cannot hang a
    /// request forever.
    pub heartbeat: Option<Duration>,
    /// The URL is the endpoint as it is (else `/acp` is appended unless its path ends so): for
    /// a server whose endpoint is elsewhere.
    pub exact: bool,
    /// The largest message (and frame) a WebSocket host may send: a larger one ends the
    /// connection (the gateway's `--max-line-bytes`, which a line of the bridge's stdout
    /// must not pass either). Over HTTP/SSE, the official client sets no limit.
    pub max_message_bytes: usize,
}

/// The method the heartbeat asks: none, so that any peer answers at once, with an error.
const PING: &str = "_acp_gateway/ping";

/// Bridges stdin/stdout to the gateway at `url` until stdin ends (or, with [`Link::once`], the
/// connection drops).
pub async fn connect(url: &str, api_key: Option<&str>, link: Link) -> anyhow::Result<()> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = api_key {
        let value = format!("Bearer {key}")
            .parse()
            .context("the API key is not a valid header value")?;
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let target = Target {
        url: url.to_owned(),
        exact: link.exact,
        headers,
        max_message_bytes: link.max_message_bytes,
    };
    target.check()?; // a bad URL fails now, not at the first message
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let mut editor = Editor::default();
    let (mut attempt, mut backoff) = (0u64, BACKOFF.0);
    loop {
        let HostConnection {
            incoming: mut from_gateway,
            outgoing: to_gateway,
            mut driver,
        } = HostConnection::open(&target)?;
        if attempt > 0 {
            for msg in editor.restore(attempt) {
                to_gateway.room().await;
                to_gateway.send(&msg.to_string());
            }
        }
        attempt += 1;
        // The heartbeat: when something last came from the other side, and whether it has
        // been asked since (nothing is asked before it has said anything).
        let (mut heard, mut asked, mut said_anything) = (tokio::time::Instant::now(), false, false);
        let mut pings = 0u64;
        // A frame taken from the queue and not yet handled (`Some(None)`: the queue closed).
        let mut ready: Option<Option<TransportFrame>> = None;
        let beat = link.heartbeat.unwrap_or(Duration::MAX);
        // Why it ended (empty: the channel closed first, and the driver says why).
        let why: String = loop {
            // The official client's driver reads from the other side into an unbounded queue,
            // as much as its socket holds each time it is polled: it is polled only once that
            // queue is empty, so that a host sending faster than the gateway takes the lines
            // on stdout finds its connection full instead of the bridge's memory. (A
            // WebSocket's reader waits for the bridge to take each message on its own.)
            if ready.is_none() {
                ready = from_gateway.next().now_or_never();
            }
            let drained = ready.is_none();
            let quiet_until = heard.checked_add(beat).unwrap_or_else(far_future);
            tokio::select! {
                _ = tokio::time::sleep_until(quiet_until), if said_anything => {
                    if asked {
                        break format!("the other side has said nothing for two heartbeats ({beat:?} each)");
                    }
                    asked = true;
                    heard = tokio::time::Instant::now();
                    pings += 1;
                    let ping = json!({"jsonrpc": "2.0", "id": format!("{OWN_ID}ping/{attempt}/{pings}"), "method": PING, "params": {}});
                    if !to_gateway.send(&ping.to_string()) {
                        break String::new();
                    }
                }
                // Read from the editor only when the connection can take what it says.
                line = async { to_gateway.room().await; stdin.next_line().await } => {
                    let Some(line) = line? else {
                        return Ok(()); // the editor is gone
                    };
                    if let Ok(msg) = serde_json::from_str::<Value>(&line) {
                        editor.sent(&msg);
                    }
                    if !to_gateway.send(&line) {
                        break String::new();
                    }
                }
                frame = async { ready.take().flatten() }, if !drained => {
                    let Some(frame) = frame else { break String::new() };
                    (heard, asked, said_anything) = (tokio::time::Instant::now(), false, true);
                    let Ok(line) = frame.to_json() else { continue };
                    let msg: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    if editor.received(&msg) {
                        backoff = BACKOFF.0;
                        if !write_line(&mut stdout, line.into_bytes()).await? {
                            return Ok(()); // the editor is gone
                        }
                    }
                }
                frame = from_gateway.next(), if drained => {
                    ready = Some(frame);
                }
                ended = &mut driver, if drained => {
                    break ended.err().unwrap_or_else(|| "it was closed".to_owned());
                }
            }
        };
        let why = match why.is_empty() {
            false => why,
            true => match tokio::time::timeout(Duration::from_secs(1), &mut driver).await {
                Ok(Err(e)) => e,
                _ => "it was closed".to_owned(),
            },
        };
        let why = crate::redact::text(&why);
        tracing::warn!(reason = %why, "the connection to the gateway ended");
        if link.once {
            anyhow::bail!(
                "the connection to {} dropped: {why}",
                crate::redact::url(url)
            );
        }
        for error in editor.lost() {
            if !write_line(&mut stdout, error.to_string().into_bytes()).await? {
                return Ok(());
            }
        }
        tracing::info!(?backoff, "connecting to the gateway again");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// An instant no wait reaches.
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86400 * 365)
}

/// Writes one line to the editor: `false` when the editor has closed its end (it is gone, as
/// when stdin ends).
async fn write_line(out: &mut tokio::io::Stdout, mut line: Vec<u8>) -> std::io::Result<bool> {
    line.push(b'\n');
    let written = match out.write_all(&line).await {
        Ok(()) => out.flush().await,
        Err(e) => Err(e),
    };
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}
