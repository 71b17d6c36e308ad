//! A new session is created on the live replica holding the fewest sessions (this one on a
//! tie). Requests for a session that another live replica holds are forwarded to it: its prompt,
//! status, permissions and the rest need the agent process that has the session loaded. The
//! event stream and the history are served here from the shared log. A forwarded request
//! carries [`FORWARDED`] and is never forwarded again; if the owner cannot be reached the
//! answer is 503 with `Retry-After` (the session becomes available here once the owner's lease
//! expires).

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderName, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;

use super::error::ApiError;
use crate::gateway::{self, Gateway};

/// Marks a request one replica forwarded to another.
pub const FORWARDED: HeaderName = HeaderName::from_static("acp-gateway-forwarded");

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
}

impl Forwarder {
    pub fn new(gateway: Gateway) -> Self {
        Forwarder {
            gateway,
            client: reqwest::Client::new(),
        }
    }
}

/// Middleware: forwards to the owning replica, else serves here.
pub async fn forward(State(forwarder): State<Forwarder>, req: Request, next: Next) -> Response {
    let gateway = &forwarder.gateway;
    if req.headers().contains_key(&FORWARDED) {
        return next.run(req).await;
    }
    if req.method() == Method::POST && req.uri().path() == "/sessions" {
        return match gateway.place_elsewhere() {
            Some(replica) => proxy(&forwarder, &replica, req)
                .await
                .unwrap_or_else(IntoResponse::into_response),
            None => next.run(req).await,
        };
    }
    let Some(id) = session_of(req.uri().path()) else {
        return next.run(req).await;
    };
    match gateway.owner_elsewhere(id).await {
        Ok(Some(owner)) => proxy(&forwarder, &owner, req)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Ok(None) => next.run(req).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// Sends `req` to `owner` and streams its answer back.
async fn proxy(forwarder: &Forwarder, owner: &str, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    // Read as an extractor would, so that the configured body limit applies.
    let body = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::PayloadTooLarge(rejection.body_text()));
        }
        Err(rejection) => return Err(ApiError::BadRequest(rejection.body_text())),
    };
    let target = format!(
        "{owner}{}",
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut headers = parts.headers;
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
    // The browser's origin was checked here, against this replica's `Host` (see `guard`); the
    // owner, reached at another name, would take it for a foreign page's.
    headers.remove(header::ORIGIN);
    headers.insert(FORWARDED, axum::http::HeaderValue::from_static("1"));
    let unreachable = |e: reqwest::Error| {
        tracing::warn!(owner, error = %e, "the replica holding the session cannot be reached");
        ApiError::Service(gateway::Error::HeldElsewhere(
            "the gateway replica holding this session cannot be reached; retry shortly".into(),
        ))
    };
    let answer = forwarder
        .client
        .request(parts.method, &target)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(unreachable)?;
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
    use super::session_of;

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
