//! What every request passes before anything else reads it: the `Host` allow-list that keeps a
//! web page from driving a gateway on loopback through DNS rebinding, the `Origin` check of
//! state-changing requests on a gateway without keys (a page may send a form POST to any
//! address) and of every WebSocket handshake (which CORS does not cover), and no NUL byte in
//! the URL, and exactly one `Host` on an HTTP/1.x request (none would pass the allow-list
//! unchecked, and two leave which one is meant to whoever reads them).
//!
//! A rebinding page points a name of its own (`evil.example`) at 127.0.0.1: the browser then
//! takes the gateway for that site and lets the page read its answers. Its requests still say
//! `Host: evil.example`, which is what is refused here (Jupyter, Vite and Ollama do the same).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Version, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// Distinct refused hosts that are logged (each once); later ones are refused silently.
const LOGGED_HOSTS: usize = 256;

/// The guard's settings, and the hosts already logged.
pub struct Guard {
    /// Whether `Host` is checked: always without keys, with keys when names are configured.
    check_host: bool,
    /// Whether the `Origin` of state-changing requests is checked (without keys).
    check_origin: bool,
    /// `--allowed-host` names, lower-case without a trailing dot; `.example.com` covers the
    /// name and its subdomains.
    names: Vec<String>,
    /// Any host (`--allowed-host '*'`).
    any_host: bool,
    /// `--cors-origin`: origins besides the gateway's own whose requests may change state.
    origins: Vec<String>,
    logged: Mutex<HashSet<String>>,
}

impl Guard {
    /// `keyed`: whether API keys are configured. `advertised` is this replica's URL for the
    /// others (`--advertise-url`), whose host is allowed too: other replicas forward to it.
    pub fn new(
        keyed: bool,
        allowed_hosts: &[String],
        cors_origins: &[String],
        advertised: Option<&str>,
    ) -> Arc<Guard> {
        let mut names: Vec<String> = allowed_hosts
            .iter()
            .map(|h| normalise(strip_port(h.trim())))
            .filter(|n| !n.is_empty())
            .collect();
        let any_host = names.iter().any(|n| n == "*");
        let advertised = advertised.and_then(|url| reqwest::Url::parse(url).ok());
        if let Some(host) = advertised.as_ref().and_then(|url| url.host_str()) {
            names.push(normalise(host));
        }
        Arc::new(Guard {
            check_host: !keyed || !allowed_hosts.is_empty(),
            check_origin: !keyed,
            names,
            any_host,
            origins: cors_origins
                .iter()
                .map(|o| o.to_ascii_lowercase())
                .collect(),
            logged: Mutex::default(),
        })
    }

    /// Whether a request for `host` (the `Host` header or the URI's authority, port and all)
    /// is served.
    fn host_allowed(&self, host: &str) -> bool {
        if self.any_host {
            return true;
        }
        let name = normalise(strip_port(host));
        if name == "localhost" {
            return true;
        }
        let ip = name.trim_start_matches('[').trim_end_matches(']');
        if ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
            return true;
        }
        self.names
            .iter()
            .any(|allowed| match allowed.strip_prefix('.') {
                Some(domain) => name == domain || name.ends_with(allowed.as_str()),
                None => name == *allowed,
            })
    }

    /// Whether a state-changing request from `origin` is served: the gateway's own origin
    /// (scheme, then exactly the request's `Host`) or a `--cors-origin`.
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.to_ascii_lowercase();
        let own = host.is_some_and(|host| {
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                == Some(host.to_ascii_lowercase().as_str())
        });
        own || self.origins.contains(&origin)
    }

    /// Logs a refused host, once per host (and only so many hosts).
    fn log_refused(&self, host: &str) {
        let mut logged = self.logged.lock().expect("guard log lock");
        if logged.len() < LOGGED_HOSTS && logged.insert(host.to_owned()) {
            tracing::warn!(
                host,
                "refused a request for a host that is not allowed (a DNS-rebinding page, or a name missing from --allowed-host); logged once per host"
            );
        }
    }
}

/// `host` without its port (an IPv6 address keeps its brackets).
fn strip_port(host: &str) -> &str {
    match host.rfind(':') {
        Some(at)
            if !host[at..].contains(']')
                && (host.starts_with('[') || host[..at].find(':').is_none()) =>
        {
            &host[..at]
        }
        _ => host,
    }
}

