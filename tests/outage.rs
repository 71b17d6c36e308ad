//! Store outages lose nothing: a PostgreSQL cluster of the test's own (`initdb` + `pg_ctl` on a
//! free port; the shared server is untouched) is stopped and started again while a long turn
//! streams. The prompt is answered, the log holds every chunk once and in order, a client that
//! followed the stream saw the same, and meanwhile `/readyz` and requests that need the store
//! answer 503 with `Retry-After`.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

/// Chunks of the long turn (the user's report: 20,000).
const CHUNKS: usize = 20_000;

/// Follows a session's stream as a reconnecting client does (from `Last-Event-ID`, again after
/// the stream ends, stays quiet for a while, or the gateway answers an error) until
/// `turn_ended`, or gives up after a bound; returns every event it saw.
async fn follow(http: reqwest::Client, url: String) -> Vec<SseEvent> {
    let deadline = Instant::now() + PATIENCE * 2;
    let mut seen: Vec<SseEvent> = Vec::new();
    let mut connects = 0;
    while Instant::now() < deadline {
        let last = seen.last().map_or(0, |e| e.id);
        let Some(mut sse) = Sse::reopen(&http, &url, last).await else {
            continue;
        };
        connects += 1;
        while let Ok(Some(e)) = tokio::time::timeout(QUIET, sse.next()).await {
            let ended = e.event == "turn_ended";
            seen.push(e);
            if ended {
                eprintln!("the follower connected {connects} time(s)");
                return seen;
            }
        }
    }
    eprintln!("the follower gave up after {} events", seen.len());
    seen
}

/// How long the follower waits for an event before it reconnects.
const QUIET: Duration = Duration::from_secs(10);

fn chunk_of(data: &Value) -> Option<&str> {
    (data["update"]["sessionUpdate"] == "agent_message_chunk")
        .then(|| data["update"]["content"]["text"].as_str().unwrap_or(""))
}

