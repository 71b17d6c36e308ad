//! An agent reached over ACP's network transport: a front gateway whose agent `host` is another
//! gateway's `/acp` (an agent host, the echo agent behind it, its own API key required), over
//! WebSocket and over HTTP/SSE, with the front on each backend. The session flows go through the
//! hop whole: create with a mode and a model, a 200-chunk prompt logged once and in order, a
//! permission answered at the front, cancel, fork (not offered: 501), the files routes (the
//! host's answer), the list sync, delete. The host SIGKILLed mid-turn ends the front's turn as
//! a member's death does, and once the host is back the session is resumed there; a host that
//! falls silent (SIGSTOP) costs a turn two heartbeats, not forever. Over WebSocket a flood of
//! updates ends its turn, a 20 MB message passes and one over the front's `--max-line-bytes`
//! ends the connection, saying why.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

pub(crate) const HOST_KEY: &str = "host-secret-key-0123456789";

/// The agent host: a gateway on SQLite in front of the echo agent (with modes and models),
/// requiring its own key.
pub(crate) async fn host() -> World {
    World::start(Backend::Sqlite, host_options()).await
}

/// The agent host's options (its replicas' leases run out after three seconds); a host
/// restarted is started again where it listened ([`Options::listen`]), to be found there.
pub(crate) fn host_options() -> Options {
    Options::default()
        .env("ECHO_AGENT_CONTROLS", "modes,models")
        .args(&[
            "--api-key",
            &format!("fronts:{HOST_KEY}"),
            "--shutdown-timeout",
            "2",
            "--heartbeat-interval",
            "1",
        ])
}

/// The front: its default agent is the host at `url`, its key from the environment, asked
/// after 5 s of silence.
pub(crate) async fn front(backend: Backend, url: &str, dir: &Path) -> World {
    World::start(backend, front_options(url, dir, HOST_KEY, 5)).await
}

/// The front's options, sending `key` to the host.
pub(crate) fn front_options(url: &str, dir: &Path, key: &str, heartbeat: u64) -> Options {
    let file = dir.join("front.toml");
    // One URL, or several separated by spaces.
    let urls: Vec<String> = url.split(' ').map(|u| format!("\"{u}\"")).collect();
    let table = format!(
        "[agents.host]\nurl = [{}]\ntoken = \"${{HOST_TOKEN}}\"\nheartbeat = {heartbeat}\n",
        urls.join(", ")
    );
    std::fs::write(&file, table).unwrap();
    Options::default().env("HOST_TOKEN", key).args(&[
        "--config",
        file.to_str().unwrap(),
        "--default-agent",
        "host",
    ])
}

/// The host's URL for `scheme` (`ws` or `http`).
pub(crate) fn url_of(host: &World, scheme: &str) -> String {
    let base = host.gw().base.replace("http://", &format!("{scheme}://"));
    format!("{base}/acp")
}

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

