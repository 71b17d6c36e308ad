//! Several people on one session in the console, in Chromium (`console-people.mjs`): Ann's page
//! shows who is watching (Cy's stream appearing through `watchers_changed`), Cy's prompt as
//! Cy's, her own prompts queued behind Cy's turn and one withdrawn, her answer to Cy's
//! permission request as hers, and her queued prompt running after Cy's turn, as hers.

use crate::support;

use serde_json::{Value, json};
use support::*;
use tokio::io::AsyncWriteExt as _;

const ANN: &str = "ann-key-0123456789ab";
const CY: &str = "cy-key-0123456789abc";

#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn console_shows_authors_the_queue_and_who_is_watching() {
    let keys = [format!("acme/ann:{ANN}"), format!("acme/cy:{CY}")];
    let opts = Options::default().args(&["--api-key", &keys[0], "--api-key", &keys[1]]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let (status, made) = (gw.with_key(Some(ANN)))
        .post("/sessions", json!({"cwd": "/tmp"}))
        .await;
    assert_eq!(status, 201, "{made}");
    let id = made["sessionId"].as_str().unwrap().to_owned();
    let base = gw.url("");
    let env = [
        ("GATEWAY_URL", base.as_str()),
        ("SESSION", &id),
        ("ANN_KEY", ANN),
    ];
    let (mut node, mut stdin, mut lines) =
        super::script::console_script("console-people.mjs", &env);
    let mut report = None;
    let mut cy_stream = None;
    while let Some(line) = tokio::time::timeout(PATIENCE * 4, lines.next_line())
        .await
        .expect("the console run ends in time")
        .unwrap()
    {
        match line.as_str() {
            "OPENED" => {
                let url = gw.url(&format!("/sessions/{id}/events?access_token={CY}"));
                cy_stream = Some(Sse::open(&gw.http, &url, None).await);
                stdin.write_all(b"CY_WATCHING\n").await.unwrap();
            }
            "SEEN" => {
                let cy = gw.with_key(Some(CY));
                cy.prompt_async(&id, "/permission by cy").await;
                stdin.write_all(b"CY_PROMPTED\n").await.unwrap();
            }
            _ if line.starts_with('{') => report = Some(line),
            _ => {}
        }
    }
    let report = super::script::clean_report(&mut node, report).await;
    assert_eq!(report["watchersAlone"], "Watching: ann", "{report:#}");
    assert_eq!(report["watchersBoth"], "Watching: ann, cy", "{report:#}");
    assert_eq!(report["sendReads"], "Queue");
    let queued = json!([["ann", "first of ann's"], ["ann", "second of ann's"]]);
    assert_eq!(report["queued"], queued, "{report:#}");
    assert_eq!(report["afterWithdraw"], json!([["ann", "first of ann's"]]));
    let said = json!([["cy", "/permission by cy"], ["ann", "first of ann's"]]);
    assert_eq!(report["said"], said, "{report:#}");
    drop(cy_stream);

    // What the page showed is what the log holds.
    let history = gw
        .with_key(Some(ANN))
        .get(&format!("/sessions/{id}/history"))
        .await
        .1;
    let events = history["events"].as_array().unwrap();
    let of = |kind: &'static str| events.iter().filter(move |e| e["event"] == kind);
    let authors: Vec<&Value> = of("turn_started")
        .map(|e| &e["data"]["author"]["user"])
        .collect();
    assert_eq!(authors, [&json!("cy"), &json!("ann")]);
    let answered = of("permission_resolved").next().unwrap();
    assert_eq!(answered["data"]["answeredBy"]["user"], "ann");
    assert_eq!(of("prompt_withdrawn").count(), 1);
    w.finish().await;
}
