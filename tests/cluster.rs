//! Gateway replicas on different loopback ports sharing one PostgreSQL database (and one agent
//! state directory, as agents on one host share their home): any replica answers for any
//! session, also of an agent it does not run, and a replica killed mid-turn loses no stored
//! event. Ignored, with that reason, when built without `DATABASE_URL`.

use crate::support;

use serde_json::Value;
use support::cluster::{beating, sessions_held, three_replicas};
use support::*;

fn seqs(events: &[SseEvent]) -> Vec<i64> {
    events.iter().map(|e| e.id).collect()
}

/// A session created through one replica is prompted, listed, probed, streamed, cancelled
/// and deleted through the others.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn any_replica_serves_any_session() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let id = a.create("/tmp").await;
    let mut stream = c.events(&id, Some(0)).await;

    let (status, body) = b.prompt(&id, "hello from b").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{body}"
    );
    let turn = stream.until("turn_ended").await;
    let mut streamed = turn.clone();
    assert_eq!(chunk_text(&turn), "hello from b");
    assert_eq!(c.status(&id).await, "live");
    let view = b.json(&format!("/sessions/{id}")).await;
    assert_eq!(
        (view["status"].as_str(), view["title"].as_str()),
        (Some("live"), Some("Echo: hello from b"))
    );
    // Listed through a replica that does not hold it: live, as it is on a.
    let listed = c.json("/sessions").await;
    assert!(
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["sessionId"] == id.as_str() && s["status"] == "live"),
        "{listed}"
    );
    // The session stays on the replica that created it: a's pool holds it, b's and c's do not.
    let held = |agent: Value| agent["members"][0]["sessions"].as_u64().unwrap();
    assert_eq!(held(a.json("/agent").await), 1);
    assert_eq!(
        held(b.json("/agent").await) + held(c.json("/agent").await),
        0
    );

    // A running turn is cancelled through another replica.
    b.prompt_async(&id, "/hang").await;
    streamed.extend(stream.until("turn_started").await);
    assert_eq!(c.session_action(&id, "cancel").await.status(), 204);
    let ended = stream.until("turn_ended").await;
    assert_eq!(ended.last().unwrap().data["stopReason"], "cancelled");
    streamed.extend(ended);
    assert_eq!(
        positions(&streamed),
        a.logged(&id).await,
        "the stream on c is the log, once, in order"
    );

    assert_eq!(c.delete(&format!("/sessions/{id}")).await.status(), 204);
    stream.until("session_deleted").await;
    assert_eq!(b.get(&format!("/sessions/{id}")).await.status(), 404);
    b.stop().await;
    c.stop().await;
    w.finish().await;
}

/// A replica that has answered the session list before lists a session another replica
/// created: its page cache follows the other replicas' writes (before, it listed none until it
/// wrote something itself). How long that took is printed, not asserted: the machine's load
/// decides it.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_replica_lists_what_another_created() {
    let (w, b, c) = three_replicas(beating()).await;
    let listed = |page: &Value, id: &str| {
        page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["sessionId"] == id)
    };
    let first = b.json("/sessions").await;
    assert_eq!(first["sessions"].as_array().unwrap().len(), 0, "{first}");
    let id = w.gw().create("/tmp").await;
    let created = std::time::Instant::now();
    loop {
        let page = b.json("/sessions").await;
        if listed(&page, &id) {
            eprintln!("b listed it {:?} after a created it", created.elapsed());
            break;
        }
        assert!(
            created.elapsed() < PATIENCE,
            "{PATIENCE:?} after a created {id}, b still lists {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    b.stop().await;
    c.stop().await;
    w.finish().await;
}

/// The replica holding a session is killed mid-turn. A client streaming from another replica
/// gets every stored event once and then `agent_exited` when the dead replica's lease expires;
/// a client reconnecting to a third with `Last-Event-ID` continues exactly; the next prompt
/// resumes the session on a live replica.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_replica_killed_mid_turn_loses_no_stored_event() {
    let (w, mut b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let id = b.create("/tmp").await;
    let mut watcher = a.events(&id, Some(0)).await;
    c.prompt_async(&id, "/chunks 400 /delay 20").await;
    let mut seen = watcher.until("agent_message_chunk").await;
    for _ in 0..20 {
        seen.push(watcher.next().await.unwrap());
    }
    b.kill().await;

    seen.extend(watcher.until("agent_exited").await);
    let exited = seen.last().unwrap();
    assert_eq!(exited.data["member"], Value::Null, "{:?}", exited.data);
    // The turn the dead replica was running ends, with an error, in the log.
    seen.extend(watcher.until("turn_ended").await);
    let ended = seen.last().unwrap();
    assert_eq!(ended.data["error"]["status"], 502, "{:?}", ended.data);
    assert_eq!(
        positions(&seen),
        c.logged(&id).await,
        "every stored event, once, in order"
    );
    assert_eq!(seqs(&seen), (1..=seen.len() as i64).collect::<Vec<_>>());

    // Reconnecting elsewhere from the middle continues exactly.
    let middle = seen[seen.len() / 2].id;
    let mut resumed = c.events(&id, Some(middle)).await;
    let rest = resumed.until("turn_ended").await;
    assert_eq!(
        seqs(&rest),
        (middle + 1..=seen.len() as i64).collect::<Vec<_>>()
    );

    assert_eq!(a.status(&id).await, "saved");
    let (status, body) = c.prompt(&id, "still here").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{body}"
    );
    assert_eq!(a.status(&id).await, "live");
    c.stop().await;
    w.finish().await;
}

