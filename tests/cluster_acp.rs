//! ACP clients of gateway replicas on one PostgreSQL database: a client on one replica drives
//! a session another holds, and neither an SDK client nor `acp-gateway connect` needs a sticky
//! balancer, also while a replica is SIGKILLed and another started. Ignored, with that reason,
//! when built without `DATABASE_URL`.

use crate::support;

use serde_json::{Value, json};
use support::acp::{AcpClient, agent_text, replica_away};
use support::balancer::RoundRobin;
use support::cluster::{beating, sessions_held, three_replicas};
use support::*;

/// An ACP client connected to one replica drives a session that another replica holds live:
/// its prompts, a permission its turn asks and its close are carried out on the holder (which
/// keeps the session), and the client reads the turns' updates, each once, from the log.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn an_acp_client_drives_a_session_another_replica_holds() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let id = b.create_here("/tmp").await;
    let held = |agent: Value| agent["members"][0]["sessions"].as_u64().unwrap();
    let mut acp = AcpClient::start(&a.base, None, false).await;
    acp.call("session/resume", json!({"sessionId": id, "cwd": "/tmp"}))
        .await
        .unwrap();

    let answer = acp.prompt(&id, "hello from a").await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let text = agent_text(&acp.drain_notes());
    assert_eq!(text, "hello from a");
    assert_eq!(
        (held(a.json("/agent").await), held(b.json("/agent").await)),
        (0, 1),
        "the session stays on b"
    );

    // A permission the turn on b asks is answered by the client on a.
    answer_a_permission(&mut acp, &id).await;

    // A permission already pending on b when a client attaches through a is asked of it.
    let turn = b.prompt_in_background(&id, "/permission again");
    b.wait_until(|g| {
        let id = id.clone();
        async move { g.json(&format!("/sessions/{id}/permissions")).await[0].is_object() }
    })
    .await;
    let mut late = AcpClient::start(&a.base, None, true).await;
    late.call("session/resume", json!({"sessionId": id, "cwd": "/tmp"}))
        .await
        .unwrap();
    let asked = late.next_asked().await;
    assert_eq!(asked.method, "session/request_permission");
    asked
        .responder
        .respond(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}))
        .unwrap();
    let turn = turn.await.unwrap().unwrap();
    assert_eq!(turn.status(), 200);
    late.close().await;
    acp.drain_notes();

    acp.call("session/close", json!({"sessionId": id}))
        .await
        .unwrap();
    assert_eq!(b.status(&id).await, "saved");
    assert_eq!(held(b.json("/agent").await), 0);
    acp.close().await;
    c.stop().await;
    w.finish().await;
}

/// `acp-gateway connect` (an editor's bridge) through the round-robin balancer: the editor's
/// session is prompted; the replica holding it (and the bridge's connection) is SIGKILLed and
/// another started at its address, as an orchestrator restarts a pod. The bridge connects again
/// and resumes the session, which is served once the dead replica's lease has expired; each
/// prompt's updates reach the editor once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn the_editor_bridge_rides_out_a_replica_behind_a_plain_balancer() {
    let (mut w, b, c) = three_replicas(beating()).await;
    let mut replicas = vec![w.gw.take().unwrap(), b, c];
    let bases: Vec<String> = replicas.iter().map(|g| g.base.clone()).collect();
    let balancer = RoundRobin::start(&bases.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let log = w.dir.path().join("connect.log");
    let (mut bridge, mut editor, _) = support::acp::bridge(&balancer.base, None, &log).await;
    let id = editor.new_session("/tmp").await;
    let answer = editor.prompt(&id, "before the kill").await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    assert_eq!(agent_text(&editor.drain_notes()), "before the kill");

    let mut holder = None;
    for (i, g) in replicas.iter().enumerate() {
        if g.json("/agent").await["members"][0]["sessions"] == 1 {
            holder = Some(i);
        }
    }
    let holder = holder.expect("a replica holds the session");
    replicas[holder].kill().await;
    let address = bases[holder].trim_start_matches("http://").to_owned();
    let opts = Options::default()
        .args(&["--heartbeat-interval", "1"])
        .listen(&address);
    replicas[holder] = Gateway::spawn(&w.db.url, w.dir.path(), &opts).await;

    // Answered by the bridge while it connects again, or by a replica while the dead one's
    // lease runs, until the session is served again.
    let answer = editor
        .prompt_through_reconnect(&id, "after the kill", &log)
        .await;
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let text = agent_text(&editor.drain_notes());
    assert!(text.ends_with("after the kill"), "{text}");
    assert_eq!(text.matches("after the kill").count(), 1, "{text}");

    editor.close().await;
    let _ = tokio::time::timeout(PATIENCE, bridge.wait()).await;
    for g in replicas {
        g.stop().await;
    }
    w.finish().await;
}

