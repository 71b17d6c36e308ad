//! End-to-end tests of the session routes against a real gateway and the real echo agent, on
//! SQLite and on PostgreSQL.

use crate::support;

use serde_json::{Value, json};
use support::*;

both_backends!(
    quick_start_flow,
    status_never_loads_or_resumes,
    list_pagination_and_filters,
    patch_title_and_lifecycle_stream,
    restart_keeps_sessions_and_events,
    sync_follows_the_agents_list,
    archive_flows_through_or_stays_in_the_cache,
    creates_racing_syncs_stay_the_gateways,
    any_character_a_client_sends_is_kept_as_sent,
);

fn listed_ids(page: &Value) -> Vec<String> {
    page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_owned())
        .collect()
}

/// `method path` with `body` as the JSON text sent (any escape, even one no JSON serializer
/// writes), returning the status and the body's text.
async fn send_raw(gw: &Gateway, method: reqwest::Method, path: &str, body: &str) -> (u16, String) {
    let r = gw
        .http
        .request(method, gw.url(path))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// What a client sends is stored and served as sent, whatever its characters, on both backends
/// and after a restart: in a title a U+0000 (which PostgreSQL's `text` refuses), and U+10FFFF
/// followed by a character of the range the gateway holds lone surrogates with. A lone
/// surrogate is not a character: a title or prompt holding one is refused (422), so that no
/// answer carries one a client made.
async fn any_character_a_client_sends_is_kept_as_sent(backend: Backend) {
    // Without `list` and `title`, the gateway's cache is the titles' home: no sync after the
    // restart overwrites them.
    let opts = Options::default().env("ECHO_AGENT_CAPS", "load,delete,resume,close");
    let mut w = World::start(backend, opts).await;
    let prompted = w.gw().create("/tmp").await;
    let (status, answer) = send_raw(
        w.gw(),
        reqwest::Method::POST,
        &format!("/sessions/{prompted}/prompt"),
        r#"{"text":"cut \ud83d"}"#,
    )
    .await;
    assert_eq!(status, 422, "{answer}");
    let titled = w.gw().create("/tmp").await;
    let title = "\"title\":\"nul\\u0000 mark\u{10FFFF}\u{10F000} pair\u{1F600}\"";
    let (status, refused) = send_raw(
        w.gw(),
        reqwest::Method::PATCH,
        &format!("/sessions/{titled}"),
        r#"{"title":"lone\udc00"}"#,
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    let (status, view) = send_raw(
        w.gw(),
        reqwest::Method::PATCH,
        &format!("/sessions/{titled}"),
        r#"{"title":"nul\u0000 mark\udbff\udfff\udbfc\udc00 pair\ud83d\ude00"}"#,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert!(view.contains(title), "{view}");
    for restarted in [false, true] {
        if restarted {
            w.restart().await;
        }
        let gw = w.gw();
        let text = async |path: &str| {
            let r = gw.get(path).await;
            assert_eq!(r.status(), 200, "GET {path}");
            r.text().await.unwrap()
        };
        let view = text(&format!("/sessions/{titled}")).await;
        assert!(view.contains(title), "restarted: {restarted}: {view}");
        let listed = text("/sessions").await;
        assert!(listed.contains(title), "restarted: {restarted}: {listed}");
    }
    assert_eq!(w.gw().metric("acp_gateway_agent_garbage_total").await, 0.0);
    w.finish().await;
}

/// A session the agent lists while the gateway is still storing its create is the gateway's
/// own: origin `gateway`, owned by its creator, announced once. Creates and refreshes run
/// concurrently to give a sync every chance to list an id before its row exists.
async fn creates_racing_syncs_stay_the_gateways(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_CAPS", "load,list,resume,close");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let mut lifecycle = gw.sse("/events", None).await;
    let cwds: Vec<String> = (0..12).map(|i| format!("/tmp/race/{i}")).collect();
    let creates = cwds.iter().map(|cwd| gw.create(cwd));
    let refreshes = (0..12).map(|_| gw.json("/sessions?refresh=true&limit=1"));
    let (ids, _) = tokio::join!(
        futures::future::join_all(creates),
        futures::future::join_all(refreshes)
    );
    for id in &ids {
        let s = gw.json(&format!("/sessions/{id}")).await;
        assert_eq!(s["origin"], "gateway", "{s}");
    }
    let mut created = Vec::new();
    while created.len() < ids.len() {
        let e = lifecycle.next().await.expect("lifecycle stream ended");
        if e.event == "session_created" {
            created.push(e.data["session"]["sessionId"].as_str().unwrap().to_owned());
        }
    }
    // One more create marks the end: nothing was announced twice before it.
    let last = gw.create("/tmp/race/last").await;
    let rest = lifecycle.until("session_created").await;
    let last_seen = rest.last().unwrap().data["session"]["sessionId"].clone();
    assert_eq!(last_seen, last.as_str());
    created.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(created, expected);
    w.finish().await;
}

/// Sessions another client creates directly on the agent appear (on `refresh=true` and by the
/// periodic sync) and can be prompted; titles changed there follow; sessions deleted there
/// vanish; a session deleted through the gateway stays deleted although the agent, which
/// cannot delete, still lists it.
async fn sync_follows_the_agents_list(backend: Backend) {
    let caps = "load,list,resume,close,title";
    let opts = Options::default().env("ECHO_AGENT_CAPS", caps);
    let mut w = World::start(backend, opts.clone()).await;
    let mine = w.gw().create("/tmp/sync").await;
    let mut editor = DirectClient::start(&w.agent_dir(), &format!("{caps},delete")).await;
    let theirs = editor.new_session("/tmp/editor").await;

    let gw = w.gw();
    let page = gw.json("/sessions?refresh=true").await;
    assert_eq!(listed_ids(&page), [theirs.clone(), mine.clone()], "{page}");
    let found = gw.json(&format!("/sessions/{theirs}")).await;
    assert_eq!(found["origin"], "upstream");
    assert_eq!(found["cwd"], "/tmp/editor");
    assert_eq!(found["status"], "saved");
    assert_eq!(
        gw.json(&format!("/sessions/{mine}")).await["origin"],
        "gateway"
    );

    editor
        .call(
            "session/set_title",
            json!({"sessionId": theirs, "title": "Named in the editor"}),
        )
        .await;
    gw.json("/sessions?refresh=true").await;
    assert_eq!(
        gw.json(&format!("/sessions/{theirs}")).await["title"],
        "Named in the editor"
    );

    editor
        .call("session/delete", json!({"sessionId": theirs}))
        .await;
    let page = gw.json("/sessions?refresh=true").await;
    assert_eq!(listed_ids(&page), [mine.as_str()], "{page}");
    assert_eq!(gw.get(&format!("/sessions/{theirs}")).await.status(), 404);

    // Deleted through the gateway: the agent keeps it (no session/delete), the sync does not
    // bring it back.
    assert_eq!(gw.delete(&format!("/sessions/{mine}")).await.status(), 204);
    let on_agent = editor.call("session/list", json!({})).await;
    assert!(on_agent.to_string().contains(&mine), "{on_agent}");
    let page = gw.json("/sessions?refresh=true").await;
    assert!(listed_ids(&page).is_empty(), "{page}");
    assert_eq!(gw.get(&format!("/sessions/{mine}")).await.status(), 404);

    // The periodic sync, without refresh; a discovered session can be prompted.
    w.opts = opts.arg("--sync-interval").arg("1");
    w.restart().await;
    let later = editor.new_session("/tmp/editor").await;
    let gw = w.gw();
    let want = vec![later.clone()];
    gw.wait_until(|g| {
        let want = want.clone();
        async move { listed_ids(&g.json("/sessions").await) == want }
    })
    .await;
    let (status, body) = gw.prompt(&later, "hello from the gateway").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(w.calls_about("session/resume", &later), 1);
    assert_eq!(gw.get(&format!("/sessions/{mine}")).await.status(), 404);
    editor.stop().await;
    w.finish().await;
}

/// Archive and unarchive go to the agent when it advertises them and are cached; archived
/// sessions are listed only with `archived=true` (a sync keeps them so) and cannot be prompted
/// until unarchived. Without the capability the archive lives in the cache.
async fn archive_flows_through_or_stays_in_the_cache(backend: Backend) {
    let with_archive = Options::default().env("ECHO_AGENT_CAPS", "load,list,resume,close,archive");
    let mut w = World::start(backend, with_archive).await;
    let gw = w.gw();
    let id = gw.create("/tmp/arch").await;
    let other = gw.create("/tmp/arch").await;
    let r = gw.session_action(&id, "archive").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["archived"], true);
    assert_eq!(
        v["status"], "saved",
        "archiving frees the session on the agent"
    );
    assert_eq!(w.calls("session/archive"), 1);
    for path in ["/sessions", "/sessions?refresh=true"] {
        assert_eq!(listed_ids(&gw.json(path).await), [other.as_str()], "{path}");
    }
    assert_eq!(
        listed_ids(&gw.json("/sessions?archived=true").await),
        [id.as_str()]
    );
    let (status, body) = gw.prompt(&id, "still there?").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("unarchive"),
        "{body}"
    );
    let r = gw.session_action(&id, "unarchive").await;
    assert_eq!(r.status(), 200);
    assert_eq!(w.calls("session/unarchive"), 1);
    let (status, body) = gw.prompt(&id, "back again").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        gw.session_action("sess_nope", "archive").await.status(),
        404
    );

    w.opts = Options::default().env("ECHO_AGENT_CAPS", "load,list,resume,close");
    w.restart().await;
    let gw = w.gw();
    let (status, _) = gw.prompt(&id, "live again").await;
    assert_eq!(status, 200);
    let closes = w.calls("session/close");
    assert_eq!(archive(gw, &id).await, (json!(true), json!("saved")));
    assert_eq!(w.calls("session/archive"), 1, "not advertised, not called");
    assert_eq!(w.calls("session/close"), closes + 1, "closed instead");
    for path in ["/sessions", "/sessions?refresh=true"] {
        assert_eq!(listed_ids(&gw.json(path).await), [other.as_str()], "{path}");
    }

    // An agent that can neither archive nor close keeps the session in memory: still no prompt.
    let r = gw.session_action(&id, "unarchive").await;
    assert_eq!(r.status(), 200);
    w.opts = Options::default().env("ECHO_AGENT_CAPS", "load,list,resume");
    w.restart().await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "live once more").await.0, 200);
    assert_eq!(archive(gw, &id).await, (json!(true), json!("live")));
    let (status, body) = gw.prompt(&id, "not while archived").await;
    assert_eq!(status, 409, "{body}");
    w.finish().await;
}

