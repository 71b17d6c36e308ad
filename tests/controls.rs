//! Session state and controls against the real echo agent (`ECHO_AGENT_CONTROLS`), on SQLite
//! and on PostgreSQL: modes, models and config options set through the routes and at create,
//! the state folded from the log (kept across a restart), `?snapshot=true`, forks, and the
//! agent's prompt suggestions.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::*;

both_backends!(
    options_drive_mode_and_model_and_the_state_follows,
    set_mode_and_set_model_without_options,
    create_with_settings_or_leave_nothing,
    state_survives_a_restart_and_streams_as_a_snapshot,
    a_fork_starts_from_its_parent,
    the_state_outlives_retention,
);

const ALL: &str = "modes,models,options";

async fn put(gw: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let r = gw.send_json(Method::PUT, path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn option<'a>(state: &'a Value, id: &str) -> Option<&'a Value> {
    state["configOptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == id)
}

async fn state(gw: &Gateway, id: &str) -> Value {
    gw.json(&format!("/sessions/{id}")).await["state"].clone()
}

/// With config options, a mode or a model goes through the option of its category; modes and
/// models follow; an option appears with a model; values are checked before the agent is
/// asked; an agent's refusal keeps its `data`.
async fn options_drive_mode_and_model_and_the_state_follows(backend: Backend) {
    let w = World::start(backend, Options::default().env("ECHO_AGENT_CONTROLS", ALL)).await;
    let gw = w.gw();
    let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let s = &created["state"];
    assert_eq!(s["modes"]["currentModeId"], "ask");
    assert_eq!(s["models"]["currentModelId"], "echo-small");
    assert!(option(s, "effort").is_none(), "{s}");

    let (status, body) = put(
        gw,
        &format!("/sessions/{id}/mode"),
        json!({"modeId": "code"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"]["modes"]["currentModeId"], "code");
    assert_eq!(
        option(&body["state"], "mode").unwrap()["currentValue"],
        "code"
    );
    assert_eq!(w.calls("session/set_config_option"), 1);
    assert_eq!(w.calls("session/set_mode"), 0);

    let (status, body) = put(
        gw,
        &format!("/sessions/{id}/model"),
        json!({"modelId": "echo-large"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"]["models"]["currentModelId"], "echo-large");
    assert_eq!(
        option(&body["state"], "effort").unwrap()["currentValue"],
        "low"
    );
    assert_eq!(w.calls("session/set_model"), 0);

    let effort = format!("/sessions/{id}/config/effort");
    let (status, body) = put(gw, &effort, json!({"value": "high"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        option(&body["state"], "effort").unwrap()["currentValue"],
        "high"
    );
    let seq = body["seq"].as_i64().unwrap();
    let calls = w.calls("session/set_config_option");
    for (path, value) in [
        (effort.as_str(), json!("max")),
        (&format!("/sessions/{id}/config/verbose"), json!("yes")),
        (&format!("/sessions/{id}/config/nope"), json!(1)),
        (&format!("/sessions/{id}/mode"), json!(null)),
    ] {
        let body = if path.ends_with("/mode") {
            json!({"modeId": "nope"})
        } else {
            json!({"value": value})
        };
        let (status, problem) = put(gw, path, body).await;
        assert_eq!(status, 422, "{path}: {problem}");
    }
    assert_eq!(
        w.calls("session/set_config_option"),
        calls,
        "refused before the agent"
    );
    let (status, body) = put(
        gw,
        &format!("/sessions/{id}/config/verbose"),
        json!({"value": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["seq"].as_i64().unwrap() > seq);
    // The agent refuses a mode with -32603 and data: its details reach the client.
    let (status, problem) = put(
        gw,
        &format!("/sessions/{id}/mode"),
        json!({"modeId": "architect"}),
    )
    .await;
    assert_eq!(status, 502, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("architect mode needs a plan first"),
        "{problem}"
    );
    // The state read back is the last answer's, and the list stays light.
    let s = state(gw, &id).await;
    assert_eq!(s["modes"]["currentModeId"], "code");
    assert_eq!(option(&s, "verbose").unwrap()["currentValue"], true);
    let list = gw.json("/sessions").await;
    assert!(list["sessions"][0].get("state").is_none(), "{list}");
    for missing in ["/sessions/sess_nope/mode", "/sessions/sess_nope/model"] {
        let (status, _) = put(gw, missing, json!({"modeId": "code", "modelId": "x"})).await;
        assert!(status == 404 || status == 422, "{missing}: {status}");
    }
    let (status, _) = put(gw, "/sessions/sess_nope/mode", json!({"modeId": "code"})).await;
    assert_eq!(status, 404);
    w.finish().await;
}

/// Without options: `session/set_mode` and `session/set_model`, recorded though the agent sends
/// nothing; a control the agent lacks is 501.
async fn set_mode_and_set_model_without_options(backend: Backend) {
    let w = World::start(
        backend,
        Options::default().env("ECHO_AGENT_CONTROLS", "modes,models"),
    )
    .await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    let (status, body) = put(
        gw,
        &format!("/sessions/{id}/mode"),
        json!({"modeId": "code"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"]["modes"]["currentModeId"], "code");
    assert_eq!(w.calls("session/set_mode"), 1);
    let (status, body) = put(
        gw,
        &format!("/sessions/{id}/model"),
        json!({"modelId": "echo-large"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"]["models"]["currentModelId"], "echo-large");
    assert_eq!(w.calls("session/set_model"), 1);
    assert_eq!(state(gw, &id).await["modes"]["currentModeId"], "code");
    let (status, problem) = put(
        gw,
        &format!("/sessions/{id}/config/verbose"),
        json!({"value": true}),
    )
    .await;
    assert_eq!(status, 501, "{problem}");
    let (status, _) = put(
        gw,
        &format!("/sessions/{id}/model"),
        json!({"modelId": "echo-huge"}),
    )
    .await;
    assert_eq!(status, 422);
    w.finish().await;

    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    for (path, body) in [
        ("mode", json!({"modeId": "code"})),
        ("model", json!({"modelId": "m"})),
    ] {
        let (status, problem) = put(gw, &format!("/sessions/{id}/{path}"), body).await;
        assert_eq!(status, 501, "{path}: {problem}");
        assert_eq!(problem["status"], 501);
    }
    assert_eq!(state(gw, &id).await, json!({}));
    w.finish().await;
}

/// `POST /sessions` applies mode, model and options before its 201 and passes `_meta` to
/// `session/new`; a setting the agent does not offer fails the create and leaves no session.
async fn create_with_settings_or_leave_nothing(backend: Backend) {
    let w = World::start(backend, Options::default().env("ECHO_AGENT_CONTROLS", ALL)).await;
    let gw = w.gw();
    let meta = json!({"claudeCode": {"options": {"maxTurns": 3}}});
    let body = json!({"cwd": "/tmp", "mode": "code", "model": "echo-large",
                      "config": {"effort": "high"}, "_meta": meta});
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let s = &created["state"];
    assert_eq!(s["modes"]["currentModeId"], "code");
    assert_eq!(s["models"]["currentModelId"], "echo-large");
    assert_eq!(option(s, "effort").unwrap()["currentValue"], "high");
    // The agent kept the `_meta` it was given, and lists it.
    let listed = gw.json("/sessions?refresh=true").await;
    let mine = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["sessionId"] == id.as_str())
        .unwrap();
    assert_eq!(mine["_meta"], meta);

    let r = gw
        .post("/sessions", json!({"cwd": "/tmp", "_meta": [1]}))
        .await;
    assert_eq!(r.status(), 422, "_meta is an object");
    for bad in [
        json!({"cwd": "/tmp", "mode": "nope"}),
        json!({"cwd": "/tmp", "config": {"effort": "high"}}),
    ] {
        let r = gw.post("/sessions", bad.clone()).await;
        assert_eq!(r.status(), 422, "{bad}");
    }
    assert_eq!(
        w.calls("session/delete"),
        2,
        "each refused create is undone at the agent"
    );
    let listed = gw.json("/sessions?refresh=true").await;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");
    w.finish().await;
}

/// The state is a fold of the log: updates the agent sends (commands, plan, usage, an option it
/// changed itself) and the prompt's `usage` land in it, a restart keeps it, and a snapshot
/// stream starts with it and goes on from its position.
async fn state_survives_a_restart_and_streams_as_a_snapshot(backend: Backend) {
    let mut w = World::start(backend, Options::default().env("ECHO_AGENT_CONTROLS", ALL)).await;
    let id = w.gw().create("/tmp").await;
    let mut sse = w.gw().events(&id, None).await;
    let (status, body) = w.gw().prompt(&id, "/state hello there").await;
    assert_eq!(status, 200, "{body}");
    let events = sse.until("turn_ended").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    for kind in [
        "available_commands_update",
        "plan",
        "usage_update",
        "config_option_update",
        "_echo/status",
    ] {
        assert!(kinds.contains(&kind), "{kinds:?}");
    }
    let ended = &events.last().unwrap().data;
    assert_eq!(
        ended["usage"],
        json!({"totalTokens": 6, "inputTokens": 3, "outputTokens": 3})
    );
    let before = state(w.gw(), &id).await;
    assert_eq!(before["availableCommands"].as_array().unwrap().len(), 2);
    assert_eq!(before["plan"][1]["status"], "in_progress");
    assert_eq!(before["usage"]["latest"]["used"], 1200);
    assert_eq!(before["usage"]["lastPrompt"]["totalTokens"], 6);
    assert_eq!(option(&before, "verbose").unwrap()["currentValue"], true);

    w.restart().await;
    let gw = w.gw();
    assert_eq!(
        state(gw, &id).await,
        before,
        "the state outlives the gateway"
    );
    let mut snap = gw
        .sse(&format!("/sessions/{id}/events?snapshot=true"), None)
        .await;
    let first = snap.next().await.unwrap();
    assert_eq!(first.event, "state");
    assert_eq!(first.data["state"], before);
    assert_eq!(first.data["seq"], first.id);
    let history = gw.history(&id).await;
    assert_eq!(first.id, history.last().unwrap()["seq"].as_i64().unwrap());
    let (status, _) = put(
        gw,
        &format!("/sessions/{id}/mode"),
        json!({"modeId": "code"}),
    )
    .await;
    assert_eq!(status, 200);
    // The agent announces the mode it was set to; its answer says nothing more, so the
    // gateway logs nothing of its own.
    let next = snap.next().await.unwrap();
    assert!(
        next.id > first.id,
        "continues after the snapshot, replays nothing"
    );
    assert_eq!(next.event, "current_mode_update");
    let history = gw.history(&id).await;
    assert_eq!(history.last().unwrap()["seq"].as_i64(), Some(next.id));
    w.finish().await;
}

/// A fork is a new session whose log starts with a reference to its parent; an agent without
/// `fork` answers 501.
async fn a_fork_starts_from_its_parent(backend: Backend) {
    let caps = "load,list,delete,resume,close,fork";
    let w = World::start(
        backend,
        Options::default()
            .env("ECHO_AGENT_CAPS", caps)
            .env("ECHO_AGENT_CONTROLS", "modes"),
    )
    .await;
    let gw = w.gw();
    let parent = gw.create("/tmp").await;
    let (status, _) = put(
        gw,
        &format!("/sessions/{parent}/mode"),
        json!({"modeId": "code"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(gw.prompt(&parent, "first words").await.0, 200);
    let parent_last = gw.history(&parent).await.last().unwrap()["seq"].clone();
    let r = gw
        .post(&format!("/sessions/{parent}/fork"), json!({}))
        .await;
    assert_eq!(r.status(), 201);
    let fork: Value = r.json().await.unwrap();
    let id = fork["sessionId"].as_str().unwrap().to_owned();
    assert_ne!(id, parent);
    assert_eq!(fork["cwd"], "/tmp");
    assert_eq!(
        fork["state"]["modes"]["currentModeId"], "code",
        "the agent kept the parent's mode"
    );
    let history = gw.history(&id).await;
    let forked = history.iter().find(|e| e["event"] == "forked").unwrap();
    assert_eq!(forked["data"]["parentSessionId"], parent.as_str());
    assert_eq!(forked["data"]["parentSeq"], parent_last);
    let (status, body) = gw.prompt(&id, "in the fork").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn"))
    );
    let r = gw.post("/sessions/sess_nope/fork", json!({})).await;
    assert_eq!(r.status(), 404);
    w.finish().await;

    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let parent = gw.create("/tmp").await;
    let r = gw
        .post(&format!("/sessions/{parent}/fork"), json!({}))
        .await;
    assert_eq!(r.status(), 501);
    w.finish().await;
}

/// Retention prunes a session's old events; the state they made is kept, because the snapshot
/// moves to the log's end after each turn that changed the state.
async fn the_state_outlives_retention(backend: Backend) {
    let opts = Options::default()
        .env("ECHO_AGENT_CONTROLS", ALL)
        .args(&["--retention-events", "4"]);
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    assert_eq!(gw.prompt(&id, "/state stated").await.0, 200);
    let stated = gw.history(&id).await.last().unwrap()["seq"]
        .as_i64()
        .unwrap();
    for word in ["one", "two", "three"] {
        assert_eq!(gw.prompt(&id, word).await.0, 200);
    }
    // Pruned (every 5 s here) down to the last turn's events.
    let started = std::time::Instant::now();
    while gw.history(&id).await[0]["seq"].as_i64().unwrap() <= stated {
        assert!(started.elapsed() < PATIENCE, "never pruned");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let s = state(gw, &id).await;
    assert_eq!(
        s["availableCommands"].as_array().map(Vec::len),
        Some(2),
        "{s}"
    );
    assert_eq!(s["plan"][0]["content"], "Read the prompt");
    assert_eq!(s["usage"]["latest"]["used"], 1200);
    assert_eq!(
        s["usage"]["lastPrompt"]["totalTokens"], 2,
        "the last turn's usage"
    );
    w.finish().await;
}

/// Prompt suggestions (ACP, unstable; the gateway advertises `session.promptSuggestions`): the
/// agent's `prompt_suggestions_update` is streamed as an event, and its list is the session's
/// `promptSuggestions` until the next one, across turns that suggest nothing and a restart; an
/// empty list withdraws them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_suggestions_stream_and_stay_in_the_state() {
    let mut w = World::start(Backend::Sqlite, Options::default()).await;
    let id = w.gw().create("/tmp").await;
    let mut sse = w.gw().events(&id, None).await;
    let (status, body) = w.gw().prompt(&id, "/suggest again /suggest more hi").await;
    assert_eq!(status, 200, "{body}");
    let events = sse.until("turn_ended").await;
    let update = find_event(&events, "prompt_suggestions_update");
    assert_eq!(
        update.data["update"]["suggestions"][1]["prompt"][0]["text"],
        "more"
    );
    let text = |t: &str| json!({"prompt": [{"type": "text", "text": t}]});
    let suggested = state(w.gw(), &id).await["promptSuggestions"].clone();
    assert_eq!(suggested, json!([text("again"), text("more")]));

    assert_eq!(w.gw().prompt(&id, "plain").await.0, 200);
    w.restart().await;
    assert_eq!(state(w.gw(), &id).await["promptSuggestions"], suggested);
    assert_eq!(w.gw().prompt(&id, "/suggest - bye").await.0, 200);
    assert_eq!(state(w.gw(), &id).await["promptSuggestions"], json!([]));
    w.finish().await;
}