/// An ACP client over the HTTP transport behind a balancer with no stickiness (each request on
/// a connection of its own, sent to the next live replica, so its POSTs and its event stream
/// land on different replicas). It creates a session, and drives one that another replica
/// holds: a prompt, a mode switch, a permission answered, a turn cancelled. That replica is
/// SIGKILLed and another started at its address, as an orchestrator restarts a pod: the
/// client's own session is prompted meanwhile, and once the dead replica's lease has expired
/// the other is prompted, switched and asked again. Every update reaches the client once, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn an_acp_client_needs_no_sticky_balancer() {
    let opts = beating().env("ECHO_AGENT_CONTROLS", "modes");
    let (mut w, b, c) = three_replicas(opts.clone()).await;
    let mut replicas = vec![w.gw.take().unwrap(), b, c];
    let bases: Vec<&str> = replicas.iter().map(|g| g.base.as_str()).collect();
    let balancer = RoundRobin::start(&bases).await;
    let mut acp = AcpClient::connect(no_sticky_transport(&balancer)).await;
    acp.initialize().await.unwrap();
    let own = acp.new_session("/tmp").await;
    let all: Vec<&Gateway> = replicas.iter().collect();
    let home = sessions_held(&all).await.iter().position(|&n| n == 1);
    let holder = (home.expect("one replica holds the new session") + 1) % 3;
    let id = replicas[holder].create_here("/tmp").await;
    acp.call("session/resume", json!({"sessionId": id, "cwd": "/tmp"}))
        .await
        .unwrap();

    for text in ["one two three", "four five"] {
        let answer = acp.prompt(&id, text).await.unwrap();
        assert_eq!(answer["stopReason"], "end_turn", "{answer}");
        assert_eq!(agent_text(&acp.drain_notes()), text);
    }
    acp.call(
        "session/set_mode",
        json!({"sessionId": id, "modeId": "code"}),
    )
    .await
    .unwrap();
    assert_eq!(mode_of(&replicas[home.unwrap()], &id).await, "code");
    answer_a_permission(&mut acp, &id).await;
    let turn = acp.prompt_in_background(&id, "/hang");
    let path = format!("/sessions/{id}/status");
    replicas[holder]
        .wait_until(|g| {
            let path = path.clone();
            async move { g.json(&path).await["activity"] == "running" }
        })
        .await;
    acp.notify("session/cancel", json!({"sessionId": id}));
    let answer = turn.await.unwrap().unwrap();
    assert_eq!(answer["stopReason"], "cancelled", "{answer}");
    acp.drain_notes();

    // The client's streams may have gone through the replica killed: then its connection ends
    // (the official transport does not resume a stream), and it connects again and resumes.
    replicas[holder].kill().await;
    let sessions = [own.as_str(), id.as_str()];
    let answer =
        prompt_through_outage(&mut acp, &balancer, &sessions, &own, "while one is down").await;
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    assert_eq!(agent_text(&acp.drain_notes()), "while one is down");
    let opts = opts.listen(replicas[holder].address());
    replicas[holder] = Gateway::spawn(&w.db.url, w.dir.path(), &opts).await;
    let answer = prompt_through_outage(&mut acp, &balancer, &sessions, &id, "after the kill").await;
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    assert_eq!(agent_text(&acp.drain_notes()), "after the kill");
    assert_eq!(mode_of(&replicas[home.unwrap()], &id).await, "code");
    acp.call(
        "session/set_mode",
        json!({"sessionId": id, "modeId": "ask"}),
    )
    .await
    .unwrap();
    assert_eq!(mode_of(&replicas[holder], &id).await, "ask");
    answer_a_permission(&mut acp, &id).await;
    for id in [&own, &id] {
        acp.call("session/close", json!({"sessionId": id}))
            .await
            .unwrap();
    }
    assert!(
        balancer
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 10,
        "the client's requests went over connections of their own"
    );
    acp.close().await;
    for g in replicas {
        g.stop().await;
    }
    w.finish().await;
}

