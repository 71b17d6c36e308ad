//! A session of an agent reached over the network keeps its files on the agent's host. When
//! that host is another acp-gateway (the member's URL is its `/acp`), the session's workspace
//! routes (files, diff, checkpoints, revert) are sent to the host's REST API, at the same path,
//! with the token the host takes instead of the caller's credentials, and the host's answer is
//! streamed back: the host's session has the same id. The caller must see the session here
//! first (404 otherwise), as for every session route. A host that is not a gateway is left to
//! the service, which answers 501: the files are out of reach.
//!
//! Runs inside [`super::forward`]: a request a replica forwards to the one holding the session
//! is sent on to the host from there.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::forward::{FORWARDED, Hop, read_body, relay};
use crate::gateway::{Caller, Gateway, SessionId};
use crate::pool::AgentHost;

/// What sending to hosts needs: the service (which host) and the HTTP client.
#[derive(Clone)]
pub struct Hosts {
    gateway: Gateway,
    client: reqwest::Client,
}

impl Hosts {
    pub fn new(gateway: Gateway) -> Self {
        Hosts {
            gateway,
            client: reqwest::Client::new(),
        }
    }
}

/// The session of a workspace route (`/sessions/{id}/files…`, `/diff`, `/checkpoints`,
/// `/revert`).
fn workspace_route(path: &str) -> Option<&str> {
    let (id, tail) = path.strip_prefix("/sessions/")?.split_once('/')?;
    let name = tail.split('/').next().unwrap_or_default();
    let workspace = matches!(name, "files" | "diff" | "checkpoints" | "revert");
    (workspace && !id.is_empty()).then_some(id)
}

/// The REST API of the gateway whose `/acp` is `url` (`None`: `url` is not a gateway's).
fn rest_base(url: &str) -> Option<String> {
    let mut url = url::Url::parse(url).ok()?;
    let scheme = match url.scheme() {
        "ws" | "http" => "http",
        "wss" | "https" => "https",
        _ => return None,
    };
    if url.path().trim_end_matches('/') != super::acp_server::PATH || url.query().is_some() {
        return None;
    }
    url.set_scheme(scheme).ok()?;
    url.set_path("");
    Some(url.as_str().trim_end_matches('/').to_owned())
}

/// Middleware: a workspace route of a session whose agent's host is a gateway goes there.
pub async fn to_host(State(hosts): State<Hosts>, req: Request, next: Next) -> Response {
    let Some(id) = workspace_route(req.uri().path()) else {
        return next.run(req).await;
    };
    let (Some(caller), Ok(id)) = (
        req.extensions().get::<Caller>().cloned(),
        SessionId::parse(id),
    ) else {
        return next.run(req).await;
    };
    let host = match hosts.gateway.files().host(&caller, &id).await {
        Ok(Some(host)) => host,
        Ok(None) => return next.run(req).await,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let Some(base) = rest_base(&host.url) else {
        return next.run(req).await;
    };
    send(&hosts, &host, &base, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Sends `req` to the host at `base`, authenticated as the front.
async fn send(
    hosts: &Hosts,
    host: &AgentHost,
    base: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = read_body(req).await?;
    let target = format!(
        "{base}{}",
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut headers = parts.headers;
    // The caller's credentials are this gateway's to check, never the host's to see; so is
    // the mark of a replica that forwarded the request here.
    headers.remove(header::AUTHORIZATION);
    headers.remove(FORWARDED);
    // A token that is no header value could not reach the host over the bridge either.
    let bearer =
        (host.token.as_ref()).and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok());
    if let Some(bearer) = bearer {
        headers.insert(header::AUTHORIZATION, bearer);
    }
    let hop = Hop {
        client: &hosts.client,
        to: base,
        unreachable: "the agent's host, where this session's files are, cannot be reached; retry shortly",
    };
    relay(hop, parts.method, &target, headers, body).await
}

#[cfg(test)]
mod tests {
    use super::{rest_base, workspace_route};

    #[test]
    fn the_routes_that_go_to_the_host() {
        assert_eq!(workspace_route("/sessions/s1/files"), Some("s1"));
        assert_eq!(workspace_route("/sessions/s1/files/a/b.txt"), Some("s1"));
        assert_eq!(workspace_route("/sessions/s1/diff"), Some("s1"));
        assert_eq!(workspace_route("/sessions/s1/checkpoints"), Some("s1"));
        assert_eq!(workspace_route("/sessions/s1/revert"), Some("s1"));
        assert_eq!(workspace_route("/sessions/s1/prompt"), None);
        assert_eq!(workspace_route("/sessions/s1"), None);
        assert_eq!(workspace_route("/sessions//files"), None);
        assert_eq!(workspace_route("/sessions/s1/filesx"), None);
    }

    #[test]
    fn a_gateways_rest_api_is_beside_its_acp() {
        assert_eq!(
            rest_base("ws://127.0.0.1:9000/acp").as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(
            rest_base("wss://host.example/acp/").as_deref(),
            Some("https://host.example")
        );
        assert_eq!(
            rest_base("https://user:pw@host.example:8443/acp").as_deref(),
            Some("https://user:pw@host.example:8443")
        );
        // Not a gateway's `/acp`: acpremote's `/acp/ws`, another path, a query.
        assert_eq!(rest_base("ws://127.0.0.1:9000/acp/ws"), None);
        assert_eq!(rest_base("ws://127.0.0.1:9000/"), None);
        assert_eq!(rest_base("ws://127.0.0.1:9000/acp?x=1"), None);
        assert_eq!(rest_base("not a url"), None);
    }
}
