//! What the hop to a remote agent adds to a prompt (not a test): the same one-word prompt
//! through a gateway running the echo agent itself (the baseline), and through front gateways
//! whose agent is that kind of gateway reached over ACP's network transport, by WebSocket and
//! by HTTP/SSE, sampled in interleaved blocks by one client in the same run. Each gateway
//! logs to an SQLite file of its own.
//!
//! Run with `bash bench/remote.sh`; `SAMPLES` sets the prompts per path (default 2000).
//! Prints a table and writes it to `bench/results/remote.md`.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::fronts::env_or;
use support::{BLOCK, Backend, Database, Gateway, Options, cores, percentile, prompt_at};

/// A gateway on its own SQLite file in `dir`, with `agent` (a command, or a URL).
async fn gateway(dir: &Path, agent: PathBuf) -> (Gateway, Database) {
    let db = Database::create(Backend::Sqlite, dir, "bench").await;
    let opts = Options {
        agent,
        ..Options::bench()
    };
    (Gateway::spawn(&db.url, dir, &opts).await, db)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let samples: usize = env_or("SAMPLES", 2000);
    let echo = Options::bench().agent;
    let (host, host_db) = gateway(&dir.path().join("host"), echo.clone()).await;
    let (local, local_db) = gateway(&dir.path().join("local"), echo).await;
    let acp = |scheme: &str| format!("{}/acp", host.base.replace("http://", scheme));
    let (ws, ws_db) = gateway(&dir.path().join("ws"), acp("ws://").into()).await;
    let (sse, sse_db) = gateway(&dir.path().join("sse"), acp("http://").into()).await;
    let paths = [
        ("local stdio agent", &local),
        ("remote agent, WebSocket", &ws),
        ("remote agent, HTTP/SSE", &sse),
    ];
    let http = reqwest::Client::new();
    let mut urls = Vec::new();
    for (_, gw) in paths {
        urls.push(gw.prompt_url(&gw.create("/tmp").await));
    }
    let prompt = |url: &str| prompt_at(http.clone(), url.to_owned(), "hello".into());
    for url in &urls {
        for _ in 0..BLOCK {
            prompt(url).await;
        }
    }
    let mut sides: Vec<Vec<Duration>> = vec![Vec::new(); urls.len()];
    // Blocks in turn, the order reversed each round, so that no path always follows another.
    let mut order: Vec<usize> = (0..urls.len()).collect();
    while sides[0].len() < samples {
        for &i in &order {
            for _ in 0..BLOCK {
                sides[i].push(prompt(&urls[i]).await);
            }
        }
        order.reverse();
    }
    for side in &mut sides {
        side.sort();
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pair = |s: &[Duration]| {
        format!(
            "{:.0} / {:.0} µs",
            us(percentile(s, 0.5)),
            us(percentile(s, 0.99))
        )
    };
    let mut table = String::new();
    for (i, (name, _)) in paths.iter().enumerate() {
        let hop = if i == 0 {
            "—".to_owned()
        } else {
            let d = |q| us(percentile(&sides[i], q)) - us(percentile(&sides[0], q));
            format!("{:+.0} / {:+.0} µs", d(0.5), d(0.99))
        };
        table += &format!("| {name} | {} | {hop} |\n", pair(&sides[i]));
    }
    let report = format!(
        "Remote agents; commit {}, {} cores; one run of `bash bench/remote.sh`\n\n\
         A one-word prompt's round trip ({samples} per path, in interleaved blocks of {BLOCK}): \
         through a gateway running the echo agent, and through front gateways whose agent is \
         such a gateway's `/acp`, by WebSocket and by HTTP/SSE (each front member is the \
         gateway's bridge process, `acp-gateway connect --once`). The hop: the path's figure \
         less the local one's, at p50 and p99.\n\n\
         | path | round trip p50 / p99 | the hop adds p50 / p99 |\n|---|---|---|\n{table}",
        support::commit(),
        cores(),
    );
    print!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/remote.md");
    std::fs::write(out, report).unwrap();
    for (gw, mut db) in [
        (ws, ws_db),
        (sse, sse_db),
        (local, local_db),
        (host, host_db),
    ] {
        gw.stop().await;
        db.remove().await;
    }
}