/// `/permission done` on `id`: the permission asked is allowed, and the turn's text says so,
/// once.
async fn answer_a_permission(acp: &mut AcpClient, id: &str) {
    let prompt = acp.prompt_in_background(id, "/permission done");
    let asked = acp.next_asked().await;
    assert_eq!(asked.method, "session/request_permission");
    assert_eq!(asked.params["sessionId"], id);
    asked
        .responder
        .respond(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}))
        .unwrap();
    let answer = prompt.await.unwrap().unwrap();
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    assert_eq!(agent_text(&acp.drain_notes()), "permission: allowdone");
}

/// The current mode of session `id`, as replica `g` reads it.
async fn mode_of(g: &Gateway, id: &str) -> Value {
    g.json(&format!("/sessions/{id}")).await["state"]["modes"]["currentModeId"].clone()
}

/// `text` prompted on `session` through `balancer` until answered, within PATIENCE: while the
/// session's replica cannot be reached (its lease runs) the prompt is refused and sent again
/// (refused otherwise, the test fails at once); once the client's connection has ended it
/// connects again and resumes `sessions`.
async fn prompt_through_outage(
    acp: &mut AcpClient,
    balancer: &RoundRobin,
    sessions: &[&str],
    session: &str,
    text: &str,
) -> Value {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        assert!(std::time::Instant::now() < deadline, "{text:?} answered");
        match acp.prompt(session, text).await {
            Ok(answer) => return answer,
            // The connection ended: as the client learns it, or as it tries to send on it.
            Err(e)
                if e.data.as_ref().is_some_and(|d| {
                    d["reason"] == "connection_terminated"
                        || d.as_str()
                            .is_some_and(|s| s.starts_with("failed to send outgoing request"))
                }) =>
            {
                eprintln!("{text:?}: the connection ended; connecting again");
                let fresh = AcpClient::connect(no_sticky_transport(balancer)).await;
                fresh.initialize().await.unwrap();
                for id in sessions {
                    fresh
                        .call("session/resume", json!({"sessionId": id, "cwd": "/tmp"}))
                        .await
                        .unwrap();
                }
                std::mem::replace(acp, fresh).close().await;
            }
            Err(e) => assert!(
                replica_away(&e),
                "{text:?} refused, not for the outage: {e:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The HTTP transport to `balancer` with every request on a connection of its own, as to a
/// balancer that picks a replica per request.
fn no_sticky_transport(balancer: &RoundRobin) -> agent_client_protocol_http::HttpClient {
    agent_client_protocol_http::HttpClient::builder(balancer.base.clone())
        .configure_http(|h| h.no_proxy().pool_max_idle_per_host(0))
        .build()
        .unwrap()
}

/// A replica started since another's last heartbeat is not in that one's view yet: a
/// connection the new replica holds is still reached through the other, which finds the new
/// replica in the registry instead of answering that it knows no such connection (which ends
/// the client's connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_connection_on_a_replica_newer_than_the_view_is_reached() {
    // `a` beats once a minute: it does not see `b` before the test ends.
    let slow = Options::default().args(&["--heartbeat-interval", "60"]);
    let w = World::start(Backend::Postgres, slow).await;
    let a = w.gw();
    let b = Gateway::spawn(&w.db.url, w.dir.path(), &Options::default()).await;
    let seen_by_a = || async { a.json("/agent").await["replicas"].as_array().unwrap().len() };
    assert_eq!(seen_by_a().await, 1, "a has not seen b yet");
    // The balancer's first connection goes to `b`, which then holds the ACP connection; the
    // later requests alternate between `a` and `b`.
    let balancer = RoundRobin::start(&[&b.base, &a.base]).await;
    let mut acp = AcpClient::connect(no_sticky_transport(&balancer)).await;
    acp.initialize().await.unwrap();
    let id = acp.new_session("/tmp").await;
    for text in ["one two", "three"] {
        let answer = acp.prompt(&id, text).await.unwrap();
        assert_eq!(answer["stopReason"], "end_turn", "{answer}");
        assert_eq!(agent_text(&acp.drain_notes()), text);
    }
    assert_eq!(seen_by_a().await, 1, "a still has not seen b");
    acp.close().await;
    drop(b);
    w.finish().await;
}
