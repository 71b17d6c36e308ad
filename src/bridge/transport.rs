//! The bridge's connection to its host, by the URL's scheme. `http(s)://` goes through the
//! official client (`agent_client_protocol_http::HttpClient`, HTTP/SSE), which queues what the
//! host sends without bound. `ws(s)://` is the bridge's own WebSocket client, which speaks the
//! official client's protocol (a GET upgraded over HTTP/1.1 through reqwest, so the same
//! headers, bearer, TLS and proxies; no subprotocol, no extension; one JSON-RPC message per text
//! frame, binary frames ignored, pings answered by the socket) but reads the host's next
//! message only once the bridge has taken the last one, and refuses a message or frame larger
//! than the agent's `--max-line-bytes`.

use std::future::Future;
use std::pin::Pin;

use agent_client_protocol::{Client, ConnectTo, TransportFrame};
use agent_client_protocol_http::HttpClient;
use anyhow::Context;
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, error::CapacityError};

/// Messages to the host that may wait for a WebSocket's writer before the bridge stops
/// reading the editor.
const OUTGOING: usize = 16;

/// Where and how to connect.
pub struct Target {
    /// The URL as given.
    pub url: String,
    /// The URL is the endpoint itself (else `/acp` is appended unless its path ends so).
    pub exact: bool,
    /// Sent with the request that opens the connection (the bearer).
    pub headers: reqwest::header::HeaderMap,
    /// The largest message the host may send over a WebSocket (and its largest frame).
    pub max_message_bytes: usize,
}

impl Target {
    /// The endpoint's URL, `/acp` appended as the official client appends it.
    fn endpoint(&self) -> anyhow::Result<reqwest::Url> {
        let mut endpoint = reqwest::Url::parse(&self.url).context("the gateway URL")?;
        anyhow::ensure!(
            matches!(endpoint.scheme(), "http" | "https" | "ws" | "wss"),
            "the gateway URL must be http://, https://, ws:// or wss://"
        );
        if !self.exact {
            let path = endpoint.path().trim_end_matches('/');
            let path = match path {
                "" => "/acp".to_owned(),
                p if p.ends_with("/acp") => p.to_owned(),
                p => format!("{p}/acp"),
            };
            endpoint.set_path(&path);
        }
        Ok(endpoint)
    }

    fn is_websocket(&self) -> bool {
        self.url.starts_with("ws://") || self.url.starts_with("wss://")
    }

    /// Fails now, not at the first message, on a URL no connection can be opened to.
    pub fn check(&self) -> anyhow::Result<()> {
        match self.is_websocket() {
            true => self.websocket_client().map(drop),
            false => self.http_client().map(drop),
        }
    }

    fn http_client(&self) -> anyhow::Result<HttpClient> {
        let builder = match self.exact {
            true => HttpClient::builder_with_endpoint(&self.url),
            false => HttpClient::builder(&self.url),
        };
        let headers = self.headers.clone();
        builder
            .configure_http(|http| http.default_headers(headers))
            .build()
            .context("the gateway URL")
    }

    /// The upgrade request's URL (`http(s)://`) and the client that sends it: HTTP/1.1, no
    /// redirects, as the official client's.
    fn websocket_client(&self) -> anyhow::Result<(reqwest::Url, reqwest::Client)> {
        let mut endpoint = self.endpoint()?;
        let scheme = if endpoint.scheme() == "wss" {
            "https"
        } else {
            "http"
        };
        endpoint
            .set_scheme(scheme)
            .map_err(|()| anyhow::anyhow!("the gateway URL cannot be http(s)"))?;
        let client = reqwest::Client::builder()
            .default_headers(self.headers.clone())
            .http1_only()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("the HTTP client")?;
        Ok((endpoint, client))
    }
}

/// Runs a connection; ends with why it ended (`Ok`: it was closed).
type Driver = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// One connection to the host: what it sends, in order (the stream ends with the connection),
/// how to send to it, and the future that runs it.
pub struct HostConnection {
    pub incoming: BoxStream<'static, TransportFrame>,
    pub outgoing: Outgoing,
    pub driver: Driver,
}

/// The way to the host.
pub enum Outgoing {
    /// The official client's queue, unbounded.
    Client(futures::channel::mpsc::UnboundedSender<TransportFrame>),
    /// The WebSocket's writer's queue, [`OUTGOING`] deep.
    Socket(mpsc::Sender<String>),
}

impl HostConnection {
    /// A new connection to `target` (opened by its driver).
    pub fn open(target: &Target) -> anyhow::Result<HostConnection> {
        if !target.is_websocket() {
            let (channel, driver) =
                ConnectTo::<Client>::into_channel_and_future(target.http_client()?);
            let (incoming, outgoing) = channel.into_parts();
            let driver: Driver = Box::pin(async move {
                match driver {
                    Some(driver) => driver.await.map_err(|e| e.to_string()),
                    None => std::future::pending().await,
                }
            });
            return Ok(HostConnection {
                incoming: incoming.boxed(),
                outgoing: Outgoing::Client(outgoing),
                driver,
            });
        }
        let (url, client) = target.websocket_client()?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(target.max_message_bytes))
            .max_frame_size(Some(target.max_message_bytes));
        // One message read ahead at most: the reader waits for the bridge to take it.
        let (to_bridge, incoming) = mpsc::channel(1);
        let (outgoing, from_bridge) = mpsc::channel(OUTGOING);
        let max = target.max_message_bytes;
        let task = tokio::spawn(websocket(url, client, config, max, to_bridge, from_bridge));
        let task = tokio_util::task::AbortOnDropHandle::new(task);
        let driver: Driver = Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(format!("the WebSocket task failed: {e}")))
        });
        Ok(HostConnection {
            incoming: tokio_stream::wrappers::ReceiverStream::new(incoming).boxed(),
            outgoing: Outgoing::Socket(outgoing),
            driver,
        })
    }
}

