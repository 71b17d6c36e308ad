//! Where a prompt's round trip through the gateway spends its time (not a test): the same
//! one-word prompt sent directly to the echo agent over stdio and through the gateway, beside
//! two HTTP-only baselines on the same machine in the same run: a bare axum route answering a
//! POST with a body the size of the gateway's answer (what HTTP itself costs) and the gateway's
//! `GET /sessions/{id}/status` (HTTP plus the gateway's middleware, no agent). All four are
//! sampled in interleaved blocks so that every side sees the same machine, by one client thread
//! (a single-threaded runtime for HTTP, plain blocking pipe I/O for the direct agent).
//!
//! Two placements: every process free to run on every core, and the agent (the gateway's and
//! the direct one) alone on core 0 with the gateway and this process on core 1. On two cores
//! the first also measures how much the gateway's work slows a co-located agent; the second
//! measures the gateway's own path.
//!
//! Run with `bash bench/latency.sh`. With `DATABASE_URL` set, PostgreSQL is measured too.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::{DirectAgent, Gateway, bare_server, percentile};

/// Samples per side, taken in blocks of BLOCK, the sides alternating.
const SAMPLES: usize = 2000;
const BLOCK: usize = 50;
const WARMUP: usize = 50;

#[derive(Default)]
struct Sides {
    direct: Vec<Duration>,
    bare: Vec<Duration>,
    status: Vec<Duration>,
    gateway: Vec<Duration>,
}

async fn timed<F: Future>(f: F) -> Duration {
    let started = Instant::now();
    f.await;
    started.elapsed()
}

async fn measure(gw: &Gateway, state: &std::path::Path, pinned: bool) -> Sides {
    let http = reqwest::Client::new();
    let id = gw.create(&http).await;
    let prompt_url = gw.prompt_url(&id);
    let answer = http
        .post(&prompt_url)
        .json(&json!({"text": "warm"}))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let bare = format!("http://{}/prompt", bare_server("/prompt", answer));
    let status_url = format!("{}/sessions/{id}/status", gw.base);
    let direct = DirectAgent::start(&state.join(if pinned { "direct-pinned" } else { "direct" }));
    let all = format!("0-{}", support::cores() - 1);
    let agents = [direct.pid(), gw.agent_pid().await];
    let placed = |cpus: &str, rest: &str| {
        for pid in agents {
            support::pin(pid, cpus);
        }
        support::pin(gw.pid(), rest);
        support::pin(std::process::id(), rest);
    };
    if pinned {
        placed("0", "1");
    }
    let mut direct = direct;
    let post = |url: &str| {
        let request = http.post(url).json(&json!({"text": "hello"}));
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
    };
    let get = |url: &str| {
        let request = http.get(url);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
    };
    for _ in 0..WARMUP {
        post(&prompt_url).await;
        post(&bare).await;
        get(&status_url).await;
    }
    let mut s = Sides::default();
    while s.gateway.len() < SAMPLES {
        for _ in 0..BLOCK {
            s.gateway.push(timed(post(&prompt_url)).await);
        }
        for _ in 0..BLOCK {
            s.bare.push(timed(post(&bare)).await);
        }
        for _ in 0..BLOCK {
            s.status.push(timed(get(&status_url)).await);
        }
        // Blocking calls on the client's own thread, as a plain stdio client makes them.
        for _ in 0..BLOCK {
            let started = Instant::now();
            direct.prompt("hello");
            s.direct.push(started.elapsed());
        }
    }
    for v in [&mut s.direct, &mut s.bare, &mut s.status, &mut s.gateway] {
        v.sort();
    }
    if pinned {
        placed(&all, &all);
    }
    s
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut backends = vec![(
        "SQLite",
        format!("sqlite:{}", dir.path().join("bench.db").display()),
        None,
    )];
    if let Some(admin) = std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()) {
        let (url, name) = support::fresh_postgres(&admin).await;
        backends.push(("PostgreSQL", url, Some((admin, name))));
    }
    let mut table = format!(
        "Prompt round trip, one-word prompt, one session, no subscriber; commit {}, {} cores; \
         {SAMPLES} samples per side in interleaved blocks of {BLOCK}\n\n\
         | backend | placement | direct stdio p50 / p99 | bare axum POST p50 / p99 | gateway status GET p50 / p99 | gateway prompt p50 / p99 | added by the gateway p50 / p99 (target ≤ 150 µs / ≤ 1 ms) |\n\
         |---|---|---|---|---|---|---|\n",
        support::commit(),
        support::cores(),
    );
    let placements: &[(&str, bool)] = if support::cores() >= 2 {
        &[("all shared", false), ("agent alone on one core", true)]
    } else {
        &[("all shared", false)]
    };
    for (i, (name, db, pg)) in backends.iter().enumerate() {
        let state = dir.path().join(format!("state-{i}"));
        let gw = Gateway::start(db, &state).await;
        for &(placement, pinned) in placements {
            eprintln!("measuring on {name}, {placement}…");
            // The client runs on a thread of its own with a single-threaded runtime, so that
            // its HTTP requests do not hop between threads of its own on the way out and in.
            let s = tokio::task::block_in_place(|| {
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| {
                            tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                                .unwrap()
                                .block_on(measure(&gw, &state, pinned))
                        })
                        .join()
                        .unwrap()
                })
            });
            let pair = |v: &[Duration]| {
                format!("{} / {}", us(percentile(v, 0.5)), us(percentile(v, 0.99)))
            };
            let added = |q| percentile(&s.gateway, q).saturating_sub(percentile(&s.direct, q));
            table += &format!(
                "| {name} | {placement} | {} | {} | {} | {} | {} / {} |\n",
                pair(&s.direct),
                pair(&s.bare),
                pair(&s.status),
                pair(&s.gateway),
                us(added(0.5)),
                us(added(0.99)),
            );
        }
        gw.stop().await;
        if let Some((admin, name)) = pg {
            support::drop_postgres(admin, name).await;
        }
    }
    print!("{table}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/latency.md");
    std::fs::write(out, table).unwrap();
}
