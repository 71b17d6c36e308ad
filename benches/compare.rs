//! Two gateways measured side by side (not a test): the same one-word prompt through gateway A
//! (this checkout's release build) and gateway B (`GATEWAY_B`, another build; this one when
//! unset), each in front of its own echo agent, and directly on a third echo agent,
//! sampled in interleaved blocks by one client thread. On a shared, noisy machine the
//! difference B − A, taken in the same minutes, is what tells whether a change helps: figures
//! from two separate runs move by more than most changes do. With neither `GATEWAY_B` nor
//! `GATEWAY_B_ARGS` set, A and B are the same build, and B − A shows the noise.
//!
//! `GATEWAY_B_ARGS` adds whitespace-separated flags to B's command line. `SAMPLES` sets the
//! samples per side (default 3000). Both placements of `bench/latency.sh` are measured. Each
//! gateway logs to an SQLite file of its own, or with `COMPARE_POSTGRES=1` to a fresh database
//! of its own on the PostgreSQL server of `DATABASE_URL`.
//!
//!   GATEWAY_B=/tmp/other/acp-gateway bash bench/compare.sh

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::{
    BLOCK, Backend, Database, DirectAgent, Gateway, Options, cores, percentile, pin, postgres,
    prompt_at,
};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let samples: usize = std::env::var("SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let this = PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway"));
    let other = std::env::var_os("GATEWAY_B").map_or_else(|| this.clone(), PathBuf::from);
    let b_args = std::env::var("GATEWAY_B_ARGS").unwrap_or_default();
    let b_args: Vec<&str> = b_args.split_whitespace().collect();
    // Each side's own database: an SQLite file, or with `COMPARE_POSTGRES` set a fresh
    // PostgreSQL database on the server of `DATABASE_URL`.
    let backend = match std::env::var_os("COMPARE_POSTGRES") {
        Some(_) => {
            postgres::admin_url().expect("COMPARE_POSTGRES needs DATABASE_URL");
            Backend::Postgres
        }
        None => Backend::Sqlite,
    };
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let mut databases = [
        Database::create(backend, &a_dir, "bench").await,
        Database::create(backend, &b_dir, "bench").await,
    ];
    let a = Gateway::spawn(&databases[0].url, &a_dir, &Options::bench()).await;
    let b_options = Options::bench().binary(&other).args(&b_args);
    let b = Gateway::spawn(&databases[1].url, &b_dir, &b_options).await;
    let http = reqwest::Client::new();
    let urls = [
        a.prompt_url(&a.create("/tmp").await),
        b.prompt_url(&b.create("/tmp").await),
    ];
    let mut direct = DirectAgent::start(&dir.path().join("direct"));
    let agents = [direct.pid(), a.agent_pid().await, b.agent_pid().await];
    println!(
        "A: {}\nB: {} {}\n{samples} prompts per side in interleaved blocks of {BLOCK}, {} cores\n",
        this.display(),
        other.display(),
        b_args.join(" "),
        cores()
    );
    println!("| placement | direct p50 / p90 / p99 | A | B | B − A p50 / p90 / p99 |");
    println!("|---|---|---|---|---|");
    let placements: &[(&str, bool)] = if cores() >= 2 {
        &[("all shared", false), ("agents alone on one core", true)]
    } else {
        &[("all shared", false)]
    };
    for &(placement, pinned) in placements {
        let place = |agents_on: &str, rest: &str| {
            for pid in agents {
                pin(pid, agents_on);
            }
            for pid in [a.pid(), b.pid(), std::process::id()] {
                pin(pid, rest);
            }
        };
        if pinned {
            place("0", "1");
        }
        let prompt = |url: &str| prompt_at(http.clone(), url.to_owned(), "hello".into());
        for _ in 0..BLOCK {
            prompt(&urls[0]).await;
            prompt(&urls[1]).await;
            direct.prompt("hello");
        }
        let mut sides: [Vec<Duration>; 3] = Default::default();
        // The side right after the direct block finds its gateway idle (a colder first prompt
        // or two, which is the p99), so A and B take turns being that side.
        let mut order = [0, 1];
        while sides[0].len() < samples {
            for side in order {
                for _ in 0..BLOCK {
                    sides[side].push(prompt(&urls[side]).await);
                }
            }
            for _ in 0..BLOCK {
                let started = Instant::now();
                direct.prompt("hello");
                sides[2].push(started.elapsed());
            }
            order.reverse();
        }
        for side in &mut sides {
            side.sort();
        }
        let qs = [0.5, 0.9, 0.99];
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let row = |s: &[Duration]| {
            qs.map(|q| format!("{:.0}", us(percentile(s, q))))
                .join(" / ")
        };
        let diff = qs
            .map(|q| {
                format!(
                    "{:+.0}",
                    us(percentile(&sides[1], q)) - us(percentile(&sides[0], q))
                )
            })
            .join(" / ");
        println!(
            "| {placement} | {} µs | {} µs | {} µs | {diff} µs |",
            row(&sides[2]),
            row(&sides[0]),
            row(&sides[1]),
        );
        if pinned {
            let all = format!("0-{}", cores() - 1);
            place(&all, &all);
        }
    }
    a.stop().await;
    b.stop().await;
    for db in &mut databases {
        db.remove().await;
    }
}
