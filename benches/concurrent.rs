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
//! `CONCURRENT_BASELINE` the path of another build of the gateway to measure beside this one.
//! Writes `bench/results/concurrent.md`.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acp_gateway::events::MAX_BATCH;
use support::floor::EVENTS_PER_TURN;
use support::peers::{Peer, PeerKind};
use support::{
    Backend, Calls, Database, Gateway, LoadPlan, MultiplexedAgent, Options, Sse, Window,
    closed_loop, cpu_time, percentile,
};

/// Every prompt: 20 chunks, "c1 " … "c20"; [`LAST_CHUNK`] is how the last one reads in an
/// event, on every front.
const PROMPT: &str = "/chunks 20";
const LAST_CHUNK: &[u8] = br#""text":"c20""#;
/// What precedes, in the bench agent's last chunk, the time it wrote the turn (see
/// `examples/bench_agent.rs`).
const WRITTEN_AT: &[u8] = br#""writtenNs":"#;
/// How long, at most, the subscribers may lag behind the last answer before they are stopped.
const CATCH_UP: Duration = Duration::from_secs(10);

/// A front, started, with its sessions.
enum Front {
    Direct(Arc<MultiplexedAgent>),
    Gateway(Box<Gateway>, Database),
    Peer(Arc<Peer>),
}

impl Front {
    async fn start(which: &Which, agent: &Path, dir: &Path) -> Front {
        match which {
            Which::Direct => Front::Direct(Arc::new(MultiplexedAgent::start(agent, dir).await)),
            Which::Gateway(backend, binary) => {
                let db = Database::create(*backend, dir, "bench").await;
                let mut opts = Options {
                    agent: agent.to_owned(),
                    ..Options::bench()
                };
                if let Some(binary) = binary {
                    opts.binary = binary.clone();
                }
                let gw = Gateway::spawn(&db.url, dir, &opts).await;
                Front::Gateway(Box::new(gw), db)
            }
            Which::Peer(kind) => Front::Peer(Arc::new(Peer::start(*kind, agent, dir).await)),
        }
    }

    async fn new_session(&self) -> String {
        match self {
            Front::Direct(agent) => agent.new_session().await,
            Front::Gateway(gw, _) => gw.create("/tmp").await,
            Front::Peer(peer) => peer.new_session().await,
        }
    }

    /// The front's process (none for the direct client, which is this one) and its agent's.
    async fn pids(&self) -> (Option<u32>, u32) {
        match self {
            Front::Direct(agent) => (None, agent.pid()),
            Front::Gateway(gw, _) => (Some(gw.pid()), gw.agent_pid().await),
            Front::Peer(peer) => (Some(peer.pid()), peer.agent_pid()),
        }
    }

    async fn stop(self) {
        match self {
            Front::Direct(agent) => drop(agent),
            Front::Gateway(gw, mut db) => {
                gw.stop().await;
                db.remove().await;
            }
            Front::Peer(peer) => {
                let peer = Arc::into_inner(peer).expect("no prompt holds the peer any more");
                peer.stop().await;
            }
        }
    }
}

/// Which front to start.
enum Which {
    Direct,
    /// On a backend; another build than this one's when given.
    Gateway(Backend, Option<std::path::PathBuf>),
    Peer(PeerKind),
}

/// What the subscribers saw.
struct Delivery {
    window: Window,
    /// Per session, when each of its turns' last chunk was read, in order.
    turn_ends: Vec<Mutex<Vec<Instant>>>,
    /// For each last chunk read in the window, the time since the agent wrote it.
    since_written: Mutex<Vec<Duration>>,
    /// Events read during the window, over all subscribers.
    events: AtomicU64,
    /// Events missing from a stream, by the gaps in its ids.
    lost: AtomicU64,
}

