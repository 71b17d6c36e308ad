//! The gateway's overhead, every figure a ratio or a difference against a baseline measured in
//! the same run: a bare axum route serving the same bytes (REST), and a direct ACP client on the
//! same echo agent's stdio (prompts and events). Also memory (RSS of the gateway process only)
//! and start-up time. Not a test: it prints a table and writes it to `bench/results/`.
//!
//! Run with `bash bench/run.sh` (it builds the release binaries first). With `DATABASE_URL`
//! set, the figures that involve the store are also measured on PostgreSQL.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::{
    Backend, Database, DirectAgent, Gateway, LoadPlan, Options, Sse, bare_server, best_alternated,
    percentile, rss_kib,
};

/// Closed-loop HTTP clients for the throughput figures; gateway and bare route alternated,
/// best of each.
const LOAD: LoadPlan = LoadPlan {
    rounds: 2,
    ..LoadPlan::STANDARD
};
/// Sequential prompts of 20 chunks for the prompt rate.
const PROMPTS: usize = 200;
const PROMPT_CHUNKS: usize = 20;
/// Sequential one-word prompts for the round-trip latency, per side.
const LATENCY_SAMPLES: usize = 1000;
/// Updates in one turn for the event rate, best of EVENT_ROUNDS.
const EVENT_CHUNKS: usize = 20_000;
const EVENT_ROUNDS: usize = 2;
/// Idle SSE connections held open at once.
const IDLE_STREAMS: usize = 10_000;
/// Live sessions created for the per-session memory figure.
const LIVE_SESSIONS: usize = 200;
/// Gateway starts for the start-up figure (median).
const STARTS: usize = 5;

struct Row {
    figure: String,
    values: Vec<String>,
    target: &'static str,
    met: Vec<bool>,
}

/// Requests per second of the gateway's `path` and of a bare route serving the same body,
/// alternated, best of `LOAD.rounds` each.
async fn rest_ratio(gw: &Gateway, path: &str, route: &'static str) -> (f64, f64) {
    let http = reqwest::Client::new();
    let url = format!("{}{path}", gw.base);
    let body: Bytes = http.get(&url).send().await.unwrap().bytes().await.unwrap();
    let bare = bare_server(route, body.clone());
    let bare_url = format!("http://{bare}{path}");
    best_alternated((&url, &bare_url), body.len(), LOAD).await
}

/// Prompts per second, 20 chunks each: through the gateway with one SSE subscriber reading
/// every event, and directly on the agent's stdio.
async fn prompt_rates(gw: &Gateway, state: &Path) -> (f64, f64) {
    let http = reqwest::Client::new();
    let id = gw.create("/tmp").await;
    let events = gw.url(&format!("/sessions/{id}/events"));
    let reader = Sse::open(&http, &events, None).await;
    let subscriber = {
        let (http, events) = (http.clone(), events.clone());
        tokio::spawn(async move { support::until_turns_end(reader, &http, &events, PROMPTS).await })
    };
    let text = format!("/chunks {PROMPT_CHUNKS}");
    let started = Instant::now();
    for _ in 0..PROMPTS {
        support::prompt_at(http.clone(), gw.prompt_url(&id), text.clone()).await;
    }
    let read = subscriber.await.unwrap();
    let gateway = PROMPTS as f64 / started.elapsed().as_secs_f64();
    assert!(read >= PROMPTS * (PROMPT_CHUNKS + 2));
    let state = state.join("direct-prompts");
    let direct = tokio::task::spawn_blocking(move || {
        let mut agent = DirectAgent::start(&state);
        let started = Instant::now();
        for _ in 0..PROMPTS {
            assert!(agent.prompt(&text) >= PROMPT_CHUNKS);
        }
        PROMPTS as f64 / started.elapsed().as_secs_f64()
    })
    .await
    .unwrap();
    (gateway, direct)
}

/// p50 and p99 of a one-word prompt's round trip through the gateway, directly, and through a
/// bare proxy, sampled in interleaved blocks (see [`support::prompt_latency`]).
async fn added_latency(gw: &Gateway, state: &Path) -> [(Duration, Duration); 3] {
    let s = support::prompt_latency(gw, state, false, LATENCY_SAMPLES).await;
    [&s.gateway, &s.direct, &s.proxy].map(|v| (percentile(v, 0.5), percentile(v, 0.99)))
}

/// Updates per second from the agent to one SSE subscriber, and read directly from stdout.
async fn event_rates(gw: &Gateway, state: &Path) -> (f64, f64) {
    let id = gw.create("/tmp").await;
    let gateway = support::sse_event_rate(gw, &id, EVENT_CHUNKS, EVENT_ROUNDS).await;
    let state = state.join("direct-events");
    let direct = tokio::task::spawn_blocking(move || {
        support::direct_event_rate(&state, EVENT_CHUNKS, EVENT_ROUNDS)
    })
    .await
    .unwrap();
    (gateway, direct)
}

