//! The ACP endpoint (`/acp`), driven by the official Rust SDK's client over the official
//! HTTP/SSE and WebSocket transport, as an editor would: a session created over ACP and
//! prompted while a REST SSE subscriber watches (and the reverse); a permission asked during an
//! ACP prompt answered through REST and the reverse, the losing side's request cancelled;
//! `session/load` replaying the exact log (against an agent that cannot load); a dropped
//! connection leaving its turn running; tenants isolated as on REST; WebSocket origins.

use crate::support;

use serde_json::{Value, json};
use support::acp::{AcpClient, agent_text};
use support::*;

both_backends!(
    a_session_created_over_acp_is_shared_with_rest,
    permissions_are_answered_from_either_side,
    load_replays_the_exact_log,
);

/// A gateway whose echo agent cannot `session/load`: the endpoint loads from the log.
fn no_load() -> Options {
    Options::default().env("ECHO_AGENT_CAPS", "list,delete,resume,close")
}

async fn a_session_created_over_acp_is_shared_with_rest(backend: Backend) {
    for ws in [false, true] {
        let w = World::start(backend, Options::default()).await;
        let gw = w.gw();
        let mut acp = AcpClient::start(&gw.base, None, ws).await;
        let id = acp.new_session("/tmp").await;
        // The session is the gateway's: listed over REST, with its agent.
        let listed = gw.json(&format!("/sessions/{id}")).await;
        assert_eq!(listed["agent"], "default", "{listed}");

        // An ACP prompt, watched over REST: the same chunks on both sides.
        let mut sse = gw.events(&id, None).await;
        let answer = acp.prompt(&id, "hello over acp").await.unwrap();
        assert_eq!(answer["stopReason"], "end_turn", "{answer}");
        let notes = acp.drain_notes();
        assert_eq!(agent_text(&notes), "hello over acp", "ws={ws}: {notes:?}");
        // Its own prompt is not echoed back to the client that sent it.
        assert!(
            !notes
                .iter()
                .any(|(_, p)| p["update"]["sessionUpdate"] == "user_message_chunk"),
            "{notes:?}"
        );
        let watched = sse.until("turn_ended").await;
        assert_eq!(chunk_text(&watched), "hello over acp");
        assert_eq!(watched[0].event, "turn_started");

        // A REST prompt reaches the ACP client: the user's message, then the agent's.
        let (status, _) = gw.prompt(&id, "hello over rest").await;
        assert_eq!(status, 200);
        let notes = acp.notes_until("agent_message_chunk").await;
        let user = &notes[0].1["update"];
        assert_eq!(user["sessionUpdate"], "user_message_chunk", "{notes:?}");
        assert_eq!(user["content"]["text"], "hello over rest");
        let mut text = agent_text(&notes);
        while text.len() < "hello over rest".len() {
            let more = acp.next_note().await;
            text += &agent_text(&[more]);
        }
        assert_eq!(text, "hello over rest");

        // ACP's list is the gateway's list.
        let list = acp.call("session/list", json!({})).await.unwrap();
        let ids: Vec<&str> = list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sessionId"].as_str().unwrap())
            .collect();
        assert!(ids.contains(&id.as_str()), "{list}");
        acp.close().await;
        w.finish().await;
    }
}

