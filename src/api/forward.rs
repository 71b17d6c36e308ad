//! Replicas may run different agents. A new session is created on the live replica holding the
//! fewest sessions among those that run its agent (this one on a tie); a create for an agent
//! this replica does not run goes to the least loaded live replica that does (and fails here,
//! 422, when none does). Requests for a session that another live replica holds are forwarded
//! to it: its prompt, status, permissions and the rest need the agent process that has the
//! session loaded. A session no replica holds is served here, unless this replica does not run
//! its agent: then by the least loaded live replica that does (here, 503, when none does). The
//! event stream and the history are served here from the shared log. A forwarded request
//! carries [`FORWARDED`], proven with the replicas' secret (see [`super::proof`]), and is never
//! forwarded again; if the replica it goes to cannot be
//! reached the answer is 503 with `Retry-After` (a session held there becomes available here
//! once the owner's lease expires).

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use serde::Deserialize;
use tracing::Instrument as _;

use super::error::ApiError;
pub use super::proof::FORWARDED;
use super::proof::{Proof, forwarded};
use crate::gateway::{self, Gateway};

/// Hop-by-hop headers, which describe one connection and are not passed on.
const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::UPGRADE,
];

/// The session a request is about, if the request needs the replica that holds it.
fn session_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/sessions/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let served_from_the_log = matches!(tail, "events" | "history");
    (!id.is_empty() && !served_from_the_log).then_some(id)
}

/// What forwarding needs: the service (who holds a session) and the HTTP client that reaches
/// the other replicas.
#[derive(Clone)]
pub struct Forwarder {
    gateway: Gateway,
    client: reqwest::Client,
    proof: Proof,
}

impl Forwarder {
    pub fn new(gateway: Gateway) -> Self {
        Forwarder {
            proof: Proof::new(&gateway),
            gateway,
            client: reqwest::Client::new(),
        }
    }
}

/// The agent a `POST /sessions` body names (`None`: none, or a body the handler will refuse).
fn agent_named(body: &[u8]) -> Option<String> {
    /// The one field of the body that says where it may be served.
    #[derive(Deserialize)]
    struct Named {
        agent: Option<String>,
    }
    // Escaped as the `Json` extractor does, so that a lone surrogate elsewhere in the body
    // does not hide the name.
    let text = crate::surrogates::escape(std::str::from_utf8(body).ok()?);
    serde_json::from_str::<Named>(&text).ok()?.agent
}

/// Middleware: forwards to the replica that must serve the request, else serves here.
pub async fn forward(State(forwarder): State<Forwarder>, req: Request, next: Next) -> Response {
    let gateway = &forwarder.gateway;
    if forwarded(&req) {
        return next.run(req).await;
    }
    if req.method() == Method::POST && req.uri().path() == "/sessions" {
        let (parts, body) = match read_body(req).await {
            Ok(read) => read,
            Err(e) => return e.into_response(),
        };
        return match gateway.replica_for_new(agent_named(&body).as_deref()) {
            Some(replica) => send(&forwarder, &replica, parts, body)
                .await
                .unwrap_or_else(IntoResponse::into_response),
            None => next.run(Request::from_parts(parts, Body::from(body))).await,
        };
    }
    let Some(id) = session_of(req.uri().path()) else {
        return next.run(req).await;
    };
    match gateway.replica_for_session(id).await {
        Ok(Some(replica)) => proxy(&forwarder, &replica, req)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Ok(None) => next.run(req).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// Reads the body of `req` as an extractor would, so that the configured body limit applies.
pub(super) async fn read_body(req: Request) -> Result<(Parts, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(body) => Ok((parts, body)),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Err(ApiError::PayloadTooLarge(rejection.body_text()))
        }
        Err(rejection) => Err(ApiError::BadRequest(rejection.body_text())),
    }
}

/// Sends `req` to `owner` and streams its answer back.
pub(super) async fn proxy(
    forwarder: &Forwarder,
    owner: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = read_body(req).await?;
    send(forwarder, owner, parts, body).await
}

