//! A browser frontend on another origin: headless Chromium (Debian's `chromium`, driven by
//! `playwright-core` from npm) loads a page from a second local server, which creates a session
//! with `fetch` and a bearer key, prompts it, and reads its stream with `EventSource` and
//! `?access_token=`. Ignored by plain `cargo test` because it needs the browser and
//! `npm ci` in `tests/browser`; `.ci/run` installs both and runs it with `--ignored`.

mod support;

use serde_json::Value;
use support::*;

const KEY: &str = "alice-browser-key-0123456789";

#[tokio::test]
#[ignore = "needs Debian's chromium and `npm ci` in tests/browser (.ci/run provides both)"]
async fn browser_on_another_origin_uses_fetch_and_eventsource() {
    let page_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page_origin = format!("http://{}", page_listener.local_addr().unwrap());
    let opts = Options::default()
        .arg("--api-key")
        .arg(&format!("alice:{KEY}"))
        .arg("--cors-origin")
        .arg(&page_origin);
    let w = World::start(Backend::Sqlite, opts).await;
    let gateway_url = w.gw().url("");
    let page = include_str!("browser/page.html")
        .replace("GATEWAY_URL", gateway_url.trim_end_matches('/'))
        .replace("API_KEY", KEY);
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(page) }),
    );
    let server = tokio::spawn(async move { axum::serve(page_listener, app).await });

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser");
    let out = tokio::time::timeout(
        PATIENCE * 2,
        tokio::process::Command::new("node")
            .arg("run.mjs")
            .current_dir(dir)
            .env("PAGE_URL", format!("{page_origin}/"))
            .env(
                "DOCS_URL",
                format!("{}/docs", gateway_url.trim_end_matches('/')),
            )
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser run ends in time")
    .expect("node runs (is Node.js installed?)");
    server.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser run failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    let docs = &report["docs"];
    assert!(docs["error"].is_null(), "the docs page failed: {docs}");
    let operations = docs["operations"].as_array().unwrap();
    for id in [
        "listSessions",
        "createSession",
        "promptSession",
        "streamSessionEvents",
    ] {
        assert!(
            operations.iter().any(|o| o == id),
            "/docs lacks {id}: {docs}"
        );
    }
    assert_eq!(
        docs["elsewhere"],
        serde_json::json!([]),
        "/docs fetched from elsewhere"
    );
    let r = &report["result"];
    assert!(r.get("error").is_none(), "the page failed: {report}");
    let id = r["sessionId"].as_str().unwrap();
    assert_eq!(r["createdStatus"], 201);
    assert_eq!(
        r["location"],
        format!("/sessions/{id}"),
        "Location is exposed"
    );
    assert_eq!(r["promptStatus"], 200);
    assert_eq!(r["stopReason"], "end_turn");
    let events = r["events"].as_array().unwrap();
    let names: Vec<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"turn_started"), "{report}");
    assert_eq!(names.last(), Some(&"turn_ended"), "{report}");
    let text: String = events
        .iter()
        .filter(|e| e["name"] == "agent_message_chunk")
        .map(|e| e["data"]["update"]["content"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "hello from a browser");
    let ids: Vec<i64> = events
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=ids.len() as i64).collect::<Vec<_>>(), "{report}");
    assert_eq!(r["listedTitle"], "Echo: hello from a browser");
    assert_eq!(r["withoutKeyStatus"], 401, "a 401 is readable cross-origin");
    assert!(
        r["withoutKeyType"]
            .as_str()
            .unwrap()
            .ends_with("unauthorized")
    );
    let log = w.log();
    assert!(
        !log.contains(KEY),
        "the access token is redacted from the logs"
    );
    w.finish().await;
}
