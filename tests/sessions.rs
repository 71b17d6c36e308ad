//! End-to-end tests of the session routes against a real gateway and the real echo agent, on
//! SQLite and on PostgreSQL.

mod common;

use common::*;
use serde_json::{Value, json};

both_backends!(
    quick_start_flow,
    status_never_loads_or_resumes,
    list_pagination_and_filters,
    patch_title_and_lifecycle_stream,
    restart_keeps_sessions_and_events,
);

/// The README flow: create → prompt → title in the list → SSE from 0 → live → delete twice → gone.
async fn quick_start_flow(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let r = gw.post("/sessions", json!({"cwd": "/tmp/project"})).await;
    assert_eq!(r.status(), 201);
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let created: Value = r.json().await.unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(location, format!("/sessions/{id}"));
    assert_eq!(created["status"], "live");

    let (status, body) = gw.prompt(&id, "hello big world").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stopReason"], "end_turn");

    let list = gw.json("/sessions").await;
    let listed = &list["sessions"][0];
    assert_eq!(listed["sessionId"], id.as_str());
    assert_eq!(listed["title"], "Echo: hello big world");
    assert_eq!(listed["cwd"], "/tmp/project");
    assert_eq!(
        gw.json(&format!("/sessions/{id}")).await["title"],
        "Echo: hello big world"
    );

    let mut sse = gw.sse(&format!("/sessions/{id}/events"), Some(0)).await;
    let events = sse.until("turn_ended").await;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        [
            "turn_started",
            "agent_message_chunk",
            "agent_message_chunk",
            "agent_message_chunk",
            "session_info_update",
            "turn_ended"
        ]
    );
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    assert_eq!(ids, (1..=6).collect::<Vec<_>>());
    assert_eq!(chunk_text(&events), "hello big world");
    assert_eq!(events[1].data["sessionId"], id.as_str());
    assert_eq!(events[5].data["stopReason"], "end_turn");

    assert_eq!(gw.status(&id).await, "live");
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    assert_eq!(
        w.calls("session/delete"),
        1,
        "the agent advertises delete, so it is called"
    );
    let list = gw.json("/sessions").await;
    assert!(list["sessions"].as_array().unwrap().is_empty(), "{list}");
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    assert_eq!(gw.status(&id).await, "not_found");
    assert_eq!(gw.get(&format!("/sessions/{id}")).await.status(), 404);
    w.finish().await;
}

/// Status is a pure probe: any number of calls on live, saved and unknown sessions never makes
/// the agent load or resume anything, with and without the agent's own session/status.
async fn status_never_loads_or_resumes(backend: Backend) {
    for caps in [
        "load,list,delete,resume,close",
        "load,list,delete,resume,close,status",
    ] {
        let w = World::start(backend, Options::default().env("ECHO_AGENT_CAPS", caps)).await;
        let gw = w.gw();
        let live = gw.create("/tmp").await;
        let saved = gw.create("/tmp").await;
        assert_eq!(
            gw.post(&format!("/sessions/{saved}/close"), json!({}))
                .await
                .status(),
            204
        );
        for _ in 0..5 {
            assert_eq!(gw.status(&live).await, "live");
            assert_eq!(gw.status(&saved).await, "saved");
            assert_eq!(gw.status("sess_unknown").await, "not_found");
        }
        assert_eq!(
            w.calls("session/load") + w.calls("session/resume"),
            0,
            "caps {caps}"
        );
        assert_eq!(
            w.calls("session/status") > 0,
            caps.contains("status"),
            "caps {caps}"
        );
        let s: Value = gw.json(&format!("/sessions/{saved}/status")).await;
        assert_eq!(
            s,
            json!({"sessionId": saved, "status": "saved", "activity": null})
        );
        let s: Value = gw.json(&format!("/sessions/{live}/status")).await;
        assert_eq!(s["activity"], "idle");
        // A prompt on the saved session resumes it (and only then).
        let (status, _) = gw.prompt(&saved, "again").await;
        assert_eq!(status, 200);
        assert_eq!(w.calls("session/resume"), 1);
        assert_eq!(gw.status(&saved).await, "live");
        w.finish().await;
    }
}

