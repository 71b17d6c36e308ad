//! Keys, tenants and browsers: every route with no key, a wrong key, another tenant's key and
//! the admin key; the loopback-only default; CORS preflights.

use crate::support;

use reqwest::{Method, RequestBuilder};
use serde_json::{Value, json};
use support::*;

const ALICE: &str = "alice-key-0123456789";
const BOB: &str = "bob-key-0123456789ab";
const ADMIN: &str = "admin-key-0123456789";

fn keyed() -> Options {
    Options::default()
        .arg("--api-key")
        .arg(&format!("alice:{ALICE}"))
        .arg("--api-key")
        .arg(&format!("bob:{BOB}"))
        .arg("--admin-api-key")
        .arg(ADMIN)
}

/// `method path` with `key` (none: no `Authorization`), not yet sent.
fn request(gw: &Gateway, key: Option<&str>, method: Method, path: &str) -> RequestBuilder {
    let req = gw.http.request(method, gw.url(path));
    match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    }
}

async fn call(
    gw: &Gateway,
    key: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = request(gw, key, method, path);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}

/// `POST /sessions` (cwd `/tmp`) with `key`.
async fn create_as(gw: &Gateway, key: &str) -> reqwest::Response {
    let body = json!({"cwd": "/tmp"});
    call(gw, Some(key), Method::POST, "/sessions", Some(body)).await
}

/// The `sessionId` of a create's answer.
async fn created_id(r: reqwest::Response) -> String {
    let v: Value = r.json().await.unwrap();
    v["sessionId"].as_str().unwrap().to_owned()
}

/// The JSON body of `GET path` with `key`.
async fn json_as(gw: &Gateway, key: &str, path: &str) -> Value {
    let r = call(gw, Some(key), Method::GET, path, None).await;
    r.json().await.unwrap()
}

/// The status of `GET path` with `key`.
async fn status_as(gw: &Gateway, key: &str, path: &str) -> u16 {
    let r = call(gw, Some(key), Method::GET, path, None).await;
    r.status().as_u16()
}

/// Every session route, as (method, path, body, what the admin gets).
fn session_routes(id: &str) -> Vec<(Method, String, Option<Value>, u16)> {
    // (method, the path after `/sessions/{id}`, body, what the admin gets)
    [
        (Method::GET, "", None, 200),
        (Method::PATCH, "", Some(json!({"title": "stolen"})), 200),
        (Method::GET, "/status", None, 200),
        (Method::POST, "/prompt", Some(json!({"text": "hi"})), 200),
        (Method::POST, "/cancel", None, 204),
        (Method::POST, "/resume", None, 200),
        (Method::GET, "/permissions", None, 200),
        (
            Method::POST,
            "/permissions/perm_x",
            Some(json!({"optionId": "allow"})),
            404,
        ),
        (Method::GET, "/history", None, 200),
        (Method::GET, "/events", None, 200),
        (Method::POST, "/archive", None, 200),
        (Method::POST, "/unarchive", None, 200),
        (Method::POST, "/close", None, 204),
        (Method::DELETE, "", None, 204),
    ]
    .into_iter()
    .map(|(method, rest, body, admin)| (method, format!("/sessions/{id}{rest}"), body, admin))
    .collect()
}

