//! Elicitations (`elicitation/create`, form mode) against the real echo agent (`/elicit`):
//! listed while pending, answered through the REST route with content checked against the
//! requested schema (422 when it does not match, 409 once answered, 404 for an unknown id),
//! declined or cancelled by a client, cancelled with the turn, declined at
//! `--permission-timeout` or under a headless policy; each logged as `elicitation_requested`
//! then `elicitation_resolved`, in order. URL mode: accepted without content, its completion
//! logged.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(
    an_accepted_form_reaches_the_agent,
    content_not_matching_the_schema_is_refused,
    a_client_declines_or_cancels,
    cancelling_the_turn_cancels_the_elicitation,
    a_url_elicitation_is_accepted_without_content_and_completed,
    a_member_exit_cancels_its_elicitations,
);

/// Starts `/elicit` on a new session and waits for its request; returns the world, the
/// session, its stream (after `elicitation_requested`), the events so far, the request id and
/// the turn.
async fn elicit(backend: Backend, opts: Options) -> Elicited {
    elicit_with(backend, opts, "/elicit").await
}

type Elicited = (
    World,
    String,
    Sse,
    Vec<SseEvent>,
    String,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
);

async fn elicit_with(backend: Backend, opts: Options, prompt: &str) -> Elicited {
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let mut sse = gw.events(&id, None).await;
    let turn = gw.prompt_in_background(&id, prompt);
    let events = sse.until("elicitation_requested").await;
    let request_id = events.last().unwrap().data["requestId"]
        .as_str()
        .unwrap()
        .to_owned();
    (w, id, sse, events, request_id, turn)
}

fn pending(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["requestId"].as_str().unwrap())
        .collect()
}

/// The events of the session's log named `elicitation_*` or `turn_*`, in log order.
async fn logged_kinds(gw: &Gateway, id: &str) -> Vec<String> {
    gw.logged(id)
        .await
        .into_iter()
        .map(|(_, kind)| kind)
        .filter(|k| k.starts_with("elicitation_") || k.starts_with("turn_"))
        .collect()
}

async fn an_accepted_form_reaches_the_agent(backend: Backend) {
    let (w, id, mut sse, events, request_id, turn) = elicit(backend, Options::default()).await;
    let gw = w.gw();
    let requested = &events.last().unwrap().data;
    assert_eq!(requested["sessionId"], id.as_str());
    assert_eq!(requested["request"]["mode"], "form");
    assert_eq!(requested["request"]["message"], "Tell echo about yourself");
    assert_eq!(
        requested["request"]["requestedSchema"]["required"],
        json!(["name", "age"])
    );
    assert!(requested["deadline"].is_string(), "{requested}");

    let list = gw.json(&format!("/sessions/{id}/elicitations")).await;
    assert_eq!(pending(&list), [request_id.as_str()]);
    assert_eq!(list[0]["response"], Value::Null);
    assert_eq!(list[0]["request"]["sessionId"], id.as_str());
    let s = gw.json(&format!("/sessions/{id}/status")).await;
    assert_eq!(s["activity"], "awaiting_input");

    let unknown = format!("/sessions/{id}/elicitations/elic_unknown");
    let r = gw.post(&unknown, json!({"action": "decline"})).await;
    assert_eq!(r.status(), 404);

    let path = format!("/sessions/{id}/elicitations/{request_id}");
    let content =
        json!({"name": "Ada", "age": 36, "code": "ABC", "subscribe": true, "color": "green"});
    let r = gw
        .post(&path, json!({"action": "accept", "content": content}))
        .await;
    assert_eq!(r.status(), 200);
    let answered: Value = r.json().await.unwrap();
    assert_eq!(
        answered["response"],
        json!({"action": "accept", "content": content})
    );
    for again in [
        json!({"action": "accept", "content": content}),
        json!({"action": "decline"}),
    ] {
        assert_eq!(gw.post(&path, again).await.status(), 409);
    }

    let res = turn.await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["stopReason"], "end_turn");
    let events = sse.until("turn_ended").await;
    let resolved = &find_event(&events, "elicitation_resolved").data;
    assert_eq!(resolved["requestId"], request_id.as_str());
    assert_eq!(resolved["action"], "accept");
    assert_eq!(resolved["content"], content);
    assert_eq!(resolved["reason"], "answered");
    assert_eq!(
        chunk_text(&events),
        r#"elicitation: accept {"age":36,"code":"ABC","color":"green","name":"Ada","subscribe":true}"#
    );
    assert_eq!(
        logged_kinds(gw, &id).await,
        [
            "turn_started",
            "elicitation_requested",
            "elicitation_resolved",
            "turn_ended"
        ]
    );
    let list = gw.json(&format!("/sessions/{id}/elicitations")).await;
    assert!(pending(&list).is_empty());
    assert_eq!(gw.metric("acp_gateway_elicitations_pending").await, 0.0);
    w.finish().await;
}

