//! Faults a real agent causes — crashes, SIGKILL from outside, hangs, ignored cancels, garbage
//! on stdout, unanswered permission requests, logins, capacity, idle sessions, shutdown — each
//! driven through the echo agent's switches against the real gateway binary.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(member_killed_from_outside_mid_turn);

fn member_pid(agent: &Value, index: usize) -> u32 {
    agent["members"][index]["pid"].as_u64().expect("member pid") as u32
}

/// SIGKILL on a member mid-turn: the waiting prompt fails with 502 at once, the stream shows
/// `agent_exited` then `turn_ended` with the error, the member comes back, the session resumes.
async fn member_killed_from_outside_mid_turn(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let pid = gw.agent_pid().await;
    let mut sse = gw.events(&id, None).await;
    let waiter = gw.prompt_in_background(&id, "/hang");
    sse.until("turn_started").await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let r = waiter.await.unwrap().unwrap();
    let (status, body) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_eq!(status, 502, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("signal 9"),
        "{body}"
    );
    let events = sse.until("turn_ended").await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["agent_exited", "turn_ended"]);
    assert_eq!(events[0].data["signal"], 9);
    assert_eq!(events[1].data["error"]["status"], 502);
    assert_eq!(gw.status(&id).await, "saved");
    gw.wait_member_state("ready").await;
    assert_ne!(gw.agent_pid().await, pid);
    let (status, body) = gw.prompt(&id, "still here").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn"))
    );
    w.finish().await;
}

