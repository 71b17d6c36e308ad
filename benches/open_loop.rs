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
//! The floor under fresh delivery, in the same run: for each store, the commit holding a turn's
//! last chunk, timed through the store's own log writer at the same rate with nothing else
//! running (`benches/support/floor.rs`, [`support::floor::commit_latency`]); no front that
//! stores an event before a subscriber reads it delivers a turn's last chunk faster. Beside it,
//! a whole turn committed in one append, the shape the gateway commits a quick turn in, and
//! acp-http-adapter's delivery with such a commit added: what the delivery targets leave for a
//! front that stores each turn before handing it on.
//!
//! With `OPEN_LOOP_UNSYNCED=1` (`bench/open-loop.sh` sets it) and PostgreSQL, the gateway is
//! measured on it a second time with `synchronous_commit = off` (its commits not waiting for
//! the disk, a setting an operator may choose), its stages beside the others: what the commit's
//! wait for the disk costs delivery in the same run.
//!
//! Run with `bash bench/open-loop.sh`, which builds the release binaries and installs the peers
//! first. `OPEN_LOOP_PERIOD_MS` sets the period per session (default 100),
//! `OPEN_LOOP_SESSIONS` the session counts (default `8,64`); `OPEN_LOOP_SECS`, `_ROUNDS`,
//! `_AGENT`, `_FRONTS` and `_BASELINE` as `CONCURRENT_…` in `benches/concurrent.rs`. Writes
//! `bench/results/open-loop.md`.

mod support;

use std::path::Path;
use std::time::Duration;