/// The README flow: create → prompt → title in the list → SSE from 0 → live → delete twice → gone.
async fn quick_start_flow(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    std::fs::create_dir_all("/tmp/project").unwrap();
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

    let events = gw.first_turn(&id).await;
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
    // The answer does not wait for the log's commit, but a read of the log right after it
    // sees the whole turn, even one whose updates the writer is still storing.
    let other = gw.create("/tmp/project").await;
    let (status, _) = gw.prompt(&other, "/chunks 20000").await;
    assert_eq!(status, 200);
    let history = gw
        .json(&format!("/sessions/{other}/history?after=20000"))
        .await;
    assert_eq!(last_event(&history)["event"], "turn_ended", "{history}");
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
        assert_eq!(gw.session_action(&saved, "close").await.status(), 204);
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
        if pages == 1 {
            // Activity moves the oldest session, not yet listed, to the top of the list, and
            // a new session appears there: neither disturbs the pages that follow.
            let (status, _) = gw.prompt(&ids[0], "move up").await;
            assert_eq!(status, 200);
            gw.create("/tmp/c").await;
            let cursor = page["nextCursor"].as_str().unwrap();
            let foreign = gw
                .get(&format!("/sessions?limit=3&cwd=/tmp/a&cursor={cursor}"))
                .await;
            assert_eq!(foreign.status(), 400, "a cursor of another listing");
        }
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(
        seen, expected,
        "newest first as of the first page, each once"
    );
    let fresh = listed_ids(&gw.json("/sessions?limit=2").await);
    assert!(
        fresh.contains(&ids[0]),
        "a new listing shows the move: {fresh:?}"
    );

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
    // A session works in an existing directory: neither a missing path nor a file will do.
    for cwd in ["/does/not/exist", "/etc/passwd"] {
        let r = gw.post("/sessions", json!({"cwd": cwd})).await;
        assert_eq!(r.status(), 422, "{cwd}");
        let p: Value = r.json().await.unwrap();
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("not an existing directory"),
            "{p}"
        );
    }
    w.finish().await;
}

