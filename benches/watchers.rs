//! What watchers cost (not a test): one session followed by 10, 100 and 1,000 SSE watchers, and
//! 1,000 sessions followed by one each, on each store and over HTTP/1.1 and HTTP/2. For each:
//! the gateway's memory per connected watcher (its RSS before and after they connect, the
//! sessions already live), the gateway's CPU per frame delivered to a watcher over five turns
//! of 22 events (`/chunks 20` with its `turn_started` and `turn_ended`), and the delivery of
//! each turn's end (prompt sent → a watcher reads `turn_ended`) at p50 / p99, with the events
//! any watcher missed (a gap in its ids) and the times a watcher fell behind the broadcast.
//!
//! The watchers run in a child process at the lowest CPU priority (`nice -n 19`): in production
//! they are elsewhere, so here they get only the CPU the gateway and the agent leave. The gateway
//! is started afresh for each row, with the bench agent (`examples/bench_agent.rs`).
//!
//! Run with `bash bench/watchers.sh`, which builds the release binaries first. SQLite is always
//! measured; with `DATABASE_URL` set, PostgreSQL too. `WATCHERS_TURNS` sets the turns (default
//! 5), `WATCHERS_ROWS` the rows as `SESSIONSxWATCHERS` (default `1x10,1x100,1x1000,1000x1`),
//! `WATCHERS_PROTOCOLS` `h1`, `h2` or both (default), `WATCHERS_GATEWAY` another gateway binary
//! to measure (an earlier build's, to compare). Writes `bench/results/watchers.md`.

mod support;

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use support::monotonic_ns;
use support::text::{env_or, load_average, ms};
use support::{Backend, Database, Gateway, Options, Sse, percentile, run_time, settled_rss};

/// Set in the watchers' child process: the [`Plan`] as JSON.
const WATCHERS_ENV: &str = "WATCHERS_BENCH_PLAN";
/// Requests (session creations, prompts, connections) in flight at once.
const CONCURRENCY: usize = 32;

/// What the child process does: `per` watchers on each of `urls`, over HTTP/2 or HTTP/1.1,
/// until `turns` turns have ended on each.
#[derive(serde::Serialize, serde::Deserialize)]
struct Plan {
    urls: Vec<String>,
    per: usize,
    http2: bool,
    turns: usize,
}

/// What the child process reports at the end.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Seen {
    /// Frames with an id read by all watchers.
    frames: u64,
    /// Their bytes, with the blank line that ends each.
    bytes: u64,
    /// Events missed: the sum of the gaps between consecutive ids.
    lost: u64,
    /// Streams that ended and were opened again with `Last-Event-ID`.
    reopened: u64,
    /// Per watcher (in the order of `urls`, `per` each): the `CLOCK_MONOTONIC` time at which it
    /// read each turn's `turn_ended`.
    ended: Vec<Vec<i64>>,
}

fn client(http2: bool) -> reqwest::Client {
    let builder = reqwest::Client::builder();
    if http2 {
        builder.http2_prior_knowledge().build().unwrap()
    } else {
        builder.http1_only().build().unwrap()
    }
}

