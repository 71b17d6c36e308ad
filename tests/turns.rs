//! Turns against the real echo agent: streaming order, async prompts, cancellation, conflicts,
//! permissions, unknown update variants, load replay, agent crashes and pool placement.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(
    async_prompt_cancel_and_conflict,
    permission_round_trip,
    cancel_resolves_pending_permission,
    unknown_update_variant_passes_through,
    load_replay_is_not_logged_twice,
    crash_mid_turn_fails_fast_and_recovers,
    pool_places_on_least_loaded_member,
    live_tail_and_after_cursor,
    agent_requests_outside_permission_get_method_not_found,
    a_prompt_waits_for_a_resume_under_way,
    a_prompt_sent_on_seeing_turn_ended_is_taken,
);

/// A client that prompts again the moment its stream shows `turn_ended` (as a frontend does)
/// is never refused with 409: the turn that ended may not have freed its session yet, and the
/// prompt waits for that. Several sessions at once, back to back.
async fn a_prompt_sent_on_seeing_turn_ended_is_taken(backend: Backend) {
    let w = World::start(backend, Options::default().pool(2)).await;
    let gw = w.gw();
    let clients = (0..4).map(|_| async {
        let id = gw.create("/tmp").await;
        let mut stream = gw.events(&id, Some(0)).await;
        for _ in 0..25 {
            gw.prompt_async(&id, "hi").await;
            let turn = stream.until("turn_ended").await;
            assert!(turn.iter().any(|e| e.event == "agent_message_chunk"));
        }
    });
    futures::future::join_all(clients).await;
    w.finish().await;
}

/// A prompt that arrives while its session is being resumed (by a request, the idle closer or
/// a replica taking it over) waits for that, rather than answering 409 as a second turn does.
async fn a_prompt_waits_for_a_resume_under_way(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_RESUME_DELAY_MS", "600");
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    assert_eq!(gw.session_action(&id, "close").await.status(), 204);
    let resume = gw.session_action(&id, "resume");
    let prompt = async {
        while w.calls("session/resume") == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        gw.prompt(&id, "while resuming").await
    };
    let (resumed, (status, body)) = tokio::join!(resume, prompt);
    assert_eq!(resumed.status(), 200);
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{body}"
    );
    assert_eq!(w.calls("session/resume"), 1);
    w.finish().await;
}

/// The gateway declares no fs capability and answers any other agent request with -32601; the
/// turn goes on.
async fn agent_requests_outside_permission_get_method_not_found(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let (status, _) = gw.prompt(&id, "/fs after").await;
    assert_eq!(status, 200);
    let events = gw.first_turn(&id).await;
    assert_eq!(chunk_text(&events), "fs: error -32601 after");
    w.finish().await;
}

async fn async_prompt_cancel_and_conflict(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let mut sse = gw.events(&id, None).await;
    gw.prompt_async(&id, "/hang").await;
    let started = sse.until("turn_started").await;
    assert_eq!(
        started.len(),
        1,
        "a stream without cursor starts at the live tail"
    );
    let s: Value = gw.json(&format!("/sessions/{id}/status")).await;
    assert_eq!(s["activity"], "running");

    let (status, body) = gw.prompt(&id, "second").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["status"], 409);

    assert_eq!(gw.session_action(&id, "cancel").await.status(), 204);
    let ended = sse.until("turn_ended").await;
    assert_eq!(ended.last().unwrap().data["stopReason"], "cancelled");
    assert_eq!(w.calls("session/cancel"), 1);
    let s: Value = gw.json(&format!("/sessions/{id}/status")).await;
    assert_eq!(s["activity"], "idle");
    // The session takes prompts again.
    let (status, body) = gw.prompt(&id, "after").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn"))
    );

    for bad in [
        json!({}),
        json!({"text": "a", "prompt": [{"type": "text", "text": "b"}]}),
        json!({"prompt": []}),
        json!({"prompt": [{"text": "no type"}]}),
    ] {
        let r = gw
            .post(&format!("/sessions/{id}/prompt"), bad.clone())
            .await;
        assert_eq!(r.status(), 422, "{bad}");
    }
    let r = gw
        .post("/sessions/sess_nope/prompt", json!({"text": "x"}))
        .await;
    assert_eq!(r.status(), 404);
    w.finish().await;
}

