//! `Idempotency-Key` against the real echo agent on both stores: a create retried makes one
//! session; a prompt whose client is cut mid-turn and sent again runs one turn and answers the
//! same twice; a webhook created twice is one subscription with one secret; a key used for
//! another request is 422, a malformed one 400; a restarted gateway still replays; an expired
//! key is pruned and runs again, but not while its request still runs; a repeat of a request
//! still running waits for it, then answers 409; a "busy" 409 is not kept, nor a 502 (the
//! agent killed mid-turn): the repeat runs again; the key of a gateway SIGKILLed mid-request is
//! taken over by the next repeat.

use crate::support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::*;

both_backends!(
    a_retried_create_makes_one_session,
    a_prompt_cut_mid_turn_and_sent_again_runs_once,
    a_key_names_one_request,
    a_restarted_gateway_replays,
    an_expired_key_is_pruned_and_runs_again,
    a_retried_webhook_is_one_subscription,
    a_busy_answer_is_not_kept,
    a_repeat_waits_for_the_running_request_then_answers_409,
    a_5xx_frees_the_key,
    a_running_request_keeps_its_key_past_the_ttl,
    a_killed_gateways_key_is_taken_over,
);

/// `body` POSTed to `path` under `key`: status, whether it was a replay, body.
async fn post_keyed(gw: &Gateway, path: &str, key: &str, body: Value) -> (u16, bool, Value) {
    let res = gw
        .http
        .post(gw.url(path))
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (status, replayed, res.json().await.unwrap_or(Value::Null))
}

async fn session_count(gw: &Gateway) -> usize {
    gw.json("/sessions").await["sessions"]
        .as_array()
        .unwrap()
        .len()
}

async fn a_retried_create_makes_one_session(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let create = json!({"cwd": "/tmp"});
    let (status, replayed, first) = post_keyed(gw, "/sessions", "create-1", create.clone()).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, again) = post_keyed(gw, "/sessions", "create-1", create.clone()).await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again, first);
    assert_eq!(session_count(gw).await, 1);
    assert_eq!(w.calls("session/new"), 1);
    // Another key is another request.
    let (status, replayed, other) = post_keyed(gw, "/sessions", "create-2", create).await;
    assert_eq!((status, replayed), (201, false));
    assert_ne!(other["sessionId"], first["sessionId"]);
    assert_eq!(session_count(gw).await, 2);
    w.finish().await;
}

async fn a_prompt_cut_mid_turn_and_sent_again_runs_once(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let prompt = json!({"text": "/chunks 10 /delay 100"});
    // The client gives up (its connection is cut) a second before the turn ends.
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let cut = impatient
        .post(gw.prompt_url(&id))
        .header("idempotency-key", "turn-1")
        .json(&prompt)
        .send()
        .await;
    assert!(cut.is_err(), "the first request was cut: {cut:?}");
    let path = format!("/sessions/{id}/prompt");
    let (status, replayed, answer) = post_keyed(gw, &path, "turn-1", prompt.clone()).await;
    assert_eq!((status, replayed), (200, true), "{answer}");
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    let (status, replayed, again) = post_keyed(gw, &path, "turn-1", prompt).await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(again, answer);
    let kinds: Vec<String> = (gw.history(&id).await.iter())
        .filter_map(|e| e["event"].as_str())
        .filter(|k| k.starts_with("turn_"))
        .map(str::to_owned)
        .collect();
    assert_eq!(kinds, ["turn_started", "turn_ended"]);
    assert_eq!(w.calls("session/prompt"), 1);

    // `Prefer: respond-async`: the 202 is kept, and the repeat starts no second turn.
    let started = || async {
        let res = gw
            .http
            .post(gw.prompt_url(&id))
            .header("idempotency-key", "async-1")
            .header("prefer", "respond-async")
            .json(&json!({"text": "later"}))
            .send()
            .await
            .unwrap();
        let replayed = res.headers().get("idempotent-replayed").is_some();
        (res.status().as_u16(), replayed)
    };
    assert_eq!(started().await, (202, false));
    assert_eq!(started().await, (202, true));
    gw.wait_until(|g| {
        let id = id.clone();
        async move {
            let log = g.history(&id).await;
            log.iter().filter(|e| e["event"] == "turn_ended").count() == 2
        }
    })
    .await;
    assert_eq!(w.calls("session/prompt"), 2);
    w.finish().await;
}

