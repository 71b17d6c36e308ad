//! An agent cannot flood the gateway, on either store: the updates of one turn past
//! `--max-updates-per-turn` are dropped and counted as garbage (the turn still ends, the log
//! holds at most the bound, the next turn has its own, other sessions answer meanwhile), and the
//! requests of one session waiting for a client past `--max-pending-requests` are refused at
//! once with a JSON-RPC error (the list shows at most the bound; the ones kept are answered);
//! requests the policy answers are forgotten past the latest 256 of a session.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(
    updates_past_the_bound_of_a_turn_are_dropped_and_counted,
    requests_past_the_pending_bound_are_refused_at_once,
    requests_answered_by_the_policy_are_not_kept_without_bound,
);

const GARBAGE: &str = "acp_gateway_agent_garbage_total";

/// The texts of the agent's message chunks in the session's log, in order.
async fn chunks(gw: &Gateway, id: &str) -> Vec<String> {
    gw.history(id)
        .await
        .iter()
        .filter(|e| e["event"] == "agent_message_chunk")
        .filter_map(|e| {
            e["data"]["update"]["content"]["text"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

async fn updates_past_the_bound_of_a_turn_are_dropped_and_counted(backend: Backend) {
    let opts = Options::default().args(&["--max-updates-per-turn", "50"]);
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let other = gw.create("/tmp").await;
    let before = gw.metric(GARBAGE).await;

    // 2000 chunks in one turn: the turn ends as usual, the log keeps the first 50 updates.
    let (status, body) = gw.prompt(&id, "/chunks 2000").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stopReason"], "end_turn", "{body}");
    let kept = chunks(gw, &id).await;
    assert!(kept.len() <= 50, "{} chunks logged", kept.len());
    assert_eq!(kept.first().map(String::as_str), Some("c1 "), "{kept:?}");
    let dropped = gw.metric(GARBAGE).await - before;
    assert!(dropped >= 1950.0, "{dropped} counted as garbage");
    assert_eq!(
        w.log()
            .matches("more updates in this turn than --max-updates-per-turn")
            .count(),
        1,
        "one warning per turn"
    );

    // Another session answers, and the next turn of this one has a bound of its own.
    let (status, body) = gw.prompt(&other, "still here").await;
    assert_eq!(status, 200, "{body}");
    assert!(chunks(gw, &other).await.concat().contains("here"));
    let (status, body) = gw.prompt(&id, "again").await;
    assert_eq!(status, 200, "{body}");
    assert!(chunks(gw, &id).await.concat().contains("again"));
    w.finish().await;
}

async fn requests_past_the_pending_bound_are_refused_at_once(backend: Backend) {
    let opts = Options::default().args(&["--max-pending-requests", "3"]);
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let before = gw.metric(GARBAGE).await;

    // Ten asked at once: seven are refused with an error the agent sees, three wait.
    let turn = gw.prompt_in_background(&id, "/permissions 10 done");
    let refused = |chunks: &[String]| {
        chunks
            .iter()
            .filter(|c| c.ends_with(": error -32603"))
            .count()
    };
    let (id2, refused2) = (id.clone(), refused);
    gw.wait_until(|g| {
        let id = id2.clone();
        async move { refused2(&chunks(g, &id).await) == 7 }
    })
    .await;
    let pending = gw.json(&format!("/sessions/{id}/permissions")).await;
    let pending = pending.as_array().unwrap();
    assert_eq!(pending.len(), 3, "{pending:?}");
    assert!(gw.metric(GARBAGE).await - before >= 7.0);

    // The three kept are answered as usual, and the turn ends.
    for request in pending {
        let request_id = request["requestId"].as_str().unwrap();
        let r = gw
            .post(
                &format!("/sessions/{id}/permissions/{request_id}"),
                json!({"optionId": "allow"}),
            )
            .await;
        assert_eq!(r.status(), 200);
    }
    let answer = turn.await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["stopReason"], "end_turn", "{body}");
    let said = chunks(gw, &id).await;
    assert_eq!(refused(&said), 7, "{said:?}");
    assert_eq!(
        said.iter().filter(|c| c.ends_with(": allow")).count(),
        3,
        "{said:?}"
    );
    assert!(gw.json(&format!("/sessions/{id}/permissions")).await == json!([]));
    w.finish().await;
}

/// An agent asking in a loop, answered by `--permission-policy allow`, leaves only the latest
/// resolved requests in memory: an answer to the first is 404 (forgotten), to the last 409
/// (resolved).
async fn requests_answered_by_the_policy_are_not_kept_without_bound(backend: Backend) {
    let opts = Options::default().args(&["--permission-policy", "allow"]);
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let (status, body) = gw.prompt(&id, "/permissions 300 done").await;
    assert_eq!(status, 200, "{body}");
    let said = chunks(gw, &id).await;
    assert_eq!(said.iter().filter(|c| c.ends_with(": allow")).count(), 300);
    let asked: Vec<String> = (gw.history(&id).await.iter())
        .filter(|e| e["event"] == "permission_requested")
        .map(|e| e["data"]["requestId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(asked.len(), 300);
    let answer = |request_id: &str| {
        let path = format!("/sessions/{id}/permissions/{request_id}");
        async move { gw.post(&path, json!({"optionId": "allow"})).await.status() }
    };
    assert_eq!(answer(&asked[0]).await, 404, "forgotten");
    assert_eq!(answer(&asked[299]).await, 409, "resolved, and kept");
    w.finish().await;
}