/// Sends the request of `parts` and `body`, marked [`FORWARDED`], to `owner` and streams its
/// answer back.
async fn send(
    forwarder: &Forwarder,
    owner: &str,
    parts: Parts,
    body: Bytes,
) -> Result<Response, ApiError> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mark = forwarder.proof.mark(&parts.method, path);
    let target = format!("{owner}{path}");
    let mut headers = parts.headers;
    headers.insert(FORWARDED, mark);
    let hop = Hop {
        client: &forwarder.client,
        to: owner,
        unreachable: "the gateway replica serving this request cannot be reached; retry shortly",
    };
    relay(hop, parts.method, &target, headers, body).await
}

/// Where [`relay`] sends a request.
pub(super) struct Hop<'a> {
    pub client: &'a reqwest::Client,
    /// The server it goes to (for the log and the trace; credentials are redacted).
    pub to: &'a str,
    /// What the client is told (503) when that server cannot be reached.
    pub unreachable: &'static str,
}

/// Sends a request to `target` through `hop` (its hop-by-hop headers and its `Origin` left
/// out, the trace context passed on) and streams the answer back.
pub(super) async fn relay(
    hop: Hop<'_>,
    method: Method,
    target: &str,
    mut headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
    // The browser's origin was checked here, against this gateway's `Host` (see `guard`); the
    // server, reached at another name, would take it for a foreign page's.
    headers.remove(header::ORIGIN);
    // The trace goes on there, as a child of this hop's span.
    // An advertised URL may carry credentials; the log and the trace do not.
    let shown = crate::redact::url(hop.to);
    let span = tracing::info_span!(
        "forward",
        "otel.name" = "forward",
        "otel.kind" = "client",
        owner = %shown,
        "http.response.status_code" = tracing::field::Empty,
    );
    for (name, value) in crate::telemetry::traces::context_of(&span).unwrap_or_default() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name),
            axum::http::HeaderValue::try_from(value),
        ) {
            headers.insert(name, value);
        }
    }
    let unreachable = |e: reqwest::Error| {
        let error = crate::redact::text(&e.to_string()).into_owned();
        tracing::warn!(owner = %shown, error, "{}", hop.unreachable);
        ApiError::Service(gateway::Error::HeldElsewhere(hop.unreachable.into()))
    };
    let answer = (hop.client)
        .request(method, target)
        .headers(headers)
        .body(body)
        .send()
        .instrument(span.clone())
        .await
        .map_err(unreachable)?;
    span.record("http.response.status_code", answer.status().as_u16());
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(name) {
            response = response.header(name, value);
        }
    }
    let stream = answer.bytes_stream().map_err(std::io::Error::other);
    Ok(response
        .body(Body::from_stream(stream))
        .expect("headers from a valid response"))
}

#[cfg(test)]
mod tests {
    use super::{agent_named, session_of};

    #[test]
    fn the_agent_a_create_names() {
        assert_eq!(
            agent_named(br#"{"cwd": "/", "agent": "b"}"#).as_deref(),
            Some("b")
        );
        assert_eq!(agent_named(br#"{"cwd": "/", "agent": null}"#), None);
        assert_eq!(agent_named(br#"{"cwd": "/"}"#), None);
        assert_eq!(agent_named(br#"{"agent": 7}"#), None);
        assert_eq!(agent_named(b"not json"), None);
        let lone = br#"{"cwd": "/\ud800", "agent": "b"}"#;
        assert_eq!(agent_named(lone).as_deref(), Some("b"));
    }

    #[test]
    fn session_routes_that_need_the_owner() {
        assert_eq!(session_of("/sessions/s1"), Some("s1"));
        assert_eq!(session_of("/sessions/s1/prompt"), Some("s1"));
        assert_eq!(session_of("/sessions/s1/permissions/p1"), Some("s1"));
        assert_eq!(session_of("/sessions/s1/events"), None);
        assert_eq!(session_of("/sessions/s1/history"), None);
        assert_eq!(session_of("/sessions"), None);
        assert_eq!(session_of("/sessions/"), None);
        assert_eq!(session_of("/agent"), None);
    }
}