async fn list_pagination_and_filters(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let mut ids = vec![];
    for i in 0..7 {
        ids.push(
            gw.create(if i % 2 == 0 { "/tmp/a" } else { "/tmp/b" })
                .await,
        );
    }
    // Walk pages of 3: every session exactly once, newest first.
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/sessions?limit=3&cursor={c}"),
            None => "/sessions?limit=3".to_owned(),
        };
        let page = gw.json(&path).await;
        pages += 1;
        for s in page["sessions"].as_array().unwrap() {
            seen.push(s["sessionId"].as_str().unwrap().to_owned());
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected, "newest first, each once");

    let a = gw.json("/sessions?cwd=/tmp/a").await;
    let a: Vec<_> = a["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["cwd"].clone())
        .collect();
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|c| c == "/tmp/a"));

    for bad in [
        "/sessions?cursor=nope",
        "/sessions?limit=0",
        "/sessions?limit=201",
        "/sessions?limit=x",
    ] {
        let r = gw.get(bad).await;
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["status"], 400);
        assert!(p["type"].as_str().unwrap().ends_with("bad-request"));
    }
    assert_eq!(gw.get("/sessions?cwd=relative").await.status(), 422);
    w.finish().await;
}

async fn patch_title_and_lifecycle_stream(backend: Backend) {
    for caps in [
        "load,list,delete,resume,close",
        "load,list,delete,resume,close,title",
    ] {
        let w = World::start(backend, Options::default().env("ECHO_AGENT_CAPS", caps)).await;
        let gw = w.gw();
        let mut lifecycle = gw.sse("/events", Some(0)).await;
        let id = gw.create("/tmp").await;
        let r = gw
            .patch(&format!("/sessions/{id}"), json!({"title": "  My title"}))
            .await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        // The echo agent trims titles; a gateway-only rename keeps them as given.
        let expected = if caps.contains("title") {
            "My title"
        } else {
            "  My title"
        };
        assert_eq!(v["title"], expected);
        assert_eq!(
            w.calls("session/set_title"),
            usize::from(caps.contains("title"))
        );
        assert_eq!(gw.json("/sessions").await["sessions"][0]["title"], expected);
        let r = gw
            .patch(&format!("/sessions/{id}"), json!({"title": null}))
            .await;
        assert_eq!(r.status(), 200);
        assert!(
            gw.json(&format!("/sessions/{id}"))
                .await
                .get("title")
                .is_none()
        );
        assert_eq!(
            gw.patch("/sessions/sess_nope", json!({"title": "x"}))
                .await
                .status(),
            404
        );
        assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);

        let created = lifecycle.until("session_created").await;
        assert_eq!(created.last().unwrap().data["sessionId"], id.as_str());
        let mut kinds = vec![];
        loop {
            let e = lifecycle.next().await.unwrap();
            kinds.push(e.event.clone());
            if e.event == "session_deleted" {
                break;
            }
        }
        assert!(
            kinds.iter().filter(|k| *k == "session_updated").count() >= 2,
            "{kinds:?}"
        );
        w.finish().await;
    }
}

/// A gateway restart keeps the list, the titles and the event log; the stream resumes where it
/// left off, and the next prompt resumes the session on the new pool.
async fn restart_keeps_sessions_and_events(backend: Backend) {
    let mut w = World::start(backend, Options::default()).await;
    let id = w.gw().create("/tmp").await;
    assert_eq!(w.gw().prompt(&id, "one two").await.0, 200);
    let before = w.gw().json(&format!("/sessions/{id}/history")).await;
    let n = before["events"].as_array().unwrap().len() as i64;
    assert!(n >= 4);

    w.restart().await;
    let gw = w.gw();
    assert_eq!(
        gw.json("/sessions").await["sessions"][0]["title"],
        "Echo: one two"
    );
    assert_eq!(gw.status(&id).await, "saved");
    let mut sse = gw.sse(&format!("/sessions/{id}/events"), Some(n)).await;
    assert_eq!(gw.prompt(&id, "three").await.0, 200);
    let events = sse.until("turn_ended").await;
    assert_eq!(events[0].id, n + 1, "continues right after Last-Event-ID");
    assert_eq!(events[0].event, "turn_started");
    assert_eq!(chunk_text(&events), "three");
    let after = gw.json(&format!("/sessions/{id}/history?limit=1000")).await;
    let seqs: Vec<i64> = after["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(w.calls("session/resume"), 1);
    w.finish().await;
}