async fn session_flows(backend: Backend, scheme: &str) {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    let front = front(backend, &url_of(&host, scheme), dir.path()).await;
    let gw = front.gw();
    let id = through_the_front(gw).await;

    // The host offers no fork: the front says so, as for a local agent without one.
    let r = gw.post(&format!("/sessions/{id}/fork"), json!({})).await;
    assert_eq!(r.status(), 501);
    // Its files are the host's, which the front asks: this session has no workspace there.
    let r = gw.get(&format!("/sessions/{id}/files")).await;
    assert_eq!(r.status(), 409);

    // A session made on the host by another of its clients reaches the front's list by the
    // list sync, as a local agent's would.
    let made_there = host
        .gw()
        .http
        .post(host.gw().url("/sessions"))
        .bearer_auth(HOST_KEY)
        .json(&json!({"cwd": "/tmp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made_there.status(), 201);
    let there: Value = made_there.json().await.unwrap();
    let listed = gw.json("/sessions?refresh=true").await.to_string();
    assert!(
        listed.contains(there["sessionId"].as_str().unwrap()),
        "{listed}"
    );

    // Listed at the front, and on the host (its own key required); deleted at the front,
    // gone from the host too.
    assert!(listed.contains(&id), "{listed}");
    let on_host = |key: &'static str| {
        let request = host
            .gw()
            .http
            .get(host.gw().url(&format!("/sessions/{id}")));
        async move { request.bearer_auth(key).send().await.unwrap().status() }
    };
    assert_eq!(on_host(HOST_KEY).await, 200);
    assert_eq!(on_host("not-the-host-key-0123").await, 401);
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    assert_eq!(on_host(HOST_KEY).await, 404);
    front.finish().await;
    host.finish().await;
}

/// What a front's client does with a session of the remote agent, checked at the front: created
/// with a mode and a model, 200 chunks logged once and in order, a permission the agent asks
/// answered, a turn cancelled. Returns the session.
async fn through_the_front(gw: &Gateway) -> String {
    // Created with the mode and model asked for.
    let r = gw
        .post(
            "/sessions",
            json!({"cwd": "/tmp", "mode": "code", "model": "echo-large"}),
        )
        .await;
    let body: Value = r.json().await.unwrap();
    let id = body["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_owned();
    assert_eq!(body["agent"], "host", "{body}");
    let state = body["state"].to_string();
    assert!(
        state.contains("\"code\"") && state.contains("echo-large"),
        "{state}"
    );

    // 200 chunks, each logged once, in order.
    let (status, answer) = gw.prompt(&id, "/chunks 200").await;
    assert_eq!(
        (status, answer["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{answer}"
    );
    let said = chunks(gw, &id).await;
    let expected: Vec<String> = (1..=200).map(|i| format!("c{i} ")).collect();
    assert_eq!(said.len(), 200, "{said:?}");
    for (got, want) in said.iter().zip(&expected) {
        assert_eq!(got.trim(), want.trim());
    }

    // The host's agent asks; the front's client answers.
    let turn = gw.prompt_in_background(&id, "/permission go");
    let request = gw.pending_permission(&id).await;
    let r = gw
        .post(
            &format!("/sessions/{id}/permissions/{request}"),
            json!({"optionId": "allow"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = turn.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let text: Vec<String> = chunks(gw, &id).await;
    assert!(
        text.iter().any(|t| t.contains("permission: allow")),
        "{text:?}"
    );

    // A turn cancelled at the front ends cancelled.
    let mut sse = gw.events(&id, None).await;
    let turn = gw.prompt_in_background(&id, "/hang");
    sse.until("turn_started").await;
    assert_eq!(gw.session_action(&id, "cancel").await.status(), 204);
    let answer: Value = turn.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(answer["stopReason"], "cancelled", "{answer}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_flows_over_websocket() {
    for backend in Backend::available() {
        session_flows(backend, "ws").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_flows_over_http() {
    for backend in Backend::available() {
        session_flows(backend, "http").await;
    }
}

/// A host whose agent floods one turn (20,000 updates) over each transport: the front's turn
/// ends, its log keeps at most its `--max-updates-per-turn`, the rest are counted as garbage,
/// and the session's next turn answers as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_host_is_bounded_at_the_front() {
    for scheme in ["ws", "http"] {
        let host = host().await;
        let dir = tempfile::tempdir().unwrap();
        let opts = front_options(&url_of(&host, scheme), dir.path(), HOST_KEY, 5)
            .args(&["--max-updates-per-turn", "500"]);
        let front = World::start(Backend::Sqlite, opts).await;
        let gw = front.gw();
        let id = gw.create("/tmp").await;
        let before = gw.metric("acp_gateway_agent_garbage_total").await;
        let (status, body) = gw.prompt(&id, "/chunks 20000").await;
        assert_eq!(
            (status, &body["stopReason"]),
            (200, &json!("end_turn")),
            "{body}"
        );
        let kept = chunks(gw, &id).await;
        assert!(kept.len() <= 500, "{scheme}: {} chunks logged", kept.len());
        let dropped = gw.metric("acp_gateway_agent_garbage_total").await - before;
        assert!(
            dropped >= 19_500.0,
            "{scheme}: {dropped} counted as garbage"
        );
        let (status, body) = gw.prompt(&id, "after the flood").await;
        assert_eq!(status, 200, "{body}");
        assert!(chunks(gw, &id).await.concat().contains("flood"));
        front.finish().await;
        host.finish().await;
    }
}

/// A reply chunk of 20 MB, over the 16 MiB frame that WebSocket clients allow by default and
/// under the front's `--max-line-bytes` (64 MiB), comes through the WebSocket whole: the
/// bridge's frame and message limits are the agent's `--max-line-bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_16_mib_passes_over_websocket() {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    let front = front(Backend::Sqlite, &url_of(&host, "ws"), dir.path()).await;
    let gw = front.gw();
    let id = gw.create("/tmp").await;
    let (status, body) = gw.prompt(&id, "/bytes 20000000").await;
    assert_eq!(
        (status, &body["stopReason"]),
        (200, &json!("end_turn")),
        "{body}"
    );
    let kept = chunks(gw, &id).await;
    assert_eq!(
        kept.iter().map(String::len).collect::<Vec<_>>(),
        [20_000_000]
    );
    let (status, body) = gw.prompt(&id, "after the big one").await;
    assert_eq!(status, 200, "{body}");
    front.finish().await;
    host.finish().await;
}

/// A message from the host over the front's `--max-line-bytes` ends the bridge's WebSocket
/// with a log line that says so: the turn ends as a member's death ends it, and the member,
/// restarted, serves the session's next turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_max_line_bytes_ends_the_websocket_with_a_clear_log_line() {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    let opts = front_options(&url_of(&host, "ws"), dir.path(), HOST_KEY, 5)
        .args(&["--max-line-bytes", "1000000"]);
    let front = World::start(Backend::Sqlite, opts).await;
    let gw = front.gw();
    let id = gw.create("/tmp").await;
    let (status, body) = gw.prompt(&id, "/bytes 2000000").await;
    assert_kind(status, &body, 502, "agent-unavailable");
    gw.wait_member_state("ready").await;
    let log = front.log();
    assert!(
        log.contains("over --max-line-bytes (1000000)"),
        "no line says why the connection ended:\n{log}"
    );
    let (status, body) = gw.prompt(&id, "after the big one").await;
    assert_eq!(
        (status, &body["stopReason"]),
        (200, &json!("end_turn")),
        "{body}"
    );
    front.finish().await;
    host.finish().await;
}

/// The host SIGKILLed mid-turn: the front's turn ends as a member's death ends it, new turns
/// are refused while the host is down, and once it is back (same port, same database) the
/// front's member connects again and the session is resumed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_turn_ends_the_turn_and_its_session_resumes() {
    let mut host = host().await;
    let address = host.gw().address().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let front = front(Backend::Sqlite, &url_of(&host, "ws"), dir.path()).await;
    let gw = front.gw();
    let id = gw.create("/tmp").await;
    let (status, _) = gw.prompt(&id, "before").await;
    assert_eq!(status, 200);

    let mut sse = gw.events(&id, None).await;
    let turn = gw.prompt_in_background(&id, "/hang");
    sse.until("turn_started").await;
    host.gw.as_mut().unwrap().kill().await;
    let r = turn.await.unwrap().unwrap();
    let (status, body) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_kind(status, &body, 502, "agent-unavailable");
    let events = sse.until("turn_ended").await;
    assert_eq!(events.last().unwrap().data["error"]["status"], 502);

    // Back on the same port and database: the member reconnects, the session resumes.
    let opts = host.opts.clone().listen(&address);
    let host_gw = Gateway::spawn(&host.db.url, host.dir.path(), &opts).await;
    host.gw = Some(host_gw);
    gw.wait_member_state("ready").await;
    let (status, body) = gw.prompt(&id, "after").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{body}"
    );
    front.finish().await;
    host.finish().await;
}

/// A host that stops answering (SIGSTOP) is asked after a heartbeat of silence and dropped
/// after another: the turn waiting on it ends with an error instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_host_times_out() {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    // Asked after a second of silence.
    let opts = front_options(&url_of(&host, "http"), dir.path(), HOST_KEY, 1);
    let front = World::start(Backend::Sqlite, opts).await;
    let gw = front.gw();
    let id = gw.create("/tmp").await;
    let pid = nix::unistd::Pid::from_raw(host.gw().pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let started = std::time::Instant::now();
    let answered = tokio::time::timeout(PATIENCE, gw.prompt(&id, "anyone there?")).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (status, body) = answered.expect("the turn ends instead of hanging");
    assert_kind(status, &body, 502, "agent-unavailable");
    // Dropped by the heartbeat (two of a second each), long before the request's own timeout
    // (60 s) would have ended it.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(30),
        "{took:?}"
    );
    front.finish().await;
    host.finish().await;
}

/// A front that sends the wrong key is refused by the host: its members do not come up, and
/// say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_key_is_required() {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    for scheme in ["ws", "http"] {
        let url = url_of(&host, scheme);
        let opts = front_options(&url, dir.path(), "wrong-key-0123456789", 5);
        let front = World::start(Backend::Sqlite, opts.no_wait()).await;
        let gw = front.gw();
        gw.wait_until(|g| async move { !g.member_error().await.is_empty() })
            .await;
        let error = gw.member_error().await;
        assert!(error.contains("401"), "{scheme}: {error}");
        let r = gw.post("/sessions", json!({"cwd": "/tmp"})).await;
        assert_eq!(r.status(), 503, "{scheme}");
        front.finish().await;
    }
    host.finish().await;
}

/// Two agent hosts, replicas on one PostgreSQL database, behind one agent of the front (a
/// member each): with one SIGKILLed, new sessions go to the other, and so do the sessions it
/// held; back, it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn with_two_hosts_one_down_the_other_serves() {
    let mut a = World::start(Backend::Postgres, host_options()).await;
    let b = Gateway::spawn(&a.db.url, a.dir.path(), &host_options()).await;
    let dir = tempfile::tempdir().unwrap();
    let address_a = a.gw().address().to_owned();
    let urls = format!("ws://{address_a}/acp ws://{}/acp", b.address());
    let front = front(Backend::Sqlite, &urls, dir.path()).await;
    let gw = front.gw();
    gw.wait_members_ready().await;
    let before: Vec<String> = [gw.create("/tmp").await, gw.create("/tmp").await].into();

    a.gw.as_mut().unwrap().kill().await;
    gw.wait_until(|g| async move {
        let members = g.json("/agent").await["members"].clone();
        members
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["state"] != "ready")
    })
    .await;
    for _ in 0..3 {
        let id = gw.create("/tmp").await;
        let (status, body) = gw.prompt(&id, "on the other host").await;
        assert_eq!(status, 200, "{body}");
    }
    // Once the dead host's lease has run out, the other takes its sessions over.
    b.wait_until(|b| async move {
        let r = b
            .http
            .get(b.url("/agent"))
            .bearer_auth(HOST_KEY)
            .send()
            .await;
        let agent: Value = r.unwrap().json().await.unwrap();
        let replicas = agent["replicas"].as_array().cloned().unwrap_or_default();
        replicas.iter().filter(|r| r["live"] == true).count() == 1
    })
    .await;
    for id in &before {
        let (status, body) = gw.prompt(id, "taken over").await;
        assert_eq!(status, 200, "{body}");
    }

    let opts = host_options().listen(&address_a);
    a.gw = Some(Gateway::spawn(&a.db.url, a.dir.path(), &opts).await);
    gw.wait_members_ready().await;
    for id in &before {
        let (status, body) = gw.prompt(id, "both back").await;
        assert_eq!(status, 200, "{body}");
    }
    front.finish().await;
    b.stop().await;
    a.finish().await;
}

/// A third-party server as the remote agent: `acpremote expose` (PyPI `acpremote`, pinned and
/// installed by `.ci/run`; its path in `ACPREMOTE`) serving the echo agent over WebSocket at its
/// own endpoint (`/acp/ws`, given as is), its bearer token required. The front's client goes
/// through the same flows; the session's files routes are 501 and a workspace is refused (the
/// host is no gateway); then the session, held by a member whose connection is cut (its
/// bridge SIGKILLed), is resumed through a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs acpremote (PyPI), then: ACPREMOTE=PATH cargo test --test integration remote_agents::third_party -- --ignored"]
async fn a_third_party_server_is_a_remote_agent() {
    let acpremote = std::env::var("ACPREMOTE").expect("ACPREMOTE: the acpremote executable");
    let dir = tempfile::tempdir().unwrap();
    let (mut server, port) = expose(&acpremote, dir.path()).await;
    let url = format!("ws://127.0.0.1:{port}/acp/ws");
    let front = front(Backend::Sqlite, &url, dir.path()).await;
    let gw = front.gw();
    let id = through_the_front(gw).await;
    // The session's files are on a host that is no gateway: out of the front's reach.
    for route in ["files", "files/README.md", "diff", "checkpoints"] {
        let r = gw.get(&format!("/sessions/{id}/{route}")).await;
        assert_eq!(r.status(), 501, "{route}");
        let problem: Value = r.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("runs on another host"), "{detail}");
    }
    // Nor does it make workspaces: a session asking for one is refused, and not left behind
    // working where its cwd says.
    let before = gw.json("/sessions").await["sessions"]
        .as_array()
        .unwrap()
        .len();
    let body = json!({"cwd": "/tmp", "workspace": {"kind": "worktree"}});
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 501);
    let after = gw.json("/sessions").await["sessions"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(after, before);

    let bridge = gw.agent_pid().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bridge as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    gw.wait_until(|g| async move {
        let pid = g.json("/agent").await["members"][0]["pid"].as_u64();
        pid.is_some_and(|pid| pid != u64::from(bridge))
    })
    .await;
    gw.wait_members_ready().await;
    let (status, body) = gw.prompt(&id, "/chunks 3 again").await;
    assert_eq!(
        (status, body["stopReason"].as_str()),
        (200, Some("end_turn")),
        "{body}"
    );
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    front.finish().await;
    let _ = server.kill().await;
}

