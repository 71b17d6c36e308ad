//! A share link's page in Chromium (`shared.mjs`): opened without a key it shows the session's
//! title and transcript, read-only (no prompt box), and, the link being live, a turn prompted
//! through the API while it is open; a revoked link's page says that it does not open.

use crate::support;

use reqwest::Method;
use serde_json::json;
use support::*;
use tokio::io::AsyncWriteExt as _;

const ACME: &str = "acme-console-key-0123456789";

#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn a_shared_session_reads_and_follows_in_the_browser() {
    let w = World::start(
        Backend::Sqlite,
        Options::default().args(&["--api-key", &format!("acme:{ACME}")]),
    )
    .await;
    let gw = w.gw();
    let acme = gw.with_key(Some(ACME));
    let made = acme
        .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
        .await;
    let id = made["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("/sessions/{id}/prompt");
    acme.send_expecting(
        Method::POST,
        &prompt,
        Some(json!({"text": "hello shared world"})),
        200,
    )
    .await;
    let shares = format!("/sessions/{id}/shares");
    let live = acme
        .send_expecting(Method::POST, &shares, Some(json!({"live": true})), 201)
        .await;
    let gone = acme
        .send_expecting(Method::POST, &shares, Some(json!({})), 201)
        .await;
    let revoke = format!("{shares}/{}", gone["id"].as_str().unwrap());
    assert_eq!(acme.send(Method::DELETE, &revoke, None).await.0, 204);

    let base = gw.url("");
    let env = [
        ("GATEWAY_URL", base.as_str()),
        ("SHARE_PATH", live["path"].as_str().unwrap()),
        ("REVOKED_PATH", gone["path"].as_str().unwrap()),
    ];
    let (mut node, mut stdin, mut lines) = super::script::console_script("shared.mjs", &env);
    let mut report = None;
    while let Some(line) = tokio::time::timeout(PATIENCE * 2, lines.next_line())
        .await
        .expect("the page run ends in time")
        .unwrap()
    {
        if line == "OPENED" {
            acme.send_expecting(
                Method::POST,
                &prompt,
                Some(json!({"text": "the second turn"})),
                200,
            )
            .await;
            stdin.write_all(b"PROMPTED\n").await.unwrap();
        } else if line.starts_with('{') {
            report = Some(line);
        }
    }
    let report = super::script::clean_report(&mut node, report).await;
    assert_eq!(report["title"], "Echo: hello shared world", "{report:#}");
    assert!(
        report["about"]
            .as_str()
            .unwrap()
            .contains("read-only, live"),
        "{report:#}"
    );
    assert_eq!(report["prompts"], 1);
    assert_eq!(report["noPromptBox"], true);
    assert_eq!(report["promptsAfter"], 2);
    assert_eq!(
        report["answers"],
        json!(["Agenthello shared world", "Agentthe second turn"]),
        "{report:#}"
    );
    assert!(
        report["revoked"]
            .as_str()
            .unwrap()
            .contains("this link is revoked"),
        "{report:#}"
    );
}