async fn a_key_names_one_request(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let (status, _, _) = post_keyed(gw, "/sessions", "k", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201);
    let (status, _, problem) = post_keyed(gw, "/sessions", "k", json!({"cwd": "/"})).await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{problem}"
    );
    let (status, _, problem) = post_keyed(gw, "/sessions", "a key", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 400, "{problem}");
    // A request that fails in a way a repeat may not leaves the key free: a prompt to a
    // session that does not exist is 404 and kept; a webhook to nowhere is refused and kept.
    let missing = "/sessions/sess_00000000000000000000000000000000/prompt";
    let (status, _, _) = post_keyed(gw, missing, "p", json!({"text": "hi"})).await;
    assert_eq!(status, 404);
    let (status, replayed, _) = post_keyed(gw, missing, "p", json!({"text": "hi"})).await;
    assert_eq!((status, replayed), (404, true));
    assert_eq!(session_count(gw).await, 1);
    w.finish().await;
}

async fn a_restarted_gateway_replays(backend: Backend) {
    let mut w = World::start(backend, Options::default()).await;
    let (status, _, first) =
        post_keyed(w.gw(), "/sessions", "across", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201);
    w.restart().await;
    let (status, replayed, again) =
        post_keyed(w.gw(), "/sessions", "across", json!({"cwd": "/tmp"})).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, first);
    assert_eq!(session_count(w.gw()).await, 1);
    w.finish().await;
}

