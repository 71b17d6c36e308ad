//! The gateway as operators and careless clients meet it: agent info, health, readiness,
//! metrics, docs, problem+json for bad input, capabilities the agent lacks, shutdown.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(missing_capabilities_answer_honestly);

#[tokio::test]
async fn agent_health_metrics_docs_and_spec() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let agent = gw.json("/agent").await;
    assert_eq!(agent["initialize"]["agentInfo"]["name"], "echo-agent");
    assert_eq!(agent["initialize"]["protocolVersion"], 1);
    assert_eq!(
        agent["initialize"]["capabilities"],
        json!({"load": true, "list": true, "resume": true, "close": true, "delete": true, "status": false, "setTitle": false, "archive": false, "fork": false, "logout": false})
    );
    assert_eq!(agent["members"][0]["state"], "ready");
    assert!(agent["members"][0]["pid"].as_u64().is_some());

    assert_eq!(gw.get("/healthz").await.status(), 200);
    assert_eq!(gw.get("/readyz").await.status(), 200);
    let id = gw.create("/tmp").await;
    assert_eq!(gw.prompt(&id, "a b").await.0, 200);
    let metrics = gw.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("acp_gateway_members_ready 1"), "{metrics}");
    assert!(metrics.contains("acp_gateway_sessions_live 1"), "{metrics}");
    assert!(
        metrics.contains("acp_gateway_turns_started_total 1"),
        "{metrics}"
    );
    for line in [
        r#"acp_gateway_http_requests_total{method="POST",route="/sessions",status="201"} 1"#,
        r#"acp_gateway_http_requests_total{method="POST",route="/sessions/{id}/prompt",status="200"} 1"#,
        r#"acp_gateway_members_by_state{state="ready"} 1"#,
        r#"acp_gateway_upstream_call_duration_seconds_count{method="session/new",outcome="ok"} 1"#,
        r#"acp_gateway_upstream_call_duration_seconds_count{method="session/prompt",outcome="ok"} 1"#,
        r#"acp_gateway_http_request_duration_seconds_count{method="POST",route="/sessions"} 1"#,
    ] {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }
    assert!(
        metrics.contains(r#"acp_gateway_http_request_duration_seconds_bucket{method="POST",route="/sessions",le="0.001"}"#),
        "latency is a histogram: {metrics}"
    );

    let docs = gw.get("/docs").await;
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("href=\"openapi.json\""));
    let served: Value = gw.json("/openapi.json").await;
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(served, committed, "the served spec is the committed one");
    let r = gw.get("/healthz").await;
    assert!(r.headers().contains_key("x-request-id"));
    w.finish().await;
}

#[tokio::test]
async fn bad_input_gets_problem_json() {
    let opts = Options::default().args(&["--max-body-bytes", "1024"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let check = |r: reqwest::Response, status: u16| async move {
        assert_eq!(r.status(), status);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["status"], status);
        assert!(
            p["type"]
                .as_str()
                .unwrap()
                .starts_with("urn:acp-gateway:problem:")
        );
        assert!(p["title"].is_string() && p["detail"].is_string());
        p
    };
    check(gw.get("/nope").await, 404).await;
    check(gw.http.put(gw.url("/sessions")).send().await.unwrap(), 405).await;
    let big =
        json!({"cwd": "/tmp", "mcpServers": [], "additionalDirectories": ["/x".repeat(1000)]});
    check(gw.post("/sessions", big).await, 413).await;
    check(
        gw.http
            .post(gw.url("/sessions"))
            .header("content-type", "application/json")
            .body("{nope")
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    check(
        gw.http
            .post(gw.url("/sessions"))
            .body("{}")
            .send()
            .await
            .unwrap(),
        415,
    )
    .await;
    check(
        gw.post("/sessions", json!({"cwd": "/tmp/../etc"})).await,
        422,
    )
    .await;
    check(
        gw.post("/sessions", json!({"cwd": "/tmp", "extra": 1}))
            .await,
        422,
    )
    .await;
    let long_id = "x".repeat(300);
    check(gw.get(&format!("/sessions/{long_id}")).await, 400).await;
    check(gw.get("/sessions/a%20b/status").await, 400).await;
    check(gw.get("/sessions/sess_unknown").await, 404).await;
    assert_eq!(
        gw.delete("/sessions/sess_unknown").await.status(),
        204,
        "delete is idempotent"
    );
    check(
        gw.post("/sessions/sess_unknown/cancel", json!({})).await,
        404,
    )
    .await;
    w.finish().await;
}

/// An agent that advertises nothing optional: delete still removes from the list (without
/// calling session/delete), status answers from the cache, close and resume say 501.
async fn missing_capabilities_answer_honestly(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_CAPS", "");
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "x").await.0, 200);
    let r = gw.session_action(&id, "close").await;
    assert_eq!(r.status(), 501);
    let p: Value = r.json().await.unwrap();
    assert!(
        p["type"]
            .as_str()
            .unwrap()
            .ends_with("not-supported-by-agent")
    );
    assert_eq!(gw.status(&id).await, "live");
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    assert_eq!(w.calls("session/delete") + w.calls("session/close"), 0);
    assert!(
        gw.json("/sessions").await["sessions"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(gw.status(&id).await, "not_found");

    // After a restart nothing is live; without resume or load a prompt cannot attach.
    let id2 = gw.create("/tmp").await;
    let mut w = w;
    w.restart().await;
    let gw = w.gw();
    assert_eq!(gw.status(&id2).await, "saved");
    let r = gw
        .post(&format!("/sessions/{id2}/prompt"), json!({"text": "x"}))
        .await;
    assert_eq!(r.status(), 501);
    assert_eq!(gw.session_action(&id2, "resume").await.status(), 501);
    w.finish().await;
}

/// SIGTERM ends open SSE streams and waiting turns, and leaves no agent process behind.
#[tokio::test]
async fn shutdown_leaves_no_agent_processes() {
    let mut w = World::start(Backend::Sqlite, Options::default().pool(3)).await;
    let gw = w.gw();
    gw.wait_members_ready().await;
    let pids: Vec<u32> = gw.json("/agent").await["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|p| pid_alive(*p)));
    let id = gw.create("/tmp").await;
    let mut sse = gw.events(&id, None).await;
    gw.prompt_async(&id, "/hang").await;
    sse.until("turn_started").await;
    let waiter = gw.prompt_in_background(&id, "x");
    w.gw.take().unwrap().stop().await;
    for pid in &pids {
        assert!(!pid_alive(*pid), "agent {pid} survived the gateway");
    }
    // The open stream ended instead of hanging.
    while sse.next().await.is_some() {}
    let _ = waiter.await.unwrap();
    w.finish().await;
}

/// SQLite stays single-replica: a second gateway on the same database file refuses to serve,
/// says why, and leaves the first one working; once the first has stopped, another may start.
#[tokio::test]
async fn a_second_gateway_on_the_same_sqlite_file_is_refused() {
    let mut w = World::start(Backend::Sqlite, Options::default()).await;
    let id = w.gw().create("/tmp").await;
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .arg("--agent")
        .arg(echo_agent())
        .args(["--listen", "127.0.0.1:0", "--database-url", &w.db.url])
        .env("ECHO_AGENT_DIR", w.dir.path().join("agent-2"))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), second)
        .await
        .expect("the second gateway exits instead of serving")
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("another gateway is already serving the SQLite database"),
        "{stderr}"
    );
    assert_eq!(w.gw().get("/readyz").await.status(), 200);
    w.restart().await;
    assert_eq!(
        w.gw().get(&format!("/sessions/{id}/status")).await.status(),
        200
    );
    w.finish().await;
}

