//! `acp-gateway connect URL`, driven over its stdin and stdout by the official SDK's client as an
//! editor that launches agents as commands would: initialize, a session, a prompt and its
//! updates through the bridge; then the gateway restarts, and the bridge connects again and
//! resumes the session on its own, so the editor goes on prompting it and hears a REST client's
//! turn on it.

use crate::support;

use serde_json::json;
use support::acp::{agent_text, bridge};
use support::*;

const KEY: &str = "editor-key-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_bridges_an_editor_and_reconnects() {
    let opts = Options::default().args(&[
        "--api-key",
        &format!("editor:{KEY}"),
        "--shutdown-timeout",
        "2",
    ]);
    let mut w = World::start(Backend::Sqlite, opts).await;
    let log = w.dir.path().join("connect.log");
    let (mut bridge, mut editor, init) = bridge(&w.gw().base, Some(KEY), &log).await;
    assert_eq!(init["agentInfo"]["name"], "acp-gateway", "{init}");
    assert_eq!(init["agentCapabilities"]["loadSession"], true);
    let id = editor.new_session("/tmp").await;
    let answer = editor.prompt(&id, "through the bridge").await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    assert_eq!(agent_text(&editor.drain_notes()), "through the bridge");

    // The gateway goes away and comes back where it was: the editor keeps its session.
    w.restart_in_place().await;
    let answer = editor
        .prompt_through_reconnect(&id, "after the restart", &log)
        .await;
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let text = agent_text(&editor.drain_notes());
    assert!(text.ends_with("after the restart"), "{text}");

    // Resumed, it follows the session: a REST client's turn reaches the editor.
    let gw = w.gw();
    let r = gw
        .http
        .post(gw.prompt_url(&id))
        .bearer_auth(KEY)
        .json(&json!({"text": "from rest"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let notes = editor.notes_until("agent_message_chunk").await;
    assert!(
        notes
            .iter()
            .any(|(_, p)| p["update"]["content"]["text"] == "from rest"
                && p["update"]["sessionUpdate"] == "user_message_chunk"),
        "{notes:?}"
    );

    // The editor goes: the bridge ends.
    editor.close().await;
    let status = tokio::time::timeout(PATIENCE, bridge.wait())
        .await
        .expect("the bridge exits when its stdin ends")
        .unwrap();
    assert!(status.success(), "{status:?}");
    w.finish().await;
}