#[tokio::test]
async fn every_route_checks_keys_and_tenants() {
    let w = World::start(Backend::Sqlite, keyed()).await;
    let gw = w.gw();
    // Probes and the API description are public; everything else needs a key.
    for path in ["/healthz", "/readyz", "/docs", "/openapi.json"] {
        assert_eq!(
            call(gw, None, Method::GET, path, None).await.status(),
            200,
            "{path}"
        );
    }
    let r = create_as(gw, ALICE).await;
    assert_eq!(r.status(), 201);
    let id = created_id(r).await;
    assert_eq!(
        call(
            gw,
            Some(ALICE),
            Method::POST,
            &format!("/sessions/{id}/prompt"),
            Some(json!({"text": "mine"}))
        )
        .await
        .status(),
        200
    );
    let history_before = gw_history_len(gw, &id).await;
    let prompts_before = w.calls("session/prompt");

    let mut routes = session_routes(&id);
    routes.extend([
        (Method::GET, "/sessions".to_owned(), None, 200),
        (
            Method::POST,
            "/sessions".to_owned(),
            Some(json!({"cwd": "/tmp"})),
            201,
        ),
        (Method::GET, "/events".to_owned(), None, 200),
        (Method::GET, "/agent".to_owned(), None, 200),
        (Method::GET, "/metrics".to_owned(), None, 200),
    ]);
    for (method, path, body, _) in &routes {
        for key in [None, Some("wrong-key-0123456789")] {
            let r = call(gw, key, method.clone(), path, body.clone()).await;
            assert_eq!(r.status(), 401, "{method} {path} with {key:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
        }
    }

    // Bob's key on Alice's session: exactly like an unknown id, and no effect.
    for (method, path, body, _) in session_routes(&id) {
        let r = call(gw, Some(BOB), method.clone(), &path, body.clone()).await;
        let status = r.status().as_u16();
        if method == Method::DELETE {
            assert_eq!(status, 204, "{path}");
        } else if path.ends_with("/status") {
            assert_eq!(status, 200);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["status"], "not_found");
        } else {
            assert_eq!(status, 404, "{method} {path}");
        }
    }
    assert_eq!(status_as(gw, BOB, "/sessions/sess_unknown_id").await, 404);
    let after = json_as(gw, ALICE, &format!("/sessions/{id}")).await;
    assert_eq!(
        after["title"], "Echo: mine",
        "bob's PATCH did not rename it"
    );
    assert_eq!(after["status"], "live");
    assert_eq!(after["archived"], false, "bob's archive did nothing");
    assert_eq!(
        gw_history_len(gw, &id).await,
        history_before,
        "bob's calls changed nothing"
    );
    assert_eq!(w.calls("session/prompt"), prompts_before);
    assert_eq!(w.calls("session/close") + w.calls("session/delete"), 0);

    // Lists and lifecycle streams are scoped to the tenant; the admin sees everything.
    let ids = |v: Value| -> Vec<String> {
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sessionId"].as_str().unwrap().to_owned())
            .collect()
    };
    let bob_list = ids(json_as(gw, BOB, "/sessions").await);
    assert!(!bob_list.contains(&id));
    let admin_list = ids(json_as(gw, ADMIN, "/sessions").await);
    assert!(admin_list.contains(&id));
    let alice_list = ids(json_as(gw, ALICE, "/sessions").await);
    assert_eq!(alice_list, vec![id.clone()]);

    // Browsers' EventSource passes the key as ?access_token= (SSE routes only).
    let r = call(
        gw,
        None,
        Method::GET,
        &format!("/sessions/{id}/events?after=0&access_token={ALICE}"),
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut sse = Sse::from_response(r);
    assert_eq!(sse.next().await.unwrap().event, "turn_started");
    let r = call(
        gw,
        None,
        Method::GET,
        &format!("/sessions?access_token={ALICE}"),
        None,
    )
    .await;
    assert_eq!(r.status(), 401, "query tokens only on SSE routes");
    let r = call(
        gw,
        None,
        Method::GET,
        &format!("/events?after=0&access_token={BOB}"),
        None,
    )
    .await;
    let mut bob_events = Sse::from_response(r);
    let bob_id = created_id(create_as(gw, BOB).await).await;
    let first = bob_events.next().await.unwrap();
    assert_eq!(
        first.data["sessionId"],
        bob_id.as_str(),
        "bob's lifecycle stream skips alice's sessions"
    );

    // The admin can do everything to Alice's session.
    for (method, path, body, expected) in session_routes(&id) {
        let r = call(gw, Some(ADMIN), method.clone(), &path, body).await;
        assert_eq!(r.status().as_u16(), expected, "admin {method} {path}");
    }
    assert_eq!(
        status_as(gw, ALICE, &format!("/sessions/{id}")).await,
        404,
        "deleted by the admin"
    );
    w.finish().await;
}

async fn gw_history_len(gw: &Gateway, id: &str) -> usize {
    let v = json_as(gw, ADMIN, &format!("/sessions/{id}/history?limit=1000")).await;
    v["events"].as_array().unwrap().len()
}

/// Without keys the gateway refuses a non-loopback address, saying why; with keys it serves.
#[tokio::test]
async fn non_loopback_needs_keys() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["--agent", "true", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without API keys"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["--agent", "true", "--api-key", "t:short"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16"));
}