/// SIGSTOPs `holder` and waits until `watcher` finds session `id` taken over (its log has
/// `agent_exited`), once the stopped replica's lease (three heartbeats) has run out; the pid to
/// SIGCONT.
async fn stall_until_taken_over(holder: &Gateway, watcher: &Gateway, id: &str) -> nix::unistd::Pid {
    let pid = nix::unistd::Pid::from_raw(holder.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    watcher
        .wait_until(|g| async move {
            g.logged(id)
                .await
                .iter()
                .any(|(_, kind)| kind == "agent_exited")
        })
        .await;
    pid
}

/// A replica that stops beating for longer than its lease (SIGSTOP) while it holds a session
/// finds, when it runs again, that another replica took the session over, and lets go of it:
/// the session never runs on two replicas; the next prompt, through any replica, is served by
/// one.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_replica_that_stalled_past_its_lease_lets_go_of_what_was_taken() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let id = b.create_here("/tmp").await;
    let (status, body) = b.prompt(&id, "on b").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sessions_held(&[a, &b, &c]).await, [0, 1, 0]);
    let pid = stall_until_taken_over(&b, a, &id).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    b.wait_until(|g| async move { sessions_held(&[g]).await == [0] })
        .await;
    let (status, body) = b.prompt(&id, "after the stall").await;
    assert_eq!(status, 200, "{body}");
    let held = sessions_held(&[a, &b, &c]).await;
    assert_eq!(held.iter().sum::<u64>(), 1, "held by one replica: {held:?}");
    b.stop().await;
    c.stop().await;
    w.finish().await;
}

/// A client gives up on a long turn it sent through c to b, which holds the session, and b
/// stalls (SIGSTOP) past its lease with that turn still running: another replica takes the
/// session over, and the client's next prompt, through a, is answered 200. So is every prompt
/// after it, through any replica, b first the moment it runs again: b, which holds the session
/// and runs the given-up turn until it lets go of them, sends the prompt to the new holder
/// (it answered 409 before, from the turn no client waited for any more).
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn after_a_stall_the_next_prompt_through_any_replica_is_answered() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let id = b.create_here("/tmp").await;
    let mut stream = a.events(&id, Some(0)).await;
    let given_up = c.prompt_in_background(&id, "/chunks 400 /delay 20");
    stream.until("agent_message_chunk").await;
    given_up.abort();
    let pid = stall_until_taken_over(&b, a, &id).await;
    let (status, body) = a.prompt(&id, "while b is stalled").await;
    assert_eq!(status, 200, "{body}");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    for (name, g) in [("b", &b), ("c", &c), ("a", a), ("b", &b)] {
        let (status, body) = g.prompt(&id, "next").await;
        assert_eq!(status, 200, "through {name}: {body}");
    }
    b.stop().await;
    c.stop().await;
    w.finish().await;
}

/// Once a dead replica's lease has expired, none of its sessions is held anywhere. As an
/// operator met it, with the default heartbeat (every 5 s, a 15 s lease): X is created and
/// prompted on a replica, then Y, and that replica is SIGKILLed. Once a prompt to Y through
/// another replica answers 200 (503 `replica-unavailable` before: the lease expired, Y was
/// claimed), X is probed through that replica and deleted through the third at once: never
/// 503, never forwarded to the dead one.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn once_a_dead_replicas_lease_expired_every_path_serves_its_sessions() {
    let (w, mut b, c) = three_replicas(Options::default()).await;
    let a = w.gw();
    let x = b.create_here("/tmp").await;
    let (status, body) = b.prompt(&x, "on b").await;
    assert_eq!(status, 200, "{body}");
    let y = b.create_here("/tmp").await;
    b.kill().await;
    let started = std::time::Instant::now();
    loop {
        let (status, body) = a.prompt(&y, "after the lease").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(started.elapsed() < PATIENCE, "{body}");
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let probed = a.get(&format!("/sessions/{x}/status")).await;
    let status = probed.status();
    let body: Value = probed.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "saved", "{body}");
    let deleted = c.delete(&format!("/sessions/{x}")).await;
    let status = deleted.status();
    assert_eq!(status, 204, "{}", deleted.text().await.unwrap_or_default());
    assert_eq!(a.status(&x).await, "not_found");
    c.stop().await;
    w.finish().await;
}

