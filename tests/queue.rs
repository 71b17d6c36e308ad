//! A session's prompt queue (`Prefer: queue`) and interrupt (`Prefer: interrupt`) against the
//! echo agent, whose `/permission` turn waits until it is answered: positions, order, withdraw,
//! 429 when full, 409 without the header, `prompt_queued` and `prompt_withdrawn` in the log and
//! each queued turn naming its `queueId`; an interrupt cancelling the running turn and going
//! first; a queued prompt surviving a restart of the gateway and running once (both stores);
//! and one queued through another replica running where the session is served.

use crate::support;

use serde_json::{Value, json};
use support::cluster::{beating, three_replicas};
use support::*;

both_backends!(
    queued_prompts_run_in_order_and_can_be_withdrawn,
    an_interrupt_cancels_the_running_turn_and_goes_first,
    a_queued_prompt_survives_a_restart_and_runs_once,
    a_queued_turn_cut_short_by_a_crash_is_not_run_again,
    a_retried_queue_request_queues_once,
    many_clients_queueing_at_once_each_get_a_place,
);

/// `POST /prompt` of `text` with `Prefer: prefer`: the status, headers and body.
async fn send(gw: &Gateway, id: &str, text: &str, prefer: &str) -> reqwest::Response {
    let mut req = gw
        .http
        .post(gw.url(&format!("/sessions/{id}/prompt")))
        .json(&json!({"text": text}));
    if !prefer.is_empty() {
        req = req.header("prefer", prefer);
    }
    req.send().await.unwrap()
}