/// The child process: opens the watchers, says "ready", then "turn K" once every watcher has
/// read turn K's end, and at the end what it saw ([`Seen`]) as JSON.
async fn watch(plan: Plan) {
    let http = client(plan.http2);
    let targets: Vec<(usize, String)> = (plan.urls.iter())
        .flat_map(|url| std::iter::repeat_n(url.clone(), plan.per))
        .enumerate()
        .collect();
    let total = targets.len();
    let opened: Vec<(usize, String, Sse)> = futures::stream::iter(targets)
        .map(|(i, url)| {
            let http = http.clone();
            async move {
                let sse = Sse::open(&http, &url, None).await;
                (i, url, sse)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    // Each watcher says which it is when it reads a turn's end.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<usize>(total.max(16));
    let mut watchers = Vec::new();
    for (i, url, sse) in opened {
        let (http, tx, turns) = (http.clone(), tx.clone(), plan.turns);
        watchers.push(tokio::spawn(async move {
            let mut sse = sse;
            let (mut seen, mut last) = (Seen::default(), None::<i64>);
            let mut ended = Vec::with_capacity(turns);
            while ended.len() < turns {
                let Some(frame) = sse.next_frame().await else {
                    seen.reopened += 1;
                    sse = Sse::open(&http, &url, last).await;
                    continue;
                };
                let Some(id) = frame.id() else { continue };
                if let Some(before) = last {
                    seen.lost += (id - before - 1).max(0) as u64;
                }
                last = Some(id);
                seen.frames += 1;
                seen.bytes += frame.bytes().len() as u64 + 2;
                if frame.event() == "turn_ended" {
                    ended.push(monotonic_ns());
                    let _ = tx.send(i).await;
                }
            }
            (i, seen, ended, sse)
        }));
    }
    drop(tx);
    println!("ready");
    let mut counts = vec![0usize; plan.turns];
    let mut turn_of = vec![0usize; total];
    while let Some(i) = rx.recv().await {
        let turn = turn_of[i];
        turn_of[i] += 1;
        counts[turn] += 1;
        if counts[turn] == total {
            println!("turn {turn}");
        }
    }
    let mut all = Seen {
        ended: vec![Vec::new(); total],
        ..Seen::default()
    };
    // The streams stay open until the bench has measured (it closes this process's stdin):
    // closing them is not charged to the delivery of the last turn.
    let mut open = Vec::with_capacity(total);
    for w in watchers {
        let (i, seen, ended, sse) = w.await.unwrap();
        all.frames += seen.frames;
        all.bytes += seen.bytes;
        all.lost += seen.lost;
        all.reopened += seen.reopened;
        all.ended[i] = ended;
        open.push(sse);
    }
    println!("{}", serde_json::to_string(&all).unwrap());
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut Vec::new()).await;
    drop(open);
}

/// One row's figures.
struct Row {
    sessions: usize,
    per: usize,
    http2: bool,
    /// The gateway's RSS growth per watcher, KiB.
    kib_per_watcher: f64,
    /// The gateway's CPU over the turns, per frame delivered.
    cpu_per_frame: Duration,
    /// Prompt sent → a watcher reads its `turn_ended`, sorted.
    delivery: Vec<Duration>,
    seen: Seen,
    lagged: u64,
    commits: u64,
}

/// Sends one turn to each session at once (at most [`CONCURRENCY`] in flight); when each was
/// sent (`CLOCK_MONOTONIC`).
async fn turn(gw: &Gateway, ids: &[String]) -> Vec<i64> {
    futures::stream::iter(ids)
        .map(|id| async move {
            let sent = monotonic_ns();
            let (status, body) = gw.prompt(id, "/chunks 20").await;
            assert_eq!(status, 200, "{body}");
            sent
        })
        .buffered(CONCURRENCY)
        .collect()
        .await
}

async fn measure(
    db: &str,
    state: &Path,
    (sessions, per): (usize, usize),
    http2: bool,
    turns: usize,
) -> Row {
    let mut opts = Options {
        agent: support::bench_agent(),
        ..Options::bench()
    };
    if let Ok(binary) = std::env::var("WATCHERS_GATEWAY") {
        opts.binary = binary.into();
    }
    let gw = Gateway::spawn(db, state, &opts).await;
    let ids: Vec<String> = futures::stream::iter(0..sessions)
        .map(|_| gw.create("/tmp"))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    // A turn in each before anyone watches: what is built lazily is not charged to watchers.
    turn(&gw, &ids).await;
    let before = settled_rss(&gw).await;
    let plan = Plan {
        urls: ids
            .iter()
            .map(|id| gw.url(&format!("/sessions/{id}/events")))
            .collect(),
        per,
        http2,
        turns,
    };
    let plan = serde_json::to_string(&plan).unwrap();
    let (mut child, mut out) = support::client_process(WATCHERS_ENV, &plan, None).await;
    let connected = settled_rss(&gw).await;
    let watchers = sessions * per;
    let metric = async |name: &str| gw.metric(name).await as u64;
    let (lagged, commits) = (
        metric("acp_gateway_sse_lagged_total").await,
        metric("acp_gateway_event_commits_total").await,
    );
    let cpu = run_time(gw.pid());
    let mut sent = Vec::new();
    for t in 0..turns {
        sent.push(turn(&gw, &ids).await);
        let line = out.next_line().await.unwrap();
        assert_eq!(line, Some(format!("turn {t}")));
    }
    let cpu = run_time(gw.pid()) - cpu;
    let lagged = metric("acp_gateway_sse_lagged_total").await - lagged;
    let commits = metric("acp_gateway_event_commits_total").await - commits;
    let line = out
        .next_line()
        .await
        .unwrap()
        .expect("what the watchers saw");
    let seen: Seen = serde_json::from_str(&line).unwrap();
    assert!(child.wait().await.unwrap().success());
    gw.stop().await;
    let mut delivery: Vec<Duration> = (seen.ended.iter().enumerate())
        .flat_map(|(w, ended)| {
            let session = w / per;
            (ended.iter().zip(&sent))
                .map(move |(at, sent)| Duration::from_nanos((at - sent[session]).max(0) as u64))
        })
        .collect();
    delivery.sort();
    Row {
        sessions,
        per,
        http2,
        kib_per_watcher: connected.saturating_sub(before) as f64 / watchers as f64,
        cpu_per_frame: cpu / seen.frames.max(1) as u32,
        delivery,
        seen,
        lagged,
        commits,
    }
}

/// The floor under a frame's CPU where each watcher has a connection of its own (HTTP/1.1):
/// `bytes` spread over `connections` loopback TCP connections, one write per connection per
/// turn for `turns` turns, written by one thread that does nothing else, and its run time per
/// frame (`frames` in all). The reading ends are drained by this process's runtime, outside
/// the thread timed; on loopback the kernel's receiving work is the writer's, as the gateway's
/// is.
async fn bare_writes(connections: usize, turns: usize, bytes: u64, frames: u64) -> Duration {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let writer = std::thread::spawn(move || {
        let mut sockets: Vec<std::net::TcpStream> = (0..connections)
            .map(|_| std::net::TcpStream::connect(address).unwrap())
            .collect();
        sockets.iter().for_each(|s| s.set_nodelay(true).unwrap());
        let write = vec![b'x'; (bytes / (connections * turns) as u64) as usize];
        let start = support::thread_run_time();
        for _ in 0..turns {
            for socket in &mut sockets {
                std::io::Write::write_all(socket, &write).unwrap();
            }
            // The readers catch up, as the watchers do between turns.
            std::thread::sleep(Duration::from_millis(20));
        }
        support::thread_run_time() - start
    });
    let mut readers = Vec::with_capacity(connections);
    for _ in 0..connections {
        let (mut socket, _) = listener.accept().await.unwrap();
        readers.push(tokio::spawn(async move {
            let mut sink = tokio::io::sink();
            tokio::io::copy(&mut socket, &mut sink).await.unwrap();
        }));
    }
    let spent = tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
    spent / frames.max(1) as u32
}

fn rows_wanted() -> Vec<(usize, usize)> {
    env_or::<String>("WATCHERS_ROWS", "1x10,1x100,1x1000,1000x1".into())
        .split(',')
        .map(|row| {
            let (s, w) = row
                .trim()
                .split_once('x')
                .expect("WATCHERS_ROWS: SESSIONSxWATCHERS");
            (s.parse().unwrap(), w.parse().unwrap())
        })
        .collect()
}

#[tokio::main]
async fn main() {
    if let Ok(plan) = std::env::var(WATCHERS_ENV) {
        return watch(serde_json::from_str(&plan).unwrap()).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let protocols: Vec<bool> = match env_or::<String>("WATCHERS_PROTOCOLS", "h1,h2".into()) {
        p if p == "h1" => vec![false],
        p if p == "h2" => vec![true],
        _ => vec![false, true],
    };
    let turns: usize = env_or("WATCHERS_TURNS", 5);
    let load_before = load_average();
    let mut table = String::new();
    for backend in Backend::available() {
        for (row, (sessions, per)) in rows_wanted().into_iter().enumerate() {
            for &http2 in &protocols {
                eprintln!("{}: {sessions} × {per}, http2 {http2}…", backend.name());
                // A store of its own: the bench agent numbers its sessions from 1 again.
                let state = dir.path().join(format!("{}-{row}-{http2}", backend.name()));
                let mut db = Database::create(backend, &state, "watchers").await;
                let r = measure(&db.url, &state, (sessions, per), http2, turns).await;
                db.remove().await;
                let frames_per_watcher = r.seen.frames as f64 / (sessions * per) as f64;
                table += &format!(
                    "| {} | {} | {} × {} | {:.1} KiB | {:.2} µs | {} / {} | {:.0} | {} | {} | {} | {} |\n",
                    backend.name(),
                    if r.http2 { "HTTP/2" } else { "HTTP/1.1" },
                    r.sessions,
                    r.per,
                    r.kib_per_watcher,
                    r.cpu_per_frame.as_secs_f64() * 1e6,
                    ms(percentile(&r.delivery, 0.5)),
                    ms(percentile(&r.delivery, 0.99)),
                    frames_per_watcher,
                    r.seen.lost,
                    r.lagged,
                    r.seen.reopened,
                    r.commits,
                );
                if !r.http2 {
                    let floor = bare_writes(sessions * per, turns, r.seen.bytes, r.seen.frames);
                    table += &format!(
                        "| {} | bare writes, no HTTP | {sessions} × {per} | — | {:.2} µs | — | \
                         {frames_per_watcher:.0} | — | — | — | — |\n",
                        backend.name(),
                        floor.await.as_secs_f64() * 1e6,
                    );
                }
            }
        }
    }
    let report = format!(
        "Watchers; commit {}{}, {} cores, load average {load_before} before and {} after; one \
         run of `bash bench/watchers.sh`\n\n\
         The gateway afresh for each row on the bench agent, the sessions live and past one turn \
         before the watchers connect (in a child process at `nice -n 19`); then {turns} turns of \
         `/chunks 20` (22 events each) in every session, the next once every watcher has read \
         the last. Memory: the gateway's RSS growth as the watchers connect, per watcher. CPU: \
         the run time of the gateway's threads (`/proc/PID/task/*/schedstat`) over the turns, \
         the streams still open, per frame a watcher read. \
         Delivery: prompt sent → a watcher reads that turn's `turn_ended`, over every watcher and \
         turn. Lost: gaps in a watcher's ids. Fell behind: `acp_gateway_sse_lagged_total`. Cut: \
         streams the gateway ended that the watcher opened again with `Last-Event-ID`. Bare \
         writes: the bytes the watchers read, written by one thread of the bench to as many \
         loopback TCP connections, one write per connection per turn, that thread's run time \
         per frame: the floor under HTTP/1.1, where each watcher has a connection of its own.\n\n\
         | backend | protocol | sessions × watchers | memory per watcher | CPU per frame | delivery p50 / p99 | frames per watcher | lost | fell behind | cut | commits |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n\
         {table}",
        support::commit(),
        std::env::var("WATCHERS_GATEWAY").map_or(String::new(), |g| format!(", gateway `{g}`")),
        support::cores(),
        load_average(),
    );
    print!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/watchers.md");
    std::fs::write(out, report).unwrap();
}