/// New sessions go to the replica holding the fewest: three created through one replica end up
/// spread over the cluster, and each is served through the replica that received it.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn new_sessions_are_spread_by_load() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(a.create("/tmp").await);
    }
    let held = |agent: Value| agent["members"][0]["sessions"].as_u64().unwrap();
    let counts = [
        held(a.json("/agent").await),
        held(b.json("/agent").await),
        held(c.json("/agent").await),
    ];
    assert_eq!(counts.iter().sum::<u64>(), 3, "{counts:?}");
    assert!(counts.iter().all(|n| *n <= 2), "not spread: {counts:?}");
    assert!(counts[0] < 3, "all stayed on the replica asked: {counts:?}");
    for id in &ids {
        let (status, body) = a.prompt(id, "where am I").await;
        assert_eq!(
            (status, body["stopReason"].as_str()),
            (200, Some("end_turn")),
            "{body}"
        );
    }
    b.stop().await;
    c.stop().await;
    w.finish().await;
}

/// This replica's id, as its `GET /agent` shows it.
async fn id_of(g: &Gateway) -> String {
    let agent = g.json("/agent").await;
    let this = agent["replicas"].as_array().unwrap().iter();
    let this = this.filter(|r| r["this"] == true).collect::<Vec<_>>();
    assert_eq!(this.len(), 1, "{agent}");
    this[0]["id"].as_str().unwrap().to_owned()
}

/// What `GET /agents` on `g` says: each agent's name, with the ids of the live replicas that
/// run it, sorted.
async fn runners(g: &Gateway) -> Vec<(String, Vec<String>)> {
    let agents = g.json("/agents").await;
    agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut ids: Vec<String> = a["replicas"]
                .as_array()
                .unwrap_or_else(|| panic!("no replicas in {a}"))
                .iter()
                .map(|id| id.as_str().unwrap().to_owned())
                .collect();
            ids.sort();
            (a["name"].as_str().unwrap().to_owned(), ids)
        })
        .collect()
}

