//! DNS rebinding and cross-site requests against a gateway on loopback without keys, sent as a
//! browser would send them (raw HTTP/1.1 on a socket, so that nothing rewrites `Host`): a page
//! whose name points at 127.0.0.1 says `Host: evil.example.com:8080`, and a page of another
//! site sends its `Origin`. Every route refuses both (403 problem+json), while loopback names,
//! `localhost` and an `--allowed-host` name keep working.

use crate::support;

use serde_json::{Value, json};
use support::raw::raw;
use support::*;

/// The gateway's own port, for `Host` headers.
fn port(gw: &Gateway) -> String {
    gw.base.rsplit(':').next().unwrap().to_owned()
}

/// Every kind of request a page could use to take the gateway over: (method, path, body).
fn routes(session: &str, request: &str) -> Vec<(&'static str, String, Option<String>)> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}});
    vec![
        ("GET", "/".into(), None),
        ("GET", "/openapi.json".into(), None),
        ("GET", "/sessions".into(), None),
        (
            "POST",
            "/sessions".into(),
            Some(json!({"cwd": "/tmp"}).to_string()),
        ),
        (
            "POST",
            format!("/sessions/{session}/prompt"),
            Some(json!({"text": "rm -rf"}).to_string()),
        ),
        (
            "POST",
            format!("/sessions/{session}/permissions/{request}"),
            Some(json!({"optionId": "allow"}).to_string()),
        ),
        ("GET", format!("/sessions/{session}/events"), None),
        ("GET", "/events".into(), None),
        ("POST", "/acp".into(), Some(init.to_string())),
    ]
}

const WS_UPGRADE: [(&str, &str); 4] = [
    ("Upgrade", "websocket"),
    ("Connection", "Upgrade"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("Sec-WebSocket-Version", "13"),
];

/// A rebinding page's requests (`Host` its own name) are refused on every route, the WebSocket
/// upgrade included; a cross-site page's state-changing requests (`Origin` its own) too;
/// loopback names, `localhost` and an `--allowed-host` name are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_reaches_nothing() {
    let opts = Options::default().args(&["--allowed-host", "gw.internal.test"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let port = port(gw);
    let session = gw.create("/tmp").await;
    gw.prompt_async(&session, "/permission please").await;
    let permissions = format!("/sessions/{session}/permissions");
    gw.wait_until(|g| {
        let path = permissions.clone();
        async move { g.json(&path).await[0]["requestId"].is_string() }
    })
    .await;
    let request = gw.json(&permissions).await[0]["requestId"]
        .as_str()
        .unwrap()
        .to_owned();

    for host in [
        format!("evil.example.com:{port}"),
        "attacker.test".to_owned(),
        format!("localhost.evil.test:{port}"),
        format!("gw.internal.test.evil.test:{port}"),
    ] {
        for (method, path, body) in routes(&session, &request) {
            let (status, problem) =
                raw(gw, method, &path, &[("Host", &host)], body.as_deref()).await;
            assert_eq!(status, 403, "{method} {path} with Host {host}: {problem}");
            let problem: Value = serde_json::from_str(&problem).unwrap();
            assert_eq!(
                problem["type"], "urn:acp-gateway:problem:forbidden",
                "{problem}"
            );
        }
        let mut upgrade = WS_UPGRADE.to_vec();
        upgrade.push(("Host", &host));
        let (status, _) = raw(gw, "GET", "/acp", &upgrade, None).await;
        assert_eq!(status, 403, "WebSocket upgrade with Host {host}");
    }
    // Nothing of it happened: still one session, its permission request still pending.
    let list = gw.json("/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");
    let pending = gw.json(&format!("/sessions/{session}/permissions")).await;
    assert_eq!(pending[0]["requestId"], request.as_str(), "{pending}");
    let log = w.log();
    assert_eq!(
        log.matches("refused a request for a host").count(),
        4,
        "one WARN per refused host: {log}"
    );

    // A page of another site may read nothing cross-origin, and may change nothing either.
    let own = format!("127.0.0.1:{port}");
    for origin in [
        "http://evil.example.com",
        "null",
        &format!("http://localhost:{port}"),
    ] {
        for (method, path, body) in routes(&session, &request) {
            if method == "GET" {
                continue;
            }
            let headers = [("Host", own.as_str()), ("Origin", origin)];
            let (status, problem) = raw(gw, method, &path, &headers, body.as_deref()).await;
            assert_eq!(status, 403, "{method} {path} from {origin}: {problem}");
        }
        let mut upgrade = WS_UPGRADE.to_vec();
        upgrade.extend([("Host", own.as_str()), ("Origin", origin)]);
        let (status, _) = raw(gw, "GET", "/acp", &upgrade, None).await;
        assert_eq!(status, 403, "WebSocket upgrade from {origin}");
    }

    // The names that are this machine, and the configured one, are served.
    for host in [
        own.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "127.0.0.2".to_owned(),
        format!("gw.internal.test:{port}"),
    ] {
        let (status, body) = raw(gw, "GET", "/sessions", &[("Host", &host)], None).await;
        assert_eq!(status, 200, "Host {host}: {body}");
        let (status, body) = raw(gw, "GET", "/", &[("Host", &host)], None).await;
        assert_eq!(status, 200, "the console with Host {host}: {body}");
        let create = json!({"cwd": "/tmp"}).to_string();
        let origin = format!("http://{host}");
        let headers = [("Host", host.as_str()), ("Origin", origin.as_str())];
        let (status, body) = raw(gw, "POST", "/sessions", &headers, Some(&create)).await;
        assert_eq!(
            status, 201,
            "POST /sessions from its own origin, Host {host}: {body}"
        );
        let mut upgrade = WS_UPGRADE.to_vec();
        upgrade.push(("Host", &host));
        let (status, body) = raw(gw, "GET", "/acp", &upgrade, None).await;
        assert_eq!(status, 101, "WebSocket upgrade with Host {host}: {body}");
    }
    // The same-origin permission answer and prompt work, as the console sends them.
    let origin = format!("http://{own}");
    let headers = [("Host", own.as_str()), ("Origin", origin.as_str())];
    let answer = json!({"optionId": "allow"}).to_string();
    let path = format!("/sessions/{session}/permissions/{request}");
    let (status, body) = raw(gw, "POST", &path, &headers, Some(&answer)).await;
    assert_eq!(status, 200, "{body}");
    w.finish().await;
}

/// With API keys, a key is what protects the gateway: any `Host` is served unless
/// `--allowed-host` is given, and then only the names given (and loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_the_host_is_checked_only_when_names_are_given() {
    const KEY: &str = "alice-key-0123456789";
    let auth = format!("Bearer {KEY}");
    for (names, served) in [(None, true), (Some("gw.example.com"), false)] {
        let mut opts = Options::default().args(&["--api-key", &format!("alice:{KEY}")]);
        if let Some(names) = names {
            opts = opts.args(&["--allowed-host", names]);
        }
        let w = World::start(Backend::Sqlite, opts).await;
        let gw = w.gw();
        let headers = [("Host", "gw.other.test"), ("Authorization", auth.as_str())];
        let (status, body) = raw(gw, "GET", "/sessions", &headers, None).await;
        assert_eq!(
            status == 200,
            served,
            "--allowed-host {names:?}: {status} {body}"
        );
        let headers = [("Host", "gw.example.com"), ("Authorization", auth.as_str())];
        let (status, body) = raw(gw, "GET", "/sessions", &headers, None).await;
        assert_eq!(status, 200, "--allowed-host {names:?}: {body}");
        w.finish().await;
    }
}

/// A NUL byte anywhere in the URL is a 400 problem on both stores: no store ever reads it (on
/// PostgreSQL a NUL in a query parameter was a 500).
async fn a_nul_in_the_url_is_a_bad_request(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    for path in [
        "/webhooks/a%00b",
        "/webhooks/a%00b/deliveries",
        "/sessions?agent=a%00b",
        "/sessions?cwd=%2Ftmp%00",
        "/sessions/a%00b",
        "/sessions/a%00b/history",
        "/agents/a%00b",
    ] {
        let r = gw.get(path).await;
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, 400, "GET {path}: {body}");
    }
    for (method, path) in [
        (reqwest::Method::PATCH, "/webhooks/a%00b"),
        (reqwest::Method::DELETE, "/webhooks/a%00b"),
        (reqwest::Method::POST, "/webhooks/a%00b/rotate-secret"),
        (reqwest::Method::POST, "/webhooks/a%00b/deliveries/1/retry"),
    ] {
        let r = gw.send_json(method.clone(), path, json!({})).await;
        assert_eq!(r.status(), 400, "{method} {path}");
    }
    assert!(!w.log().contains(" ERROR "), "{}", w.log());
    w.finish().await;
}

