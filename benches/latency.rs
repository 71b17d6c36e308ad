//! Where a prompt's round trip through the gateway spends its time (not a test): the same
//! one-word prompt sent directly to the echo agent over stdio, through the gateway, and through
//! a bare proxy (an axum route that only relays the prompt line and the answer line: the floor
//! of any HTTP front for a stdio agent on this machine), beside two HTTP-only baselines in the
//! same run: a bare axum route answering a POST with a body the size of the gateway's answer
//! (what HTTP itself costs) and the gateway's `GET /sessions/{id}/status` (HTTP plus the
//! gateway's middleware, no agent). All five are sampled in interleaved blocks so that every
//! side sees the same machine, by one client thread (a single-threaded runtime for HTTP, plain
//! blocking pipe I/O for the direct agent).
//!
//! Two placements: every process free to run on every core, and the agent (the gateway's and
//! the direct one) alone on core 0 with the gateway and this process on core 1. On two cores
//! the first also measures how much the gateway's work slows a co-located agent; the second
//! measures the gateway's own path.
//!
//! Run with `bash bench/latency.sh`. With `DATABASE_URL` set, PostgreSQL is measured too.

mod support;

use std::time::Duration;

use support::{BLOCK, Backend, Database, Gateway, Options, percentile};

/// Samples per side (see [`support::prompt_latency`]).
const SAMPLES: usize = 2000;

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = format!(
        "Prompt round trip, one-word prompt, one session, no subscriber; commit {}, {} cores; \
         {SAMPLES} samples per side in interleaved blocks of {BLOCK}\n\n\
         | backend | placement | direct stdio p50 / p99 | bare axum POST p50 / p99 | gateway status GET p50 / p99 | bare proxy prompt p50 / p99 | gateway prompt p50 / p99 | added by the bare proxy p50 / p99 | added by the gateway p50 / p99 (target ≤ 150 µs / ≤ 1 ms) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        support::commit(),
        support::cores(),
    );
    let placements: &[(&str, bool)] = if support::cores() >= 2 {
        &[("all shared", false), ("agent alone on one core", true)]
    } else {
        &[("all shared", false)]
    };
    for (i, backend) in Backend::available().into_iter().enumerate() {
        let name = backend.name();
        let state = dir.path().join(format!("state-{i}"));
        let mut db = Database::create(backend, &state, "bench").await;
        let gw = Gateway::spawn(&db.url, &state, &Options::bench()).await;
        for &(placement, pinned) in placements {
            eprintln!("measuring on {name}, {placement}…");
            let s = support::prompt_latency(&gw, &state, pinned, SAMPLES).await;
            let pair = |v: &[Duration]| {
                format!("{} / {}", us(percentile(v, 0.5)), us(percentile(v, 0.99)))
            };
            // Signed: with noisy tails the direct side's p99 can be the higher one.
            let added = |side: &[Duration], q| {
                let (g, d) = (percentile(side, q), percentile(&s.direct, q));
                match g.checked_sub(d) {
                    Some(more) => us(more),
                    None => format!("−{}", us(d - g)),
                }
            };
            table += &format!(
                "| {name} | {placement} | {} | {} | {} | {} | {} | {} / {} | {} / {} |\n",
                pair(&s.direct),
                pair(&s.bare),
                pair(&s.status),
                pair(&s.proxy),
                pair(&s.gateway),
                added(&s.proxy, 0.5),
                added(&s.proxy, 0.99),
                added(&s.gateway, 0.5),
                added(&s.gateway, 0.99),
            );
        }
        gw.stop().await;
        db.remove().await;
    }
    print!("{table}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/latency.md");
    std::fs::write(out, table).unwrap();
}