/// A browser page on an allowed origin gets its preflight answered (credentials, the headers it
/// sends and reads); other origins get no CORS headers.
#[tokio::test]
async fn cors_preflight() {
    let w = World::start(
        Backend::Sqlite,
        keyed().args(&["--cors-origin", "http://app.example"]),
    )
    .await;
    let gw = w.gw();
    let preflight = |origin: &'static str| {
        gw.http
            .request(Method::OPTIONS, gw.url("/sessions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .send()
    };
    let r = preflight("http://app.example").await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.example"
    );
    assert_eq!(r.headers()["access-control-allow-credentials"], "true");
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        allowed.contains("authorization") && allowed.contains("content-type"),
        "{allowed}"
    );
    let r = preflight("http://evil.example").await.unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    // The actual request from the allowed origin carries the CORS headers and needs the key.
    let r = request(gw, Some(ALICE), Method::POST, "/sessions")
        .header("origin", "http://app.example")
        .json(&json!({"cwd": "/tmp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.example"
    );
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(exposed.contains("location"), "{exposed}");
    w.finish().await;
}

/// A page on a `--cors-origin` may send every request header the API reads (its preflight
/// for `Idempotency-Key`, `Prefer`, `Last-Event-ID` and trace context is allowed) and read
/// every response header it defines: a replayed answer's `Idempotent-Replayed`, the limits'
/// `RateLimit`, `RateLimit-Policy` and `Retry-After`, `Location`, `Preference-Applied`.
#[tokio::test]
async fn cors_covers_every_header_the_api_defines() {
    let w = World::start(
        Backend::Sqlite,
        keyed().args(&["--cors-origin", "http://app.example"]),
    )
    .await;
    let gw = w.gw();
    let asked =
        "authorization,content-type,idempotency-key,prefer,last-event-id,traceparent,tracestate";
    let r = request(gw, None, Method::OPTIONS, "/sessions")
        .header("origin", "http://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", asked)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    for header in asked.split(',') {
        assert!(
            allowed.split(',').any(|h| h.trim() == header),
            "{header}: {allowed}"
        );
    }

    // The same create twice under one key: the second is the first's answer, replayed, and
    // the page can read that it is, and the limit headers a 429 would carry.
    let create = || {
        request(gw, Some(ALICE), Method::POST, "/sessions")
            .header("origin", "http://app.example")
            .header("idempotency-key", "page-create-1")
            .json(&json!({"cwd": "/tmp"}))
            .send()
    };
    let first = create().await.unwrap();
    assert_eq!(first.status(), 201);
    let replayed = create().await.unwrap();
    assert_eq!(replayed.status(), 201);
    assert!(replayed.headers().contains_key("idempotent-replayed"));
    let exposed = replayed.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    let exposed: Vec<&str> = exposed.split(',').map(str::trim).collect();
    for header in [
        "idempotent-replayed",
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "location",
        "content-location",
        "preference-applied",
    ] {
        assert!(exposed.contains(&header), "{header}: {exposed:?}");
    }
    w.finish().await;
}

/// --workspace-root confines cwd and additionalDirectories: relative paths, `..`, symlinks out of
/// the root and paths elsewhere are 422; paths inside are fine (an extra directory need not
/// exist yet; the cwd must).
#[tokio::test]
async fn workspace_confinement() {
    let outside = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    std::fs::create_dir(root_path.join("project")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root_path.join("escape")).unwrap();
    std::os::unix::fs::symlink(root_path.join("project"), root_path.join("alias")).unwrap();
    let w = World::start(
        Backend::Sqlite,
        Options::default().args(&["--workspace-root", root_path.to_str().unwrap()]),
    )
    .await;
    let gw = w.gw();
    let r = root_path.to_str().unwrap();
    let create = |cwd: String, extra: Vec<String>| async move {
        gw.post(
            "/sessions",
            json!({"cwd": cwd, "additionalDirectories": extra}),
        )
        .await
        .status()
        .as_u16()
    };
    for ok in [r.to_owned(), format!("{r}/project"), format!("{r}/alias")] {
        assert_eq!(create(ok.clone(), vec![]).await, 201, "{ok}");
    }
    // A directory not made yet is confined too: fine as an extra directory, not as the cwd,
    // which must exist.
    let new_dir = format!("{r}/project/new-dir");
    assert_eq!(create(r.to_owned(), vec![new_dir.clone()]).await, 201);
    assert_eq!(create(new_dir, vec![]).await, 422);
    let outside_path = outside.path().to_str().unwrap().to_owned();
    for bad in [
        "relative/path".to_owned(),
        format!("{r}/project/../../etc"),
        format!("{r}/escape"),
        format!("{r}/escape/sub"),
        outside_path.clone(),
        "/".to_owned(),
        format!("{r}/pro\0ject"),
    ] {
        assert_eq!(create(bad.clone(), vec![]).await, 422, "{bad:?}");
    }
    assert_eq!(
        create(format!("{r}/project"), vec![outside_path]).await,
        422,
        "additionalDirectories are confined too"
    );
    assert_eq!(
        create(format!("{r}/project"), vec![format!("{r}/alias")]).await,
        201
    );
    w.finish().await;
}

/// Per-tenant request rate, requests in flight and open streams answer 429 with Retry-After
/// and the IETF RateLimit-Policy and RateLimit headers;
/// one tenant's excess never blocks another; ordinary requests time out with 504.
#[tokio::test]
async fn per_tenant_limits() {
    let opts = keyed().args(&["--rate-limit", "1"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let burst = (0..20).map(|_| call(gw, Some(ALICE), Method::GET, "/sessions", None));
    let r = futures::future::join_all(burst)
        .await
        .into_iter()
        .find(|r| r.status() == 429)
        .expect("20 requests at once exceed 1 per second");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // The IETF RateLimit headers name the limit reached.
    assert_eq!(r.headers()["ratelimit-policy"], "\"requests\";q=1;w=1");
    let state = r.headers()["ratelimit"].to_str().unwrap();
    assert!(state.starts_with("\"requests\";r=0;t="), "{state}");
    assert_eq!(
        status_as(gw, BOB, "/sessions").await,
        200,
        "bob has his own budget"
    );
    w.finish().await;

    let opts = keyed().args(&[
        "--max-concurrent-requests",
        "1",
        "--max-streams",
        "1",
        "--request-timeout",
        "1",
        "--cancel-grace",
        "3",
    ]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let id = created_id(create_as(gw, ALICE).await).await;
    // One stream at a time for alice.
    let events = format!("/sessions/{id}/events");
    let alices_stream = || call(gw, Some(ALICE), Method::GET, &events, None);
    let first = alices_stream().await;
    assert_eq!(first.status(), 200);
    let second = alices_stream().await;
    assert_eq!(second.status(), 429);
    assert_eq!(
        second.headers()["ratelimit-policy"],
        "\"streams\";q=1;qu=\"concurrent-requests\""
    );
    assert_eq!(second.headers()["ratelimit"], "\"streams\";r=0");
    // (A closed stream's slot is freed when the gateway next writes to it: at the latest after
    // two keep-alive intervals, so the test does not wait for it.)
    drop(first);
    assert_eq!(
        status_as(gw, BOB, "/events").await,
        200,
        "bob's streams are his own"
    );
    // A waiting prompt holds alice's only request slot (prompts have no timeout).
    let prompt = gw.http.post(gw.prompt_url(&id)).bearer_auth(ALICE);
    let waiter = tokio::spawn(prompt.json(&json!({"text": "/deaf"})).send());
    // Only once the prompt is running (seen with the admin's own budget) is alice's slot
    // surely taken: a request of hers sent earlier could have raced the prompt for it.
    gw.wait_until(|g| {
        let path = format!("/sessions/{id}/status");
        async move { json_as(g, ADMIN, &path).await["activity"] == "running" }
    })
    .await;
    assert_eq!(status_as(gw, ALICE, "/sessions").await, 429);
    assert_eq!(status_as(gw, BOB, "/sessions").await, 200);
    // The admin's cancel waits --cancel-grace (3 s) for a deaf agent: longer than the 1 s
    // request timeout, so it answers 504 (the escalation still happens).
    let r = call(
        gw,
        Some(ADMIN),
        Method::POST,
        &format!("/sessions/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(r.status(), 504);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(
        waiter.await.unwrap().unwrap().status(),
        502,
        "the ignored cancel restarted the agent, ending the turn"
    );
    w.finish().await;
}