/// The gateway's RSS growth per live session (the agent is another process).
async fn rss_per_session(gw: &Gateway) -> f64 {
    // One first, so that lazily built state (pools, caches) is not charged to sessions.
    gw.create("/tmp").await;
    settle().await;
    let before = rss_kib(gw.pid());
    for _ in 0..LIVE_SESSIONS {
        gw.create("/tmp").await;
    }
    settle().await;
    (rss_kib(gw.pid()).saturating_sub(before)) as f64 / LIVE_SESSIONS as f64
}

/// The gateway's RSS growth per idle SSE connection, IDLE_STREAMS open on `GET /events`.
async fn rss_per_stream(gw: &Gateway) -> f64 {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("{}/events", gw.base);
    // One first, for the same reason as above.
    let first = http.get(&url).send().await.unwrap();
    settle().await;
    let before = rss_kib(gw.pid());
    let mut streams = Vec::with_capacity(IDLE_STREAMS);
    for chunk in 0..IDLE_STREAMS / 500 {
        let opened = futures::future::join_all((0..500).map(|_| http.get(&url).send())).await;
        for r in opened {
            let r = r.unwrap_or_else(|e| panic!("stream {} failed to open: {e}", chunk * 500));
            assert_eq!(r.status(), 200);
            streams.push(r);
        }
    }
    let open = gw.metric("acp_gateway_sse_subscribers").await;
    assert!(open >= IDLE_STREAMS as f64, "{open} streams open");
    settle().await;
    let after = rss_kib(gw.pid());
    drop(streams);
    drop(first);
    (after.saturating_sub(before)) as f64 / IDLE_STREAMS as f64
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Spawn of the echo agent to its `initialize` answer: the agent's own start, which the
/// start-up figure leaves out.
fn agent_start(state: &Path) -> Duration {
    let started = Instant::now();
    drop(DirectAgent::start(state));
    started.elapsed()
}

/// Median of STARTS gateway starts on a fresh SQLite file, spawn to `/readyz` 200, minus the
/// median agent start measured the same way alternately.
async fn startup(dir: &Path) -> (Duration, Duration) {
    let (mut gateway, mut agent) = (Vec::new(), Vec::new());
    for i in 0..STARTS {
        let state = dir.join(format!("start-{i}"));
        let db = Database::create(Backend::Sqlite, &state, "bench").await;
        let gw = Gateway::spawn(&db.url, &state, &Options::bench()).await;
        gateway.push(gw.ready_after);
        gw.stop().await;
        let state = dir.join(format!("agent-start-{i}"));
        agent.push(
            tokio::task::spawn_blocking(move || agent_start(&state))
                .await
                .unwrap(),
        );
    }
    gateway.sort();
    agent.sort();
    (percentile(&gateway, 0.5), percentile(&agent, 0.5))
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Raises this process's open-file limit to its hard limit; the gateway inherits it.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard as usize > IDLE_STREAMS + 1000,
        "the open-file hard limit ({hard}) is too low for {IDLE_STREAMS} streams"
    );
}

