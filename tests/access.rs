//! The small doors of access: keys read again without a restart (and what a removed key opened
//! closed), the bearer scheme in any case, `/metrics` for admins only, stdio MCP servers only
//! where allowed, prompt content the agent did not advertise, and a client's lone surrogate.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::acp::AcpClient;
use support::*;

const ALICE: &str = "alice-key-0123456789";
const BOB: &str = "bob-key-0123456789ab";
const ADMIN: &str = "admin-key-0123456789";

/// `key`'s lifecycle stream, open.
async fn lifecycle(gw: &Gateway, key: &str) -> Sse {
    let r = Sse::request(&gw.http, &gw.url("/events"), None)
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    Sse::from_response(r)
}

/// Whether `sse` ends (rather than waiting for events) within PATIENCE.
async fn ends(sse: &mut Sse) -> bool {
    while sse.next().await.is_some() {}
    true
}

/// The reload counter of `/metrics` for `result`.
async fn reloads(gw: &Gateway, result: &str) -> f64 {
    let (_, text) = gw.with_key(Some(ADMIN)).get("/metrics").await;
    let prefix = format!("acp_gateway_api_key_reloads_total{{result=\"{result}\"}} ");
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Keys in `--api-keys-file` change without a restart: a removed key is refused at once and
/// what it opened (an SSE stream, `/acp` connections over HTTP/SSE and WebSocket) ends, while
/// another key's stream goes on; a file that does not parse keeps the keys; SIGHUP reloads;
/// each reload is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_key_stops_working_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    let both = format!("alice:{ALICE}\nbob:{BOB}\n*:{ADMIN}\n");
    std::fs::write(&file, &both).unwrap();
    let opts = Options::default().args(&["--api-keys-file", file.to_str().unwrap()]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let (status, _) = gw.with_key(Some(ALICE)).get("/sessions").await;
    assert_eq!(status, 200);
    let mut alices = lifecycle(gw, ALICE).await;
    let mut bobs = lifecycle(gw, BOB).await;
    let acp_http = AcpClient::start(&gw.base, Some(ALICE), false).await;
    let acp_ws = AcpClient::start(&gw.base, Some(ALICE), true).await;
    assert!(acp_ws.call("session/list", json!({})).await.is_ok());

    // Alice's key goes: the file is seen changed within a second or two.
    std::fs::write(&file, format!("bob:{BOB}\n*:{ADMIN}\n")).unwrap();
    assert!(ends(&mut alices).await, "alice's stream ends");
    let (status, _) = gw.with_key(Some(ALICE)).get("/sessions").await;
    assert_eq!(status, 401);
    for (name, client) in [("HTTP/SSE", &acp_http), ("WebSocket", &acp_ws)] {
        let listed = client.call("session/list", json!({})).await;
        assert!(
            listed.is_err(),
            "/acp over {name} with a removed key: {listed:?}"
        );
    }
    // Bob's stream is still open: it sees the session bob creates now.
    let (status, created) = gw
        .with_key(Some(BOB))
        .post("/sessions", json!({"cwd": "/tmp"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let seen = tokio::time::timeout(PATIENCE, bobs.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.event, "session_created");
    assert_eq!(reloads(gw, "ok").await, 1.0);

    // A file that does not parse changes nothing, and says why.
    std::fs::write(&file, format!("alice:short\nbob:{BOB}\n*:{ADMIN}\n")).unwrap();
    gw.wait_until(|g| async move { reloads(g, "failed").await == 1.0 })
        .await;
    let (status, _) = gw.with_key(Some(BOB)).get("/sessions").await;
    assert_eq!(status, 200, "bob's key survives a bad file");
    assert!(w.log().contains("API keys not reloaded"), "{}", w.log());

    // SIGHUP reads the file at once (written back, with alice, within the same second).
    std::fs::write(&file, &both).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gw.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    gw.wait_until(|g| async move { g.with_key(Some(ALICE)).get("/sessions").await.0 == 200 })
        .await;
    assert!(reloads(gw, "ok").await >= 2.0);
    acp_http.close().await;
    acp_ws.close().await;
    w.finish().await;
}

/// `Authorization: bearer KEY` works (RFC 9110: the scheme is case-insensitive); `/metrics`,
/// which shows every tenant's numbers, is for admin keys only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheme_is_case_insensitive_and_metrics_are_for_admins() {
    let opts = Options::default().args(&[
        "--api-key",
        &format!("alice:{ALICE}"),
        "--admin-api-key",
        ADMIN,
    ]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let r = gw
            .http
            .get(gw.url("/sessions"))
            .header("authorization", format!("{scheme} {ALICE}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    let (status, problem) = gw.with_key(Some(ALICE)).get("/metrics").await;
    assert_eq!(status, 403, "{problem}");
    assert_eq!(problem["type"], "urn:acp-gateway:problem:forbidden");
    let (status, text) = gw.with_key(Some(ADMIN)).get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        text.as_str().unwrap().contains("acp_gateway_members"),
        "{text}"
    );
    w.finish().await;
}

/// A stdio MCP server is a command the agent runs on the gateway's host: with keys it is
/// refused (422 naming `--mcp-servers`) unless `--mcp-servers any`; `http` and `sse` servers
/// pass; without keys anything passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_mcp_servers_need_the_flag_where_keys_are() {
    let stdio = json!({"name": "shell", "command": "/bin/sh", "args": ["-c", "id"], "env": []});
    let http =
        json!({"type": "http", "name": "docs", "url": "https://mcp.example/docs", "headers": []});
    let create = |servers: Vec<Value>| json!({"cwd": "/tmp", "mcpServers": servers});
    let keyed = ["--api-key", "alice:alice-key-0123456789"];
    for (args, stdio_allowed) in [
        (keyed.to_vec(), false),
        ([&keyed[..], &["--mcp-servers", "any"]].concat(), true),
        (vec![], true),
        (vec!["--mcp-servers", "http"], false),
    ] {
        let w = World::start(Backend::Sqlite, Options::default().args(&args)).await;
        let gw = w.gw();
        let key = (!args.is_empty() && args[0] == "--api-key").then_some(ALICE);
        let (status, body) = gw
            .with_key(key)
            .post("/sessions", create(vec![http.clone()]))
            .await;
        assert_eq!(status, 201, "{args:?}: an http server: {body}");
        let (status, body) = gw
            .with_key(key)
            .post("/sessions", create(vec![http.clone(), stdio.clone()]))
            .await;
        if stdio_allowed {
            assert_eq!(status, 201, "{args:?}: {body}");
        } else {
            assert_problem(
                &format!("{args:?}"),
                status,
                &body,
                422,
                "--mcp-servers any",
            );
        }
        w.finish().await;
    }
}

/// An image, audio or embedded resource the session's agent did not advertise is refused
/// before the agent is asked: 422 naming the capability over REST, -32602 over `/acp`; text and
/// resource links always pass, and an agent that advertises `image` gets its image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_content_must_be_advertised() {
    let image = json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="});
    let audio = json!({"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="});
    let resource =
        json!({"type": "resource", "resource": {"uri": "file:///tmp/a.txt", "text": "a"}});
    let link = json!({"type": "resource_link", "uri": "file:///tmp/a.txt", "name": "a.txt"});
    let text = json!({"type": "text", "text": "look"});
    let (w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let prompt = format!("/sessions/{id}/prompt");
    for (block, capability) in [
        (&image, "image"),
        (&audio, "audio"),
        (&resource, "embeddedContext"),
    ] {
        let body = json!({"prompt": [text, block]});
        let problem = gw.send_expecting(Method::POST, &prompt, body, 422).await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("`{capability}`")) && detail.contains("prompt[1]"),
            "{problem}"
        );
    }
    assert_eq!(w.calls("session/prompt"), 0, "the agent was never asked");
    let body = json!({"prompt": [text, link]});
    gw.send_expecting(Method::POST, &prompt, body, 200).await;

    let acp = AcpClient::start(&gw.base, None, false).await;
    let acp_id = acp.new_session("/tmp").await;
    let refused = acp
        .call(
            "session/prompt",
            json!({"sessionId": acp_id, "prompt": [text, image]}),
        )
        .await
        .unwrap_err();
    assert_eq!(i32::from(refused.code), -32602, "{refused:?}");
    acp.close().await;
    w.finish().await;

    let opts = Options::default().env("ECHO_AGENT_CAPS", "load,image");
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let prompt = format!("/sessions/{id}/prompt");
    let body = json!({"prompt": [text, image]});
    gw.send_expecting(Method::POST, &prompt, body, 200).await;
    let body = json!({"prompt": [audio]});
    gw.send_expecting(Method::POST, &prompt, body, 422).await;
    w.finish().await;
}

/// A lone UTF-16 surrogate in what a client sends is refused (422), so that no response ever
/// carries one the client made; a genuine U+10FFFF and U+0000 are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_lone_surrogate_is_refused() {
    let (w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let raw = |method: Method, path: String, body: &'static str| {
        gw.http
            .request(method, gw.url(&path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (method, path, body) in [
        (
            Method::PATCH,
            format!("/sessions/{id}"),
            r#"{"title":"x\ud800y"}"#,
        ),
        (
            Method::POST,
            format!("/sessions/{id}/prompt"),
            r#"{"text":"cut \ud83d"}"#,
        ),
        (
            Method::POST,
            "/webhooks".to_owned(),
            r#"{"url":"https://hooks.example/a","events":["*"],"description":"\udc00"}"#,
        ),
        (
            Method::POST,
            "/sessions".to_owned(),
            r#"{"cwd":"/tmp","_meta":{"k":"\ud83d"}}"#,
        ),
    ] {
        let r = raw(method.clone(), path.clone(), body).await.unwrap();
        let status = r.status().as_u16();
        let problem: Value = r.json().await.unwrap();
        let what = format!("{method} {path}");
        assert_problem(&what, status, &problem, 422, "lone UTF-16 surrogate");
    }
    let r = raw(
        Method::PATCH,
        format!("/sessions/{id}"),
        r#"{"title":"nul\u0000 pair\ud83d\ude00 \udbff\udfff"}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let view: Value = r.json().await.unwrap();
    assert_eq!(view["title"], "nul\u{0} pair\u{1F600} \u{10FFFF}", "{view}");
    w.finish().await;
}

/// The gateway's own tenants are no key's: `admin` is the tenant of the admin's sessions (and
/// of those found in the agent's own list), `default` that of a keyless gateway's. A key given
/// for either (`--api-key admin:KEY`, a keys-file line, any case) stops the gateway from
/// starting, saying why; a keys file that gains such a line is not reloaded (the old keys stay,
/// the log says why), so the key opens nothing, and no tenant reaches the admin's sessions,
/// its webhooks or the answers kept under its `Idempotency-Key`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_tenants_belong_to_no_key() {
    const PROBE: &str = "probe-key-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    let file_arg = file.to_str().unwrap().to_owned();
    for (flag, value, file_text) in [
        ("--api-key", format!("admin:{PROBE}"), None),
        ("--api-key", format!("Default:{PROBE}"), None),
        (
            "--api-keys-file",
            file_arg.clone(),
            Some(format!("*:{ADMIN}\nadmin:{PROBE}\n")),
        ),
    ] {
        if let Some(text) = file_text {
            std::fs::write(&file, text).unwrap();
        }
        let gateway = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
            .args(["--agent", "true", "--listen", "127.0.0.1:0", flag, &value])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(PATIENCE, gateway.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{flag} {value}: the gateway started"))
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}: started");
        assert!(err.contains("is reserved"), "{flag}: {err}");
        assert!(!err.contains(PROBE), "the key is not printed: {err}");
    }

    std::fs::write(&file, format!("alice:{ALICE}\n*:{ADMIN}\n")).unwrap();
    let opts = Options::default().args(&["--api-keys-file", &file_arg, "--webhook-allow-private"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let admin = gw.with_key(Some(ADMIN));
    let idempotent = |key: &str| {
        gw.http
            .post(gw.url("/sessions"))
            .bearer_auth(key)
            .header("idempotency-key", "the-same-key")
            .json(&json!({"cwd": "/tmp"}))
    };
    let r = idempotent(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let admins: Value = r.json().await.unwrap();
    let admins = admins["sessionId"].as_str().unwrap().to_owned();
    let hook = admin
        .send_expecting(
            Method::POST,
            "/webhooks",
            Some(json!({"url": "http://127.0.0.1:9/hook", "events": ["*"]})),
            201,
        )
        .await;
    let hook = hook["id"].as_str().unwrap().to_owned();

    // The probe's line comes: the reload is refused, and says why.
    std::fs::write(&file, format!("alice:{ALICE}\n*:{ADMIN}\nadmin:{PROBE}\n")).unwrap();
    gw.wait_until(|g| async move { reloads(g, "failed").await == 1.0 })
        .await;
    assert!(w.log().contains("is reserved"), "{}", w.log());
    for (method, path, body) in [
        (Method::GET, "/sessions".to_owned(), None),
        (Method::GET, format!("/sessions/{admins}"), None),
        (Method::GET, "/webhooks".to_owned(), None),
        (
            Method::PATCH,
            format!("/webhooks/{hook}"),
            Some(json!({"url": "http://127.0.0.1:9/mine"})),
        ),
    ] {
        let (status, _) = gw.with_key(Some(PROBE)).send(method, &path, body).await;
        assert_eq!(status, 401, "the probe's key {path}");
    }

    // Nor does any tenant reach what the admin made.
    let alice = gw.with_key(Some(ALICE));
    let listed = alice
        .send_expecting(Method::GET, "/sessions", None, 200)
        .await;
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let (status, _) = alice.get(&format!("/sessions/{admins}")).await;
    assert_eq!(status, 404);
    let (status, _) = alice
        .send(
            Method::PATCH,
            &format!("/webhooks/{hook}"),
            Some(json!({"url": "http://127.0.0.1:9/mine"})),
        )
        .await;
    assert_eq!(status, 404);
    let r = idempotent(ALICE).send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(!r.headers().contains_key("idempotent-replayed"));
    let alices: Value = r.json().await.unwrap();
    assert_ne!(
        alices["sessionId"],
        admins.as_str(),
        "not the admin's answer"
    );
    let (_, hooks) = admin.get("/webhooks").await;
    assert_eq!(hooks[0]["url"], "http://127.0.0.1:9/hook", "{hooks}");
    w.finish().await;
}