/// Reads `sse` to its end, recording in `delivery`. `session` is the stream's session; on a
/// stream of every session (None), the session is found by its id through `index`.
async fn subscribe(
    mut sse: Sse,
    session: Option<usize>,
    index: Arc<HashMap<Box<[u8]>, usize>>,
    delivery: Arc<Delivery>,
) {
    let last_chunk = memchr::memmem::Finder::new(LAST_CHUNK);
    let written_at = memchr::memmem::Finder::new(WRITTEN_AT);
    let mut last_id = None;
    while let Some(frame) = sse.next_frame().await {
        let Some(id) = frame.id() else {
            continue; // keep-alive comment
        };
        let now = Instant::now();
        if delivery.window.contains(now) {
            delivery.events.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(last) = last_id
            && id > last + 1
        {
            delivery
                .lost
                .fetch_add((id - last - 1) as u64, Ordering::Relaxed);
        }
        last_id = Some(id);
        if last_chunk.find(frame.bytes()).is_none() {
            continue;
        }
        if let Some(at) = written_at.find(frame.bytes())
            && delivery.window.contains(now)
        {
            let digits = &frame.bytes()[at + WRITTEN_AT.len()..];
            let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
            let written: Option<i64> = std::str::from_utf8(&digits[..len])
                .ok()
                .and_then(|d| d.parse().ok());
            if let Some(written) = written {
                let since = Duration::from_nanos((monotonic_ns() - written).max(0) as u64);
                delivery.since_written.lock().unwrap().push(since);
            }
        }
        let session = session.or_else(|| session_of(frame.bytes(), &index));
        if let Some(s) = session {
            delivery.turn_ends[s].lock().unwrap().push(now);
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds, as the bench agent reads it.
fn monotonic_ns() -> i64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("a clock");
    t.tv_sec() * 1_000_000_000 + t.tv_nsec()
}

/// The session an event names (`"sessionId":"…"`), by its position in the run.
fn session_of(frame: &[u8], index: &HashMap<Box<[u8]>, usize>) -> Option<usize> {
    const KEY: &[u8] = br#""sessionId":""#;
    let start = memchr::memmem::find(frame, KEY)? + KEY.len();
    let len = memchr::memchr(b'"', &frame[start..])?;
    index.get(&frame[start..start + len]).copied()
}

/// CPU time used so far by the front, the agent and this process, and the update lines the
/// direct client has read.
#[derive(Clone, Copy)]
struct Usage {
    front: Duration,
    agent: Duration,
    client: Duration,
    direct_updates: u64,
}

impl Usage {
    fn now((front, agent): (Option<u32>, u32), direct: Option<&MultiplexedAgent>) -> Usage {
        Usage {
            front: front.map_or(Duration::ZERO, cpu_time),
            agent: cpu_time(agent),
            client: cpu_time(std::process::id()),
            direct_updates: direct.map_or(0, |a| a.updates()),
        }
    }

    /// From `self` to `later`.
    fn until(self, later: Usage) -> Usage {
        Usage {
            front: later.front - self.front,
            agent: later.agent - self.agent,
            client: later.client - self.client,
            direct_updates: later.direct_updates - self.direct_updates,
        }
    }
}

/// One front's figures at one session count.
struct Figures {
    /// Measuring time, over all rounds.
    secs: f64,
    /// Round trips of the prompts answered in the windows.
    latency: Vec<Duration>,
    /// Times from sending a prompt to reading its last chunk; `None` without a subscriber.
    delivery: Option<Vec<Duration>>,
    /// Times from the agent writing a turn to a subscriber reading its last chunk (the bench
    /// agent's stamp).
    since_written: Vec<Duration>,
    /// Turns whose last chunk no subscriber read (within [`CATCH_UP`]), and events missing.
    undelivered: usize,
    lost: u64,
    events: u64,
    prompts: usize,
    usage: Usage,
    has_front_process: bool,
}

impl Figures {
    fn prompts_per_sec(&self) -> f64 {
        self.prompts as f64 / self.secs
    }

    /// Pools another round's figures into these.
    fn absorb(&mut self, other: Figures) {
        self.secs += other.secs;
        self.latency.extend(other.latency);
        if let (Some(mine), Some(theirs)) = (&mut self.delivery, other.delivery) {
            mine.extend(theirs);
        }
        self.since_written.extend(other.since_written);
        self.undelivered += other.undelivered;
        self.lost += other.lost;
        self.events += other.events;
        self.prompts += other.prompts;
        self.usage = Usage {
            front: self.usage.front + other.usage.front,
            agent: self.usage.agent + other.usage.agent,
            client: self.usage.client + other.usage.client,
            direct_updates: self.usage.direct_updates + other.usage.direct_updates,
        };
    }

    fn sort(&mut self) {
        self.latency.sort();
        if let Some(delivery) = &mut self.delivery {
            delivery.sort();
        }
        self.since_written.sort();
    }
}

/// Runs the load on `front`'s `sessions`: subscribers first, then one closed-loop client per
/// session over `plan`'s window.
async fn measure(front: &Front, sessions: &[String], plan: LoadPlan) -> Figures {
    let n = sessions.len();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .build()
        .unwrap();
    let pids = front.pids().await;
    // Every stream is open before the window is set (a subscriber misses nothing: the frames
    // wait in the connection until it reads them).
    let streams: Vec<(Sse, Option<usize>)> = match front {
        Front::Direct(_) => vec![],
        Front::Gateway(gw, _) => {
            let mut streams = Vec::with_capacity(n);
            for (i, id) in sessions.iter().enumerate() {
                streams.push((gw.events(id, None).await, Some(i)));
            }
            streams
        }
        Front::Peer(peer) => vec![(Sse::open(&http, &peer.stream, None).await, None)],
    };
    let window = plan.window_from_now();
    let delivery = Arc::new(Delivery {
        window,
        turn_ends: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
        since_written: Mutex::default(),
        events: AtomicU64::new(0),
        lost: AtomicU64::new(0),
    });
    let index: Arc<HashMap<Box<[u8]>, usize>> = Arc::new(
        (sessions.iter().enumerate())
            .map(|(i, s)| (s.as_bytes().into(), i))
            .collect(),
    );
    let subscribed = !streams.is_empty();
    let subscribers: Vec<_> = streams
        .into_iter()
        .map(|(sse, session)| {
            tokio::spawn(subscribe(sse, session, index.clone(), delivery.clone()))
        })
        .collect();
    let load = async {
        let sessions = Arc::new(sessions.to_vec());
        match front {
            Front::Direct(agent) => {
                let agent = agent.clone();
                closed_loop(n, window, move |k| {
                    let (agent, sessions) = (agent.clone(), sessions.clone());
                    async move { agent.prompt(&sessions[k], PROMPT).await }
                })
                .await
            }
            Front::Gateway(gw, _) => {
                let urls: Arc<Vec<String>> =
                    Arc::new(sessions.iter().map(|id| gw.prompt_url(id)).collect());
                let http = http.clone();
                closed_loop(n, window, move |k| {
                    let turn = support::prompt_at(http.clone(), urls[k].clone(), PROMPT.into());
                    async move {
                        turn.await;
                    }
                })
                .await
            }
            Front::Peer(peer) => {
                let (peer, http) = (peer.clone(), http.clone());
                closed_loop(n, window, move |k| {
                    let (peer, http, sessions) = (peer.clone(), http.clone(), sessions.clone());
                    async move { peer.prompt(&http, &sessions[k], PROMPT).await }
                })
                .await
            }
        }
    };
    let direct = match front {
        Front::Direct(agent) => Some(agent.as_ref()),
        _ => None,
    };
    let usage = async {
        tokio::time::sleep_until(window.start.into()).await;
        let before = Usage::now(pids, direct);
        tokio::time::sleep_until(window.end.into()).await;
        before.until(Usage::now(pids, direct))
    };
    let (calls, usage) = tokio::join!(load, usage);
    if subscribed {
        let deadline = Instant::now() + CATCH_UP;
        while Instant::now() < deadline && !caught_up(&delivery, &calls) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for s in subscribers {
        s.abort();
    }
    figures(&calls, &delivery, usage, pids.0.is_some(), subscribed)
}

/// Whether every turn's last chunk has been read.
fn caught_up(delivery: &Delivery, calls: &[Calls]) -> bool {
    (delivery.turn_ends.iter().zip(calls))
        .all(|(ends, calls)| ends.lock().unwrap().len() >= calls.len())
}

fn figures(
    calls: &[Calls],
    delivery: &Delivery,
    usage: Usage,
    has_front_process: bool,
    subscribed: bool,
) -> Figures {
    let window = delivery.window;
    let mut latency = Vec::new();
    let mut delivered = Vec::new();
    let mut undelivered = 0;
    for (calls, ends) in calls.iter().zip(&delivery.turn_ends) {
        let ends = ends.lock().unwrap();
        for (j, &(started, ended)) in calls.iter().enumerate() {
            if !window.contains(ended) {
                continue;
            }
            latency.push(ended - started);
            match ends.get(j) {
                Some(&read) => delivered.push(read - started),
                None => undelivered += 1,
            }
        }
    }
    let prompts = latency.len();
    let events = if subscribed {
        delivery.events.load(Ordering::Relaxed)
    } else {
        usage.direct_updates
    };
    Figures {
        secs: window.secs(),
        latency,
        delivery: subscribed.then_some(delivered),
        since_written: std::mem::take(&mut delivery.since_written.lock().unwrap()),
        undelivered: if subscribed { undelivered } else { 0 },
        lost: delivery.lost.load(Ordering::Relaxed),
        events,
        prompts,
        usage,
        has_front_process,
    }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

fn us(total: Duration, per: usize) -> String {
    if per == 0 {
        return "—".into();
    }
    format!("{:.1} µs", total.as_secs_f64() * 1e6 / per as f64)
}

fn pair(sorted: &[Duration]) -> String {
    if sorted.is_empty() {
        return "—".into();
    }
    format!(
        "{} / {}",
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99))
    )
}

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

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not valid"))
        })
        .unwrap_or(default)
}

