//! A session out and in, on both stores: `GET /sessions/{id}/export` as JSON Lines and as a
//! Markdown transcript of a session with turns, a tool call with its diff, a permission
//! answered and a crash; `POST /sessions/import` into another tenant (a read-only transcript
//! with the same events, readable, followable and deletable), into another gateway whose
//! agent knows the session (it goes on, numbering after the imported events, and a client
//! resumes across the move), and the imports refused with nothing left behind.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::seen::{ACME, GLOBEX, get_as, two_tenants};
use support::sse::Sse;
use support::*;

both_backends!(
    a_session_exports_whole_and_imports_as_a_transcript,
    an_import_its_agent_can_load_goes_on,
    bad_imports_are_refused_and_leave_nothing,
    a_long_answer_exports_as_one_paragraph,
);

const NDJSON: &str = "application/x-ndjson";

/// `POST /sessions/import` of `body` as `media` with `key`: the status and the answer.
async fn import(gw: &Gateway, key: Option<&str>, media: &str, body: String) -> (u16, Value) {
    let mut req = gw
        .http
        .post(gw.url("/sessions/import"))
        .header("content-type", media);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let r = req.body(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Every event of session `id`, as the history pages them.
async fn all_events(gw: &Gateway, key: Option<&str>, id: &str) -> Vec<Value> {
    let (mut events, mut after) = (Vec::new(), 0);
    loop {
        let path = format!("/sessions/{id}/history?after={after}&limit=1000");
        let page = (gw.with_key(key))
            .send_expecting(Method::GET, &path, None, 200)
            .await;
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        match page["nextAfter"].as_i64() {
            Some(next) => after = next,
            None => return events,
        }
    }
}

/// `events` with each data's `sessionId` taken out, to compare sessions of two ids.
fn without_ids(events: &[Value]) -> Vec<Value> {
    let mut events = events.to_vec();
    for e in &mut events {
        if let Some(data) = e["data"].as_object_mut() {
            data.remove("sessionId");
        }
    }
    events
}

/// An export's lines, parsed.
fn lines(text: &str) -> Vec<Value> {
    assert!(text.ends_with('\n'), "an export ends with a newline");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A session of acme's with two turns, a tool call, a permission allowed and a crash.
async fn busy_session(gw: &Gateway) -> String {
    let acme = gw.with_key(Some(ACME));
    let created = acme
        .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
        .await;
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("/sessions/{id}/prompt");
    let said = acme
        .post(&prompt, json!({"text": "/tool notes.md hello world"}))
        .await;
    assert_eq!(said.0, 200, "{}", said.1);
    acme.prompt_async(&id, "/permission go on").await;
    let request = loop {
        let (_, pending) = acme.get(&format!("/sessions/{id}/permissions")).await;
        if let Some(request) = pending[0]["requestId"].as_str() {
            break request.to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let path = format!("/sessions/{id}/permissions/{request}");
    acme.send_expecting(Method::POST, &path, Some(json!({"optionId": "allow"})), 200)
        .await;
    gw.wait_until(|g| {
        let id = id.clone();
        async move {
            let events = all_events(g, Some(ACME), &id).await;
            events.iter().filter(|e| e["event"] == "turn_ended").count() == 2
        }
    })
    .await;
    let crashed = acme.post(&prompt, json!({"text": "/crash"})).await;
    assert_ne!(crashed.0, 200, "{}", crashed.1);
    gw.wait_until(|g| {
        let id = id.clone();
        async move {
            let events = all_events(g, Some(ACME), &id).await;
            events.iter().any(|e| e["event"] == "agent_exited")
        }
    })
    .await;
    id
}

/// The export holds the session, its state and every event as the history has them, then
/// an end that counts them; the Markdown transcript shows what happened; another tenant's
/// import is a read-only transcript with the same events, which it reads, follows and
/// deletes, and which the session's own tenant does not see.
async fn a_session_exports_whole_and_imports_as_a_transcript(backend: Backend) {
    let w = World::start(backend, two_tenants()).await;
    let gw = w.gw();
    let id = busy_session(gw).await;
    let history = all_events(gw, Some(ACME), &id).await;

    let path = format!("/sessions/{id}/export");
    let (status, media, text) = get_as(gw, Some(ACME), &path, NDJSON).await;
    assert_eq!((status, media.as_str()), (200, NDJSON), "{text}");
    let export = lines(&text);
    let header = &export[0];
    assert_eq!(header["format"], "acp-gateway.session");
    assert_eq!(header["version"], 1);
    assert_eq!(header["session"]["sessionId"], id.as_str());
    assert_eq!(header["session"]["owner"]["user"], "ann");
    let last = history.last().unwrap()["seq"].as_i64().unwrap();
    assert_eq!(header["state"]["seq"], last);
    let exported = &export[1..export.len() - 1];
    assert_eq!(exported, history.as_slice());
    assert_eq!(
        export.last().unwrap(),
        &json!({"end": {"events": history.len(), "lastSeq": last}})
    );
    for kind in [
        "tool_call",
        "tool_call_update",
        "permission_resolved",
        "agent_exited",
    ] {
        assert!(
            exported.iter().any(|e| e["event"] == kind),
            "no {kind} in {text}"
        );
    }
    assert_eq!((get_as(gw, Some(GLOBEX), &path, NDJSON).await).0, 404);

    let (status, media, md) = get_as(gw, Some(ACME), &path, "text/markdown").await;
    assert_eq!(
        (status, media.as_str()),
        (200, "text/markdown; charset=utf-8")
    );
    for shown in [
        "## Prompt by ann",
        "/tool notes.md hello world",
        "**Agent:**\n\nhello world",
        "**Tool call:** Edit notes.md (edit, in_progress)",
        "```diff\n--- /tmp/notes.md\n+++ /tmp/notes.md\n+echo wrote notes.md\n```",
        "**Tool call** `tool_1`: completed",
        "```\nwrote notes.md\n```",
        "**Permission asked** for echo wants to write a file: ",
        "**Permission answered** by ann: `allow`",
        "**The agent exited** (exit code 3)",
    ] {
        assert!(md.contains(shown), "{shown:?} is not in\n{md}");
    }
    let (_, _, by_query) = get_as(gw, Some(ACME), &format!("{path}?format=markdown"), "*/*").await;
    assert_eq!(by_query.lines().next(), md.lines().next());

    // Another tenant's import: a new id (this one is taken here), read-only, the same events.
    let (status, view) = import(gw, Some(GLOBEX), NDJSON, text.clone()).await;
    assert_eq!(status, 201, "{view}");
    let copy = view["sessionId"].as_str().unwrap().to_owned();
    assert_ne!(copy, id);
    let imported = &view["_meta"]["acp-gateway/import"];
    assert_eq!(imported["from"], id.as_str());
    assert_eq!(imported["readOnly"], true);
    assert!(
        imported["why"].as_str().unwrap().contains("only an admin"),
        "{imported}"
    );
    assert_eq!(view["owner"]["user"], "dee");
    assert_eq!(view["state"], header["state"]["state"]);
    let copied = all_events(gw, Some(GLOBEX), &copy).await;
    assert_eq!(without_ids(&copied), without_ids(&history));
    assert!(
        copied
            .iter()
            .all(|e| e["data"]["sessionId"] == copy.as_str())
    );
    assert_eq!(
        (gw.with_key(Some(ACME))
            .get(&format!("/sessions/{copy}"))
            .await)
            .0,
        404
    );

    let url = gw.url(&format!("/sessions/{copy}/events"));
    let request = Sse::request(&gw.http, &url, Some(0)).bearer_auth(GLOBEX);
    let mut follow = Sse::from_response(request.send().await.unwrap());
    for e in &copied {
        let got = follow.next().await.unwrap();
        assert_eq!(
            (got.id, got.event.as_str()),
            (e["seq"].as_i64().unwrap(), e["event"].as_str().unwrap())
        );
    }

    let globex = gw.with_key(Some(GLOBEX));
    let (status, refused) = globex
        .post(&format!("/sessions/{copy}/prompt"), json!({"text": "hi"}))
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("read-only transcript"),
        "{refused}"
    );
    let (status, refused) = globex
        .post(&format!("/sessions/{copy}/resume"), json!({}))
        .await;
    assert_eq!(status, 409, "{refused}");
    let again = all_events(gw, Some(GLOBEX), &copy).await;
    assert_eq!(again.len(), copied.len(), "a refused prompt logs nothing");
    let (status, _) = globex
        .send(Method::DELETE, &format!("/sessions/{copy}"), None)
        .await;
    assert_eq!(status, 204);
    assert_eq!((globex.get(&format!("/sessions/{copy}")).await).0, 404);
    assert_eq!(
        all_events(gw, Some(ACME), &id).await,
        history,
        "the original is untouched"
    );
}

/// On a gateway of its own store whose agent knows the session, an import keeps its id and
/// goes on: a prompt loads it and its events follow the imported ones; a client that read
/// part of it on the first gateway resumes on the second exactly after what it read.
async fn an_import_its_agent_can_load_goes_on(backend: Backend) {
    let a = World::start(backend, Options::default()).await;
    let id = a.gw().create("/tmp").await;
    for text in ["one two", "three four"] {
        assert_eq!(a.gw().prompt(&id, text).await.0, 200);
    }
    let history = all_events(a.gw(), None, &id).await;
    let (_, _, text) = get_as(a.gw(), None, &format!("/sessions/{id}/export"), NDJSON).await;

    let agent_dir = a.agent_dir();
    let shared = Options::default().env("ECHO_AGENT_DIR", agent_dir.to_str().unwrap());
    let b = World::start(backend, shared).await;
    let (status, view) = import(b.gw(), None, "application/x-ndjson; charset=utf-8", text).await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["sessionId"], id.as_str());
    assert_eq!(view["_meta"]["acp-gateway/import"]["readOnly"], false);
    assert_eq!(view["status"], "saved");
    assert_eq!(all_events(b.gw(), None, &id).await, history);

    let read = history[history.len() / 2]["seq"].as_i64().unwrap();
    let mut follow = b.gw().events(&id, Some(read)).await;
    let (status, answer) = b.gw().prompt(&id, "five six").await;
    assert_eq!(status, 200, "{answer}");
    let after = all_events(b.gw(), None, &id).await;
    assert_eq!(&after[..history.len()], history.as_slice());
    let last = history.last().unwrap()["seq"].as_i64().unwrap();
    assert_eq!(after[history.len()]["seq"], last + 1);
    assert_eq!(b.gw().said(&id, "five six").await, "five six");
    for e in &after {
        let seq = e["seq"].as_i64().unwrap();
        if seq > read {
            assert_eq!(follow.next().await.unwrap().id, seq);
        }
    }
}

/// Imports that are not a whole export are refused, saying which line is wrong, and nothing
/// of them is left: the list is as it was.
async fn bad_imports_are_refused_and_leave_nothing(backend: Backend) {
    let w = World::start(
        backend,
        Options::default().args(&["--max-body-bytes", "200000"]),
    )
    .await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    assert_eq!(gw.prompt(&id, "a few words here").await.0, 200);
    let (_, _, text) = get_as(gw, None, &format!("/sessions/{id}/export"), NDJSON).await;
    let good: Vec<&str> = text.lines().collect();
    let join = |lines: &[&str]| lines.join("\n") + "\n";
    let n = good.len();
    let swapped = {
        let mut lines = good.clone();
        lines.swap(2, 3);
        join(&lines)
    };
    let not_object = good[2]
        .replace("\"data\":{", "\"data\":[{")
        .replace("},\"createdAt\"", "}],\"createdAt\"");
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("application/json", text.clone(), 415, "x-ndjson"),
        (NDJSON, String::new(), 422, "empty"),
        (NDJSON, "not json\n".into(), 422, "line 1"),
        (NDJSON, join(&good[..n - 1]), 422, "cut short"),
        (
            NDJSON,
            join(&[&good[..2], &["{\"seq\": 1, \"oops\": 2}"], &good[2..]].concat()),
            422,
            "line 3",
        ),
        (NDJSON, swapped, 422, "line 4"),
        (
            NDJSON,
            join(&[&good[..2], &[not_object.as_str()], &good[3..]].concat()),
            422,
            "line 3",
        ),
        (
            NDJSON,
            join(&[&good[..], &["{}"]].concat()),
            422,
            "after the export's end",
        ),
        (
            NDJSON,
            join(&[&good[..n - 1], &["{\"end\":{\"events\":1,\"lastSeq\":1}}"]].concat()),
            422,
            "the end counts",
        ),
        (
            NDJSON,
            text.replace("acp-gateway.session", "something.else"),
            422,
            "line 1",
        ),
        (
            NDJSON,
            text.replace("\"cwd\":\"/tmp\"", "\"cwd\":\"tmp\""),
            422,
            "line 1: cwd must be an absolute path",
        ),
        (
            NDJSON,
            format!("{text}{}", " ".repeat(200_000)),
            413,
            "larger",
        ),
    ];
    for (media, body, want, says) in cases {
        let (status, problem) = import(gw, None, media, body).await;
        assert_eq!(status, want, "{says}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(says), "{says:?} is not in {problem}");
    }
    let listed = gw.json("/sessions").await;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");
    // And the good one still goes in.
    let (status, view) = import(gw, None, NDJSON, text).await;
    assert_eq!(status, 201, "{view}");
}

/// An answer longer than a page of the log (500 events) is one paragraph of the transcript,
/// and the JSON Lines hold every one of its events.
async fn a_long_answer_exports_as_one_paragraph(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    assert_eq!(gw.prompt(&id, "/chunks 1200 long").await.0, 200);
    let path = format!("/sessions/{id}/export");
    let (_, _, md) = get_as(gw, None, &path, "text/markdown").await;
    assert_eq!(md.matches("**Agent:**").count(), 1, "{md}");
    let words: Vec<String> = (1..=1200).map(|n| format!("c{n}")).collect();
    assert!(md.contains(&words.join(" ")), "the answer whole, in order");
    let (_, _, text) = get_as(gw, None, &path, NDJSON).await;
    let chunks = text.matches("\"event\":\"agent_message_chunk\"").count();
    assert_eq!(chunks, 1200);
}