/// Queues `text`: its queue id and position.
async fn queue(gw: &Gateway, id: &str, text: &str, prefer: &str) -> (String, i64) {
    let r = send(gw, id, text, prefer).await;
    assert_eq!(r.status(), 202);
    let applied = r.headers()["preference-applied"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(applied, prefer);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let queued: Value = r.json().await.unwrap();
    let queue_id = queued["queueId"].as_str().unwrap().to_owned();
    assert_eq!(location, format!("/sessions/{id}/queue/{queue_id}"));
    assert_eq!(queued["prompt"][0]["text"], text);
    (queue_id, queued["position"].as_i64().unwrap())
}

/// The prompts of the session's turns so far, in order, and the queue ids they name.
async fn turns(gw: &Gateway, id: &str) -> Vec<(String, Option<String>)> {
    let started = gw.with_key(None).logged(id, "turn_started").await;
    started
        .iter()
        .map(|t| {
            let text = t["prompt"][0]["text"].as_str().unwrap().to_owned();
            (text, t["queueId"].as_str().map(str::to_owned))
        })
        .collect()
}

/// Waits until `n` turns of the session have ended and its queue is empty.
async fn drained(gw: &Gateway, id: &str, n: usize) {
    gw.wait_until(|g| async move {
        let ended = g.with_key(None).logged(id, "turn_ended").await.len();
        let queue = g.json(&format!("/sessions/{id}/queue")).await;
        ended >= n && queue.as_array().unwrap().is_empty()
    })
    .await;
}

/// Answers the session's pending permission request.
async fn allow(gw: &Gateway, id: &str) {
    let request = gw.pending_permission(id).await;
    let path = format!("/sessions/{id}/permissions/{request}");
    let r = gw.post(&path, json!({"optionId": "allow"})).await;
    assert_eq!(r.status(), 200);
}

async fn queued_prompts_run_in_order_and_can_be_withdrawn(backend: Backend) {
    let opts = Options::default().args(&["--max-queued-prompts", "3"]);
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let _turn = gw.prompt_in_background(&id, "/permission first");
    gw.pending_permission(&id).await;

    let (one, at) = queue(gw, &id, "one", "queue").await;
    assert_eq!(at, 1);
    let (two, at) = queue(gw, &id, "two", "queue").await;
    assert_eq!(at, 2);
    let (three, at) = queue(gw, &id, "three", "queue").await;
    assert_eq!(at, 3);
    let full = send(gw, &id, "four", "queue").await;
    assert_eq!(full.status(), 429);
    let problem: Value = full.json().await.unwrap();
    assert!(
        problem["type"].as_str().unwrap().ends_with("queue-full"),
        "{problem}"
    );
    assert_eq!(send(gw, &id, "no header", "").await.status(), 409);

    let listed = gw.json(&format!("/sessions/{id}/queue")).await;
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queueId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [&one, &two, &three]);
    let path = format!("/sessions/{id}/queue/{two}");
    assert_eq!(gw.delete(&path).await.status(), 204);
    assert_eq!(gw.delete(&path).await.status(), 404);
    let listed = gw.json(&format!("/sessions/{id}/queue")).await;
    let positions: Vec<(&str, i64)> = (listed.as_array().unwrap().iter())
        .map(|q| {
            (
                q["queueId"].as_str().unwrap(),
                q["position"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(positions, [(one.as_str(), 1), (three.as_str(), 2)]);
    let (four, at) = queue(gw, &id, "four", "queue").await;
    assert_eq!(at, 3, "a place is free again");

    allow(gw, &id).await;
    drained(gw, &id, 4).await;
    let ran = turns(gw, &id).await;
    let want = [
        ("/permission first".to_owned(), None),
        ("one".to_owned(), Some(one.clone())),
        ("three".to_owned(), Some(three.clone())),
        ("four".to_owned(), Some(four.clone())),
    ];
    assert_eq!(ran, want);
    assert_eq!(
        gw.with_key(None).logged(&id, "prompt_queued").await.len(),
        4
    );
    let withdrawn = gw.with_key(None).logged(&id, "prompt_withdrawn").await;
    assert_eq!(withdrawn.len(), 1);
    assert_eq!(
        (
            withdrawn[0]["queueId"].as_str(),
            withdrawn[0]["reason"].as_str()
        ),
        (Some(two.as_str()), Some("withdrawn"))
    );
    // A started prompt cannot be withdrawn; a finished one is gone.
    let gone = gw.delete(&format!("/sessions/{id}/queue/{one}")).await;
    assert_eq!(gone.status(), 404);
    w.finish().await;
}

async fn an_interrupt_cancels_the_running_turn_and_goes_first(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let _turn = gw.prompt_in_background(&id, "/permission first");
    gw.pending_permission(&id).await;
    let (later, _) = queue(gw, &id, "later", "queue").await;
    let (now, at) = queue(gw, &id, "now", "interrupt").await;
    assert_eq!(at, 1, "ahead of the queue");
    drained(gw, &id, 3).await;
    let ran = turns(gw, &id).await;
    let want = [
        ("/permission first".to_owned(), None),
        ("now".to_owned(), Some(now)),
        ("later".to_owned(), Some(later)),
    ];
    assert_eq!(ran, want);
    let ended = gw.with_key(None).logged(&id, "turn_ended").await;
    assert_eq!(ended[0]["stopReason"], "cancelled", "{ended:?}");
    w.finish().await;
}

async fn a_queued_prompt_survives_a_restart_and_runs_once(backend: Backend) {
    let (mut w, id) = World::with_session(backend, Options::default()).await;
    let _turn = w.gw().prompt_in_background(&id, "/permission first");
    w.gw().pending_permission(&id).await;
    let (queued, _) = queue(w.gw(), &id, "after the restart", "queue").await;
    w.restart().await;
    let gw = w.gw();
    drained(gw, &id, 2).await;
    let ran = turns(gw, &id).await;
    let runs = ran
        .iter()
        .filter(|(_, q)| q.as_deref() == Some(&queued))
        .count();
    assert_eq!(runs, 1, "{ran:?}");
    assert_eq!(ran.last().unwrap().0, "after the restart");
    // The sweep goes on: still once.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let again = turns(gw, &id).await;
    assert_eq!(again.len(), ran.len(), "{again:?}");
    w.finish().await;
}

/// The gateway is killed (SIGKILL) during a queued prompt's turn: restarted, it finds the turn
/// in the log and takes the prompt off the queue rather than sending it again.
async fn a_queued_turn_cut_short_by_a_crash_is_not_run_again(backend: Backend) {
    // Heartbeats every second: the killed replica's lease (on PostgreSQL) runs out after three.
    let (mut w, id) = World::with_session(backend, beating()).await;
    let (queued, at) = queue(w.gw(), &id, "/permission queued", "queue").await;
    assert_eq!(at, 1);
    w.gw().pending_permission(&id).await;
    w.gw.as_mut().unwrap().kill().await;
    w.restart().await;
    let gw = w.gw();
    let path = format!("/sessions/{id}/queue");
    let path = path.as_str();
    // 503 while the killed replica's lease runs.
    gw.wait_until(|g| async move {
        let r = g.get(path).await;
        r.status() == 200
            && r.json::<Value>()
                .await
                .unwrap()
                .as_array()
                .unwrap()
                .is_empty()
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let ran = turns(gw, &id).await;
    assert_eq!(ran, [("/permission queued".to_owned(), Some(queued))]);
    w.finish().await;
}

/// The same `Idempotency-Key` twice: one queued prompt, the same answer.
async fn a_retried_queue_request_queues_once(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let _turn = gw.prompt_in_background(&id, "/permission first");
    gw.pending_permission(&id).await;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let r = gw
            .http
            .post(gw.url(&format!("/sessions/{id}/prompt")))
            .header("prefer", "queue")
            .header("idempotency-key", "queue-once-1")
            .json(&json!({"text": "once"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        answers.push(r.json::<Value>().await.unwrap()["queueId"].clone());
    }
    assert_eq!(answers[0], answers[1]);
    let queue = gw.json(&format!("/sessions/{id}/queue")).await;
    assert_eq!(queue.as_array().unwrap().len(), 1, "{queue}");
    allow(gw, &id).await;
    drained(gw, &id, 2).await;
    w.finish().await;
}

/// Twelve clients queue at once (the bound is 12): each gets a place of its own, positions 1 to
/// 12; one more is refused; then every prompt runs once, in the order of those places.
async fn many_clients_queueing_at_once_each_get_a_place(backend: Backend) {
    const CLIENTS: usize = 12;
    let opts = Options::default().args(&["--max-queued-prompts", "12"]);
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let _turn = gw.prompt_in_background(&id, "/permission first");
    gw.pending_permission(&id).await;
    let sends = (0..CLIENTS).map(|i| {
        let (gw, id) = (gw, id.as_str());
        async move { (i, queue(gw, id, &format!("client {i}"), "queue").await) }
    });
    let mut placed = futures::future::join_all(sends).await;
    placed.sort_by_key(|(_, (_, position))| *position);
    let positions: Vec<i64> = placed.iter().map(|(_, (_, p))| *p).collect();
    assert_eq!(positions, (1..=CLIENTS as i64).collect::<Vec<_>>());
    assert_eq!(send(gw, &id, "one too many", "queue").await.status(), 429);
    allow(gw, &id).await;
    drained(gw, &id, CLIENTS + 1).await;
    let ran = turns(gw, &id).await;
    let want: Vec<(String, Option<String>)> = placed
        .iter()
        .map(|(i, (queue_id, _))| (format!("client {i}"), Some(queue_id.clone())))
        .collect();
    assert_eq!(ran[1..], want[..]);
    w.finish().await;
}

/// Queued through one replica while another serves the session: it runs there, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_prompt_queued_through_another_replica_runs_where_the_session_is() {
    let (w, b, c) = three_replicas(beating()).await;
    let id = b.create("/tmp").await;
    let _turn = b.prompt_in_background(&id, "/permission first");
    b.pending_permission(&id).await;
    let (queued, at) = queue(&c, &id, "through c", "queue").await;
    assert_eq!(at, 1);
    let listed = w.gw().json(&format!("/sessions/{id}/queue")).await;
    assert_eq!(listed[0]["queueId"], queued.as_str());
    allow(&c, &id).await;
    drained(w.gw(), &id, 2).await;
    let ran = turns(&c, &id).await;
    assert_eq!(ran[1], ("through c".to_owned(), Some(queued)));
    assert_eq!(ran.len(), 2);
    b.stop().await;
    c.stop().await;
    w.finish().await;
}
