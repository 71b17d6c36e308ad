//! Event-rate benchmark (not a test): how fast agent updates reach an SSE subscriber through the
//! gateway, as a ratio of how fast the same agent's stdout can be read directly, measured in the
//! same run; and whether 1,000 subscribers on one session slow the agent's turn.
//!
//! Run with `bash bench/events.sh` (it builds the release binaries first). With `DATABASE_URL`
//! set, the gateway figures are also measured on PostgreSQL. Prints a table and writes it to
//! `bench/results/`.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Backend, Database, Gateway, Options, Sse};
use tokio::io::BufReader;

const CHUNKS: usize = 20_000;
const ROUNDS: usize = 3;
const FANOUT: usize = 1_000;
/// Chunks per turn in the fan-out comparison (every one is delivered FANOUT times).
const FANOUT_CHUNKS: usize = 2_000;
/// Fan-out turns with one subscriber and with FANOUT, alternated (medians compared).
const FANOUT_ROUNDS: usize = 11;
/// Set in the reader child process: "N URL".
const READERS_ENV: &str = "EVENTS_BENCH_READERS";

/// Subscribers on a session, in a child process at the lowest CPU priority (`nice -n 19`):
/// in production the clients run elsewhere, so here they only get the CPU the gateway and the
/// agent leave, and the turn's time shows what fan-out costs the gateway, not its clients.
struct Readers {
    child: tokio::process::Child,
    out: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Readers {
    /// Starts `n` subscribers on `url` and returns once all are connected.
    async fn connect(url: &str, n: usize, cpus: Option<&str>) -> Readers {
        let (child, out) = support::client_process(READERS_ENV, &format!("{n} {url}"), cpus).await;
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
        let reader = Sse::open(&http, url, None).await;
        let (http, url) = (http.clone(), url.to_owned());
        readers.push(tokio::spawn(async move {
            support::until_turns_end(reader, &http, &url, 1).await
        }));
    }
    println!("ready");
    let mut fewest = usize::MAX;
    for r in readers {
        fewest = fewest.min(r.await.unwrap());
    }
    println!("{fewest}");
}

/// One measured turn.
struct Turn {
    /// By the log: turn_started to turn_ended.
    agent: Duration,
    /// The prompt's round trip as its HTTP client saw it.
    round_trip: Duration,
    /// Gateway CPU time from the prompt until every subscriber has read it all.
    cpu: Duration,
    /// The agent's time writing its stdout (waiting for the gateway to read, when the pipe is
    /// full), by its own clock.
    writing: Duration,
}

/// The fan-out comparison under one CPU placement: medians, one subscriber and FANOUT.
struct Fanout {
    /// The agent's turn by the log (turn_started to turn_ended), medians: one subscriber, FANOUT.
    agent: (Duration, Duration),
    /// Least and greatest slowdown of the agent's turn in one round (FANOUT ÷ one, same round).
    slowdown_range: (f64, f64),
    /// The prompt's round trip as its HTTP client saw it, medians: one subscriber, FANOUT.
    round_trip: (Duration, Duration),
    /// Gateway CPU time per turn, from the prompt until every subscriber has read it all:
    /// with one subscriber, with FANOUT.
    cpu: (Duration, Duration),
    /// The agent's time writing its stdout per turn: with one subscriber, with FANOUT.
    writing: (Duration, Duration),
    /// Times a subscriber fell behind the broadcast during the fan-out turns.
    lagged: u64,
    /// Group commits (one broadcast frame each) per fan-out turn, on average.
    commits: u64,
}

struct GatewayFigures {
    rate: f64,
    /// Every process free to run on every core.
    shared: Fanout,
    /// The agent alone on the first core; the gateway, the subscribers and this process on the
    /// second (None on a machine with fewer than two cores).
    pinned: Option<Fanout>,
}

/// The agent's turn with one subscriber and with FANOUT, alternated FANOUT_ROUNDS times, each
/// on a fresh session; the medians are compared. With `pinned`, the agent's process runs alone
/// on core 0 and everything else on core 1 for the duration.
async fn fanout(gw: &Gateway, pinned: bool) -> Fanout {
    let http = reqwest::Client::new();
    let all = format!("0-{}", support::cores() - 1);
    if pinned {
        support::pin(gw.agent_pid().await, "0");
        support::pin(gw.pid(), "1");
        support::pin(std::process::id(), "1");
    }
    let readers_cpus = pinned.then_some("1");
    let probe = gw.prompt_url(&gw.create("/tmp").await);
    let turn_with = async |subscribers: usize| {
        let id = gw.create("/tmp").await;
        let url = gw.url(&format!("/sessions/{id}/events"));
        let readers = Readers::connect(&url, subscribers, readers_cpus).await;
        let writing = support::agent_stdout_writing(&http, &probe).await;
        let cpu = support::cpu_time(gw.pid());
        let took = support::prompt_at(
            http.clone(),
            gw.prompt_url(&id),
            format!("/chunks {FANOUT_CHUNKS}"),
        )
        .await;
        assert!(readers.finish().await >= FANOUT_CHUNKS);
        let cpu = support::cpu_time(gw.pid()) - cpu;
        let writing = support::agent_stdout_writing(&http, &probe).await - writing;
        Turn {
            agent: support::agent_turn(gw, &id).await,
            round_trip: took,
            cpu,
            writing,
        }
    };
    let lagged = async || gw.metric("acp_gateway_sse_lagged_total").await as u64;
    let commits = async || gw.metric("acp_gateway_event_commits_total").await as u64;
    let (mut one, mut many) = (Vec::new(), Vec::new());
    let (mut fanout_lagged, mut fanout_commits) = (0, 0);
    for _ in 0..FANOUT_ROUNDS {
        one.push(turn_with(1).await);
        let (lagged_before, commits_before) = (lagged().await, commits().await);
        many.push(turn_with(FANOUT).await);
        fanout_lagged += lagged().await - lagged_before;
        fanout_commits += commits().await - commits_before;
    }
    if pinned {
        support::pin(gw.agent_pid().await, &all);
        support::pin(gw.pid(), &all);
        support::pin(std::process::id(), &all);
    }
    let mut pairs: Vec<f64> = one
        .iter()
        .zip(&many)
        .map(|(a, b)| b.agent.as_secs_f64() / a.agent.as_secs_f64())
        .collect();
    pairs.sort_by(f64::total_cmp);
    let median = |turns: &[Turn], figure: fn(&Turn) -> Duration| {
        let mut v: Vec<Duration> = turns.iter().map(figure).collect();
        v.sort();
        v[FANOUT_ROUNDS / 2]
    };
    let both = |figure: fn(&Turn) -> Duration| (median(&one, figure), median(&many, figure));
    Fanout {
        agent: both(|t| t.agent),
        slowdown_range: (pairs[0], pairs[FANOUT_ROUNDS - 1]),
        round_trip: both(|t| t.round_trip),
        cpu: both(|t| t.cpu),
        writing: both(|t| t.writing),
        lagged: fanout_lagged,
        commits: fanout_commits / FANOUT_ROUNDS as u64,
    }
}

async fn gateway_figures(db: &str, state: &Path) -> GatewayFigures {
    let gw = Gateway::spawn(db, state, &Options::bench()).await;
    let id = gw.create("/tmp").await;
    let rate = support::sse_event_rate(&gw, &id, CHUNKS, ROUNDS).await;
    let shared = fanout(&gw, false).await;
    let pinned = if support::cores() >= 2 {
        Some(fanout(&gw, true).await)
    } else {
        None
    };
    gw.stop().await;
    GatewayFigures {
        rate,
        shared,
        pinned,
    }
}

#[tokio::main]
async fn main() {
    if let Ok(spec) = std::env::var(READERS_ENV) {
        return run_readers(&spec).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let direct_state = dir.path().join("direct");
    let direct = tokio::task::spawn_blocking(move || {
        support::direct_event_rate(&direct_state, CHUNKS, ROUNDS)
    })
    .await
    .unwrap();
    let mut rows = vec![];
    for backend in Backend::available() {
        let state = dir.path().join(backend.name());
        let mut db = Database::create(backend, &state, "bench").await;
        rows.push((backend.name(), gateway_figures(&db.url, &state).await));
        db.remove().await;
    }
    let (commit, cores) = (support::commit(), support::cores());
    let mut table = format!(
        "Event rate, {CHUNKS} agent_message_chunk updates per turn, best of {ROUNDS}; commit {commit}, {cores} cores\n\n\
         | backend | direct stdout read (events/s) | agent → SSE (events/s) | ratio (target ≥ 0.50) |\n\
         |---|---|---|---|\n"
    );
    for (name, f) in &rows {
        table.push_str(&format!(
            "| {name} | {direct:.0} | {:.0} | {:.2} |\n",
            f.rate,
            f.rate / direct
        ));
    }
    table.push_str(&format!(
        "\nFan-out: the agent's {FANOUT_CHUNKS}-chunk turn with 1 and with {FANOUT} subscribers on its session, \
         {FANOUT_ROUNDS} rounds alternated, medians\n\n\
         | backend | CPUs | turn as logged (turn_started → turn_ended), 1 subscriber | same, {FANOUT} subscribers | logged turn, {FANOUT} ÷ 1 (medians; range of the rounds) | agent's time writing stdout per turn, 1 / {FANOUT} subscribers | prompt round trip, 1 / {FANOUT} subscribers | gateway CPU per turn, 1 / {FANOUT} subscribers | log commits (broadcasts) per turn | subscribers fell behind |\n\
         |---|---|---|---|---|---|---|---|---|---|\n"
    ));
    for (name, f) in &rows {
        let placements = [
            ("all shared", Some(&f.shared)),
            ("agent alone on one core", f.pinned.as_ref()),
        ];
        for (placement, fan) in placements {
            let Some(f) = fan else { continue };
            table.push_str(&format!(
                "| {name} | {placement} | {:.0} ms | {:.0} ms | {:.2}× ({:.2}–{:.2}) | {:.1} / {:.1} ms | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {} | {} |\n",
                f.agent.0.as_secs_f64() * 1e3,
                f.agent.1.as_secs_f64() * 1e3,
                f.agent.1.as_secs_f64() / f.agent.0.as_secs_f64(),
                f.slowdown_range.0,
                f.slowdown_range.1,
                f.writing.0.as_secs_f64() * 1e3,
                f.writing.1.as_secs_f64() * 1e3,
                f.round_trip.0.as_secs_f64() * 1e3,
                f.round_trip.1.as_secs_f64() * 1e3,
                f.cpu.0.as_secs_f64() * 1e3,
                f.cpu.1.as_secs_f64() * 1e3,
                f.commits,
                f.lagged,
            ));
        }
    }
    println!("{table}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/events.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}