/// `acpremote expose` serving the echo agent on a port of its own, once its `/healthz` answers
/// 200. It takes a port number, not 0, so it is offered a free one; when another process takes
/// that port first (acpremote exits saying the address is in use, and only then) it is started
/// again on another. Until it listens, a probe's connection is refused, and nothing else.
async fn expose(acpremote: &str, dir: &Path) -> (tokio::process::Child, u16) {
    use tokio::io::AsyncReadExt;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = tokio::process::Command::new(acpremote)
            .args(["expose", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--token-env",
                "SERVER_TOKEN",
                "--env",
                "ECHO_AGENT_CONTROLS=modes,models",
            ])
            .arg("--")
            .arg(echo_agent())
            .env("SERVER_TOKEN", HOST_KEY)
            .env("ECHO_AGENT_DIR", dir.join("agent"))
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stderr = server.stderr.take().unwrap();
        let said = tokio::spawn(async move {
            let mut said = String::new();
            let _ = stderr.read_to_string(&mut said).await;
            eprint!("{said}");
            said
        });
        let health = format!("http://127.0.0.1:{port}/healthz");
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "acpremote did not start"
            );
            if let Some(status) = server.try_wait().unwrap() {
                let said = said.await.unwrap();
                assert!(
                    said.to_lowercase().contains("address already in use"),
                    "acpremote exited ({status}):\n{said}"
                );
                break;
            }
            match http.get(&health).send().await {
                Ok(r) => {
                    assert_eq!(r.status(), 200, "acpremote's /healthz");
                    return (server, port);
                }
                Err(e) if e.is_connect() => {}
                Err(e) => panic!("acpremote's /healthz: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