/// Lower case, no trailing dot: how names are compared.
fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The host a request is for: the URI's authority (HTTP/2's `:authority`), else `Host`.
fn request_host(req: &Request) -> Option<String> {
    if let Some(authority) = req.uri().authority() {
        return Some(authority.as_str().to_owned());
    }
    host_header(req.headers()).map(str::to_owned)
}

/// The `Host` header; one that is not text is read as U+FFFD, which no rule allows.
fn host_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// Whether the percent-decoded path or query holds a NUL byte.
fn nul_in_url(req: &Request) -> bool {
    let uri = req.uri();
    let decoded_nul = |s: &str| {
        s.as_bytes()
            .windows(3)
            .any(|w| w[0] == b'%' && w[1] == b'0' && w[2] == b'0')
    };
    decoded_nul(uri.path()) || uri.query().is_some_and(decoded_nul)
}

/// Why an HTTP/1.x request's `Host` is unusable (RFC 9112 §3.2: exactly one is required), if
/// it is. HTTP/2 names its host in `:authority` (the URI's), which may come without `Host`.
fn host_count_refused(req: &Request) -> Option<&'static str> {
    if req.version() >= Version::HTTP_2 {
        return None;
    }
    match req.headers().get_all(header::HOST).iter().count() {
        1 => None,
        0 => Some("the request has no Host header: HTTP/1.1 requires one"),
        _ => Some("the request has more than one Host header: it must have exactly one"),
    }
}

/// Middleware: refuses a request without exactly one `Host` (400 problem+json), what [`Guard`]
/// does not serve (403), and a URL with a NUL byte (400).
pub async fn guard(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    if let Some(why) = host_count_refused(&req) {
        return ApiError::BadRequest(why.into()).into_response();
    }
    let host = request_host(&req);
    let refused_host = host
        .as_deref()
        .filter(|h| guard.check_host && !guard.host_allowed(h));
    if let Some(host) = refused_host {
        guard.log_refused(host);
        return ApiError::Forbidden(format!(
            "this gateway does not answer to the host {host:?}: it serves loopback addresses, localhost and the names given with --allowed-host"
        ))
        .into_response();
    }
    // A WebSocket handshake is not subject to CORS: its origin is checked, keys or not.
    let websocket = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if websocket || (guard.check_origin && !safe) {
        let origin = req
            .headers()
            .get(header::ORIGIN)
            .map(|o| o.to_str().unwrap_or("null"));
        if let Some(origin) = origin.filter(|o| !guard.origin_allowed(o, host.as_deref())) {
            return ApiError::Forbidden(format!(
                "a page from {origin:?} may not change anything here: only the gateway's own origin and --cors-origin may"
            ))
            .into_response();
        }
    }
    if nul_in_url(&req) {
        return ApiError::BadRequest("the URL holds a NUL byte (%00)".into()).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_localhost_and_the_named_hosts_are_served() {
        let names = [
            "gw.example.com:443".to_owned(),
            ".corp.example".to_owned(),
            String::new(),
        ];
        let guard = Guard::new(false, &names, &[], Some("http://10.0.0.7:8080"));
        for host in [
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]:8080",
            "[::1]",
            "localhost",
            "LOCALHOST:80",
            "localhost.:8080",
            "gw.example.com",
            "GW.example.com.:443",
            "corp.example",
            "a.b.corp.example:8080",
            "10.0.0.7:8080",
        ] {
            assert!(guard.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example.com:8080",
            "attacker.test",
            "localhost.evil.test:8080",
            "gw.example.com.evil.test",
            "xcorp.example",
            "10.0.0.8:8080",
            "0.0.0.0:8080",
            "[::ffff:7f00:1]x",
            "",
        ] {
            assert!(!guard.host_allowed(host), "{host}");
        }
        assert!(Guard::new(false, &["*".to_owned()], &[], None).host_allowed("anything.test"));
    }

    #[test]
    fn own_and_configured_origins_may_change_state() {
        let guard = Guard::new(false, &[], &["http://localhost:5173".to_owned()], None);
        assert!(guard.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        assert!(guard.origin_allowed("http://localhost:5173", Some("127.0.0.1:8080")));
        assert!(!guard.origin_allowed("http://evil.example", Some("127.0.0.1:8080")));
        assert!(!guard.origin_allowed("http://127.0.0.1:8081", Some("127.0.0.1:8080")));
        assert!(!guard.origin_allowed("null", Some("127.0.0.1:8080")));
    }
}
