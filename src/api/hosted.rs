//! A session of an agent reached over the network keeps its files on the agent's host. When
//! that host is another acp-gateway (the member's URL is its `/acp`), the session's workspace
//! routes (files, diff, checkpoints, revert) are sent to the host's REST API, at the same path,
//! with the token the host takes instead of the caller's credentials, and the host's answer is
//! streamed back: the host's session has the same id. The caller must see the session here
//! first, as for every session route, and the path must stay the session's at the host (no
//! `.`/`..` segment: 400). A host that is not a gateway is left to the service, which answers
//! 501: the files are out of reach.
//!
//! Runs inside [`super::forward`]: a request a replica forwards to the one holding the session
//! is sent on to the host from there.

use std::collections::HashMap;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::forward::{Hop, read_body, relay};
use crate::gateway::{Caller, Error, Gateway, SessionId};
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

/// The routes sent to the host (as matched: `{*path}` is the files route's catch-all).
const WORKSPACE_ROUTES: [&str; 5] = [
    "/sessions/{id}/files",
    "/sessions/{id}/files/{*path}",
    "/sessions/{id}/diff",
    "/sessions/{id}/checkpoints",
    "/sessions/{id}/revert",
];

/// Whether a URL parser would move `path` elsewhere: a `.` or `..` segment (percent-encoded
/// or not) is resolved, and a `\` is a `/` in an `http` URL. Sent on, such a path could leave
/// the session's routes at the host, which trusts this gateway's token with every session.
fn resolvable(path: &str) -> bool {
    let dots = |segment: &str| {
        let segment = segment.to_ascii_lowercase().replace("%2e", ".");
        segment == "." || segment == ".."
    };
    path.contains('\\') || path.split('/').any(dots)
}

/// `query` without an `access_token` (a stream's credential, this gateway's own).
fn without_token(query: &str) -> String {
    let kept: Vec<&str> = (query.split('&'))
        .filter(|pair| pair.split('=').next() != Some("access_token"))
        .collect();
    kept.join("&")
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
pub async fn to_host(
    State(hosts): State<Hosts>,
    matched: Option<MatchedPath>,
    params: Option<Path<HashMap<String, String>>>,
    req: Request,
    next: Next,
) -> Response {
    let route = matched.as_ref().map(MatchedPath::as_str);
    let id = params.as_ref().and_then(|p| p.get("id"));
    let (Some(id), true) = (id, route.is_some_and(|r| WORKSPACE_ROUTES.contains(&r))) else {
        return next.run(req).await;
    };
    let (Some(caller), Ok(id)) = (req.extensions().get::<Caller>(), SessionId::parse(id)) else {
        return next.run(req).await;
    };
    // A session this gateway cannot find, or finds served here, is the handler's to answer.
    let Ok(Some(host)) = hosts.gateway.files().host(caller, &id).await else {
        return next.run(req).await;
    };
    let Some(base) = rest_base(&host.url) else {
        return next.run(req).await;
    };
    if resolvable(req.uri().path()) {
        let why = "a path with a `.` or `..` segment, or a `\\`, is not sent to the agent's host";
        return ApiError::BadRequest(why.into()).into_response();
    }
    send(&hosts, &host, &base, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Sends `req` to the host at `base`, authenticated as this gateway. The host refusing this
/// gateway's token is the gateway's configuration at fault (502), not the caller's (a 401
/// passed on would sign the console out).
async fn send(
    hosts: &Hosts,
    host: &AgentHost,
    base: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = read_body(req).await?;
    let mut target = format!("{base}{}", parts.uri.path());
    if let Some(query) = parts
        .uri
        .query()
        .map(without_token)
        .filter(|q| !q.is_empty())
    {
        target = format!("{target}?{query}");
    }
    let mut headers = parts.headers;
    // The caller's credentials are this gateway's to check, never the host's to see.
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::COOKIE);
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
    let answer = relay(hop, parts.method, &target, headers, body).await?;
    if matches!(
        answer.status(),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
    ) && answer.headers().get(header::WWW_AUTHENTICATE).is_some()
    {
        return Err(ApiError::Service(Error::AgentMisbehaved(
            "the agent's host refused this gateway's token (the agent's `token`)".into(),
        )));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::{resolvable, rest_base, without_token};

    #[test]
    fn paths_a_url_parser_would_move() {
        for moved in [
            "/sessions/s1/files/../x",
            "/sessions/s1/files/%2e%2e/%2E%2e/s2/files/x",
            "/sessions/s1/files/.%2e",
            "/sessions/s1/files/./x",
            "/sessions/s1/files/a\\b",
        ] {
            assert!(resolvable(moved), "{moved}");
        }
        for kept in [
            "/sessions/s1/files/..%2fx",
            "/sessions/s1/files/a..b/.x",
            "/sessions/s1/diff",
        ] {
            assert!(!resolvable(kept), "{kept}");
        }
    }

    #[test]
    fn a_streams_token_stays_here() {
        assert_eq!(without_token("access_token=k&checkpoint=c"), "checkpoint=c");
        assert_eq!(without_token("checkpoint=c"), "checkpoint=c");
        assert_eq!(without_token("access_token=k"), "");
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