#[tokio::main]
async fn main() {
    raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let backends = Backend::available();
    let names: Vec<&str> = backends.iter().map(|b| b.name()).collect();
    let mut rows: Vec<Row> = Vec::new();
    let mut push = |figure: String, target: &'static str, values: Vec<(String, bool)>| {
        rows.push(Row {
            figure,
            target,
            met: values.iter().map(|v| v.1).collect(),
            values: values.into_iter().map(|v| v.0).collect(),
        });
    };
    let mut per_backend: Vec<Vec<(String, bool)>> = vec![Vec::new(); 12];
    let mut idle_rss = Vec::new();
    let mut session_rss = Vec::new();
    let mut stream_rss = None;
    for (i, &backend) in backends.iter().enumerate() {
        eprintln!("measuring on {}…", backend.name());
        let state = dir.path().join(format!("state-{i}"));
        let mut db = Database::create(backend, &state, "bench").await;
        let gw = Gateway::spawn(&db.url, &state, &Options::bench()).await;
        settle().await;
        idle_rss.push(rss_kib(gw.pid()) as f64 / 1024.0);
        session_rss.push(rss_per_session(&gw).await);
        let id = gw.create("/tmp").await;
        let status_path = format!("/sessions/{id}/status");
        let (status, status_bare) = rest_ratio(&gw, &status_path, "/sessions/{id}/status").await;
        let (list, list_bare) = rest_ratio(&gw, "/sessions?limit=50", "/sessions").await;
        let (prompts, prompts_direct) = prompt_rates(&gw, &state).await;
        let [(g50, g99), (d50, d99), (p50, p99)] = added_latency(&gw, &state).await;
        let (events, events_direct) = event_rates(&gw, &state).await;
        if i == 0 {
            stream_rss = Some(rss_per_stream(&gw).await);
        }
        gw.stop().await;
        db.remove().await;
        let figures = [
            (
                format!(
                    "{status:.0} / {status_bare:.0} = {:.2}",
                    status / status_bare
                ),
                status / status_bare >= 0.60,
            ),
            (
                format!("{list:.0} / {list_bare:.0} = {:.2}", list / list_bare),
                list / list_bare >= 0.25,
            ),
            (
                format!(
                    "{prompts:.0} / {prompts_direct:.0} = {:.2}",
                    prompts / prompts_direct
                ),
                prompts / prompts_direct >= 0.50,
            ),
            (
                format!(
                    "{} / {} (gateway {} / {}, direct {} / {}; a bare proxy adds {} / {})",
                    us(g50.saturating_sub(d50)),
                    us(g99.saturating_sub(d99)),
                    us(g50),
                    us(g99),
                    us(d50),
                    us(d99),
                    us(p50.saturating_sub(d50)),
                    us(p99.saturating_sub(d99)),
                ),
                g50.saturating_sub(d50) <= Duration::from_micros(150)
                    && g99.saturating_sub(d99) <= Duration::from_millis(1),
            ),
            (
                format!(
                    "{events:.0} / {events_direct:.0} = {:.2}",
                    events / events_direct
                ),
                events / events_direct >= 0.50,
            ),
        ];
        for (k, f) in figures.into_iter().enumerate() {
            per_backend[k].push(f);
        }
    }
    let labels = [
        (
            "`GET /sessions/{id}/status` req/s ÷ bare axum route req/s",
            "≥ 0.60",
        ),
        (
            "`GET /sessions?limit=50` req/s ÷ bare axum route with the same body",
            "≥ 0.25",
        ),
        (
            "prompts/s through the gateway (20 chunks each, one SSE subscriber) ÷ direct stdio client",
            "≥ 0.50",
        ),
        (
            "added latency of a prompt round trip, p50 / p99",
            "≤ 150 µs / ≤ 1 ms",
        ),
        ("agent→SSE events/s ÷ direct stdout read rate", "≥ 0.50"),
    ];
    for (k, (label, target)) in labels.into_iter().enumerate() {
        push(
            label.to_owned(),
            target,
            std::mem::take(&mut per_backend[k]),
        );
    }
    let stream_rss = stream_rss.unwrap();
    push(
        format!("{IDLE_STREAMS} idle SSE connections: gateway RSS growth per connection"),
        "≤ 16 KiB",
        vec![(format!("{stream_rss:.1} KiB (SQLite)"), stream_rss <= 16.0)],
    );
    push(
        "gateway RSS growth per live session (excluding the agent)".into(),
        "≤ 64 KiB",
        session_rss
            .iter()
            .map(|v| (format!("{v:.1} KiB"), *v <= 64.0))
            .collect(),
    );
    push(
        "idle gateway RSS".into(),
        "≤ 30 MiB",
        idle_rss
            .iter()
            .map(|v| (format!("{v:.1} MiB"), *v <= 30.0))
            .collect(),
    );
    let (ready, agent) = startup(dir.path()).await;
    let own = ready.saturating_sub(agent);
    push(
        "start to `/readyz` 200 with SQLite, agent start excluded".into(),
        "≤ 300 ms",
        vec![(
            format!(
                "{:.0} ms (to ready {:.0} ms, agent start {:.0} ms)",
                own.as_secs_f64() * 1e3,
                ready.as_secs_f64() * 1e3,
                agent.as_secs_f64() * 1e3
            ),
            own <= Duration::from_millis(300),
        )],
    );

    let mut table = format!(
        "Gateway overhead; commit {}, {} cores; one run of `bash bench/run.sh`\n\n\
         Throughput: {} (reqwest), gateway and bare route alternated, best of {}. \
         Prompts: {PROMPTS} sequential; latency: {LATENCY_SAMPLES} one-word prompts per side in interleaved blocks of {}, one client thread; the bare proxy is an axum route that only relays the prompt line and the answer line, the floor of any HTTP front for the agent (`bash bench/latency.sh` breaks it down). \
         Events: one turn of {EVENT_CHUNKS} chunks, best of {EVENT_ROUNDS}. RSS: the gateway process only.\n\n\
         | figure | {} | target | met? |\n|---|{}---|---|\n",
        support::commit(),
        support::cores(),
        LOAD.describe(),
        LOAD.rounds,
        support::BLOCK,
        names.join(" | "),
        "---|".repeat(names.len()),
    );
    for row in &rows {
        let mut values = row.values.clone();
        values.resize(names.len(), "—".into());
        let met = if row.met.iter().all(|m| *m) {
            "yes"
        } else {
            "**no**"
        };
        table.push_str(&format!(
            "| {} | {} | {} | {met} |\n",
            row.figure,
            values.join(" | "),
            row.target
        ));
    }
    println!("{table}");
    let out = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/gateway.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}