use support::Backend;
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
    let mut floors = String::new();
    let mut stages = String::new();
    for &n in &setup.counts {
        let results = setup.run(n, Some(period), dir.path()).await;
        let adapter = (setup.fronts.iter().zip(&results))
            .find(|((_, which), _)| matches!(which, Which::Peer(PeerKind::AcpHttpAdapter)))
            .map(|(_, (_, f))| f);
        // The peer whose fresh delivery is fastest at p99: its samples, and its CPU per event.
        let best_peer = (setup.fronts.iter().zip(&results))
            .filter(|((_, which), (_, f))| {
                matches!(which, Which::Peer(_)) && !f.since_written.is_empty()
            })
            .map(|(_, (name, f))| (name, f))
            .min_by_key(|(_, f)| percentile(&f.since_written, 0.99));
        for backend in gateway_backends(&setup) {
            let state = dir.path().join(format!("{n}-commit-{}", backend.name()));
            let secs = Duration::from_secs(setup.secs);
            let commits = support::floor::commit_latency(backend, &state, n, period, secs).await;
            let (took, storing) = (&commits.last, &commits.storing);
            table += &format!(
                "| {n} | the log alone, {}: a turn's last commit | — | — | — | {} | — | {} |\n\
                 | {n} | the log alone, {0}: a whole turn in one commit | — | — | — | {} | — | — |\n",
                backend.name(),
                spread(took),
                us(storing.cpu, storing.events as usize),
                spread(&commits.whole),
            );
            if let Some((peer, f)) = best_peer {
                floors += &format!(
                    "- {n} sessions, {}: a turn's last commit alone takes {} at p99 and storing \
                     {} of CPU per event, against {peer}'s fresh delivery p99 of {} and {} of \
                     CPU per event; its relay plus a commit: fresh p99 {}\n",
                    backend.name(),
                    ms(percentile(took, 0.99)),
                    us(storing.cpu, storing.events as usize),
                    ms(percentile(&f.since_written, 0.99)),
                    us(f.usage.front, f.events as usize),
                    ms(percentile(&plus_drawn(&f.since_written, took), 0.99)),
                );
            }
            if let Some(adapter) = adapter.filter(|a| !delivery(a).is_empty()) {
                let theirs = delivery(adapter);
                let with_commit = plus_drawn(theirs, &commits.whole);
                let ratio = |q| {
                    percentile(&with_commit, q).as_secs_f64() / percentile(theirs, q).as_secs_f64()
                };
                floors += &format!(
                    "- {n} sessions, {}: a whole turn's commit alone takes {} at p50 and {} at \
                     p99; acp-http-adapter's delivery plus such a commit: p50 {:.2} × and p99 \
                     {:.2} × its own\n",
                    backend.name(),
                    ms(percentile(&commits.whole, 0.5)),
                    ms(percentile(&commits.whole, 0.99)),
                    ratio(0.5),
                    ratio(0.99),
                );
            }
        }
        for ((_, which), (name, f)) in setup.fronts.iter().zip(&results) {
            table += &row(n, name, f);
            if !f.stages.0.is_empty() {
                stages += &stage_row(n, name, f);
            }
            let measured = matches!(which, Which::Gateway(_, None) | Which::Unsynced);
            if let (true, Some(adapter)) = (measured, adapter) {
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
         window. The log alone: the store's own log writer, nothing else running, each session \
         given a turn at the same rate, its first events committed, then its last chunk with its \
         `turn_ended`, that commit timed (in the fresh column): the floor under a fresh delivery \
         for a front that stores an event before a subscriber reads it; every other turn instead \
         committed whole in one append (the shape of a quick turn's commit in the gateway), \
         timed.\n\n\
         | sessions | front | prompts/s | round trip p50 / p99 / p99.9 | delivery p50 / p99 / p99.9 | fresh p50 / p99 / p99.9 | events lost | front CPU per event |\n\
         |---|---|---|---|---|---|---|---|\n\
         {table}\n{ratios}{floors}\n\
         Where the gateway's events spent their time in the window \
         (`acp_gateway_event_stage_seconds` from `/metrics`, read at the window's start and end): \
         queued for the log writer until their batch's write starts (per event), the write with \
         its commit (per batch), the commit until a subscriber's stream takes it (per run). \
         Quantiles are the bound of the bucket holding them; beside them the fresh delivery, \
         the agent's write until the subscriber reads the turn's last chunk.\n\n\
         | sessions | front | waited p50 / p99 / mean | written p50 / p99 / mean (batches) | handed p50 / p99 / mean | fresh p50 / p99 |\n\
         |---|---|---|---|---|---|\n\
         {stages}",
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

/// `samples` each plus a commit drawn from `commits` (spread over them), sorted: a front as
/// fast as the one measured that also commits.
fn plus_drawn(samples: &[Duration], commits: &[Duration]) -> Vec<Duration> {
    let mut sum: Vec<Duration> = (samples.iter().enumerate())
        .map(|(i, d)| *d + commits[(i * 7919) % commits.len()])
        .collect();
    sum.sort();
    sum
}

/// A gateway front's stage timings, and its fresh delivery beside them.
fn stage_row(n: usize, name: &str, f: &Figures) -> String {
    let cell = |i: usize| {
        let s = &f.stages.0[i];
        format!(
            "{} / {} / {}",
            s.quantile(0.5),
            s.quantile(0.99),
            us(s.mean(), 1)
        )
    };
    let fresh = match f.since_written.as_slice() {
        [] => "—".to_owned(),
        d => format!("{} / {}", ms(percentile(d, 0.5)), ms(percentile(d, 0.99))),
    };
    let batches = f.stages.0.get(1).map_or(0, |s| s.count());
    format!(
        "| {n} | {name} | {} | {} ({batches}) | {} | {fresh} |\n",
        cell(0),
        cell(1),
        cell(2)
    )
}

/// The stores the gateway is measured on in this run.
fn gateway_backends(setup: &Setup) -> Vec<Backend> {
    let mut out = Vec::new();
    for (_, which) in &setup.fronts {
        if let Which::Gateway(backend, None) = which
            && !out.contains(backend)
        {
            out.push(*backend);
        }
    }
    out
}