async fn content_not_matching_the_schema_is_refused(backend: Backend) {
    let (w, id, mut sse, _, request_id, turn) = elicit(backend, Options::default()).await;
    let gw = w.gw();
    let path = format!("/sessions/{id}/elicitations/{request_id}");
    let accept = |content: Value| json!({"action": "accept", "content": content});
    for (body, why) in [
        (accept(json!({"name": "Ada"})), "age: required"),
        (
            accept(json!({"name": "Ada", "age": "36"})),
            "age: must be an integer",
        ),
        (
            accept(json!({"name": "Ada", "age": 36.5})),
            "age: must be an integer",
        ),
        (
            accept(json!({"name": "Ada", "age": 200})),
            "age: must be at most 150",
        ),
        (
            accept(json!({"name": "A", "age": 36})),
            "name: must be at least 2",
        ),
        (
            accept(json!({"name": 7, "age": 36})),
            "name: must be a string",
        ),
        (
            accept(json!({"name": "Ada", "age": 36, "code": "abc"})),
            "code: must match",
        ),
        (
            accept(json!({"name": "Ada", "age": 36, "color": "pink"})),
            "color: must be one of",
        ),
        (
            accept(json!({"name": "Ada", "age": 36, "subscribe": "yes"})),
            "subscribe: must be a boolean",
        ),
        (
            accept(json!({"name": "Ada", "age": 36, "nick": "A"})),
            "nick: not a property",
        ),
        (accept(json!("Ada")), "must be an object"),
        (json!({"action": "accept"}), "accept needs `content`"),
        (
            json!({"action": "decline", "content": {"name": "Ada", "age": 36}}),
            "only accept carries",
        ),
        (
            json!({"action": "cancel", "content": {}}),
            "only accept carries",
        ),
    ] {
        let r = gw.post(&path, body.clone()).await;
        assert_eq!(r.status(), 422, "{body}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{body}"
        );
        let problem: Value = r.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(why), "{body}: {problem}");
    }
    // Every problem is named at once.
    let r = gw.post(&path, accept(json!({"age": -1, "extra": 1}))).await;
    let problem: Value = r.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    for why in [
        "name: required",
        "age: must be at least 0",
        "extra: not a property",
    ] {
        assert!(detail.contains(why), "{problem}");
    }
    // An action outside the three is not an answer.
    let r = gw.post(&path, json!({"action": "maybe"})).await;
    assert!(r.status() == 400 || r.status() == 422, "{}", r.status());

    // None of these resolved it: it is still pending, and a valid answer still works.
    let list = gw.json(&format!("/sessions/{id}/elicitations")).await;
    assert_eq!(pending(&list), [request_id.as_str()]);
    let r = gw
        .post(&path, accept(json!({"name": "Bo", "age": 0})))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(turn.await.unwrap().unwrap().status(), 200);
    let events = sse.until("turn_ended").await;
    assert_eq!(
        chunk_text(&events),
        r#"elicitation: accept {"age":0,"name":"Bo"}"#
    );
    w.finish().await;
}

async fn a_client_declines_or_cancels(backend: Backend) {
    for (action, stop_reason) in [("decline", "end_turn"), ("cancel", "cancelled")] {
        let (w, id, mut sse, _, request_id, turn) = elicit(backend, Options::default()).await;
        let gw = w.gw();
        let path = format!("/sessions/{id}/elicitations/{request_id}");
        let r = gw.post(&path, json!({"action": action})).await;
        assert_eq!(r.status(), 200, "{action}");
        let answered: Value = r.json().await.unwrap();
        assert_eq!(answered["response"], json!({"action": action}));
        let res = turn.await.unwrap().unwrap();
        assert_eq!(res.status(), 200);
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["stopReason"], stop_reason, "{action}");
        let events = sse.until("turn_ended").await;
        let resolved = &find_event(&events, "elicitation_resolved").data;
        assert_eq!(resolved["action"], action);
        assert_eq!(resolved["reason"], "answered");
        assert!(resolved.get("content").is_none(), "{resolved}");
        assert_eq!(chunk_text(&events), format!("elicitation: {action}"));
        w.finish().await;
    }
}

/// Cancelling the turn, or closing the session, resolves its pending elicitation as `cancel`,
/// logged before the turn's end.
async fn cancelling_the_turn_cancels_the_elicitation(backend: Backend) {
    for route in ["cancel", "close"] {
        let (w, id, mut sse, _, request_id, _turn) = elicit(backend, Options::default()).await;
        let gw = w.gw();
        let r = gw.session_action(&id, route).await;
        assert_eq!(r.status(), 204, "{route}");
        let events = sse.until("turn_ended").await;
        let resolved = &find_event(&events, "elicitation_resolved").data;
        assert_eq!(resolved["requestId"], request_id.as_str());
        assert_eq!(resolved["action"], "cancel", "{route}");
        assert_eq!(resolved["reason"], "cancelled", "{route}");
        assert_eq!(
            events.last().unwrap().data["stopReason"],
            "cancelled",
            "{route}"
        );
        let path = format!("/sessions/{id}/elicitations/{request_id}");
        let r = gw.post(&path, json!({"action": "decline"})).await;
        assert_eq!(r.status(), 409, "{route}");
        let list = gw.json(&format!("/sessions/{id}/elicitations")).await;
        assert!(pending(&list).is_empty());
        assert_eq!(
            logged_kinds(gw, &id).await,
            [
                "turn_started",
                "elicitation_requested",
                "elicitation_resolved",
                "turn_ended"
            ],
            "{route}"
        );
        w.finish().await;
    }
}

