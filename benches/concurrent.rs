//! Throughput under concurrent load, the gateway beside its peers in the same run (not a test):
//! N sessions (8, then 64) on one echo agent, one closed-loop client per session sending
//! 20-chunk prompts (`/chunks 20`) for a bounded time, with one SSE subscriber per session
//! reading every event, through each front in turn:
//!
//! - a direct stdio client (the baseline): this process multiplexing the N clients' requests on
//!   the agent's stdio ([`support::MultiplexedAgent`]), no HTTP, no subscriber;
//! - the gateway on SQLite, and on PostgreSQL when `DATABASE_URL` is set;
//! - acp-http-adapter and sandbox-agent ([`support::peers`]), installed pinned from their
//!   registries by `bench/peers.sh`. Each has one event stream per agent process, carrying every
//!   session's updates, so they get one subscriber in all (N on the same stream would read
//!   every event N times).
//!
//! Every front starts afresh for each N and round: its own agent process, state and database.
//! Reported: prompts per second and the prompt's round trip (p50 / p99) over the window; the
//! time from sending a prompt to its subscriber reading the turn's last chunk; and CPU time from
//! `/proc` over the window: the front's per prompt and per event its subscribers read, the
//! agent's per prompt, and this process's (the load generator) per prompt.
//!
//! Run with `bash bench/concurrent.sh` (or as part of `bash bench/run.sh`), which builds the
//! release binaries and installs the peers first. `CONCURRENT_SECS` sets the window (default
//! 5 s, after 1 s of warm-up), `CONCURRENT_SESSIONS` the session counts (default `8,64`),
//! `CONCURRENT_ROUNDS` how many times each front is measured, afresh, in alternating order
//! (default 2; the samples are pooled), `CONCURRENT_AGENT` the agent (`bench`, the default:
//! `examples/bench_agent.rs`, which costs far less than any front; or `echo`),
//! `CONCURRENT_FRONTS` which fronts (names holding one of its comma-separated words),
//! `CONCURRENT_BASELINE` the paths of other builds of the gateway to measure beside this one
//! (comma-separated), `CONCURRENT_TRACED=1` adds this build with its spans on (`RUST_LOG=info`),
//! traces off, and traces on with the collector down, sampling none and all.
//! Writes `bench/results/concurrent.md` (`concurrent-traced.md` with `CONCURRENT_TRACED=1`).

mod support;

use std::path::Path;
use std::time::Duration;

use acp_gateway::events::MAX_BATCH;
use support::Backend;
use support::floor::EVENTS_PER_TURN;
use support::fronts::{Figures, PROMPT, Setup, Which, load_average, pair, us};

