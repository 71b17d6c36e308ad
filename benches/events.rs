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
use tokio::io::{AsyncBufReadExt, BufReader};

const CHUNKS: usize = 20_000;
const ROUNDS: usize = 3;
const FANOUT: usize = 1_000;
/// Chunks per turn in the fan-out comparison (every one is delivered FANOUT times).
const FANOUT_CHUNKS: usize = 2_000;
/// Set in the reader child process: "N URL".
const READERS_ENV: &str = "EVENTS_BENCH_READERS";

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

/// Direct baseline: an ACP client on the agent's stdio that reads stdout in large blocks on its
/// own thread and only counts update lines — the least work any reader can do.
fn direct_rate(state: &Path) -> f64 {
    use std::io::{Read, Write};
    let mut child = std::process::Command::new(echo_agent())
        .env("ECHO_AGENT_DIR", state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut send = |id: u64, method: &str, params: Value| {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string()
            + "\n";
        stdin.write_all(line.as_bytes()).unwrap();
    };
    let (mut buf, mut pending) = (vec![0u8; 1 << 20], Vec::<u8>::new());
    // Reads until the response to `id`; returns it and the number of update lines before it.
    let mut until = |id: u64| -> (Value, usize) {
        let mut updates = 0;
        loop {
            let mut start = 0;
            while let Some(nl) = pending[start..].iter().position(|b| *b == b'\n') {
                let line = &pending[start..start + nl];
                start += nl + 1;
                if line.windows(16).any(|w| w == b"\"session/update\"") {
                    updates += 1;
                } else if let Ok(v) = serde_json::from_slice::<Value>(line)
                    && v["id"] == id
                {
                    pending.drain(..start);
                    return (v, updates);
                }
            }
            pending.drain(..start);
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0, "the agent closed stdout");
            pending.extend_from_slice(&buf[..n]);
        }
    };
    send(
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    until(1);
    send(2, "session/new", json!({"cwd": "/tmp", "mcpServers": []}));
    let session = until(2).0["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut best: f64 = 0.0;
    for round in 0..ROUNDS {
        let id = 10 + round as u64;
        let started = Instant::now();
        let text = format!("/chunks {CHUNKS}");
        send(
            id,
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        );
        let (_, updates) = until(id);
        assert!(updates >= CHUNKS);
        best = best.max(CHUNKS as f64 / started.elapsed().as_secs_f64());
    }
    let _ = child.kill();
    let _ = child.wait();
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

/// An SSE subscriber that, like a browser's EventSource, reconnects with `Last-Event-ID` when
/// its stream ends, until it has read a `turn_ended`.
struct Reader {
    res: reqwest::Response,
}

impl Reader {
    async fn open(http: &reqwest::Client, url: &str) -> Reader {
        Reader {
            res: http.get(url).send().await.unwrap(),
        }
    }

    /// Returns how many events arrived, over all connections. Frames are scanned as bytes in
    /// place, so a thousand readers cost their clients as little CPU as possible.
    async fn until_turn_end(self, http: &reqwest::Client, url: &str) -> usize {
        let frame_end = memchr::memmem::Finder::new(b"\n\n");
        let (mut res, mut events, mut last) = (self.res, 0usize, None::<String>);
        loop {
            let mut body = res.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            while let Some(Ok(bytes)) = body.next().await {
                buf.extend_from_slice(&bytes);
                let mut start = 0;
                while let Some(end) = frame_end.find(&buf[start..]) {
                    let frame = &buf[start..start + end];
                    start += end + 2;
                    let Some(rest) = frame.strip_prefix(b"id: ") else {
                        continue; // keep-alive comment
                    };
                    let id_end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
                    events += 1;
                    if rest[id_end..].starts_with(b"\nevent: turn_ended\n") {
                        return events;
                    }
                    last = Some(String::from_utf8_lossy(&rest[..id_end]).into_owned());
                }
                buf.drain(..start);
            }
            let mut req = http.get(url);
            if let Some(id) = &last {
                req = req.header("last-event-id", id);
            }
            res = req.send().await.unwrap();
        }
    }
}

/// Subscribers on a session, in a child process at the lowest CPU priority (`nice -n 19`):
/// in production the clients run elsewhere, so here they only get the CPU the gateway and the
/// agent leave, and the turn's time shows what fan-out costs the gateway, not its clients.
struct Readers {
    child: tokio::process::Child,
    out: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Readers {
    /// Starts `n` subscribers on `url` and returns once all are connected.
    async fn connect(url: &str, n: usize) -> Readers {
        let mut child = tokio::process::Command::new("nice")
            .args(["-n", "19"])
            .arg(std::env::current_exe().unwrap())
            .env(READERS_ENV, format!("{n} {url}"))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("nice (coreutils) starts the reader process");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(out.next_line().await.unwrap().as_deref(), Some("ready"));
        Readers { child, out }
    }

    /// Waits until every subscriber has read the turn's end; returns the fewest events any read.
    async fn finish(mut self) -> usize {
        let line = self.out.next_line().await.unwrap().expect("reader result");
        assert!(self.child.wait().await.unwrap().success());
        line.parse().unwrap()
    }
}

/// The reader process: `n` subscribers on `url`, "ready" once connected, then the fewest
/// events any of them read by the turn's end.
async fn run_readers(spec: &str) {
    let (n, url) = spec.split_once(' ').unwrap();
    let http = reqwest::Client::new();
    let mut readers = Vec::new();
    for _ in 0..n.parse::<usize>().unwrap() {
        let reader = Reader::open(&http, url).await;
        let (http, url) = (http.clone(), url.to_owned());
        readers.push(tokio::spawn(async move {
            reader.until_turn_end(&http, &url).await
        }));
    }
    println!("ready");
    let mut fewest = usize::MAX;
    for r in readers {
        fewest = fewest.min(r.await.unwrap());
    }
    println!("{fewest}");
}

struct GatewayFigures {
    rate: f64,
    turn_one: Duration,
    turn_fanout: Duration,
    /// Times a subscriber fell behind the broadcast during the fan-out turn.
    fanout_lagged: u64,
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
    let events_url = format!("{}/sessions/{id}/events", gw.base);
    let prompt = |chunks: usize| {
        let (http, url) = (http.clone(), format!("{}/sessions/{id}/prompt", gw.base));
        async move {
            let started = Instant::now();
            let r = http
                .post(url)
                .json(&json!({"text": format!("/chunks {chunks}")}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            started.elapsed()
        }
    };
    // One subscriber: agent → gateway → log → SSE, timed from the prompt to the last event read.
    let mut best = 0.0f64;
    for _ in 0..ROUNDS {
        let reader = Reader::open(&http, &events_url).await;
        let started = Instant::now();
        let turn = tokio::spawn(prompt(CHUNKS));
        let events = reader.until_turn_end(&http, &events_url).await;
        let elapsed = started.elapsed();
        assert!(events >= CHUNKS);
        best = best.max(CHUNKS as f64 / elapsed.as_secs_f64());
        turn.await.unwrap();
    }
    // Fan-out: how long the agent's turn takes with one subscriber, and with FANOUT.
    let turn_with = async |subscribers: usize| {
        let readers = Readers::connect(&events_url, subscribers).await;
        let took = prompt(FANOUT_CHUNKS).await;
        assert!(readers.finish().await >= FANOUT_CHUNKS);
        took
    };
    let lagged = async || {
        let text = http
            .get(format!("{}/metrics", gw.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("acp_gateway_sse_lagged_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("acp_gateway_sse_lagged_total in /metrics")
    };
    let turn_one = turn_with(1).await.min(turn_with(1).await);
    let lagged_before = lagged().await;
    let turn_fanout = turn_with(FANOUT).await;
    let fanout_lagged = lagged().await - lagged_before;
    gw.stop().await;
    GatewayFigures {
        rate: best,
        turn_one,
        turn_fanout,
        fanout_lagged,
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
    if let Ok(spec) = std::env::var(READERS_ENV) {
        return run_readers(&spec).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let direct_state = dir.path().join("direct");
    let direct = tokio::task::spawn_blocking(move || direct_rate(&direct_state))
        .await
        .unwrap();
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
         | backend | direct stdout read (events/s) | agent → SSE (events/s) | ratio (target ≥ 0.50) | {FANOUT_CHUNKS}-chunk turn, 1 subscriber | same turn, {FANOUT} subscribers | slowdown | subscribers fell behind |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for (name, f) in &rows {
        table.push_str(&format!(
            "| {name} | {direct:.0} | {:.0} | {:.2} | {:.0} ms | {:.0} ms | {:.2}× | {} |\n",
            f.rate,
            f.rate / direct,
            f.turn_one.as_secs_f64() * 1e3,
            f.turn_fanout.as_secs_f64() * 1e3,
            f.turn_fanout.as_secs_f64() / f.turn_one.as_secs_f64(),
            f.fanout_lagged,
        ));
    }
    println!("{table}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/events.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}