async fn permission_round_trip(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let mut sse = gw.events(&id, None).await;
    let turn = gw.prompt_in_background(&id, "/permission please");
    let requested = sse.until("permission_requested").await;
    let request_id = requested.last().unwrap().data["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let pending: Value = gw.json(&format!("/sessions/{id}/permissions")).await;
    assert_eq!(pending.as_array().unwrap().len(), 1);
    assert_eq!(pending[0]["requestId"], request_id.as_str());
    assert_eq!(pending[0]["request"]["options"][0]["optionId"], "allow");
    // The default --permission-timeout (300 s) gives it a deadline, in the event as well.
    let deadline = pending[0]["deadline"].as_str().expect("a deadline");
    assert_eq!(requested.last().unwrap().data["deadline"], deadline);
    let created = chrono::DateTime::parse_from_rfc3339(pending[0]["createdAt"].as_str().unwrap());
    let due = chrono::DateTime::parse_from_rfc3339(deadline).unwrap() - created.unwrap();
    assert_eq!(due.num_seconds(), 300);
    let s: Value = gw.json(&format!("/sessions/{id}/status")).await;
    assert_eq!(s["activity"], "awaiting_permission");

    let path = format!("/sessions/{id}/permissions/{request_id}");
    assert_eq!(
        gw.post(&path, json!({"optionId": "bogus"})).await.status(),
        422
    );
    assert_eq!(
        gw.post(
            &format!("/sessions/{id}/permissions/perm_unknown"),
            json!({"optionId": "allow"})
        )
        .await
        .status(),
        404
    );
    let r = gw.post(&path, json!({"optionId": "allow"})).await;
    assert_eq!(r.status(), 200);
    let answered: Value = r.json().await.unwrap();
    assert_eq!(
        answered["outcome"],
        json!({"outcome": "selected", "optionId": "allow"})
    );
    assert_eq!(
        gw.post(&path, json!({"optionId": "allow"})).await.status(),
        409
    );

    let res = turn.await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    let events = sse.until("turn_ended").await;
    let resolved = find_event(&events, "permission_resolved");
    assert_eq!(resolved.data["reason"], "answered");
    assert!(
        chunk_text(&events).starts_with("permission: allow"),
        "{}",
        chunk_text(&events)
    );
    assert!(
        gw.json(&format!("/sessions/{id}/permissions"))
            .await
            .as_array()
            .unwrap()
            .is_empty()
    );
    w.finish().await;
}

/// Cancelling the turn, or closing the session, resolves its pending permission request as
/// cancelled, and the turn ends cancelled.
async fn cancel_resolves_pending_permission(backend: Backend) {
    for route in ["cancel", "close"] {
        let (w, id) = World::with_session(backend, Options::default()).await;
        let gw = w.gw();
        let mut sse = gw.events(&id, None).await;
        gw.prompt_async(&id, "/permission").await;
        sse.until("permission_requested").await;
        let r = gw.session_action(&id, route).await;
        assert_eq!(r.status(), 204, "{route}");
        let events = sse.until("turn_ended").await;
        let resolved = find_event(&events, "permission_resolved");
        assert_eq!(resolved.data["reason"], "cancelled", "{route}");
        assert_eq!(resolved.data["outcome"], json!({"outcome": "cancelled"}));
        assert_eq!(
            events.last().unwrap().data["stopReason"],
            "cancelled",
            "{route}"
        );
        let expected = if route == "close" { "saved" } else { "live" };
        assert_eq!(gw.status(&id).await, expected);
        w.finish().await;
    }
}

async fn unknown_update_variant_passes_through(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "/unknown hi").await.0, 200);
    let events = gw.first_turn(&id).await;
    let unknown = find_event(&events, "future_variant_x");
    assert_eq!(
        unknown.data["update"],
        json!({"sessionUpdate": "future_variant_x", "payload": {"n": 1}})
    );
    // An update tagged with a gateway event's name is not logged: the turn ends once, the
    // gateway's way.
    let history = gw.history(&id).await;
    let ended: Vec<&Value> = history
        .iter()
        .filter(|e| e["event"] == "turn_ended")
        .collect();
    assert_eq!(ended.len(), 1, "{history:?}");
    assert_eq!(ended[0]["data"]["stopReason"], "end_turn");
    w.finish().await;
}

/// Without session/resume the gateway loads; the agent's replay of a session the log already
/// holds is not appended again.
async fn load_replay_is_not_logged_twice(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_CAPS", "load,list,delete,close");
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "a b c").await.0, 200);
    let before = gw.history_len(&id).await;
    assert_eq!(gw.session_action(&id, "close").await.status(), 204);
    assert_eq!(gw.status(&id).await, "saved");
    let r = gw.session_action(&id, "resume").await;
    assert_eq!(r.status(), 200);
    assert_eq!(w.calls("session/load"), 1);
    assert_eq!(gw.status(&id).await, "live");
    let after = gw.history_len(&id).await;
    assert_eq!(before, after, "replayed updates are not appended again");
    w.finish().await;
}