async fn permissions_are_answered_from_either_side(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let mut acp = AcpClient::start(&gw.base, None, false).await;
    let mut other = AcpClient::start(&gw.base, None, true).await;
    let id = acp.new_session("/tmp").await;
    other
        .call("session/resume", json!({"sessionId": id, "cwd": "/tmp"}))
        .await
        .unwrap();

    // Asked during an ACP prompt: both ACP clients are asked; REST answers first; the ACP
    // clients' requests are cancelled, and the turn goes on with REST's answer.
    let prompt = acp.prompt_in_background(&id, "/permission done");
    let asked = acp.next_asked().await;
    let asked_other = other.next_asked().await;
    assert_eq!(asked.method, "session/request_permission");
    assert_eq!(
        asked.params["toolCall"]["toolCallId"], "call_1",
        "{}",
        asked.params
    );
    assert_eq!(asked_other.params, asked.params);
    let pending = gw.json(&format!("/sessions/{id}/permissions")).await;
    let request_id = pending[0]["requestId"].as_str().unwrap().to_owned();
    let r = gw
        .post(
            &format!("/sessions/{id}/permissions/{request_id}"),
            json!({"optionId": "allow"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    for asked in [asked, asked_other] {
        let cancelled = asked.responder.cancellation();
        tokio::time::timeout(PATIENCE, cancelled.cancelled())
            .await
            .expect("the ACP client's request is cancelled once REST answered");
    }
    let answer = prompt.await.unwrap().unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    let text = agent_text(&acp.drain_notes());
    assert!(text.starts_with("permission: allow"), "{text}");

    // Asked during a REST prompt: the ACP client answers first.
    let turn = gw.prompt_in_background(&id, "/permission again");
    let asked = acp.next_asked().await;
    let asked_other = other.next_asked().await;
    asked
        .responder
        .respond(json!({"outcome": {"outcome": "selected", "optionId": "reject"}}))
        .unwrap();
    tokio::time::timeout(PATIENCE, asked_other.responder.cancellation().cancelled())
        .await
        .expect("the other ACP client's request is cancelled");
    let answer: Value = turn.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let resolved = gw.history(&id).await;
    let resolved: Vec<&Value> = resolved
        .iter()
        .filter(|e| e["event"] == "permission_resolved")
        .collect();
    assert_eq!(resolved.len(), 2);
    assert_eq!(
        resolved[1]["data"]["outcome"]["optionId"], "reject",
        "{:?}",
        resolved[1]
    );
    assert_eq!(resolved[1]["data"]["reason"], "answered");
    acp.close().await;
    other.close().await;
    w.finish().await;
}

async fn load_replays_the_exact_log(backend: Backend) {
    let w = World::start(backend, no_load()).await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    for text in ["/chunks 3 first", "/state second", "third turn"] {
        assert_eq!(gw.prompt(&id, text).await.0, 200);
    }
    // What the log says the client should see: each update as the agent sent it, each prompt
    // as the user's message.
    let mut expected = Vec::new();
    for e in gw.history(&id).await {
        let data = &e["data"];
        if let Some(update) = data.get("update") {
            expected.push(update.clone());
        } else if e["event"] == "turn_started" {
            for block in data["prompt"].as_array().unwrap() {
                expected.push(json!({"sessionUpdate": "user_message_chunk", "content": block}));
            }
        }
    }
    assert!(expected.len() > 8, "{expected:?}");

    let mut acp = AcpClient::start(&gw.base, None, false).await;
    let loaded = acp
        .call(
            "session/load",
            json!({"sessionId": id, "cwd": "/tmp", "mcpServers": []}),
        )
        .await
        .unwrap();
    assert!(loaded.is_object(), "{loaded}");
    let replayed: Vec<Value> = acp
        .drain_notes()
        .into_iter()
        .map(|(method, params)| {
            assert_eq!(method, "session/update");
            assert_eq!(params["sessionId"], id.as_str());
            params["update"].clone()
        })
        .collect();
    assert_eq!(replayed, expected);
    assert_eq!(
        w.calls("session/load"),
        0,
        "the agent was not asked to load"
    );

    // Then followed live: a prompt on the loaded session streams as usual.
    let answer = acp.prompt(&id, "after load").await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    assert_eq!(agent_text(&acp.drain_notes()), "after load");
    acp.close().await;
    w.finish().await;
}

/// A turn started over ACP goes on when its connection drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_does_not_stop_its_turn() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let acp = AcpClient::start(&gw.base, None, false).await;
    let id = acp.new_session("/tmp").await;
    let mut sse = gw.events(&id, None).await;
    acp.notify("_nothing", json!({})); // notifications the gateway does not know are ignored
    let cx = acp.cx.clone();
    let msg = agent_client_protocol::UntypedMessage::new(
        "session/prompt",
        json!({"sessionId": id, "prompt": [{"type": "text", "text": "/delay 300 /chunks 4 x"}]}),
    )
    .unwrap();
    cx.send_request(msg).detach();
    sse.until("turn_started").await;
    acp.close().await;
    let events = sse.until("turn_ended").await;
    assert_eq!(events.last().unwrap().data["stopReason"], "end_turn");
    assert_eq!(chunk_text(&events), "c1 c2 c3 c4");
    w.finish().await;
}

/// Keys and tenants as on REST: no key, no connection; a tenant sees only its sessions, and a
/// connection opened with one key is unknown under another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated_over_acp() {
    let (alice_key, bob_key) = ("alice-key-0123456789", "bob-key-0123456789ab");
    let opts = Options::default().args(&[
        "--api-key",
        &format!("alice:{alice_key}"),
        "--api-key",
        &format!("bob:{bob_key}"),
    ]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    // No key: 401 before any ACP.
    let r = gw
        .http
        .post(gw.url("/acp"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let alice = AcpClient::start(&gw.base, Some(alice_key), false).await;
    let bob = AcpClient::start(&gw.base, Some(bob_key), true).await;
    let id = alice.new_session("/tmp").await;
    let listed = bob.call("session/list", json!({})).await.unwrap();
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let listed = alice.call("session/list", json!({})).await.unwrap();
    assert_eq!(listed["sessions"][0]["sessionId"], id.as_str());
    for method in ["session/load", "session/resume"] {
        let err = bob
            .call(
                method,
                json!({"sessionId": id, "cwd": "/tmp", "mcpServers": []}),
            )
            .await
            .unwrap_err();
        assert_eq!(i32::from(err.code), -32002, "{method}: {err:?}");
    }
    let err = bob.prompt(&id, "not mine").await.unwrap_err();
    assert_eq!(i32::from(err.code), -32002, "{err:?}");
    // Over REST too, the session is alice's.
    let r = gw
        .http
        .get(gw.url(&format!("/sessions/{id}")))
        .bearer_auth(bob_key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // Alice's connection id, used with Bob's key, names no connection.
    let init = gw
        .http
        .post(gw.url("/acp"))
        .bearer_auth(alice_key)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), 200);
    let connection = init.headers()["acp-connection-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let r = gw
        .http
        .post(gw.url("/acp"))
        .bearer_auth(bob_key)
        .header("acp-connection-id", &connection)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    alice.close().await;
    bob.close().await;
    w.finish().await;
}

/// A browser may open a WebSocket only from the gateway's own origin or a `--cors-origin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_origins_are_checked() {
    let opts = Options::default().args(&["--cors-origin", "https://editor.example"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let upgrade = |origin: &'static str| {
        gw.http
            .get(gw.url("/acp"))
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("origin", origin)
            .send()
    };
    assert_eq!(upgrade("https://evil.example").await.unwrap().status(), 403);
    let ok = upgrade("https://editor.example").await.unwrap();
    assert_eq!(ok.status(), 101, "{:?}", ok.headers());
    // The SDK's WebSocket client (no Origin) works.
    let client = AcpClient::start(&gw.base, None, true).await;
    let id = client.new_session("/tmp").await;
    assert!(client.prompt(&id, "hi").await.is_ok());
    client.close().await;
    w.finish().await;
}
