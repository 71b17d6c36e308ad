//! A one-word prompt's round trip, sampled on five sides in interleaved blocks by one client
//! thread: directly on an echo agent's stdio, through a bare proxy, through the gateway, and
//! two HTTP-only baselines (a bare axum route, the gateway's status route).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::baselines::{BareProxy, DirectAgent, bare_server};
use super::shared::Gateway;
use super::shared::process::{cores, pin};

/// Latency samples are taken in blocks of this many per side, the sides alternating.
pub const BLOCK: usize = 50;
const WARMUP: usize = 50;

/// A one-word prompt's round trip (sorted samples): directly on an echo agent's stdio and
/// through the gateway, beside a bare axum route answering a POST with the gateway's answer
/// and the gateway's `GET /sessions/{id}/status`.
#[derive(Default)]
pub struct Sides {
    pub direct: Vec<Duration>,
    /// Through [`BareProxy`]: the least an HTTP front for the agent adds.
    pub proxy: Vec<Duration>,
    pub bare: Vec<Duration>,
    pub status: Vec<Duration>,
    pub gateway: Vec<Duration>,
}

/// What the measuring thread needs of the gateway, found out beforehand on the caller's runtime
/// (the gateway's own HTTP client belongs to that runtime).
struct Target {
    prompt_url: String,
    status_url: String,
    pid: u32,
    agent_pid: u32,
}

/// Samples `samples` round trips per side (see [`Sides`]) in interleaved blocks, so that every
/// side sees the same machine. One client thread takes them all: a single-threaded runtime for
/// HTTP, so that requests do not hop between the client's own threads on the way out and in,
/// and plain blocking pipe I/O for the direct agent. With `pinned`, both agents run alone on
/// core 0 and the gateway and this process on core 1 for the duration.
pub async fn prompt_latency(gw: &Gateway, state: &Path, pinned: bool, samples: usize) -> Sides {
    let id = gw.create("/tmp").await;
    let target = Target {
        prompt_url: gw.prompt_url(&id),
        status_url: gw.url(&format!("/sessions/{id}/status")),
        pid: gw.pid(),
        agent_pid: gw.agent_pid().await,
    };
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(measure(&target, state, pinned, samples))
                })
                .join()
                .unwrap()
        })
    })
}

async fn timed<F: Future>(f: F) -> Duration {
    let started = Instant::now();
    f.await;
    started.elapsed()
}

async fn measure(gw: &Target, state: &Path, pinned: bool, samples: usize) -> Sides {
    let http = reqwest::Client::new();
    let prompt_url = gw.prompt_url.clone();
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
    let status_url = gw.status_url.clone();
    let direct = DirectAgent::start(&state.join(if pinned { "direct-pinned" } else { "direct" }));
    let proxy = BareProxy::start(&state.join(if pinned { "proxy-pinned" } else { "proxy" }));
    let proxy_url = format!("http://{}/prompt", proxy.addr);
    let all = format!("0-{}", cores() - 1);
    let agents = [direct.pid(), proxy.agent_pid, gw.agent_pid];
    let placed = |cpus: &str, rest: &str| {
        for pid in agents {
            pin(pid, cpus);
        }
        pin(gw.pid, rest);
        pin(std::process::id(), rest);
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
        post(&proxy_url).await;
        post(&bare).await;
        get(&status_url).await;
    }
    let mut s = Sides::default();
    while s.gateway.len() < samples {
        for _ in 0..BLOCK {
            s.gateway.push(timed(post(&prompt_url)).await);
        }
        for _ in 0..BLOCK {
            s.proxy.push(timed(post(&proxy_url)).await);
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
    for v in [
        &mut s.direct,
        &mut s.proxy,
        &mut s.bare,
        &mut s.status,
        &mut s.gateway,
    ] {
        v.sort();
    }
    if pinned {
        placed(&all, &all);
    }
    s
}