/// URL mode: the request carries the URL; accepting carries no content (422 with some); the
/// agent's `elicitation/complete` is logged as `elicitation_completed` after the resolution.
async fn a_url_elicitation_is_accepted_without_content_and_completed(backend: Backend) {
    let (w, id, mut sse, events, request_id, turn) =
        elicit_with(backend, Options::default(), "/elicit-url").await;
    let gw = w.gw();
    let requested = &events.last().unwrap().data["request"];
    assert_eq!(requested["mode"], "url");
    assert_eq!(requested["url"], "https://example.org/echo-login");
    assert_eq!(requested["elicitationId"], "echo-login");
    let path = format!("/sessions/{id}/elicitations/{request_id}");
    let r = gw
        .post(
            &path,
            json!({"action": "accept", "content": {"name": "Ada"}}),
        )
        .await;
    assert_eq!(r.status(), 422);
    let r = gw.post(&path, json!({"action": "accept"})).await;
    assert_eq!(r.status(), 200);
    let answered: Value = r.json().await.unwrap();
    assert_eq!(answered["response"], json!({"action": "accept"}));
    assert_eq!(turn.await.unwrap().unwrap().status(), 200);
    let events = sse.until("turn_ended").await;
    let resolved = &find_event(&events, "elicitation_resolved").data;
    assert_eq!(
        (&resolved["action"], &resolved["reason"]),
        (&json!("accept"), &json!("answered"))
    );
    assert!(resolved.get("content").is_none(), "{resolved}");
    let completed = &find_event(&events, "elicitation_completed").data;
    assert_eq!(
        completed,
        &json!({"sessionId": id, "requestId": request_id, "elicitationId": "echo-login"})
    );
    assert_eq!(chunk_text(&events), "elicitation: accept");
    let kinds: Vec<String> = gw
        .logged(&id)
        .await
        .into_iter()
        .map(|(_, kind)| kind)
        .filter(|k| k.starts_with("elicitation_"))
        .collect();
    assert_eq!(
        kinds,
        [
            "elicitation_requested",
            "elicitation_resolved",
            "elicitation_completed"
        ]
    );
    w.finish().await;
}

/// The agent process exits while its elicitation waits: the elicitation is logged as cancelled
/// before `agent_exited`, and it is no longer listed or answerable.
async fn a_member_exit_cancels_its_elicitations(backend: Backend) {
    let (w, id, mut sse, _, request_id, turn) = elicit(backend, Options::default()).await;
    let gw = w.gw();
    let pid = gw.agent_pid().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let events = sse.until("agent_exited").await;
    let resolved = &find_event(&events, "elicitation_resolved").data;
    assert_eq!(resolved["requestId"], request_id.as_str());
    assert_eq!(
        (&resolved["action"], &resolved["reason"]),
        (&json!("cancel"), &json!("cancelled"))
    );
    let _ = turn.await;
    let list = gw.json(&format!("/sessions/{id}/elicitations")).await;
    assert!(pending(&list).is_empty());
    let path = format!("/sessions/{id}/elicitations/{request_id}");
    let r = gw.post(&path, json!({"action": "decline"})).await;
    assert_eq!(r.status(), 404);
    w.finish().await;
}

/// Elicitations nobody answers fail closed: declined after --permission-timeout (the deadline
/// the request showed), or at once under a headless permission policy.
#[tokio::test]
async fn unanswered_elicitations_are_declined() {
    for (args, reason) in [
        (["--permission-timeout", "1"], "timeout"),
        (["--permission-policy", "allow"], "policy"),
    ] {
        let opts = Options::default().args(&args);
        let (w, id) = World::with_session(Backend::Sqlite, opts).await;
        let gw = w.gw();
        let (status, body) = gw.prompt(&id, "/elicit").await;
        assert_eq!((status, &body["stopReason"]), (200, &json!("end_turn")));
        let events = gw.first_turn(&id).await;
        let requested = &find_event(&events, "elicitation_requested").data;
        let resolved = &find_event(&events, "elicitation_resolved").data;
        assert_eq!(resolved["requestId"], requested["requestId"]);
        assert_eq!(resolved["action"], "decline", "{reason}");
        assert_eq!(resolved["reason"], reason);
        let deadline = requested["deadline"]
            .as_str()
            .map(chrono::DateTime::parse_from_rfc3339);
        if reason == "timeout" {
            assert!(matches!(deadline, Some(Ok(_))), "{requested}");
        } else {
            assert!(deadline.is_none(), "{requested}");
        }
        assert_eq!(chunk_text(&events), "elicitation: decline");
        assert_eq!(
            logged_kinds(gw, &id).await,
            [
                "turn_started",
                "elicitation_requested",
                "elicitation_resolved",
                "turn_ended"
            ],
            "{reason}"
        );
        w.finish().await;
    }
}