/// Replicas sharing one PostgreSQL database see each other in `GET /agent` and `/metrics`: each
/// registers with the address it serves on and its live sessions; one that stops cleanly
/// leaves the view, one killed outright is shown as not live once three heartbeats are missed.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn replicas_on_one_database_see_each_other() {
    async fn replicas(g: &Gateway) -> Vec<Value> {
        g.json("/agent").await["replicas"]
            .as_array()
            .unwrap()
            .clone()
    }
    async fn metrics(g: &Gateway) -> String {
        g.get("/metrics").await.text().await.unwrap()
    }
    let opts = Options {
        args: vec!["--heartbeat-interval".into(), "1".into()],
        ..Options::default()
    };
    let w = World::start(Backend::Postgres, opts.clone()).await;
    let a = w.gw();
    let (b_dir, c_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = Gateway::spawn(&w.db.url, b_dir.path(), &opts).await;
    let mut c = Gateway::spawn(&w.db.url, c_dir.path(), &opts).await;
    b.create("/tmp").await;

    // Every replica sees all three, live, itself under the address it serves on.
    for g in [a, &b, &c] {
        g.wait_until(|g| async move {
            let view = replicas(g).await;
            view.len() == 3 && view.iter().all(|r| r["live"] == true)
        })
        .await;
        let view = replicas(g).await;
        let this: Vec<&Value> = view.iter().filter(|r| r["this"] == true).collect();
        assert_eq!(this.len(), 1, "{view:?}");
        assert_eq!(this[0]["address"].as_str(), Some(g.base.as_str()));
    }
    // b's live session shows in a's view once b has beaten since creating it.
    let b_base = b.base.clone();
    a.wait_until(|g| {
        let b_base = b_base.clone();
        async move {
            replicas(g)
                .await
                .iter()
                .any(|r| r["address"] == b_base.as_str() && r["sessionsLive"] == 1)
        }
    })
    .await;
    assert!(metrics(a).await.contains("acp_gateway_replicas_live 3"));

    // A clean stop unregisters; a kill leaves a row that stops being live.
    assert!(b.stop().await.success());
    c.kill().await;
    let c_base = c.base.clone();
    a.wait_until(|g| {
        let c_base = c_base.clone();
        async move {
            let view = replicas(g).await;
            view.len() == 2
                && view
                    .iter()
                    .any(|r| r["address"] == c_base.as_str() && r["live"] == false)
        }
    })
    .await;
    let metrics = metrics(a).await;
    assert!(metrics.contains("acp_gateway_replicas 2"), "{metrics}");
    assert!(metrics.contains("acp_gateway_replicas_live 1"), "{metrics}");
    w.finish().await;
}