async fn patch_title_and_lifecycle_stream(backend: Backend) {
    // With `title`, the agent keeps titles: it trims them and cannot clear one (422, nothing
    // changed). Without it, the cache is the title's home and `null` clears it.
    for caps in [
        "load,delete,resume,close",
        "load,list,delete,resume,close,title",
    ] {
        let agent_titles = caps.contains("title");
        let w = World::start(backend, Options::default().env("ECHO_AGENT_CAPS", caps)).await;
        let gw = w.gw();
        let mut lifecycle = gw.sse("/events", Some(0)).await;
        let id = gw.create("/tmp").await;
        let r = gw
            .patch(&format!("/sessions/{id}"), json!({"title": "  My title"}))
            .await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        let expected = if agent_titles {
            "My title"
        } else {
            "  My title"
        };
        assert_eq!(v["title"], expected);
        assert_eq!(w.calls("session/set_title"), usize::from(agent_titles));
        assert_eq!(gw.json("/sessions").await["sessions"][0]["title"], expected);
        let r = gw
            .patch(&format!("/sessions/{id}"), json!({"title": null}))
            .await;
        if agent_titles {
            gw.json("/sessions?refresh=true").await; // the agent's list has the last word
        }
        let title_now = gw.json(&format!("/sessions/{id}")).await;
        if agent_titles {
            assert_eq!(r.status(), 422);
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            assert_eq!(title_now["title"], expected);
        } else {
            assert_eq!(r.status(), 200);
            assert!(title_now.get("title").is_none(), "{title_now}");
        }
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
        let renames = if agent_titles { 1 } else { 2 };
        assert!(
            kinds.iter().filter(|k| *k == "session_updated").count() >= renames,
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
    let mut sse = gw.events(&id, Some(n)).await;
    assert_eq!(gw.prompt(&id, "three").await.0, 200);
    let events = sse.until("turn_ended").await;
    assert_eq!(events[0].id, n + 1, "continues right after Last-Event-ID");
    assert_eq!(events[0].event, "turn_started");
    assert_eq!(chunk_text(&events), "three");
    let after = gw.json(&format!("/sessions/{id}/history?limit=1000")).await;
    let seqs = seqs(&after);
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
    assert_eq!(w.calls("session/resume"), 1);
    w.finish().await;
}

/// Archives session `id`; returns the answer's `archived` and `status`.
async fn archive(gw: &Gateway, id: &str) -> (Value, Value) {
    let v: Value = gw.session_action(id, "archive").await.json().await.unwrap();
    (v["archived"].clone(), v["status"].clone())
}
