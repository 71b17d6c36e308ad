//! What only the benchmarks need, on top of what they share with the tests (`tests/support`,
//! included here as [`shared`] and re-exported): baselines to measure the gateway against
//! ([`baselines`], and the peers installed by `bench/peers.sh`: [`peers`]), the interleaved
//! prompt round trip ([`latency`]), closed- and open-loop load ([`load`]), the fronts the load
//! benches drive ([`fronts`]), event rates, and the run's
//! commit for the reports.
//!
//! Each bench includes it with `mod support;`. A bench uses part of it, hence the `allow`.
#![allow(dead_code, unused_imports)]

#[path = "../../tests/support/mod.rs"]
pub mod shared;

pub mod baselines;
pub mod floor;
pub mod fronts;
pub mod latency;
pub mod load;
pub mod peers;
pub mod stages;
pub mod text;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use baselines::{BareProxy, DirectAgent, MultiplexedAgent, bare_server};
pub use latency::{BLOCK, Sides, prompt_latency};
pub use load::{
    Calls, LoadPlan, Window, best_alternated, clients, closed_loop, load, load_spread, open_loop,
};
pub use shared::agent::{bench_agent, echo_agent};
pub use shared::process::{cores, cpu_time, pin, rss_kib, run_time, thread_run_time};
pub use shared::{Backend, Database, Gateway, Options, Sse, postgres};

/// The commit measured (`git rev-parse --short HEAD`, `+dirty` with local changes).
pub fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let head = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    if dirty { format!("{head}+dirty") } else { head }
}

pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The gateway's RSS (KiB) once its allocator has settled (750 ms of quiet).
pub async fn settled_rss(gw: &Gateway) -> u64 {
    tokio::time::sleep(Duration::from_millis(750)).await;
    rss_kib(gw.pid())
}

/// The clients of a bench, run as a child process of this bench's own binary (with `env` set to
/// `spec`, which the bench's `main` looks for) at the lowest CPU priority (`nice -n 19`), on
/// `cpus` when given: in production clients are elsewhere, so here they get only the CPU the
/// gateway and the agent leave. Returns once the child has said "ready", with its other lines;
/// its stdin is a pipe that [`tokio::process::Child::wait`] closes.
pub async fn client_process(
    env: &str,
    spec: &str,
    cpus: Option<&str>,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut command = match cpus {
        Some(cpus) => {
            let mut c = tokio::process::Command::new("taskset");
            c.args(["-c", cpus, "nice"]);
            c
        }
        None => tokio::process::Command::new("nice"),
    };
    let mut child = command
        .args(["-n", "19"])
        .arg(std::env::current_exe().unwrap())
        .env(env, spec)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("nice (coreutils) starts the clients' process");
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(out.next_line().await.unwrap().as_deref(), Some("ready"));
    (child, out)
}

/// Sends `request` and returns its JSON body.
pub async fn send_json(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// Posts a prompt to `url` (a session's prompt route) and waits for the turn; returns how long
/// it took. Owns its arguments, so that it can be spawned.
pub async fn prompt_at(http: reqwest::Client, url: String, text: String) -> Duration {
    let started = Instant::now();
    let r = http
        .post(url)
        .json(&json!({"text": text}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    started.elapsed()
}

/// The time from a session's first `turn_started` to its first `turn_ended`, by the log's
/// timestamps: how long the agent took as the gateway saw it (both are stored as the gateway
/// reads them from the agent, however late its subscribers are).
pub async fn agent_turn(gw: &Gateway, id: &str) -> Duration {
    let (mut after, mut started, mut ended) = (0, None, None);
    while ended.is_none() {
        let page = gw
            .json(&format!("/sessions/{id}/history?after={after}&limit=1000"))
            .await;
        let events = page["events"].as_array().expect("a history page");
        assert!(!events.is_empty(), "no turn_ended in the history of {id}");
        for e in events {
            let at =
                || chrono::DateTime::parse_from_rfc3339(e["createdAt"].as_str().unwrap()).unwrap();
            match e["event"].as_str() {
                Some("turn_started") if started.is_none() => started = Some(at()),
                Some("turn_ended") if ended.is_none() => ended = Some(at()),
                _ => {}
            }
            after = e["seq"].as_i64().unwrap();
        }
    }
    (ended.unwrap() - started.expect("turn_started before turn_ended"))
        .to_std()
        .unwrap()
}

/// The echo agent's time spent writing to its stdout so far, in its answer to a one-word
/// prompt on session `id` (`_meta.echoAgent.stdoutWriteMicros`; the figure is per process).
/// Time the agent waited for the gateway to read shows up here.
pub async fn agent_stdout_writing(http: &reqwest::Client, url: &str) -> Duration {
    let answer = send_json(http.post(url).json(&json!({"text": "probe"}))).await;
    let micros = answer["result"]["_meta"]["echoAgent"]["stdoutWriteMicros"].as_u64();
    Duration::from_micros(micros.unwrap_or_else(|| panic!("no stdoutWriteMicros in {answer}")))
}

/// Reads `sse` (opened on `url`) until `turns` `turn_ended` events have arrived, reconnecting
/// with `Last-Event-ID` when the stream ends, as a browser's EventSource does; returns how many
/// events arrived over all connections. Frames are not parsed beyond their id and name, so
/// that a thousand subscribers cost their process little.
pub async fn until_turns_end(
    mut sse: Sse,
    http: &reqwest::Client,
    url: &str,
    turns: usize,
) -> usize {
    let (mut events, mut ended, mut last) = (0usize, 0, None);
    loop {
        while let Some(frame) = sse.next_frame().await {
            let Some(id) = frame.id() else {
                continue; // keep-alive comment
            };
            events += 1;
            last = Some(id);
            if frame.event() == "turn_ended" {
                ended += 1;
                if ended == turns {
                    return events;
                }
            }
        }
        sse = Sse::open(http, url, last).await;
    }
}

/// Best of `rounds` turns of `chunks` updates: updates per second from the agent to one SSE
/// subscriber of session `id`, timed from the prompt to the last event read.
pub async fn sse_event_rate(gw: &Gateway, id: &str, chunks: usize, rounds: usize) -> f64 {
    let http = reqwest::Client::new();
    let events = gw.url(&format!("/sessions/{id}/events"));
    let mut best = 0.0f64;
    for _ in 0..rounds {
        let reader = Sse::open(&http, &events, None).await;
        let started = Instant::now();
        let turn = tokio::spawn(prompt_at(
            http.clone(),
            gw.prompt_url(id),
            format!("/chunks {chunks}"),
        ));
        assert!(until_turns_end(reader, &http, &events, 1).await >= chunks);
        best = best.max(chunks as f64 / started.elapsed().as_secs_f64());
        turn.await.unwrap();
    }
    best
}

/// The baseline of [`sse_event_rate`]: best of `rounds`, updates per second a bare client
/// reads from the same agent's stdout.
pub fn direct_event_rate(state: &Path, chunks: usize, rounds: usize) -> f64 {
    let mut agent = DirectAgent::start(state);
    let mut best = 0.0f64;
    for _ in 0..rounds {
        let started = Instant::now();
        assert!(agent.prompt(&format!("/chunks {chunks}")) >= chunks);
        best = best.max(chunks as f64 / started.elapsed().as_secs_f64());
    }
    best
}

/// `CLOCK_MONOTONIC` now, in nanoseconds, as the bench agent reads it.
pub fn monotonic_ns() -> i64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("a clock");
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}