/// The one-minute load average (`/proc/loadavg`).
fn load_average() -> String {
    let avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    avg.split_whitespace().next().unwrap_or("?").to_owned()
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let secs: u64 = env_or("CONCURRENT_SECS", 5);
    let rounds: usize = env_or("CONCURRENT_ROUNDS", 2);
    let agent_kind: String = env_or("CONCURRENT_AGENT", "bench".into());
    let (agent, agent_name) = match agent_kind.as_str() {
        "bench" => (
            support::bench_agent(),
            "bench agent (`examples/bench_agent.rs`)",
        ),
        "echo" => (support::echo_agent(), "echo agent"),
        other => panic!("CONCURRENT_AGENT={other}: bench or echo"),
    };
    let counts: Vec<usize> = env_or::<String>("CONCURRENT_SESSIONS", "8,64".into())
        .split(',')
        .map(|n| n.trim().parse().expect("CONCURRENT_SESSIONS: numbers"))
        .collect();
    let mut fronts = vec![("direct stdio client".to_owned(), Which::Direct)];
    for backend in Backend::available() {
        let name = format!("acp-gateway, {}", backend.name());
        fronts.push((name, Which::Gateway(backend, None)));
        if let Ok(other) = std::env::var("CONCURRENT_BASELINE") {
            let name = format!("acp-gateway {other}, {}", backend.name());
            fronts.push((name, Which::Gateway(backend, Some(other.into()))));
        }
    }
    fronts.push((String::new(), Which::Peer(PeerKind::AcpHttpAdapter)));
    fronts.push((String::new(), Which::Peer(PeerKind::SandboxAgent)));
    // `CONCURRENT_FRONTS=sqlite,adapter` measures only the fronts whose name holds one of
    // these (for a profile of one front); the peers' names are their kinds' here.
    let only: String = env_or("CONCURRENT_FRONTS", String::new());
    if !only.is_empty() {
        let wanted = |name: &str| {
            let name = name.to_lowercase();
            only.split(',')
                .any(|w| name.contains(&w.trim().to_lowercase()))
        };
        fronts.retain(|(name, which)| match which {
            Which::Peer(PeerKind::AcpHttpAdapter) => wanted("acp-http-adapter"),
            Which::Peer(PeerKind::SandboxAgent) => wanted("sandbox-agent"),
            _ => wanted(name),
        });
    }
    let load_before = load_average();
    let mut table = String::new();
    let mut ratios = String::new();
    let mut floors = String::new();
    for &n in &counts {
        let plan = LoadPlan {
            concurrency: n,
            warmup: Duration::from_secs(1),
            window: Duration::from_secs(secs),
            rounds: 1,
        };
        // Each round starts every front afresh, in the reverse order of the round before, so
        // that no front always runs at the same point of the machine's other work.
        let mut results: Vec<Option<(String, Figures)>> = fronts.iter().map(|_| None).collect();
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..fronts.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (name, which) = &fronts[i];
                let state = dir.path().join(format!("{n}-{round}-{i}"));
                let front = Front::start(which, &agent, &state).await;
                let name = match &front {
                    Front::Peer(peer) => peer.name.clone(),
                    _ => name.clone(),
                };
                eprintln!("{n} sessions, round {}: {name}…", round + 1);
                let mut sessions = Vec::with_capacity(n);
                for _ in 0..n {
                    sessions.push(front.new_session().await);
                }
                let f = measure(&front, &sessions, plan).await;
                front.stop().await;
                match &mut results[i] {
                    Some((_, pooled)) => pooled.absorb(f),
                    slot => *slot = Some((name, f)),
                }
            }
        }
        let mut rates: Vec<(String, &Which, f64)> = Vec::new();
        // Per backend, the agent's and the bench's CPU per prompt on the gateway's row.
        let mut others: Vec<(Backend, Duration)> = Vec::new();
        for ((_, which), result) in fronts.iter().zip(results) {
            let (name, mut f) = result.expect("every front measured");
            f.sort();
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
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/concurrent.md");
    std::fs::write(out, report).unwrap();
}
