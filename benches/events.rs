//! Event-rate benchmark (not a test): how fast agent updates reach an SSE subscriber through the
//! gateway, as a ratio of how fast the same agent's stdout can be read directly, measured in the
//! same run; and whether 1,000 subscribers on one session slow the agent's turn.
//!
//! Run with `bash bench/events.sh` (it builds the release binaries first). With `DATABASE_URL`
//! set, the gateway figures are also measured on PostgreSQL. Prints a table and writes it to
//! `bench/results/`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use support::{Gateway, Reader, drop_postgres, fresh_postgres};
use tokio::io::{AsyncBufReadExt, BufReader};

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
            reader.until_turns_end(&http, &url, 1).await
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
    /// The agent's turn by the log (turn_started to turn_ended), medians: one subscriber, FANOUT.
    agent: (Duration, Duration),
    /// Least and greatest slowdown of the agent's turn in one round (FANOUT ÷ one, same round).
    slowdown_range: (f64, f64),
    /// The prompt's round trip as its HTTP client saw it, medians: one subscriber, FANOUT.
    round_trip: (Duration, Duration),
    /// Gateway CPU time per turn, from the prompt until every subscriber has read it all:
    /// with one subscriber, with FANOUT.
    cpu: (Duration, Duration),
    /// Times a subscriber fell behind the broadcast during the fan-out turns.
    fanout_lagged: u64,
    /// Group commits (one broadcast frame each) per fan-out turn, on average.
    fanout_commits: u64,
}

async fn gateway_figures(db: &str, state: &Path) -> GatewayFigures {
    let gw = Gateway::start(db, state).await;
    let http = reqwest::Client::new();
    let id = gw.create(&http).await;
    let best = support::sse_event_rate(&gw, &id, CHUNKS, ROUNDS).await;
    // Fan-out: the agent's turn with one subscriber and with FANOUT, alternated FANOUT_ROUNDS
    // times, each on a fresh session; the medians are compared.
    let turn_with = async |subscribers: usize| {
        let id = gw.create(&http).await;
        let readers =
            Readers::connect(&format!("{}/sessions/{id}/events", gw.base), subscribers).await;
        let cpu = support::cpu_time(gw.pid());
        let took = support::prompt_at(
            http.clone(),
            gw.prompt_url(&id),
            format!("/chunks {FANOUT_CHUNKS}"),
        )
        .await;
        assert!(readers.finish().await >= FANOUT_CHUNKS);
        let cpu = support::cpu_time(gw.pid()) - cpu;
        (gw.agent_turn(&id).await, took, cpu)
    };
    let lagged = async || gw.metric("acp_gateway_sse_lagged_total").await as u64;
    let commits = async || gw.metric("acp_gateway_event_commits_total").await as u64;
    let (mut one, mut many) = (Vec::new(), Vec::new());
    let (mut trip_one, mut trip_many) = (Vec::new(), Vec::new());
    let (mut cpu_one, mut cpu_many) = (Duration::ZERO, Duration::ZERO);
    let (mut fanout_lagged, mut fanout_commits) = (0, 0);
    for _ in 0..FANOUT_ROUNDS {
        let (agent, took, cpu) = turn_with(1).await;
        one.push(agent);
        trip_one.push(took);
        cpu_one += cpu;
        let (lagged_before, commits_before) = (lagged().await, commits().await);
        let (agent, took, cpu) = turn_with(FANOUT).await;
        many.push(agent);
        trip_many.push(took);
        cpu_many += cpu;
        fanout_lagged += lagged().await - lagged_before;
        fanout_commits += commits().await - commits_before;
    }
    let mut pairs: Vec<f64> = one
        .iter()
        .zip(&many)
        .map(|(a, b)| b.as_secs_f64() / a.as_secs_f64())
        .collect();
    pairs.sort_by(f64::total_cmp);
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[FANOUT_ROUNDS / 2]
    };
    let fanout_commits = fanout_commits / FANOUT_ROUNDS as u64;
    gw.stop().await;
    GatewayFigures {
        rate: best,
        agent: (median(one), median(many)),
        slowdown_range: (pairs[0], pairs[FANOUT_ROUNDS - 1]),
        round_trip: (median(trip_one), median(trip_many)),
        cpu: (
            cpu_one / FANOUT_ROUNDS as u32,
            cpu_many / FANOUT_ROUNDS as u32,
        ),
        fanout_lagged,
        fanout_commits,
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
    let (commit, cores) = (support::commit(), support::cores());
    let mut table = format!(
        "Event rate, {CHUNKS} agent_message_chunk updates per turn, best of {ROUNDS}; commit {commit}, {cores} cores\n\n\
         | backend | direct stdout read (events/s) | agent → SSE (events/s) | ratio (target ≥ 0.50) | agent's {FANOUT_CHUNKS}-chunk turn, 1 subscriber (median of {FANOUT_ROUNDS}) | same turn, {FANOUT} subscribers | agent slowdown (medians; range of the rounds) | prompt round trip, 1 / {FANOUT} subscribers | gateway CPU per turn, 1 / {FANOUT} subscribers | log commits (broadcasts) per turn | subscribers fell behind |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (name, f) in &rows {
        table.push_str(&format!(
            "| {name} | {direct:.0} | {:.0} | {:.2} | {:.0} ms | {:.0} ms | {:.2}× ({:.2}–{:.2}) | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {} | {} |\n",
            f.rate,
            f.rate / direct,
            f.agent.0.as_secs_f64() * 1e3,
            f.agent.1.as_secs_f64() * 1e3,
            f.agent.1.as_secs_f64() / f.agent.0.as_secs_f64(),
            f.slowdown_range.0,
            f.slowdown_range.1,
            f.round_trip.0.as_secs_f64() * 1e3,
            f.round_trip.1.as_secs_f64() * 1e3,
            f.cpu.0.as_secs_f64() * 1e3,
            f.cpu.1.as_secs_f64() * 1e3,
            f.fanout_commits,
            f.fanout_lagged,
        ));
    }
    println!("{table}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/events.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}