async fn crash_mid_turn_fails_fast_and_recovers(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let pid_before = gw.agent_pid().await;
    let mut sse = gw.events(&id, None).await;
    let (status, body) = gw.prompt(&id, "/crash").await;
    assert_kind(status, &body, 502, "agent-unavailable");
    assert!(
        body["detail"].as_str().unwrap().contains("exit code 3"),
        "{body}"
    );
    assert!(
        !body["detail"]
            .as_str()
            .unwrap()
            .contains("crashing mid-turn"),
        "stderr stays out of bodies"
    );
    let events = sse.until("turn_ended").await;
    assert!(
        events
            .iter()
            .any(|e| e.event == "agent_exited" && e.data["code"] == 3),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap().data["error"]["status"], 502);
    assert_eq!(gw.status(&id).await, "saved");
    assert!(
        !pid_alive(pid_before) || {
            // give the reaper a moment; the pool waits for the child
            gw.wait_until(|_| async move { !pid_alive(pid_before) })
                .await;
            true
        }
    );
    gw.wait_member_state("ready").await;
    let agent = gw.json("/agent").await;
    assert!(agent["members"][0]["restarts"].as_u64().unwrap() >= 1);
    assert_eq!(agent["members"][0]["lastExit"]["code"], 3);
    let (status, body) = gw.prompt(&id, "back again").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn"))
    );
    w.finish().await;
}

async fn pool_places_on_least_loaded_member(backend: Backend) {
    let w = World::start(backend, Options::default().pool(2)).await;
    let gw = w.gw();
    gw.wait_members_ready().await;
    let mut ids = vec![];
    for _ in 0..4 {
        ids.push(gw.create("/tmp").await);
    }
    let agent = gw.json("/agent").await;
    let loads: Vec<u64> = agent["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["sessions"].as_u64().unwrap())
        .collect();
    assert_eq!(loads, [2, 2]);
    // Each session is pinned: prompts work without any load/resume.
    for id in &ids {
        assert_eq!(gw.prompt(id, "x").await.0, 200);
    }
    assert_eq!(w.calls("session/load") + w.calls("session/resume"), 0);
    w.finish().await;
}

async fn live_tail_and_after_cursor(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "/chunks 5").await.0, 200);
    let total = gw.history_len(&id).await as i64;
    // ?after=N and Last-Event-ID: N both resume with N+1.
    let mut a = gw
        .sse(&format!("/sessions/{id}/events?after=3"), None)
        .await;
    assert_eq!(a.next().await.unwrap().id, 4);
    let mut b = gw.events(&id, Some(total - 1)).await;
    let last = b.next().await.unwrap();
    assert_eq!((last.id, last.event.as_str()), (total, "turn_ended"));
    // History pages.
    let page = gw
        .json(&format!("/sessions/{id}/history?after=2&limit=2"))
        .await;
    assert_eq!(seqs(&page), [3, 4]);
    assert_eq!(page["nextAfter"], 4);
    assert_eq!(
        gw.get(&format!("/sessions/{id}/history?limit=0"))
            .await
            .status(),
        400
    );
    let r = gw
        .http
        .get(gw.url(&format!("/sessions/{id}/events")))
        .header("last-event-id", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(gw.get("/sessions/sess_nope/events").await.status(), 404);
    w.finish().await;
}

/// An agent that stops waiting for an answer withdraws its request (`$/cancel_request`): the
/// request is resolved as `withdrawn` before the turn goes on, and a client's late answer is
/// refused rather than sent to an agent that no longer asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_agent_withdraws_is_resolved_and_a_late_answer_refused() {
    let (w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let mut sse = gw.events(&id, None).await;
    gw.prompt_async(&id, "/permission-for 300 hi").await;
    let asked = sse.until("permission_requested").await;
    let request_id = find_event(&asked, "permission_requested").data["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = sse.until("turn_ended").await;
    let resolved = find_event(&events, "permission_resolved");
    assert_eq!(resolved.data["reason"], "withdrawn", "{:?}", resolved.data);
    assert_eq!(resolved.data["requestId"], json!(request_id));
    let said: String = (events.iter())
        .filter(|e| e.event == "agent_message_chunk")
        .filter_map(|e| e.data["update"]["content"]["text"].as_str())
        .collect();
    assert!(said.contains("permission: withdrawn"), "{said}");
    let path = format!("/sessions/{id}/permissions/{request_id}");
    let late = gw.post(&path, json!({"optionId": "allow"})).await;
    assert_eq!(late.status(), 409);
    w.finish().await;
}

/// A call the gateway stops waiting for (`--control-timeout`) is cancelled at the agent with
/// `$/cancel_request`, so the agent does not go on making a session nobody will use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_gateway_gives_up_on_is_cancelled_at_the_agent() {
    let opts = Options::default()
        .env("ECHO_AGENT_NEW_DELAY_MS", "60000")
        .args(&["--control-timeout", "1"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 504);
    gw.wait_until(|_| async { w.calls("$/cancel_request") == 1 })
        .await;
    // The agent answers the cancelled call (-32800): an answer the gateway expects, not garbage.
    gw.wait_until(|_| async { w.log().contains("the late answer to a call given up on") })
        .await;
    assert!(!w.log().contains("unknown request id"), "{}", w.log());
    assert_eq!(gw.metric("acp_gateway_agent_garbage_total").await, 0.0);
    w.finish().await;
}
