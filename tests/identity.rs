//! The gateway owns session identity. ACP makes a session id unique only within one agent
//! process: an agent that numbers its sessions per process (the echo agent with
//! `ECHO_AGENT_IDS=per-process`: `m1`, `m2`… in each) hands two members, or two agents, the
//! same ids. A create whose id names another session (another tenant's, another agent's, a
//! deleted one) fails with 502 and never takes that session over, and a list sync never changes
//! a row's tenant or agent. On both stores, with two tenants and with none.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(
    two_members_hand_out_one_id_to_two_tenants,
    two_members_hand_out_one_id_without_keys,
    two_agents_hand_out_one_id,
);

const ALICE: &str = "alice-key-0123456789";
const BOB: &str = "bob-key-0123456789ab";

/// The agent text a session's history holds, all turns.
fn said(history: &Value) -> String {
    history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["data"]["prompt"][0]["text"].as_str())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Alice's session on member 0 is `m1`; member 1 answers bob's create with `m1` too. Bob gets
/// a 502 and nothing of alice's, alice keeps her session, the clashing session is deleted at
/// the agent, and bob's retry (member 1's `m2`) works.
async fn two_members_hand_out_one_id_to_two_tenants(backend: Backend) {
    let opts = Options::default()
        .pool(2)
        .env("ECHO_AGENT_IDS", "per-process")
        .args(&[
            "--api-key",
            &format!("alice:{ALICE}"),
            "--api-key",
            &format!("bob:{BOB}"),
        ]);
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let (alice, bob) = (gw.with_key(Some(ALICE)), gw.with_key(Some(BOB)));
    gw.wait_until(|g| async move {
        let r = g
            .http
            .get(g.url("/agent"))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        let agent: Value = r.json().await.unwrap();
        agent["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["state"] == "ready")
    })
    .await;
    let (status, created) = alice.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["sessionId"], "m1");
    let prompt = json!({"text": "alice secret plan"});
    let (status, _) = alice.post("/sessions/m1/prompt", prompt).await;
    assert_eq!(status, 200);

    let (status, problem) = bob.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 502, "bob's create must fail: {problem}");
    assert_eq!(
        problem["type"], "urn:acp-gateway:problem:agent-protocol-error",
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("\"m1\""),
        "{problem}"
    );
    assert_eq!(
        w.calls("session/delete"),
        1,
        "the clashing session is deleted at the agent"
    );

    for path in ["/sessions/m1", "/sessions/m1/history"] {
        let (status, body) = bob.get(path).await;
        assert_eq!(status, 404, "bob GET {path}: {body}");
    }
    let (_, bobs) = bob.get("/sessions").await;
    assert_eq!(bobs["sessions"], json!([]), "{bobs}");
    let (status, mine) = alice.get("/sessions/m1").await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(mine["title"], "Echo: alice secret plan", "{mine}");
    let (_, history) = alice.get("/sessions/m1/history").await;
    assert_eq!(said(&history), "alice secret plan", "{history}");
    let prompt = json!({"text": "still mine"});
    let (status, _) = alice.post("/sessions/m1/prompt", prompt).await;
    assert_eq!(status, 200, "alice's session still works");

    // A retry gets a fresh id from the same member, and is bob's alone.
    let (status, retried) = bob.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201, "{retried}");
    let bob_id = retried["sessionId"].as_str().unwrap().to_owned();
    assert_ne!(bob_id, "m1");
    let prompt = json!({"text": "bob's own"});
    let (status, _) = bob
        .post(&format!("/sessions/{bob_id}/prompt"), prompt)
        .await;
    assert_eq!(status, 200);
    let (_, history) = alice.get("/sessions/m1/history").await;
    assert_eq!(
        said(&history),
        "alice secret plan | still mine",
        "{history}"
    );
    let (_, history) = bob.get(&format!("/sessions/{bob_id}/history")).await;
    assert_eq!(said(&history), "bob's own", "{history}");
    w.finish().await;
}

/// Without keys the two conversations are never merged into one log: the second create fails,
/// and a create whose id names a deleted session fails too (a tombstone is never reused).
async fn two_members_hand_out_one_id_without_keys(backend: Backend) {
    let opts = Options::default()
        .pool(2)
        .env("ECHO_AGENT_IDS", "per-process");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    gw.wait_members_ready().await;
    assert_eq!(gw.create("/tmp").await, "m1");
    let (status, _) = gw.prompt("m1", "first conversation").await;
    assert_eq!(status, 200);
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 502, "{}", r.text().await.unwrap());
    let history = gw.json("/sessions/m1/history").await;
    assert_eq!(said(&history), "first conversation", "{history}");
    let list = gw.json("/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");

    // m1 deleted, its tombstone stays m1's: member 1's next id is m2, member 0's next is m2
    // too (taken by then), and so on; whatever a member answers, no create reuses m1.
    assert_eq!(gw.delete("/sessions/m1").await.status(), 204);
    let mut made = Vec::new();
    for _ in 0..4 {
        let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        match status {
            201 => made.push(body["sessionId"].as_str().unwrap().to_owned()),
            502 => assert_eq!(body["type"], "urn:acp-gateway:problem:agent-protocol-error"),
            other => panic!("create answered {other}: {body}"),
        }
    }
    assert!(!made.contains(&"m1".to_owned()), "{made:?}");
    let mut unique = made.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), made.len(), "{made:?}");
    assert_eq!(gw.status("m1").await, "not_found");
    w.finish().await;
}

/// Two agents number their sessions alike: `b`'s `m1` is refused while `a`'s exists, and `b`'s
/// list sync, which lists its own `m1` (closed, not deleted: `b` cannot delete), changes
/// nothing of `a`'s row.
async fn two_agents_hand_out_one_id(backend: Backend) {
    let b_dir = tempfile::tempdir().unwrap();
    let echo = echo_agent();
    let opts = Options {
        agent: format!("a={}", echo.display()).into(),
        ..Options::default()
    }
    .env("ECHO_AGENT_IDS", "per-process")
    .args(&[
        "--agent",
        &format!(
            "b=env ECHO_AGENT_DIR={} ECHO_AGENT_CAPS=load,list,resume,close {}",
            b_dir.path().display(),
            echo.display()
        ),
        "--default-agent",
        "a",
    ]);
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    gw.wait_until(|g| async move { g.json("/agents/b").await["ready"] == true })
        .await;
    assert_eq!(gw.create("/tmp").await, "m1");
    let (status, _) = gw.prompt("m1", "a's conversation").await;
    assert_eq!(status, 200);
    let before = gw.json("/sessions/m1").await;
    let r = gw
        .post("/sessions", json!({"cwd": "/tmp", "agent": "b"}))
        .await;
    assert_eq!(r.status(), 502, "{}", r.text().await.unwrap());
    assert_eq!(
        w.calls("session/close"),
        1,
        "b cannot delete: its m1 is closed"
    );
    // b still lists its m1: the sync leaves a's row as it was.
    let refreshed = gw.json("/sessions?refresh=true").await;
    assert_eq!(
        refreshed["sessions"].as_array().unwrap().len(),
        1,
        "{refreshed}"
    );
    let after = gw.json("/sessions/m1").await;
    for field in ["agent", "tenant", "origin", "cwd", "createdAt"] {
        assert_eq!(
            after[field], before[field],
            "the sync changed {field}: {after}"
        );
    }
    assert_eq!(after["agent"], "a", "{after}");
    let history = gw.json("/sessions/m1/history").await;
    assert_eq!(said(&history), "a's conversation", "{history}");
    w.finish().await;
}
