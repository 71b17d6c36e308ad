//! The list sync never takes a session in use for a deleted one. An agent's `session/list` is
//! not a snapshot (newest first, and every turn moves its session to the front), so a session
//! missing from a walk through the pages is asked about directly, and spared while any replica
//! holds it or it had events since the sync began; one the agent no longer knows is still
//! tombstoned, and comes back if the agent lists it again. The replica tests are ignored,
//! with that reason, when built without `DATABASE_URL`.

use crate::support;

both_backends!(
    a_vanished_session_comes_back_when_listed_or_used,
    an_agent_that_cannot_be_asked_must_miss_a_session_twice,
);

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::cluster::three_replicas;
use support::*;

/// Three replicas syncing every second with an agent that lists three sessions to a page,
/// while twelve sessions are prompted in closed loops through random replicas: no session is
/// ever marked deleted, and the client that waits for an answer can prompt again through any
/// replica (never 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn busy_sessions_on_other_replicas_are_never_marked_deleted() {
    let opts = Options::default().env("ECHO_AGENT_PAGE_SIZE", "3").args(&[
        "--heartbeat-interval",
        "1",
        "--sync-interval",
        "1",
    ]);
    let (mut w, b, c) = three_replicas(opts).await;
    let replicas = Arc::new([w.gw.take().unwrap(), b, c]);
    let mut ids = vec![];
    for i in 0..12 {
        ids.push(replicas[i % 3].create("/tmp/busy").await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = ids
        .iter()
        .cloned()
        .map(|id| {
            let (replicas, stop) = (replicas.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = std::collections::BTreeMap::<u16, usize>::new();
                let mut rng = fastrand::Rng::new();
                while !stop.load(Ordering::Relaxed) {
                    let gw = &replicas[rng.usize(..3)];
                    let (status, body) = gw.prompt(&id, "/chunks 3 busy").await;
                    *answers.entry(status).or_default() += 1;
                    if status != 200 {
                        eprintln!("{id}: {status} {body}");
                    }
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(15)).await;
    stop.store(true, Ordering::Relaxed);
    let mut problems = vec![];
    for (id, answers) in ids.iter().zip(loops) {
        let answers = answers.await.unwrap();
        if answers.keys().any(|s| *s != 200) {
            problems.push(format!("{id}: prompts answered {answers:?}"));
        }
    }
    for id in &ids {
        for gw in replicas.iter() {
            let status = gw.get(&format!("/sessions/{id}")).await.status();
            if status != 200 {
                problems.push(format!("{id}: GET answers {status} on {}", gw.base));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for gw in replicas.iter() {
        assert_eq!(gw.metric("acp_gateway_sessions_vanished_total").await, 0.0);
    }
    for gw in Arc::into_inner(replicas).unwrap() {
        gw.stop().await;
    }
    w.finish().await;
}

/// Two replicas on one database and one agent state directory: one creates sessions, several
/// at once, while the other syncs the agent's list as fast as it can, and so lists some of them
/// before the creating replica has recorded them. Every create succeeds (never "already names
/// another session"), and every session is the creator's, on both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_session_another_replica_lists_while_it_is_created_is_the_creators() {
    let w = World::start(Backend::Postgres, Options::default()).await;
    let b = Arc::new(Gateway::spawn(&w.db.url, w.dir.path(), &w.opts).await);
    let a = w.gw();
    let stop = Arc::new(AtomicBool::new(false));
    let syncing = {
        let (b, stop) = (b.clone(), stop.clone());
        tokio::spawn(async move {
            let mut syncs = 0;
            while !stop.load(Ordering::Relaxed) {
                b.json("/sessions?refresh=true").await;
                syncs += 1;
            }
            syncs
        })
    };
    // Created on a itself (marked as forwarded: not placed on b, whose own sync waits for its
    // own creates).
    let mark = a.forwarding_mark(&reqwest::Method::POST, "/sessions").await;
    let create = || async {
        let r = a
            .http
            .post(a.url("/sessions"))
            .header("acp-gateway-forwarded", &mark)
            .json(&serde_json::json!({"cwd": "/tmp"}))
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.unwrap(),
        )
    };
    let mut created = Vec::new();
    let mut failed = Vec::new();
    for _ in 0..10 {
        for (status, body) in futures::future::join_all((0..6).map(|_| create())).await {
            match body["sessionId"].as_str() {
                Some(id) if status == 201 => created.push(id.to_owned()),
                _ => failed.push(format!("{status} {body}")),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let syncs = syncing.await.unwrap();
    // How often the race was met is the machine's load's to decide: printed, not asserted.
    let taken = w.log().matches("it is the creator's").count();
    eprintln!("b synced {syncs} times while a created 60 sessions; {taken} listed by b first");
    assert!(failed.is_empty(), "creates failed:\n{}", failed.join("\n"));
    for gw in [a, &b] {
        for id in &created {
            let session = gw.json(&format!("/sessions/{id}")).await;
            assert_eq!(session["origin"], "gateway", "{session}");
        }
    }
    Arc::into_inner(b).unwrap().stop().await;
    w.finish().await;
}

/// `ECHO_AGENT_DIR`'s file of session `id`, moved aside (`away`) or back: the agent knows the
/// session only while it is there.
fn move_session_file(agent_dir: &std::path::Path, id: &str, away: bool) {
    let file = agent_dir.join("sessions").join(format!("{id}.json"));
    let aside = agent_dir.join(format!("{id}.json.aside"));
    let (from, to) = if away { (file, aside) } else { (aside, file) };
    std::fs::rename(&from, &to).unwrap_or_else(|e| panic!("{from:?} → {to:?}: {e}"));
}

/// A sync on one replica does not tombstone a session another replica holds although its
/// agent no longer lists it; once no one holds it and the agent, asked, does not know it, the
/// sync does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_session_another_replica_holds_is_spared_one_the_agent_lost_is_not() {
    let opts = Options::default().args(&["--heartbeat-interval", "1", "--sync-interval", "0"]);
    let (w, b, c) = three_replicas(opts).await;
    let a = w.gw();
    let id = a.create("/tmp/held").await;
    let (status, body) = a.prompt(&id, "hello").await;
    assert_eq!(status, 200, "{body}");
    b.json("/sessions?refresh=true").await;
    // Out of band, the agent's file goes: only a's process, which holds the session open,
    // still knows it; b's listing does not show it.
    move_session_file(&w.agent_dir(), &id, true);
    b.json("/sessions?refresh=true").await;
    for gw in [a, &b, &c] {
        assert_eq!(gw.get(&format!("/sessions/{id}")).await.status(), 200);
    }
    assert_eq!(b.metric("acp_gateway_sessions_vanished_total").await, 0.0);

    // Closed on a (through c), nobody holds it, and its last event is older than the sync:
    // b asks the agent, which does not know it.
    assert_eq!(c.session_action(&id, "close").await.status(), 204);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut lifecycle = b.sse("/events", None).await;
    b.json("/sessions?refresh=true").await;
    for gw in [a, &b, &c] {
        assert_eq!(gw.get(&format!("/sessions/{id}")).await.status(), 404);
    }
    assert_eq!(b.metric("acp_gateway_sessions_vanished_total").await, 1.0);
    let deleted = lifecycle.until("session_deleted").await;
    let deleted = deleted.last().unwrap();
    assert_eq!(deleted.data["sessionId"], id.as_str());
    assert_eq!(deleted.data["reason"], "vanished_upstream");
    assert!(
        w.log()
            .lines()
            .any(|l| l.contains("WARN") && l.contains(&id) && l.contains("vanished_upstream")),
        "the tombstone is logged at WARN with its reason"
    );
    b.stop().await;
    c.stop().await;
    w.finish().await;
}

/// A session the sync tombstoned because the agent lost it comes back, with its log, when the
/// agent lists it again; and when a client prompts it and the agent serves it.
async fn a_vanished_session_comes_back_when_listed_or_used(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let id = gw.create("/tmp/lost").await;
    let (status, body) = gw.prompt(&id, "/chunks 3 before").await;
    assert_eq!(status, 200, "{body}");
    gw.json("/sessions?refresh=true").await;
    assert_eq!(gw.session_action(&id, "close").await.status(), 204);
    let logged = gw.history(&id).await;
    let vanish = || async {
        move_session_file(&w.agent_dir(), &id, true);
        tokio::time::sleep(Duration::from_secs(3)).await;
        gw.json("/sessions?refresh=true").await;
        assert_eq!(gw.get(&format!("/sessions/{id}")).await.status(), 404);
        move_session_file(&w.agent_dir(), &id, false);
    };

    vanish().await;
    let mut lifecycle = gw.sse("/events", None).await;
    let page = gw.json("/sessions?refresh=true").await;
    assert!(page.to_string().contains(&id), "listed again: {page}");
    let back = gw.json(&format!("/sessions/{id}")).await;
    assert_eq!(back["title"], "Echo: /chunks 3 before", "{back}");
    let created = lifecycle.until("session_created").await;
    assert_eq!(created.last().unwrap().data["sessionId"], id.as_str());
    let history = gw.history(&id).await;
    assert_eq!(&history[..logged.len()], &logged[..], "the log is kept");
    assert_eq!(history[logged.len()]["event"], "session_deleted");
    assert_eq!(history[logged.len()]["data"]["reason"], "vanished_upstream");

    // Tombstoned again; this time a client prompts it before any sync lists it.
    vanish().await;
    let (status, body) = gw.prompt(&id, "/chunks 2 after").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(gw.get(&format!("/sessions/{id}")).await.status(), 200);
    assert_eq!(gw.metric("acp_gateway_sessions_vanished_total").await, 2.0);
    assert_eq!(gw.metric("acp_gateway_sessions_revived_total").await, 2.0);

    // A session deleted through the gateway never comes back.
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    let (status, _) = gw.prompt(&id, "still there?").await;
    assert_eq!(status, 404);
    w.finish().await;
}

/// Of an agent that can be asked about no single session (no `session/status`, no resume and
/// close), a session another client deleted is tombstoned only once two syncs some seconds
/// apart have missed it.
async fn an_agent_that_cannot_be_asked_must_miss_a_session_twice(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_CAPS", "load,list");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let mut editor = DirectClient::start(&w.agent_dir(), "load,list,delete").await;
    let theirs = editor.new_session("/tmp/editor").await;
    let page = gw.json("/sessions?refresh=true").await;
    assert!(page.to_string().contains(&theirs), "{page}");
    editor
        .call("session/delete", serde_json::json!({"sessionId": theirs}))
        .await;
    gw.json("/sessions?refresh=true").await;
    // Once that sync has missed it (it noted when), not before: a sync under load may start
    // late, and the last one below must come five seconds after the first miss.
    let missed = Instant::now();
    assert_eq!(
        gw.get(&format!("/sessions/{theirs}")).await.status(),
        200,
        "one miss is no evidence"
    );
    while missed.elapsed() < Duration::from_secs(5) {
        gw.json("/sessions?refresh=true").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    gw.json("/sessions?refresh=true").await;
    assert_eq!(gw.get(&format!("/sessions/{theirs}")).await.status(), 404);
    assert_eq!(gw.metric("acp_gateway_sessions_vanished_total").await, 1.0);
    editor.stop().await;
    w.finish().await;
}