impl Outgoing {
    /// Resolves once [`Outgoing::send`] has room for a message (at once but on a WebSocket
    /// whose writer is behind), or the connection is gone.
    pub async fn room(&self) {
        if let Outgoing::Socket(tx) = self {
            drop(tx.reserve().await);
        }
    }

    /// Queues `line` for the host: `false` when the connection is gone. On a WebSocket whose
    /// writer is [`OUTGOING`] messages behind (see [`Outgoing::room`]), it is dropped.
    pub fn send(&self, line: &str) -> bool {
        match self {
            Outgoing::Client(tx) => tx.unbounded_send(TransportFrame::parse_json(line)).is_ok(),
            Outgoing::Socket(tx) => match tx.try_send(line.to_owned()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!("the connection's writer is behind: a message was dropped");
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
        }
    }
}

/// A WebSocket connection to `url`: the upgrade, then its writer (the bridge's messages, and a
/// close once the bridge stops sending) and its reader (each text message to the bridge once
/// the bridge has room), until either ends.
async fn websocket(
    url: reqwest::Url,
    client: reqwest::Client,
    config: WebSocketConfig,
    max: usize,
    to_bridge: mpsc::Sender<TransportFrame>,
    mut from_bridge: mpsc::Receiver<String>,
) -> Result<(), String> {
    let failed = |e: &dyn std::fmt::Display| format!("WebSocket connect failed: {e}");
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let response = client
        .get(url)
        .version(reqwest::Version::HTTP_11)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", &key)
        .send()
        .await
        .map_err(|e| failed(&e))?;
    upgraded(&response, &key).map_err(|e| failed(&e))?;
    let socket = response.upgrade().await.map_err(|e| failed(&e))?;
    let socket =
        tokio_tungstenite::WebSocketStream::from_raw_socket(socket, Role::Client, Some(config))
            .await;
    let (mut sink, mut stream) = socket.split();
    let writer = async move {
        while let Some(line) = from_bridge.recv().await {
            let sent = sink.send(Message::text(line)).await;
            sent.map_err(|e| format!("ws send: {e}"))?;
        }
        let closed = sink.send(Message::Close(None)).await;
        closed.map_err(|e| format!("ws close: {e}"))
    };
    let reader = async move {
        loop {
            match stream.next().await {
                Some(Ok(Message::Text(text))) => {
                    if to_bridge
                        .send(TransportFrame::parse_json(text.as_str()))
                        .await
                        .is_err()
                    {
                        return Ok(()); // the bridge has let this connection go
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    tracing::warn!("ignoring a binary WebSocket frame (ACP uses text)");
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(frame))) => {
                    return Err(format!("WebSocket closed by peer: {frame:?}"));
                }
                Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, .. }))) => {
                    return Err(format!(
                        "the host sent a message of {size} bytes, over --max-line-bytes ({max})"
                    ));
                }
                Some(Err(e)) => return Err(format!("ws recv: {e}")),
                None => return Err("WebSocket stream ended".to_owned()),
            }
        }
    };
    tokio::select! {
        ended = writer => ended,
        ended = reader => ended,
    }
}

/// Whether `response` accepts the upgrade asked with `key`, as the official client checks it.
fn upgraded(response: &reqwest::Response, key: &str) -> Result<(), String> {
    if response.version() != reqwest::Version::HTTP_11 {
        return Err(format!(
            "expected HTTP/1.1, received {:?}",
            response.version()
        ));
    }
    if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        return Err(format!("unexpected status {}", response.status()));
    }
    let headers = response.headers();
    let one = |name: &str| {
        let mut values = headers.get_all(name).iter();
        values.next().filter(|_| values.next().is_none())
    };
    if !one("upgrade").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket")) {
        return Err("invalid upgrade header".to_owned());
    }
    let connection_upgrade = headers.get_all("connection").iter().any(|value| {
        value.to_str().is_ok_and(|value| {
            value.split(',').any(|part| {
                part.trim_matches([' ', '\t'])
                    .eq_ignore_ascii_case("upgrade")
            })
        })
    });
    if !connection_upgrade {
        return Err("invalid connection header".to_owned());
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if one("sec-websocket-accept").map(|v| v.as_bytes()) != Some(accept.as_bytes()) {
        return Err("invalid Sec-WebSocket-Accept".to_owned());
    }
    // ACP negotiates no subprotocol and no extension.
    for header in ["sec-websocket-protocol", "sec-websocket-extensions"] {
        if headers.contains_key(header) {
            return Err(format!("unsupported {header}"));
        }
    }
    Ok(())
}