both_backends!(a_nul_in_the_url_is_a_bad_request);

/// An HTTP/1.1 request must name exactly one host: without `Host` it would pass the allow-list
/// unchecked, and with two the gateway would pick one while a proxy in front may have read the
/// other. Both are 400 problem+json, with keys or without, on every route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_names_exactly_one_host() {
    const KEY: &str = "alice-key-0123456789";
    let auth = format!("Bearer {KEY}");
    for keyed in [false, true] {
        let mut opts = Options::default();
        if keyed {
            opts = opts.args(&["--api-key", &format!("alice:{KEY}")]);
        }
        let w = World::start(Backend::Sqlite, opts).await;
        let gw = w.gw();
        let own = format!("127.0.0.1:{}", port(gw));
        let key = [("Authorization", auth.as_str())];
        let key = if keyed { &key[..] } else { &[] };
        let with = |hosts: &[&'static str]| {
            let mut headers: Vec<(&str, &str)> = hosts.iter().map(|h| ("Host", *h)).collect();
            headers.extend_from_slice(key);
            headers
        };
        let own: &'static str = own.leak();
        for (case, headers) in [
            ("no Host", with(&[])),
            ("two Hosts, own first", with(&[own, "evil.example.com"])),
            ("two Hosts, own last", with(&["evil.example.com", own])),
            ("the same Host twice", with(&[own, own])),
        ] {
            for path in ["/sessions", "/healthz"] {
                let (status, body) = raw(gw, "GET", path, &headers, None).await;
                assert_eq!(status, 400, "keyed {keyed}, {case}, {path}: {body}");
                let problem: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(problem["status"], 400, "{problem}");
                assert!(
                    problem["detail"].as_str().unwrap().contains("Host"),
                    "{problem}"
                );
            }
        }
        let (status, body) = raw(gw, "GET", "/sessions", &with(&[own]), None).await;
        assert_eq!(status, 200, "keyed {keyed}, one Host: {body}");
        w.finish().await;
    }
}
