//! Delivery at a fixed rate, as a web page sees it, the gateway beside its peers in the same run
//! (not a test): N sessions (8, then 64) on one bench agent, each sent a 20-chunk prompt
//! (`/chunks 20`) every period (100 ms by default) whatever the answers take, the sessions'
//! prompts spread evenly over the period; one SSE subscriber per session on the gateway, one
//! stream in all on each peer. The fronts are those of `benches/concurrent.rs`, started afresh
//! for each N and round, the rounds' samples pooled.
//!
//! Reported per front: prompts per second, the round trip, the delivery (prompt sent → its
//! subscriber reads the turn's last chunk; for the direct stdio client, which reads the updates
//! before the answer on the same pipe, its round trip) and the fresh delivery (the agent writes
//! the turn → a subscriber reads its last chunk), each at p50 / p99 / p99.9; events lost; the
//! front's CPU per event read. Then the gateway's delivery against acp-http-adapter's.
//!
//! Run with `bash bench/open-loop.sh`, which builds the release binaries and installs the peers
//! first. `OPEN_LOOP_PERIOD_MS` sets the period per session (default 100),
//! `OPEN_LOOP_SESSIONS` the session counts (default `8,64`); `OPEN_LOOP_SECS`, `_ROUNDS`,
//! `_AGENT`, `_FRONTS` and `_BASELINE` as `CONCURRENT_…` in `benches/concurrent.rs`. Writes
//! `bench/results/open-loop.md`.

mod support;

use std::path::Path;
use std::time::Duration;

use support::fronts::{Figures, PROMPT, Setup, Which, env_or, load_average, ms, us};
use support::peers::PeerKind;
use support::percentile;

/// p50 / p99 / p99.9 of `sorted`.
fn spread(sorted: &[Duration]) -> String {
    if sorted.is_empty() {
        return "—".into();
    }
    let at = |q| ms(percentile(sorted, q));
    format!("{} / {} / {}", at(0.5), at(0.99), at(0.999))
}

/// The delivery times of a front: its subscribers', or the direct client's round trips.
fn delivery(f: &Figures) -> &[Duration] {
    f.delivery.as_deref().unwrap_or(&f.latency)
}

fn row(n: usize, name: &str, f: &Figures) -> String {
    let delivered = match &f.delivery {
        Some(d) if f.undelivered > 0 => format!("{} ({} turns unread)", spread(d), f.undelivered),
        _ => spread(delivery(f)),
    };
    let front_event = if f.has_front_process {
        us(f.usage.front, f.events as usize)
    } else {
        "—".into()
    };
    format!(
        "| {n} | {name} | {:.0} | {} | {delivered} | {} | {} | {front_event} |\n",
        f.prompts_per_sec(),
        spread(&f.latency),
        spread(&f.since_written),
        f.lost,
    )
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::from_env("OPEN_LOOP", "8,64");
    let period = Duration::from_millis(env_or("OPEN_LOOP_PERIOD_MS", 100));
    let load_before = load_average();
    let mut table = String::new();
    let mut ratios = String::new();
    for &n in &setup.counts {
        let results = setup.run(n, Some(period), dir.path()).await;
        let adapter = setup
            .fronts
            .iter()
            .zip(&results)
            .find(|((_, which), _)| matches!(which, Which::Peer(PeerKind::AcpHttpAdapter)))
            .map(|(_, (_, f))| f);
        for ((_, which), (name, f)) in setup.fronts.iter().zip(&results) {
            table += &row(n, name, f);
            if let (Which::Gateway(_, None), Some(adapter)) = (which, adapter) {
                let (mine, theirs) = (delivery(f), delivery(adapter));
                if mine.is_empty() || theirs.is_empty() {
                    continue;
                }
                let ratio =
                    |q| percentile(mine, q).as_secs_f64() / percentile(theirs, q).as_secs_f64();
                ratios += &format!(
                    "- {n} sessions, {name}: delivery p50 {:.2} × acp-http-adapter's (target ≤ 1.5), \
                     p99 {:.2} × (target ≤ 1); {} events lost\n",
                    ratio(0.5),
                    ratio(0.99),
                    f.lost,
                );
            }
        }
    }
    let report = format!(
        "Open-loop delivery; commit {}, {} cores, load average {load_before} before and {} after \
         (other work shares the machine); one run of `bash bench/open-loop.sh`\n\n\
         One {} per front, N sessions on it, each sent `{PROMPT}` (20 chunks) every {} ms \
         whatever the answers take (the sessions spread over the period), for {} s after 1 s of \
         warm-up; every front started afresh for each N and each of {} rounds (in the reverse \
         order every other round), the rounds' samples pooled. Subscribers: one SSE stream per \
         session on the gateway, one stream in all on each peer. Delivery: prompt sent → its \
         subscriber reads the turn's last chunk (the direct stdio client: its round trip, the \
         updates read before the answer); fresh: the agent writes the turn → a subscriber reads \
         its last chunk (the bench agent's `CLOCK_MONOTONIC` stamp). CPU from /proc over the \
         window.\n\n\
         | sessions | front | prompts/s | round trip p50 / p99 / p99.9 | delivery p50 / p99 / p99.9 | fresh p50 / p99 / p99.9 | events lost | front CPU per event |\n\
         |---|---|---|---|---|---|---|---|\n\
         {table}\n{ratios}",
        support::commit(),
        support::cores(),
        load_average(),
        setup.agent_name,
        period.as_millis(),
        setup.secs,
        setup.rounds,
    );
    print!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/open-loop.md");
    std::fs::write(out, report).unwrap();
}