/// An agent that ignores session/cancel is restarted after --cancel-grace; cancel returns only
/// once the turn has ended.
#[tokio::test]
async fn ignored_cancel_restarts_the_member() {
    let opts = Options::default().args(&["--cancel-grace", "1"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let pid = gw.agent_pid().await;
    let mut sse = gw.events(&id, None).await;
    gw.prompt_async(&id, "/deaf").await;
    sse.until("turn_started").await;
    assert_eq!(gw.session_action(&id, "cancel").await.status(), 204);
    let events = sse.until("turn_ended").await;
    assert!(
        events.iter().any(|e| e.event == "agent_exited"),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap().data["error"]["status"], 502);
    assert_eq!(w.calls("session/cancel"), 1);
    let agent = gw.json("/agent").await;
    assert!(
        agent["members"][0]["lastError"]
            .as_str()
            .unwrap_or("")
            .contains("ignored session/cancel")
            || member_pid(&agent, 0) != pid,
        "{agent}"
    );
    gw.wait_member_state("ready").await;
    assert!(!pid_alive(pid));
    assert_eq!(gw.prompt(&id, "again").await.0, 200);
    w.finish().await;
}

/// A member that does not answer initialize in time is killed and replaced, and says why.
#[tokio::test]
async fn slow_initialize_is_killed_and_retried() {
    let opts = Options::default()
        .env("ECHO_AGENT_INIT_DELAY_MS", "30000")
        .arg("--init-timeout")
        .arg("1")
        .no_wait();
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    gw.wait_restarts(2).await;
    let error = gw.member_error().await;
    assert!(error.contains("initialize failed"), "{error}");
    let r = gw.get("/readyz").await;
    assert_eq!(r.status(), 503);
    w.finish().await;
}

/// A crash loop is reported, not spun: the member backs off, /agent says crash_loop and
/// /readyz answers 503 saying why.
#[tokio::test]
async fn crash_loop_makes_the_gateway_unready() {
    let w = World::start(
        Backend::Sqlite,
        Options::default()
            .env("ECHO_AGENT_CRASH", "start")
            .no_wait(),
    )
    .await;
    let gw = w.gw();
    gw.wait_member_state("crash_loop").await;
    let restarts = gw.json("/agent").await["members"][0]["restarts"]
        .as_u64()
        .unwrap();
    assert!(
        (5..20).contains(&restarts),
        "backoff, not a spin: {restarts} restarts"
    );
    let r = gw.get("/readyz").await;
    assert_eq!(r.status(), 503);
    let p: Value = r.json().await.unwrap();
    assert!(
        p["detail"].as_str().unwrap().contains("crash-looping"),
        "{p}"
    );
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    w.finish().await;
}

/// Non-JSON lines, non-JSON-RPC objects, responses to unknown ids, over-long lines and an
/// update holding a number no f64 holds (`1e999`: JSON's grammar allows it, no value the
/// gateway reads it into does) are counted and skipped; the member keeps running and the turn
/// completes.
#[tokio::test]
async fn garbage_from_the_agent_is_counted_and_survived() {
    let opts = Options::default().args(&["--max-line-bytes", "4096"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let pid = gw.agent_pid().await;
    let id = gw.create("/tmp").await;
    let (status, body) = gw.prompt(&id, "/garbage /overflow still fine").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn"))
    );
    let metrics = gw.get("/metrics").await.text().await.unwrap();
    let garbage: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("acp_gateway_agent_garbage_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(garbage, 5, "{metrics}");
    let agent = gw.json("/agent").await;
    assert_eq!(member_pid(&agent, 0), pid);
    assert_eq!(agent["members"][0]["restarts"], 0);
    let turn = gw.first_turn(&id).await;
    assert_eq!(chunk_text(&turn), "still fine");
    assert!(turn.iter().all(|e| e.event != "plan"), "{turn:?}");
    w.finish().await;
}

/// Unanswered permission requests fail closed after --permission-timeout (a reject option).
#[tokio::test]
async fn permission_timeout_fails_closed() {
    let opts = Options::default().args(&["--permission-timeout", "1"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let (status, _) = gw.prompt(&id, "/permission x").await;
    assert_eq!(status, 200);
    let events = gw.first_turn(&id).await;
    let resolved = find_event(&events, "permission_resolved");
    assert_eq!(resolved.data["reason"], "timeout");
    assert_eq!(
        resolved.data["outcome"],
        json!({"outcome": "selected", "optionId": "reject"})
    );
    assert!(chunk_text(&events).starts_with("permission: reject"));
    w.finish().await;
}

/// --permission-policy answers without a client, and says so in the stream.
#[tokio::test]
async fn permission_policies_answer_headlessly() {
    for (policy, option) in [("allow", "allow"), ("reject", "reject")] {
        let opts = Options::default().args(&["--permission-policy", policy]);
        let (w, id) = World::with_session(Backend::Sqlite, opts).await;
        let gw = w.gw();
        assert_eq!(gw.prompt(&id, "/permission x").await.0, 200);
        let events = gw.first_turn(&id).await;
        let resolved = find_event(&events, "permission_resolved");
        assert_eq!(resolved.data["reason"], "policy");
        assert_eq!(resolved.data["outcome"]["optionId"], option);
        assert!(chunk_text(&events).starts_with(&format!("permission: {option}")));
        w.finish().await;
    }
}

/// Per-member and global caps on live sessions answer 503 with Retry-After; freeing a slot
/// makes room again.
#[tokio::test]
async fn capacity_caps_answer_503() {
    let opts = Options::default()
        .pool(2)
        .args(&["--max-sessions-per-member", "1"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    gw.wait_members_ready().await;
    let a = gw.create("/tmp").await;
    let _b = gw.create("/tmp").await;
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(gw.session_action(&a, "close").await.status(), 204);
    let _c = gw.create("/tmp").await;
    w.finish().await;

    let opts = Options::default().args(&["--max-sessions", "1"]);
    let (w, a) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    assert_eq!(
        gw.post("/sessions", json!({"cwd": "/tmp"})).await.status(),
        503
    );
    assert_eq!(gw.session_action(&a, "close").await.status(), 204);
    let b = gw.create("/tmp").await;
    // A saved session cannot be resumed while the cap is reached either.
    let r = gw
        .post(&format!("/sessions/{a}/prompt"), json!({"text": "x"}))
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(gw.delete(&format!("/sessions/{b}")).await.status(), 204);
    assert_eq!(gw.prompt(&a, "x").await.0, 200);
    w.finish().await;
}

/// Live sessions idle longer than --idle-timeout are closed (the agent supports close).
#[tokio::test]
async fn idle_sessions_are_closed() {
    let opts = Options::default().args(&["--idle-timeout", "1"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let sid = id.clone();
    gw.wait_until(move |g| {
        let sid = sid.clone();
        async move { g.status(&sid).await == "saved" }
    })
    .await;
    assert_eq!(w.calls("session/close"), 1);
    assert_eq!(gw.prompt(&id, "wake up").await.0, 200);
    assert_eq!(gw.status(&id).await, "live");
    w.finish().await;
}

/// authMethods are shown; without --agent-auth-method the agent's -32000 is a 503
/// agent-auth-required naming them; with it every member authenticates at start; a method the agent does
/// not offer keeps the pool unready, saying why.
#[tokio::test]
async fn agent_login() {
    let w = World::start(
        Backend::Sqlite,
        Options::default().env("ECHO_AGENT_AUTH", "echo-login"),
    )
    .await;
    let gw = w.gw();
    let agent = gw.json("/agent").await;
    assert_eq!(agent["initialize"]["authMethods"][0]["id"], "echo-login");
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 503);
    let p: Value = r.json().await.unwrap();
    assert!(
        p["type"].as_str().unwrap().ends_with("agent-auth-required"),
        "{p}"
    );
    assert_eq!(p["authMethods"], json!(["echo-login"]), "{p}");
    w.finish().await;

    let opts = Options::default()
        .env("ECHO_AGENT_AUTH", "echo-login")
        .args(&["--agent-auth-method", "echo-login"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    assert_eq!(w.gw().prompt(&id, "hi").await.0, 200);
    assert_eq!(w.calls("authenticate"), 1);
    w.finish().await;

    let opts = Options::default()
        .env("ECHO_AGENT_AUTH", "echo-login")
        .args(&["--agent-auth-method", "other"])
        .no_wait();
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    gw.wait_restarts(1).await;
    let error = gw.member_error().await;
    assert!(error.contains("does not offer auth method"), "{error}");
    assert_eq!(gw.get("/readyz").await.status(), 503);
    w.finish().await;
}

/// --agent-env and --agent-cwd reach the agent processes.
#[tokio::test]
async fn agent_environment_and_cwd() {
    let cwd = tempfile::tempdir().unwrap();
    let cwd_path = cwd.path().canonicalize().unwrap();
    let opts = Options::default()
        .args(&["--agent-env", "GREETING=hello there"])
        .args(&["--agent-cwd", cwd_path.to_str().unwrap()]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "/env GREETING /pwd").await.0, 200);
    let text = chunk_text(&gw.first_turn(&id).await);
    assert!(text.contains("GREETING=hello there"), "{text}");
    assert!(text.contains(cwd_path.to_str().unwrap()), "{text}");
    w.finish().await;
}

/// SIGTERM: running turns are cancelled and live sessions closed before the agents go; agents
/// that ignore SIGTERM are killed; no process the gateway started survives; exit status 0.
#[tokio::test]
async fn shutdown_cancels_closes_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .pool(2)
        .env("ECHO_AGENT_SPAWN_CHILD", "1")
        .env("ECHO_AGENT_IGNORE_TERM", "1")
        .env(
            "ECHO_AGENT_CHILD_PID_FILE",
            dir.path().join("children").to_str().unwrap(),
        );
    let mut w = World::start(Backend::Sqlite, opts).await;
    let marker = w.dir.path().join("agent").to_string_lossy().into_owned();
    let gw = w.gw();
    gw.wait_members_ready().await;
    let running = gw.create("/tmp").await;
    let idle = gw.create("/tmp").await;
    let mut sse = gw.events(&running, None).await;
    gw.prompt_async(&running, "/hang").await;
    sse.until("turn_started").await;
    let children: Vec<u32> = std::fs::read_to_string(dir.path().join("children"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(children.len(), 2, "each member spawned a grandchild");
    // gateway + 2 agents + 2 grandchildren
    assert_eq!(
        processes_with_env(&marker).len(),
        5,
        "{:?}",
        processes_with_env(&marker)
    );

    let gateway = w.gw.take().unwrap();
    let status = gateway.stop().await;
    assert!(status.success(), "exit status {status}");
    assert_eq!(
        processes_with_env(&marker),
        Vec::<u32>::new(),
        "processes left behind"
    );
    assert!(children.iter().all(|p| !pid_alive(*p)));
    assert_eq!(w.calls("session/cancel"), 1);
    assert_eq!(
        w.calls("session/close"),
        2,
        "both live sessions were closed"
    );

    // The cancelled turn's end is in the log.
    w.restart().await;
    let history = w.gw().json(&format!("/sessions/{running}/history")).await;
    let last = last_event(&history);
    assert_eq!(
        (last["event"].as_str(), last["data"]["stopReason"].as_str()),
        (Some("turn_ended"), Some("cancelled"))
    );
    let _ = idle;
    w.finish().await;
}