async fn an_expired_key_is_pruned_and_runs_again(backend: Backend) {
    let w = World::start(
        backend,
        Options::default().args(&["--idempotency-ttl", "1"]),
    )
    .await;
    let gw = w.gw();
    let (status, _, first) = post_keyed(gw, "/sessions", "brief", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(StatusCode::OK, gw.get("/readyz").await.status());
    let (status, replayed, again) =
        post_keyed(gw, "/sessions", "brief", json!({"cwd": "/tmp"})).await;
    assert_eq!((status, replayed), (201, false));
    assert_ne!(again["sessionId"], first["sessionId"]);
    // The pruner deletes expired keys (every TTL here): the table empties once this one expires.
    let db = w.db.url.clone();
    let deadline = std::time::Instant::now() + PATIENCE;
    while keys_stored(&db).await > 0 {
        assert!(std::time::Instant::now() < deadline, "expired keys pruned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    w.finish().await;
}

/// Rows of `idempotency_keys` in the database at `url`.
async fn keys_stored(url: &str) -> i64 {
    use sqlx::Connection;
    let query = "SELECT COUNT(*) FROM idempotency_keys";
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
    } else {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_scalar(query).fetch_one(&mut c).await.unwrap()
    }
}

async fn a_retried_webhook_is_one_subscription(backend: Backend) {
    let opts = Options::default().arg("--webhook-allow-private");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let hook = json!({"url": "http://127.0.0.1:9/hook", "events": ["turn_ended"]});
    let (status, replayed, first) = post_keyed(gw, "/webhooks", "hook", hook.clone()).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    assert!(
        first["secret"].as_str().is_some_and(|s| !s.is_empty()),
        "{first}"
    );
    let (status, replayed, again) = post_keyed(gw, "/webhooks", "hook", hook).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, first, "the same subscription, with the same secret");
    let listed = gw.json("/webhooks").await;
    let listed = listed["webhooks"]
        .as_array()
        .or(listed.as_array())
        .unwrap()
        .len();
    assert_eq!(listed, 1);
    w.finish().await;
}

/// A prompt refused 409 because a turn runs is not the key's answer: once the turn has ended,
/// the same keyed prompt runs.
async fn a_busy_answer_is_not_kept(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let path = format!("/sessions/{id}/prompt");
    let running = gw.prompt_in_background(&id, "/chunks 10 /delay 100");
    gw.wait_until(|g| {
        let id = id.clone();
        async move { (g.history(&id).await.iter()).any(|e| e["event"] == "turn_started") }
    })
    .await;
    let (status, replayed, busy) = post_keyed(gw, &path, "busy", json!({"text": "next"})).await;
    assert_eq!((status, replayed), (409, false), "{busy}");
    assert_eq!(running.await.unwrap().unwrap().status(), 200);
    let (status, replayed, answer) = post_keyed(gw, &path, "busy", json!({"text": "next"})).await;
    assert_eq!((status, replayed), (200, false), "{answer}");
    assert_eq!(answer["stopReason"], "end_turn");
    assert_eq!(w.calls("session/prompt"), 2);
    w.finish().await;
}

/// With a TTL shorter than a turn, a repeat after the TTL waits for the first request and gets
/// its answer: the key is not taken again while its request runs.
async fn a_running_request_keeps_its_key_past_the_ttl(backend: Backend) {
    let opts = Options::default().args(&["--idempotency-ttl", "1"]);
    let (w, id) = World::with_session(backend, opts).await;
    let gw = w.gw();
    let path = format!("/sessions/{id}/prompt");
    let prompt = json!({"text": "/chunks 15 /delay 200"});
    let first = {
        let (http, url, prompt) = (gw.http.clone(), gw.url(&path), prompt.clone());
        tokio::spawn(async move {
            let res = (http
                .post(url)
                .header("idempotency-key", "long")
                .json(&prompt))
            .send()
            .await
            .unwrap();
            (res.status().as_u16(), res.json::<Value>().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, replayed, again) = post_keyed(gw, &path, "long", prompt).await;
    let (first_status, first) = first.await.unwrap();
    assert_eq!(first_status, 200, "{first}");
    assert_eq!((status, replayed, &again), (200, true, &first));
    assert_eq!(w.calls("session/prompt"), 1);
    w.finish().await;
}

/// A gateway SIGKILLed while a keyed prompt runs leaves the key to the next gateway on the
/// database: the repeat runs there (the turn died with its gateway) instead of waiting for a
/// request that will never answer and getting 409.
async fn a_killed_gateways_key_is_taken_over(backend: Backend) {
    let opts = Options::default().args(&["--heartbeat-interval", "1"]);
    let (mut w, id) = World::with_session(backend, opts).await;
    let path = format!("/sessions/{id}/prompt");
    let prompt = json!({"text": "/chunks 50 /delay 100"});
    let gw = w.gw();
    let first = (gw.http.post(gw.url(&path)))
        .header("idempotency-key", "orphan")
        .json(&prompt)
        .send();
    let first = tokio::spawn(first);
    gw.wait_until(|g| {
        let id = id.clone();
        async move { (g.history(&id).await.iter()).any(|e| e["event"] == "agent_message_chunk") }
    })
    .await;
    let mut dead = w.gw.take().unwrap();
    dead.kill().await;
    assert!(first.await.unwrap().is_err());
    w.gw = Some(Gateway::spawn(&w.db.url, w.dir.path(), &w.opts).await);
    let (status, replayed, answer) = post_keyed(w.gw(), &path, "orphan", prompt.clone()).await;
    assert_eq!((status, replayed), (200, false), "{answer}");
    assert_eq!(answer["stopReason"], "end_turn");
    // Answered now, and kept.
    let (status, replayed, again) = post_keyed(w.gw(), &path, "orphan", prompt).await;
    assert_eq!((status, replayed, &again), (200, true, &answer));
    w.finish().await;
}

/// How long the gateway is told to let a repeat wait for the request still running under its
/// key (`--idempotency-wait`).
const WAIT: Duration = Duration::from_secs(3);

/// A keyed prompt sent from a task of its own: its status, whether it was a replay, its body.
fn post_keyed_in_background(
    gw: &Gateway,
    path: &str,
    key: &'static str,
    body: Value,
) -> tokio::task::JoinHandle<(u16, bool, Value)> {
    let request = gw
        .http
        .post(gw.url(path))
        .header("idempotency-key", key)
        .json(&body);
    tokio::spawn(async move {
        let res = request.send().await.unwrap();
        let status = res.status().as_u16();
        let replayed = res.headers().get("idempotent-replayed").is_some();
        (status, replayed, res.json().await.unwrap_or(Value::Null))
    })
}

/// Waits until the session's log holds an event `kind`.
async fn wait_for_event(gw: &Gateway, id: &str, kind: &'static str) {
    gw.wait_until(|g| async move { (g.history(id).await.iter()).any(|e| e["event"] == kind) })
        .await;
}

/// A repeat of a keyed prompt whose turn still runs waits for it, `--idempotency-wait`;
/// still running then, it answers 409 with `Retry-After`, having run nothing itself. Once the
/// first has ended, the repeat gets its answer.
async fn a_repeat_waits_for_the_running_request_then_answers_409(backend: Backend) {
    let options = Options {
        args: vec!["--idempotency-wait".into(), WAIT.as_secs().to_string()],
        ..Options::default()
    };
    let (w, id) = World::with_session(backend, options).await;
    let gw = w.gw();
    let path = format!("/sessions/{id}/prompt");
    let prompt = json!({"text": "/hang"});
    let first = post_keyed_in_background(gw, &path, "held", prompt.clone());
    wait_for_event(gw, &id, "turn_started").await;

    let asked = Instant::now();
    let res = (gw.http.post(gw.url(&path)))
        .header("idempotency-key", "held")
        .json(&prompt)
        .send()
        .await
        .unwrap();
    let waited = asked.elapsed();
    let retry_after = res.headers().get("retry-after").cloned();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let status = res.status().as_u16();
    let problem: Value = res.json().await.unwrap();
    assert_kind(status, &problem, 409, "conflict");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("still running"),
        "{problem}"
    );
    assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
    assert!(!replayed);
    assert!(
        waited >= WAIT - Duration::from_millis(500) && waited < WAIT + Duration::from_secs(10),
        "the repeat waited {waited:?} for the request still running, not the gateway's {WAIT:?}"
    );
    assert_eq!(w.calls("session/prompt"), 1, "the repeat ran nothing");

    let r = gw.session_action(&id, "cancel").await;
    assert_eq!(r.status(), 204);
    let (status, replayed, answer) = first.await.unwrap();
    assert_eq!((status, replayed), (200, false), "{answer}");
    assert_eq!(answer["stopReason"], "cancelled", "{answer}");
    let (status, replayed, again) = post_keyed(gw, &path, "held", prompt).await;
    assert_eq!((status, replayed, &again), (200, true, &answer));
    assert_eq!(w.calls("session/prompt"), 1);
    w.finish().await;
}

/// A keyed prompt answered 502 (its agent process SIGKILLed mid-turn) is not the key's answer:
/// the repeat, once the member is back, runs the turn again, and that answer is kept.
async fn a_5xx_frees_the_key(backend: Backend) {
    let (w, id) = World::with_session(backend, Options::default()).await;
    let gw = w.gw();
    let path = format!("/sessions/{id}/prompt");
    let prompt = json!({"text": "/chunks 50 /delay 100"});
    let first = post_keyed_in_background(gw, &path, "failed", prompt.clone());
    wait_for_event(gw, &id, "agent_message_chunk").await;
    let agent = nix::unistd::Pid::from_raw(gw.agent_pid().await as i32);
    nix::sys::signal::kill(agent, nix::sys::signal::Signal::SIGKILL).unwrap();
    let (status, replayed, failed) = first.await.unwrap();
    assert_kind(status, &failed, 502, "agent-unavailable");
    assert!(!replayed);

    gw.wait_restarts(1).await;
    gw.wait_members_ready().await;
    let (status, replayed, answer) = post_keyed(gw, &path, "failed", prompt.clone()).await;
    assert_eq!(
        (status, replayed),
        (200, false),
        "the repeat ran again: {answer}"
    );
    assert_eq!(answer["stopReason"], "end_turn", "{answer}");
    assert_eq!(w.calls("session/prompt"), 2);
    let (status, replayed, again) = post_keyed(gw, &path, "failed", prompt).await;
    assert_eq!((status, replayed, &again), (200, true, &answer));
    assert_eq!(w.calls("session/prompt"), 2);
    w.finish().await;
}