/// Replicas may run different agents. A create for agent `b` sent to a replica that runs only
/// `a` is forwarded to the replica that runs `b`; the session, saved and held by nobody, is
/// prompted, renamed, archived and deleted through the replica without `b` (each request
/// forwarded to the one with it). `GET /agent` and `GET /agents` on either replica say which
/// replicas run which agent. Once no live replica runs `b`, a create for it is refused as on
/// a gateway alone (422 naming the agents it runs).
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_replica_forwards_what_only_another_replicas_agent_serves() {
    let echo = echo_agent();
    let only_a = Options {
        agent: format!("a={}", echo.display()).into(),
        args: vec!["--heartbeat-interval".into(), "1".into()],
        ..Options::default()
    };
    let both = only_a.clone().args(&[
        "--agent",
        &format!("b={}", echo.display()),
        "--default-agent",
        "a",
    ]);
    let mut w = World::start(Backend::Postgres, both).await;
    let one = Gateway::spawn(&w.db.url, w.dir.path(), &only_a).await;
    let two = w.gw();
    for g in [&one, two] {
        g.wait_until(|g| async move {
            let replicas = g.json("/agent").await["replicas"].clone();
            replicas.as_array().unwrap().len() == 2
                && replicas
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["live"] == true)
        })
        .await;
    }
    let (id_one, id_two) = (id_of(&one).await, id_of(two).await);
    let mut both_ids = vec![id_one.clone(), id_two.clone()];
    both_ids.sort();

    // Created through the replica without b: forwarded to the one with it.
    let r = one
        .post(
            "/sessions",
            serde_json::json!({"cwd": "/tmp", "agent": "b"}),
        )
        .await;
    let status = r.status();
    let created: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["agent"], "b", "{created}");
    let id = created["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(two.json("/agents/b").await["members"][0]["sessions"], 1);

    // Saved, held by no replica: each request through the replica without b succeeds.
    let saved = |what: &'static str| {
        let (one, id) = (&one, &id);
        async move {
            assert_eq!(
                one.session_action(id, "close").await.status(),
                204,
                "{what}"
            );
            assert_eq!(one.status(id).await, "saved", "before {what}");
        }
    };
    saved("the prompt").await;
    let (status, body) = one.prompt(&id, "on a replica without b").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{body}"
    );
    saved("the rename").await;
    let path = format!("/sessions/{id}");
    let renamed = one.patch(&path, serde_json::json!({"title": "t"})).await;
    let status = renamed.status();
    let renamed: Value = renamed.json().await.unwrap();
    assert_eq!(
        (status.as_u16(), &renamed["title"]),
        (200, &Value::from("t")),
        "{renamed}"
    );
    assert_eq!(one.status(&id).await, "saved", "before the archive");
    let archived = one.session_action(&id, "archive").await;
    let status = archived.status();
    let archived: Value = archived.json().await.unwrap();
    assert_eq!(
        (status.as_u16(), &archived["archived"]),
        (200, &Value::Bool(true)),
        "{archived}"
    );
    assert_eq!(one.delete(&path).await.status(), 204);
    assert_eq!(two.get(&path).await.status(), 404);

    // Each replica publishes its agents, the default first.
    for g in [&one, two] {
        let agent = g.json("/agent").await;
        for r in agent["replicas"].as_array().unwrap() {
            let expected = if r["id"] == id_two.as_str() {
                serde_json::json!(["a", "b"])
            } else {
                serde_json::json!(["a"])
            };
            assert_eq!(r["agents"], expected, "{agent}");
        }
        let expected = vec![
            ("a".to_owned(), both_ids.clone()),
            ("b".to_owned(), vec![id_two.clone()]),
        ];
        assert_eq!(runners(g).await, expected, "GET /agents on {}", g.base);
    }
    let b_on_one = one.json("/agents/b").await;
    assert_eq!(
        (&b_on_one["members"], &b_on_one["ready"]),
        (&serde_json::json!([]), &Value::Bool(false)),
        "{b_on_one}"
    );

    // Over ACP too: a session of b made through the replica without b is made on the other,
    // and prompted there through this connection.
    let acp = support::acp::AcpClient::start(&one.base, None, false).await;
    let made = acp
        .call(
            "session/new",
            serde_json::json!({"cwd": "/tmp", "mcpServers": [], "_meta": {"agent": "b"}}),
        )
        .await
        .unwrap();
    let id = made["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(two.json(&format!("/sessions/{id}")).await["agent"], "b");
    let answer = acp.prompt(&id, "made elsewhere").await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    acp.close().await;

    // The replica with b stops: once it is gone from the others' view, nobody runs b.
    w.gw.take().unwrap().stop().await;
    one.wait_until(|g| async move { g.get("/agents/b").await.status() == 404 })
        .await;
    assert_eq!(
        runners(&one).await,
        vec![("a".to_owned(), vec![id_one.clone()])]
    );
    let r = one
        .post(
            "/sessions",
            serde_json::json!({"cwd": "/tmp", "agent": "b"}),
        )
        .await;
    assert_eq!(r.status(), 422);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(
        problem["type"]
            .as_str()
            .map(|t| t.ends_with("validation-failed")),
        Some(true),
        "{problem}"
    );
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("unknown agent \"b\""), "{problem}");
    one.stop().await;
    w.finish().await;
}

/// A request sent again with its `Idempotency-Key` through another replica gets the first
/// one's answer: a create makes one session, and a prompt whose client was cut mid-turn on one
/// replica, sent again through another, waits for that turn and answers its result.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn every_replica_honours_an_idempotency_key() {
    let (w, b, c) = three_replicas(beating()).await;
    let a = w.gw();
    let keyed = |g: &Gateway, path: &str, key: &str, body: Value| {
        g.http
            .post(g.url(path))
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let first = keyed(a, "/sessions", "create", serde_json::json!({"cwd": "/tmp"}))
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let again = keyed(
        &b,
        "/sessions",
        "create",
        serde_json::json!({"cwd": "/tmp"}),
    )
    .await
    .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    let listed = c.json("/sessions").await["sessions"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(listed, 1);

    let id = first["sessionId"].as_str().unwrap();
    let path = format!("/sessions/{id}/prompt");
    let prompt = serde_json::json!({"text": "/chunks 10 /delay 100"});
    let cut = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        keyed(a, &path, "turn", prompt.clone()),
    )
    .await;
    assert!(cut.is_err(), "the first prompt's client gave up mid-turn");
    let answer = keyed(&c, &path, "turn", prompt).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["idempotent-replayed"], "true");
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let turns = a.history(id).await;
    let started = turns
        .iter()
        .filter(|e| e["event"] == "turn_started")
        .count();
    assert_eq!(started, 1);
    b.stop().await;
    c.stop().await;
    w.finish().await;
}