fn row(n: usize, name: &str, f: &Figures) -> String {
    let delivery = match &f.delivery {
        None => "—".to_owned(),
        // Lost events shift which turn a last chunk is matched with: no figure then.
        Some(_) if f.lost > 0 => format!("{} events lost", f.lost),
        Some(d) if f.undelivered > 0 => format!("{} ({} turns unread)", pair(d), f.undelivered),
        Some(d) => pair(d),
    };
    let (front_prompt, front_event) = if f.has_front_process {
        (
            us(f.usage.front, f.prompts),
            us(f.usage.front, f.events as usize),
        )
    } else {
        ("—".into(), "—".into())
    };
    format!(
        "| {n} | {name} | {:.0} | {} | {delivery} | {} | {:.1} | {front_prompt} | {front_event} | {} | {} |\n",
        f.prompts_per_sec(),
        pair(&f.latency),
        pair(&f.since_written),
        f.events as f64 / f.prompts.max(1) as f64,
        us(f.usage.agent, f.prompts),
        us(f.usage.client, f.prompts),
    )
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::from_env("CONCURRENT", "8,64");
    let (secs, rounds, agent_name) = (setup.secs, setup.rounds, setup.agent_name);
    let load_before = load_average();
    let mut table = String::new();
    let mut ratios = String::new();
    let mut floors = String::new();
    for &n in &setup.counts {
        let results = setup.run(n, None, dir.path()).await;
        let fronts = &setup.fronts;
        let mut rates: Vec<(String, &Which, f64)> = Vec::new();
        // Per backend, the agent's and the bench's CPU per prompt on the gateway's row.
        let mut others: Vec<(Backend, Duration)> = Vec::new();
        for ((_, which), (name, f)) in fronts.iter().zip(results) {
            table += &row(n, &name, &f);
            rates.push((name, which, f.prompts_per_sec()));
            if let Which::Gateway(backend, None) = which {
                let prompts = f.prompts.max(1) as u32;
                others.push((*backend, (f.usage.agent + f.usage.client) / prompts));
            }
        }
        let best_peer = rates
            .iter()
            .filter(|r| matches!(r.1, Which::Peer(_)))
            .map(|r| r.2)
            .fold(0.0, f64::max);
        for (name, _, rate) in rates
            .iter()
            .filter(|r| matches!(r.1, Which::Gateway(_, None)))
        {
            ratios += &format!(
                "- {n} sessions, {name}: {:.2} × the faster peer's prompts/s (target ≥ 1.5)\n",
                rate / best_peer
            );
        }
        for (backend, other) in others {
            let state = dir.path().join(format!("{n}-floor-{}", backend.name()));
            let floor =
                support::floor::measure(backend, &state, n, Duration::from_secs(secs)).await;
            let per_prompt = floor.per_event() * EVENTS_PER_TURN as u32 + other;
            let ceiling = support::cores() as f64 / per_prompt.as_secs_f64();
            floors += &format!(
                "| {n} | {} | {} | {} | {} | {ceiling:.0} | {:.2} |\n",
                backend.name(),
                us(floor.cpu, floor.events as usize),
                us(other, 1),
                us(per_prompt, 1),
                ceiling / best_peer,
            );
        }
    }
    let report = format!(
        "Concurrent prompts; commit {}, {} cores, load average {load_before} before and {} after \
         (other work shares the machine); one run of `bash bench/concurrent.sh`\n\n\
         One {agent_name} per front, N sessions on it, one closed-loop client per session sending \
         `{PROMPT}` (20 chunks) for {secs} s after 1 s of warm-up; every front started afresh \
         for each N and each of {rounds} rounds (the fronts in the reverse order every other \
         round), the rounds' samples pooled. Subscribers: one SSE stream per session on the gateway; one stream in all on \
         each peer (theirs carry every session); none on the direct client, which counts the \
         update lines it reads. Delivery: prompt sent → its subscriber reads the turn's last \
         chunk; fresh: the agent writes the turn → a subscriber reads its last chunk (the \
         agent's `CLOCK_MONOTONIC` stamp in that chunk, over the turns read; with the bench \
         agent only). CPU from /proc over the window: the front's process (per prompt, and per event \
         its subscribers read), the agent's, and the bench's own (the load generator and \
         subscribers; for the direct row, the client itself).\n\n\
         | sessions | front | prompts/s | round trip p50 / p99 | delivery p50 / p99 | fresh p50 / p99 | events read per prompt | front CPU per prompt | front CPU per event | agent CPU per prompt | bench CPU per prompt |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n\
         {table}\n{ratios}\n\
         The floor: the store's own log writer appending the N sessions' {EVENTS_PER_TURN}-event \
         turns, as many per commit as fill the gateway writer's largest batch ({MAX_BATCH} events), for {secs} s with nothing else running (CPU of this \
         process, and of PostgreSQL's server processes), beside the agent's and the bench's CPU \
         per prompt from the gateway's row: the prompts/s that {} cores could carry with the log \
         kept if nothing else the front does cost anything.\n\n\
         | sessions | backend | storing, CPU per event | agent + bench, CPU per prompt | floor per prompt | most prompts/s | × the faster peer |\n\
         |---|---|---|---|---|---|---|\n\
         {floors}",
        support::commit(),
        support::cores(),
        load_average(),
        support::cores(),
    );
    print!("{report}");
    // With the traced fronts, a report of its own (it is run with only some fronts).
    let name = match std::env::var("CONCURRENT_TRACED").as_deref() {
        Ok("1") => "concurrent-traced.md",
        _ => "concurrent.md",
    };
    let out = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("bench/results")
        .join(name);
    std::fs::write(out, report).unwrap();
}