/// Waits (bounded) until the readiness probe `path` answers `status`: ready (200) or not (503),
/// it answers nothing else meanwhile.
async fn wait_status(gw: &Gateway, path: &str, status: u16) -> reqwest::Response {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = gw.get(path).await;
        if r.status() == status {
            return r;
        }
        assert!(
            [200, 503].contains(&r.status().as_u16()),
            "{path} answers 200 or 503, not {}",
            r.status()
        );
        assert!(
            Instant::now() < deadline,
            "{path} did not answer {status} within {PATIENCE:?} (last {})",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A long turn under way, followed by an SSE client.
struct Turn {
    id: String,
    prompt: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
    follower: tokio::task::JoinHandle<Vec<SseEvent>>,
}

impl Turn {
    /// Creates a session, follows its stream and starts a turn of [`CHUNKS`] chunks; returns
    /// once the turn runs.
    async fn start(gw: &Gateway) -> Turn {
        let id = gw.create("/tmp").await;
        let follower = tokio::spawn(follow(
            gw.http.clone(),
            gw.url(&format!("/sessions/{id}/events")),
        ));
        let prompt = gw.prompt_in_background(&id, &format!("/chunks {CHUNKS}"));
        gw.wait_until(|g| {
            let id = id.clone();
            async move { g.json(&format!("/sessions/{id}/status")).await["activity"] == "running" }
        })
        .await;
        Turn {
            id,
            prompt,
            follower,
        }
    }

    /// The prompt is answered `end_turn`; the log holds every chunk once, in order, with seqs
    /// 1..n; the follower saw exactly the log.
    async fn assert_nothing_lost(self, gw: &Gateway) {
        let answer = tokio::time::timeout(PATIENCE * 4, self.prompt)
            .await
            .expect("the prompt is answered after the store is back")
            .unwrap()
            .unwrap();
        let answer_status = answer.status().as_u16();
        let answer: Value = answer.json().await.unwrap();
        let streamed = self.follower.await.unwrap();
        let logged = gw.history(&self.id).await;

        assert_eq!(answer_status, 200, "the prompt's answer: {answer}");
        assert_eq!(answer["stopReason"], "end_turn");
        let seqs: Vec<i64> = logged.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
        let n = seqs.len() as i64;
        assert!(
            seqs.iter().copied().eq(1..=n),
            "the log's seqs are 1..{n} with no gap or repeat"
        );
        let chunks: Vec<&str> = logged.iter().filter_map(|e| chunk_of(&e["data"])).collect();
        assert_eq!(
            chunks.len(),
            CHUNKS,
            "the log holds {} of {CHUNKS} chunks",
            chunks.len()
        );
        let in_order = chunks.iter().enumerate().all(|(i, text)| {
            let i = i + 1;
            *text
                == if i == CHUNKS {
                    format!("c{i}")
                } else {
                    format!("c{i} ")
                }
        });
        assert!(in_order, "the chunks are c1..c{CHUNKS}, in order");
        let ended = logged.iter().filter(|e| e["event"] == "turn_ended").count();
        assert_eq!(ended, 1, "one turn_ended");
        let logged_positions: Vec<(i64, String)> = logged
            .iter()
            .map(|e| {
                (
                    e["seq"].as_i64().unwrap(),
                    e["event"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert!(
            positions(&streamed) == logged_positions,
            "the follower saw the log: {} events streamed, {} logged",
            streamed.len(),
            logged.len()
        );
    }
}

/// The gateway log's lines about the event log writer failing and recovering.
fn writer_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("cannot append to the event log")
                || l.contains("the event log is written again")
        })
        .collect()
}

/// PostgreSQL stopped (fast shutdown) 0.1 s or so into a 20,000-chunk turn and started again:
/// meanwhile `/readyz` and a request that needs the store answer 503 (with `Retry-After`), and
/// the agent waits; afterwards nothing is missing or repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(initdb), ignore = "needs PostgreSQL's initdb: /usr/lib/postgresql")]
async fn a_database_restart_mid_turn_loses_no_event() {
    let cluster = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::spawn(&cluster.url(), dir.path(), &Options::default()).await;
    let log = || std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default();
    let turn = Turn::start(&gw).await;

    let started = Instant::now();
    cluster.pg_ctl("stop");
    let stopped = started.elapsed();
    // While it is down: not ready, and requests that need the store are asked to come back.
    wait_status(&gw, "/readyz", 503).await;
    let unknown = "sess_0123456789abcdef0123456789abcdef";
    let mut answers = Vec::new();
    for path in [
        format!("/sessions/{unknown}"),
        format!("/sessions/{}/history", turn.id),
    ] {
        let r = gw.get(&path).await;
        let status = r.status().as_u16();
        let retry_after = r.headers().get("retry-after").cloned();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        answers.push((path, status, retry_after, body));
    }
    let prompt_done_while_down = turn.prompt.is_finished();
    cluster.pg_ctl("start");
    let outage = started.elapsed();
    wait_status(&gw, "/readyz", 200).await;
    eprintln!(
        "database stopped in {stopped:?}, down for {outage:?}; the prompt had {}finished meanwhile",
        if prompt_done_while_down { "" } else { "not " }
    );
    for (path, status, ..) in &answers {
        eprintln!("during the outage GET {path} answered {status}");
    }

    turn.assert_nothing_lost(&gw).await;
    for line in writer_lines(&log()) {
        eprintln!("  {line}");
    }
    for (path, status, retry_after, body) in answers {
        assert_eq!(status, 503, "GET {path} during the outage: {body}");
        assert_eq!(body["type"], "urn:acp-gateway:problem:store-unavailable");
        assert!(retry_after.is_some(), "503 with Retry-After");
    }
    gw.stop().await;
    drop(cluster);
}

/// SQLite cannot write: another connection holds the database's write lock (`BEGIN
/// EXCLUSIVE`) past two busy timeouts while a turn streams, so appends fail with SQLITE_BUSY.
/// (A read-only file would not do: the tests run as root, which file modes do not stop.)
/// Once the lock is released, nothing is missing or repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlite_write_failure_mid_turn_loses_no_event() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let file = w.db.url.strip_prefix("sqlite:").unwrap().to_owned();
    let turn = Turn::start(w.gw()).await;

    let locker = rusqlite::Connection::open(&file).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let locked = Instant::now();
    // Held until two appends have failed (the busy timeout is 5 s): the second is the one
    // that gathered what the agent sent meanwhile.
    let deadline = locked + PATIENCE;
    while writer_lines(&w.log()).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no append failed within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = w.gw().get("/readyz").await.status().as_u16();
    locker.execute_batch("ROLLBACK").unwrap();
    eprintln!(
        "the write lock was held for {:?}; /readyz meanwhile: {ready}",
        locked.elapsed()
    );

    turn.assert_nothing_lost(w.gw()).await;
    for line in writer_lines(&w.log()) {
        eprintln!("  {line}");
    }
    assert_eq!(
        ready, 503,
        "not ready while the event log cannot be written"
    );
    w.finish().await;
}

/// A shutdown while the database is down ends within its bound (`--shutdown-timeout` for the
/// turns, again for the event log) and logs how many events of the session were not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(initdb), ignore = "needs PostgreSQL's initdb: /usr/lib/postgresql")]
async fn a_shutdown_during_an_outage_ends_and_says_what_was_not_stored() {
    let cluster = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default().args(&["--shutdown-timeout", "2"]);
    let gw = Gateway::spawn(&cluster.url(), dir.path(), &opts).await;
    let turn = Turn::start(&gw).await;
    let id = turn.id.clone();
    cluster.pg_ctl("stop");
    wait_status(&gw, "/readyz", 503).await;

    let stopping = Instant::now();
    let status = gw.stop().await;
    let took = stopping.elapsed();
    let log = std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default();
    let lost: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("these events are not stored"))
        .collect();
    eprintln!("the gateway stopped in {took:?} ({status}); it logged:");
    for line in &lost {
        eprintln!("  {line}");
    }
    drop(turn);
    // `stop` kills after 30 s: an exit of its own, well within that.
    assert!(
        status.success(),
        "the gateway exits 0, not killed: {status}"
    );
    assert!(
        lost.iter().any(|l| l.contains(&id)),
        "the session's unstored events are logged"
    );
}

/// A lifecycle event that cannot be stored is kept and stored once the store writes again:
/// an idle session is closed while another connection holds SQLite's write lock past the busy
/// timeout, and `GET /events` gets its `session_status` once the lock is released (before,
/// the event was dropped with an error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_event_during_a_write_failure_is_stored_later() {
    let opts = Options::default().args(&["--idle-timeout", "1"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let file = w.db.url.strip_prefix("sqlite:").unwrap().to_owned();
    let mut lifecycle = gw.sse("/events", None).await;

    let locker = rusqlite::Connection::open(&file).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let failed = |log: &str| {
        log.contains("cannot append to the lifecycle log")
            || log.contains("cannot append a lifecycle event")
    };
    let deadline = Instant::now() + PATIENCE;
    while !failed(&w.log()) {
        assert!(
            Instant::now() < deadline,
            "no lifecycle append failed within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    locker.execute_batch("ROLLBACK").unwrap();

    let status = tokio::time::timeout(Duration::from_secs(20), lifecycle.until("session_status"))
        .await
        .expect("the session_status event arrives once the store writes again");
    let status = status.last().unwrap();
    assert_eq!(
        (
            status.data["sessionId"].as_str(),
            status.data["status"].as_str(),
            status.data["reason"].as_str()
        ),
        (Some(id.as_str()), Some("saved"), Some("idle")),
        "{:?}",
        status.data
    );
    w.finish().await;
}

/// A create whose session cannot be stored fails whole: 503 with `Retry-After`, and the
/// agent's new session is deleted again, so no later sync brings it back as a session nobody
/// created (before, the agent kept it and the next listing showed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_cannot_be_stored_is_undone_at_the_agent() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let file = w.db.url.strip_prefix("sqlite:").unwrap().to_owned();
    let locker = rusqlite::Connection::open(&file).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let r = gw
        .post("/sessions", serde_json::json!({"cwd": "/tmp"}))
        .await;
    let (status, retry_after) = (r.status().as_u16(), r.headers().get("retry-after").cloned());
    let body: Value = r.json().await.unwrap_or(Value::Null);
    locker.execute_batch("ROLLBACK").unwrap();

    assert_eq!(status, 503, "{body}");
    assert_eq!(body["type"], "urn:acp-gateway:problem:store-unavailable");
    assert!(retry_after.is_some(), "503 with Retry-After");
    assert_eq!(w.calls("session/new"), 1);
    assert_eq!(w.calls("session/delete"), 1, "undone at the agent");
    let listed = gw.json("/sessions?refresh=true").await;
    assert_eq!(listed["sessions"], serde_json::json!([]), "{listed}");
    w.finish().await;
}
