//! Event-rate benchmark (not a test): how fast agent updates reach an SSE subscriber through the
//! gateway, as a ratio of how fast the same agent's stdout can be read directly, measured in the
//! same run; and whether 1,000 subscribers on one session slow the agent's turn.
//!
//! Run with `bash bench/events.sh` (it builds the release binaries first). With `DATABASE_URL`
//! set, the gateway figures are also measured on PostgreSQL. Prints a table and writes it to
//! `bench/results/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const CHUNKS: usize = 20_000;
const ROUNDS: usize = 3;
const FANOUT: usize = 1_000;

fn release_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn echo_agent() -> PathBuf {
    let p = release_dir().join("examples/echo_agent");
    assert!(
        p.exists(),
        "{} is missing: run bench/events.sh, which builds it",
        p.display()
    );
    p
}

/// Direct baseline: an ACP client on the agent's stdio, reading every update line.
async fn direct_rate(state: &Path) -> f64 {
    let mut child = tokio::process::Command::new(echo_agent())
        .env("ECHO_AGENT_DIR", state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = async |id: u64, method: &str, params: Value| {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string()
            + "\n";
        stdin.write_all(line.as_bytes()).await.unwrap();
    };
    send(
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await;
    let mut session = String::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["id"] == 1 {
            send(2, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
        } else if v["id"] == 2 {
            session = v["result"]["sessionId"].as_str().unwrap().to_owned();
            break;
        }
    }
    let mut best: f64 = 0.0;
    for round in 0..ROUNDS {
        let id = 10 + round as u64;
        let started = Instant::now();
        send(id, "session/prompt", json!({"sessionId": session, "prompt": [{"type": "text", "text": format!("/chunks {CHUNKS}")}]})).await;
        let mut updates = 0usize;
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["method"] == "session/update" {
                updates += 1;
            } else if v["id"] == id {
                break;
            }
        }
        assert!(updates >= CHUNKS);
        best = best.max(CHUNKS as f64 / started.elapsed().as_secs_f64());
    }
    best
}

struct Gateway {
    base: String,
    child: tokio::process::Child,
}

impl Gateway {
    async fn start(db: &str, state: &Path) -> Gateway {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
            .args(["--listen", "127.0.0.1:0", "--database-url", db, "--agent"])
            .arg(echo_agent())
            .env("ECHO_AGENT_DIR", state)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = out.next_line().await.unwrap().unwrap();
        let base = first.strip_prefix("listening on ").unwrap().to_owned();
        let http = reqwest::Client::new();
        for _ in 0..600 {
            if http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                return Gateway { base, child };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the gateway did not become ready");
    }

    async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }
}

/// Reads an SSE body until `turn_ended`; returns how many events arrived.
async fn read_until_turn_end(res: reqwest::Response) -> usize {
    let mut body = res.bytes_stream();
    let (mut buf, mut events) = (String::new(), 0usize);
    while let Some(Ok(bytes)) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if frame.starts_with(':') {
                continue;
            }
            events += 1;
            if frame.contains("\nevent: turn_ended\n") {
                return events;
            }
        }
    }
    events
}

struct GatewayFigures {
    rate: f64,
    turn_one: Duration,
    turn_fanout: Duration,
}

async fn gateway_figures(db: &str, state: &Path) -> GatewayFigures {
    let gw = Gateway::start(db, state).await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/sessions", gw.base))
        .json(&json!({"cwd": "/tmp"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sessionId"].as_str().unwrap().to_owned();
    let prompt = |http: reqwest::Client| {
        let url = format!("{}/sessions/{id}/prompt", gw.base);
        async move {
            let started = Instant::now();
            let r = http
                .post(url)
                .json(&json!({"text": format!("/chunks {CHUNKS}")}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            started.elapsed()
        }
    };
    // One subscriber: agent → gateway → log → SSE, timed from the prompt to the last event read.
    let (mut best, mut turn_one) = (0.0f64, Duration::MAX);
    for _ in 0..ROUNDS {
        let res = http
            .get(format!("{}/sessions/{id}/events", gw.base))
            .send()
            .await
            .unwrap();
        let started = Instant::now();
        let turn = tokio::spawn(prompt(http.clone()));
        let events = read_until_turn_end(res).await;
        let elapsed = started.elapsed();
        assert!(events >= CHUNKS);
        best = best.max(CHUNKS as f64 / elapsed.as_secs_f64());
        turn_one = turn_one.min(turn.await.unwrap());
    }
    // Fan-out: the same turn with FANOUT subscribers reading; how long does the agent's turn take?
    let mut turn_fanout = Duration::MAX;
    for _ in 0..ROUNDS {
        let mut readers = Vec::new();
        for _ in 0..FANOUT {
            let res = http
                .get(format!("{}/sessions/{id}/events", gw.base))
                .send()
                .await
                .unwrap();
            readers.push(tokio::spawn(read_until_turn_end(res)));
        }
        turn_fanout = turn_fanout.min(prompt(http.clone()).await);
        for r in readers {
            assert!(r.await.unwrap() >= CHUNKS);
        }
    }
    gw.stop().await;
    GatewayFigures {
        rate: best,
        turn_one,
        turn_fanout,
    }
}

async fn fresh_postgres(admin: &str) -> (String, String) {
    use sqlx::Connection;
    let name = format!("acpgw_bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("DATABASE_URL unreachable");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let base = admin.rsplit_once('/').unwrap().0;
    (format!("{base}/{name}"), name)
}

async fn drop_postgres(admin: &str, name: &str) {
    use sqlx::Connection;
    if let Ok(mut conn) = sqlx::PgConnection::connect(admin).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await;
    }
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let direct = direct_rate(&dir.path().join("direct")).await;
    let mut rows = vec![];
    let sqlite = format!("sqlite:{}", dir.path().join("bench.db").display());
    rows.push((
        "SQLite",
        gateway_figures(&sqlite, &dir.path().join("sqlite")).await,
    ));
    if let Some(admin) = std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()) {
        let (url, name) = fresh_postgres(&admin).await;
        rows.push((
            "PostgreSQL",
            gateway_figures(&url, &dir.path().join("pg")).await,
        ));
        drop_postgres(&admin, &name).await;
    }
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut table = format!(
        "Event rate, {CHUNKS} agent_message_chunk updates per turn, best of {ROUNDS}; commit {commit}, {cores} cores\n\n\
         | backend | direct stdout read (events/s) | agent → SSE (events/s) | ratio (target ≥ 0.50) | turn, 1 subscriber | turn, {FANOUT} subscribers | slowdown |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for (name, f) in &rows {
        table.push_str(&format!(
            "| {name} | {direct:.0} | {:.0} | {:.2} | {:.0} ms | {:.0} ms | {:.2}× |\n",
            f.rate,
            f.rate / direct,
            f.turn_one.as_secs_f64() * 1e3,
            f.turn_fanout.as_secs_f64() * 1e3,
            f.turn_fanout.as_secs_f64() / f.turn_one.as_secs_f64(),
        ));
    }
    println!("{table}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/events.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}
