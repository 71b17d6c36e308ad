//! Several agents behind one gateway, on SQLite and on PostgreSQL: two differently configured
//! echo agents (each its own state directory and switches), sessions created, listed, filtered,
//! prompted, resumed after a restart and deleted on each; one agent's crash loop leaves the
//! other serving.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(
    two_agents_side_by_side,
    a_crash_looping_agent_leaves_the_other_serving,
    an_agent_not_logged_in_names_its_auth_methods,
    an_agent_never_touches_another_agents_session,
);

/// Agent `a` (the echo agent as the tests run it) and agent `b` given by `b`'s extra
/// environment (its own state directory), `a` the default.
fn two_agents(w_dir: &str, b_env: &str) -> Options {
    let echo = echo_agent();
    Options {
        agent: format!("a={}", echo.display()).into(),
        ..Options::default()
    }
    .args(&[
        "--agent",
        &format!("b=env ECHO_AGENT_DIR={w_dir} {b_env} {}", echo.display()),
        "--default-agent",
        "a",
    ])
}

fn ids(page: &Value) -> Vec<String> {
    let mut ids: Vec<String> = page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

async fn created(gw: &Gateway, body: Value) -> Value {
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 201);
    r.json().await.unwrap()
}

async fn two_agents_side_by_side(backend: Backend) {
    let b_dir = tempfile::tempdir().unwrap();
    let b_env = "ECHO_AGENT_CHUNKS=3 ECHO_AGENT_CONTROLS=modes";
    let opts = two_agents(&b_dir.path().display().to_string(), b_env);
    let mut w = World::start(backend, opts).await;
    let gw = w.gw();
    // Ready once any agent is: b may still be starting.
    gw.wait_until(|g| async move { g.json("/agents/b").await["ready"] == true })
        .await;

    let agents = gw.json("/agents").await;
    let names: Vec<&str> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(agents[0]["default"], true);
    assert_eq!(agents[1]["default"], false);
    let b = gw.json("/agents/b").await;
    assert_eq!(b["agentInfo"]["name"], "echo-agent");
    assert_eq!(b["ready"], true);
    assert_eq!(b["members"][0]["state"], "ready");
    assert_eq!(gw.get("/agents/nope").await.status(), 404);
    let ready = gw.get("/readyz").await.text().await.unwrap();
    assert!(ready.starts_with("ready: a, b"), "{ready}");
    let metrics = gw.get("/metrics").await.text().await.unwrap();
    for agent in ["a", "b"] {
        let line = format!("acp_gateway_agent_members_ready{{agent=\"{agent}\"}} 1");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }

    // Created on each; an unknown name is 422 naming the configured ones.
    let on_a = created(gw, json!({"cwd": "/tmp"})).await;
    let on_b = created(gw, json!({"cwd": "/tmp", "agent": "b"})).await;
    assert_eq!(on_a["agent"], "a");
    assert_eq!(on_b["agent"], "b");
    assert!(on_a["state"].get("modes").is_none(), "a offers no modes");
    assert_eq!(on_b["state"]["modes"]["currentModeId"], "ask", "b does");
    let r = gw
        .post("/sessions", json!({"cwd": "/tmp", "agent": "nope"}))
        .await;
    assert_eq!(r.status(), 422);
    let problem: Value = r.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"a\"") && detail.contains("\"b\""),
        "{detail}"
    );
    let (a_id, b_id) = (
        on_a["sessionId"].as_str().unwrap().to_owned(),
        on_b["sessionId"].as_str().unwrap().to_owned(),
    );

    // Prompted, each by its own agent: b streams three numbered chunks.
    let (status, _) = gw.prompt(&a_id, "hello there").await;
    assert_eq!(status, 200);
    let (status, _) = gw.prompt(&b_id, "hello there").await;
    assert_eq!(status, 200);
    let text = |id: String| async move {
        gw.history(&id)
            .await
            .iter()
            .filter(|e| e["event"] == "agent_message_chunk")
            .map(|e| {
                e["data"]["update"]["content"]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect::<String>()
    };
    assert_eq!(text(a_id.clone()).await, "hello there");
    assert_eq!(text(b_id.clone()).await, "c1 c2 c3");

    // Listed and filtered by agent; a sync keeps each agent's sessions its own.
    for path in ["/sessions", "/sessions?refresh=true"] {
        let mut both = vec![a_id.clone(), b_id.clone()];
        both.sort();
        assert_eq!(ids(&gw.json(path).await), both, "{path}");
    }
    assert_eq!(ids(&gw.json("/sessions?agent=a").await), [a_id.as_str()]);
    assert_eq!(ids(&gw.json("/sessions?agent=b").await), [b_id.as_str()]);
    assert!(ids(&gw.json("/sessions?agent=c").await).is_empty());
    let page = gw.json("/sessions?agent=b").await;
    assert_eq!(page["sessions"][0]["agent"], "b");

    // After a restart each session resumes in its own agent.
    w.restart().await;
    let gw = w.gw();
    assert_eq!(gw.status(&b_id).await, "saved");
    let (status, body) = gw.prompt(&b_id, "again").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(gw.json(&format!("/sessions/{b_id}")).await["agent"], "b");
    let chunks: Vec<Value> = gw
        .history(&b_id)
        .await
        .into_iter()
        .filter(|e| e["event"] == "agent_message_chunk")
        .collect();
    assert_eq!(chunks.len(), 6, "three chunks a turn: b answered again");

    // Deleted on one; the other stays. An id nobody knows is deleted (204) as often as asked,
    // though its tombstone names no agent.
    assert_eq!(gw.delete(&format!("/sessions/{a_id}")).await.status(), 204);
    for _ in 0..2 {
        assert_eq!(gw.delete("/sessions/sess_never_seen").await.status(), 204);
    }
    assert_eq!(
        ids(&gw.json("/sessions?refresh=true").await),
        [b_id.as_str()]
    );
    w.finish().await;
}

async fn a_crash_looping_agent_leaves_the_other_serving(backend: Backend) {
    let b_dir = tempfile::tempdir().unwrap();
    let opts = two_agents(
        &b_dir.path().display().to_string(),
        "ECHO_AGENT_CRASH=start",
    );
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    // Ready, because a is; b is named as not ready.
    let ready = gw.get("/readyz").await;
    assert_eq!(ready.status(), 200);
    let ready = ready.text().await.unwrap();
    assert!(ready.contains("not ready: b"), "{ready}");
    let id = created(gw, json!({"cwd": "/tmp"})).await["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(gw.prompt(&id, "still here").await.0, 200);
    let r = gw
        .post("/sessions", json!({"cwd": "/tmp", "agent": "b"}))
        .await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let b = gw.json("/agents/b").await;
    assert_eq!(b["ready"], false);
    assert!(b["unreadyReason"].as_str().is_some(), "{b}");
    assert!(b["members"][0]["restarts"].as_u64().is_some());
    // a keeps serving while b keeps failing: a refresh syncs a (b's failure is only logged).
    assert_eq!(gw.prompt(&id, "and still").await.0, 200);
    let listed = gw.get("/sessions?refresh=true").await;
    assert_eq!(listed.status(), 200);
    let page: Value = listed.json().await.unwrap();
    assert_eq!(page["sessions"][0]["sessionId"], id.as_str());
    assert_eq!(gw.json("/agents/a").await["ready"], true);
    w.finish().await;
}

/// Agent `a` names `b`'s session in an update, a permission request and an elicitation: the
/// update is not logged on `b`'s session, the requests are refused, all are counted as garbage;
/// so too once `b` holds the session no more.
async fn an_agent_never_touches_another_agents_session(backend: Backend) {
    let b_dir = tempfile::tempdir().unwrap();
    let w = World::start(backend, two_agents(&b_dir.path().display().to_string(), "")).await;
    let gw = w.gw();
    let theirs = created(gw, json!({"cwd": "/tmp", "agent": "b"})).await["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mine = gw.create("/tmp").await;
    let garbage = gw.metric("acp_gateway_agent_garbage_total").await;
    let (status, _) = gw.prompt(&mine, &format!("/spoof {theirs} mine")).await;
    assert_eq!(status, 200);
    let said = Value::from(gw.history(&mine).await).to_string();
    assert!(said.contains("spoof: refused -32602"), "{said}");
    assert!(said.contains("spoof: elicitation refused -32602"), "{said}");
    let theirs_said = Value::from(gw.history(&theirs).await).to_string();
    assert!(!theirs_said.contains("spoofed"), "{theirs_said}");
    assert!(gw.json(&format!("/sessions/{theirs}/permissions")).await[0].is_null());
    assert!(gw.json(&format!("/sessions/{theirs}/elicitations")).await[0].is_null());
    assert_eq!(
        gw.metric("acp_gateway_agent_garbage_total").await,
        garbage + 3.0
    );
    // Nor once it is held by no member (closed): it is still `b`'s.
    assert_eq!(gw.session_action(&theirs, "close").await.status(), 204);
    assert_eq!(gw.status(&theirs).await, "saved");
    let (status, _) = gw.prompt(&mine, &format!("/spoof {theirs} again")).await;
    assert_eq!(status, 200);
    let theirs_said = Value::from(gw.history(&theirs).await).to_string();
    assert!(!theirs_said.contains("spoofed"), "{theirs_said}");
    assert_eq!(
        gw.metric("acp_gateway_agent_garbage_total").await,
        garbage + 6.0
    );
    w.finish().await;
}

/// An agent that needs a sign-in nobody configured: 503 `agent-auth-required` (never a 5xx of
/// the gateway's or the agent's failing), naming what it offers; the other agent serves.
async fn an_agent_not_logged_in_names_its_auth_methods(backend: Backend) {
    let b_dir = tempfile::tempdir().unwrap();
    let opts = two_agents(
        &b_dir.path().display().to_string(),
        "ECHO_AGENT_AUTH=api-key",
    );
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let r = gw
        .post("/sessions", json!({"cwd": "/tmp", "agent": "b"}))
        .await;
    assert_eq!(r.status(), 503);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("agent-auth-required"),
        "{problem}"
    );
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("\"b\"") && detail.contains("api-key"),
        "{detail}"
    );
    assert_eq!(problem["authMethods"], json!(["api-key"]), "{problem}");
    assert_eq!(
        gw.json("/agents/b").await["authMethods"][0]["id"],
        "api-key"
    );
    created(gw, json!({"cwd": "/tmp", "agent": "a"})).await;
    w.finish().await;
}

/// None of the gateway's own settings (`ACP_GATEWAY_*`: its keys, its database URL) reach an
/// agent's process, which runs tools on a prompt's say; the agent's own environment still
/// sets any variable.
#[tokio::test]
async fn the_gateways_settings_never_reach_an_agent() {
    let opts = Options::default()
        .env("ACP_GATEWAY_REQUEST_TIMEOUT", "61")
        .args(&["--agent-env", "ACP_GATEWAY_GIVEN=yes"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let asked = "/env ACP_GATEWAY_REQUEST_TIMEOUT /env ACP_GATEWAY_GIVEN hi";
    assert_eq!(gw.prompt(&id, asked).await.0, 200);
    let said = Value::from(gw.history(&id).await).to_string();
    assert!(said.contains("ACP_GATEWAY_REQUEST_TIMEOUT unset"), "{said}");
    assert!(said.contains("ACP_GATEWAY_GIVEN=yes"), "{said}");
    w.finish().await;
}
