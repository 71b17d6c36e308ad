//! The fronts the load benches drive (the direct stdio client, the gateway on a backend, the
//! peers), started afresh per run; the SSE subscribers that time each turn's delivery; the CPU
//! each process spends over the window; and each front's figures, pooled over rounds.
//! Used by `benches/concurrent.rs` (closed loop) and `benches/open_loop.rs` (a fixed rate).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::load::{Calls, LoadPlan, Window, clients};
use super::peers::{Peer, PeerKind};
use super::stages::Stages;
pub use super::text::{env_or, load_average, ms, pair, us};
use super::{
    Backend, Database, Gateway, MultiplexedAgent, Options, Sse, cpu_time, monotonic_ns, percentile,
};

/// Every prompt: 20 chunks, "c1 " … "c20"; [`LAST_CHUNK`] is how the last one reads in an
/// event, on every front.
pub const PROMPT: &str = "/chunks 20";
pub const LAST_CHUNK: &[u8] = br#""text":"c20""#;
/// What precedes, in the bench agent's last chunk, the time it wrote the turn (see
/// `examples/bench_agent.rs`).
pub const WRITTEN_AT: &[u8] = br#""writtenNs":"#;
/// The database URL's parameter of [`Which::Unsynced`] (`options=-c synchronous_commit=off`).
const UNSYNCED: &str = "options=-c%20synchronous_commit%3Doff";
/// How long, at most, the subscribers may lag behind the last answer before they are stopped.
pub const CATCH_UP: Duration = Duration::from_secs(10);

/// A front, started, with its sessions.
pub enum Front {
    Direct(Arc<MultiplexedAgent>),
    Gateway(Box<Gateway>, Database),
    Peer(Arc<Peer>),
}

impl Front {
    pub async fn start(which: &Which, agent: &Path, dir: &Path) -> Front {
        match which {
            Which::Direct => Front::Direct(Arc::new(MultiplexedAgent::start(agent, dir).await)),
            Which::Gateway(..) | Which::Traced(..) | Which::Unsynced => {
                let backend = which.backend().expect("a gateway");
                let mut db = Database::create(backend, dir, "bench").await;
                if let Which::Unsynced = which {
                    db.url += if db.url.contains('?') { "&" } else { "?" };
                    db.url += UNSYNCED;
                }
                let mut opts = Options {
                    agent: agent.to_owned(),
                    ..Options::bench()
                };
                if let Which::Gateway(_, Some(binary)) = which {
                    opts.binary = binary.clone();
                }
                if let Which::Traced(_, sampled) = which {
                    // The spans at `info` exist (the filter lets them through), as they do by
                    // default; the request log lines are still off.
                    opts.rust_log = "info,tower_http=off".into();
                    if let Some(ratio) = sampled {
                        // Exporting to a collector that is down: nothing listens on port 9.
                        opts = opts
                            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
                            .env("OTEL_TRACES_SAMPLER", "traceidratio")
                            .env("OTEL_TRACES_SAMPLER_ARG", ratio);
                    }
                }
                let gw = Gateway::spawn(&db.url, dir, &opts).await;
                Front::Gateway(Box::new(gw), db)
            }
            Which::Peer(kind) => Front::Peer(Arc::new(Peer::start(*kind, agent, dir).await)),
        }
    }

    pub async fn new_session(&self) -> String {
        match self {
            Front::Direct(agent) => agent.new_session().await,
            Front::Gateway(gw, _) => gw.create("/tmp").await,
            Front::Peer(peer) => peer.new_session().await,
        }
    }

    /// The front's process (none for the direct client, which is this one) and its agent's.
    pub async fn pids(&self) -> (Option<u32>, u32) {
        match self {
            Front::Direct(agent) => (None, agent.pid()),
            Front::Gateway(gw, _) => (Some(gw.pid()), gw.agent_pid().await),
            Front::Peer(peer) => (Some(peer.pid()), peer.agent_pid()),
        }
    }

    pub async fn stop(self) {
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
pub enum Which {
    Direct,
    /// On a backend; another build than this one's when given.
    Gateway(Backend, Option<std::path::PathBuf>),
    /// This build with its spans at `info` on: traces off (`None`), or on with the collector
    /// down, sampling this ratio of them ("0" or "1").
    Traced(Backend, Option<&'static str>),
    /// This build on PostgreSQL with `synchronous_commit = off` in its database URL (as an
    /// operator may set it): its commits do not wait for the WAL to reach the disk.
    Unsynced,
    Peer(PeerKind),
}

impl Which {
    /// The gateway's backend, for a gateway.
    pub fn backend(&self) -> Option<Backend> {
        match self {
            Which::Gateway(backend, _) | Which::Traced(backend, _) => Some(*backend),
            Which::Unsynced => Some(Backend::Postgres),
            _ => None,
        }
    }
}

/// What the subscribers saw.
pub struct Delivery {
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
pub async fn subscribe(
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

/// The session an event names (`"sessionId":"…"`), by its position in the run.
pub fn session_of(frame: &[u8], index: &HashMap<Box<[u8]>, usize>) -> Option<usize> {
    const KEY: &[u8] = br#""sessionId":""#;
    let start = memchr::memmem::find(frame, KEY)? + KEY.len();
    let len = memchr::memchr(b'"', &frame[start..])?;
    index.get(&frame[start..start + len]).copied()
}

/// CPU time used so far by the front, the agent and this process, and the update lines the
/// direct client has read.
#[derive(Clone, Copy)]
pub struct Usage {
    pub front: Duration,
    pub agent: Duration,
    pub client: Duration,
    pub direct_updates: u64,
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
pub struct Figures {
    /// Measuring time, over all rounds.
    pub secs: f64,
    /// Round trips of the prompts answered in the windows.
    pub latency: Vec<Duration>,
    /// Times from sending a prompt to reading its last chunk; `None` without a subscriber.
    pub delivery: Option<Vec<Duration>>,
    /// Times from the agent writing a turn to a subscriber reading its last chunk (the bench
    /// agent's stamp).
    pub since_written: Vec<Duration>,
    /// Turns whose last chunk no subscriber read (within [`CATCH_UP`]), and events missing.
    pub undelivered: usize,
    pub lost: u64,
    pub events: u64,
    pub prompts: usize,
    pub usage: Usage,
    pub has_front_process: bool,
    /// The gateway's stage histograms over the windows (none for another front).
    pub stages: Stages,
}

impl Figures {
    pub fn prompts_per_sec(&self) -> f64 {
        self.prompts as f64 / self.secs
    }

    /// Pools another round's figures into these.
    pub fn absorb(&mut self, other: Figures) {
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
        self.stages.absorb(other.stages);
        self.usage = Usage {
            front: self.usage.front + other.usage.front,
            agent: self.usage.agent + other.usage.agent,
            client: self.usage.client + other.usage.client,
            direct_updates: self.usage.direct_updates + other.usage.direct_updates,
        };
    }

    pub fn sort(&mut self) {
        self.latency.sort();
        if let Some(delivery) = &mut self.delivery {
            delivery.sort();
        }
        self.since_written.sort();
    }
}

/// Runs the load on `front`'s `sessions`: subscribers first, then one closed-loop client per
/// session over `plan`'s window, each sending its next prompt as its last is answered
/// (`every: None`) or at a fixed period.
pub async fn measure(
    front: &Front,
    sessions: &[String],
    plan: LoadPlan,
    every: Option<Duration>,
) -> Figures {
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
                clients(n, every, window, move |k| {
                    let (agent, sessions) = (agent.clone(), sessions.clone());
                    async move { agent.prompt(&sessions[k], PROMPT).await }
                })
                .await
            }
            Front::Gateway(gw, _) => {
                let urls: Arc<Vec<String>> =
                    Arc::new(sessions.iter().map(|id| gw.prompt_url(id)).collect());
                let http = http.clone();
                clients(n, every, window, move |k| {
                    let turn = super::prompt_at(http.clone(), urls[k].clone(), PROMPT.into());
                    async move {
                        turn.await;
                    }
                })
                .await
            }
            Front::Peer(peer) => {
                let (peer, http) = (peer.clone(), http.clone());
                clients(n, every, window, move |k| {
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
    let gateway = match front {
        Front::Gateway(gw, _) => Some(gw),
        _ => None,
    };
    let usage = async {
        tokio::time::sleep_until(window.start.into()).await;
        let before = Usage::now(pids, direct);
        let stages = match gateway {
            Some(gw) => Stages::read(gw).await,
            None => Stages::default(),
        };
        tokio::time::sleep_until(window.end.into()).await;
        let usage = before.until(Usage::now(pids, direct));
        let stages = match gateway {
            Some(gw) => Stages::read(gw).await.since(&stages),
            None => stages,
        };
        (usage, stages)
    };
    let (calls, (usage, stages)) = tokio::join!(load, usage);
    if subscribed {
        let deadline = Instant::now() + CATCH_UP;
        while Instant::now() < deadline && !caught_up(&delivery, &calls) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for s in subscribers {
        s.abort();
    }
    Figures {
        stages,
        ..figures(&calls, &delivery, usage, pids.0.is_some(), subscribed)
    }
}

/// Whether every turn's last chunk has been read.
pub fn caught_up(delivery: &Delivery, calls: &[Calls]) -> bool {
    (delivery.turn_ends.iter().zip(calls))
        .all(|(ends, calls)| ends.lock().unwrap().len() >= calls.len())
}

pub fn figures(
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
        stages: Stages::default(),
    }
}

/// What a load bench runs, from its environment (`{PREFIX}_SECS`, `_ROUNDS`, `_AGENT`,
/// `_SESSIONS`, `_FRONTS`, `_BASELINE`: see `benches/concurrent.rs`; `_BASELINE` may name
/// several builds, separated by commas).
pub struct Setup {
    pub secs: u64,
    pub rounds: usize,
    pub agent: std::path::PathBuf,
    pub agent_name: &'static str,
    pub counts: Vec<usize>,
    /// Each front's name (empty for a peer: its own, once started) and how to start it.
    pub fronts: Vec<(String, Which)>,
}

impl Setup {
    pub fn from_env(prefix: &str, counts: &str) -> Setup {
        let var = |name: &str| format!("{prefix}_{name}");
        let agent_kind: String = env_or(&var("AGENT"), "bench".into());
        let (agent, agent_name) = match agent_kind.as_str() {
            "bench" => (
                super::bench_agent(),
                "bench agent (`examples/bench_agent.rs`)",
            ),
            "echo" => (super::echo_agent(), "echo agent"),
            other => panic!("{}={other}: bench or echo", var("AGENT")),
        };
        let counts: Vec<usize> = env_or::<String>(&var("SESSIONS"), counts.into())
            .split(',')
            .map(|n| n.trim().parse().expect("session counts: numbers"))
            .collect();
        let mut fronts = vec![("direct stdio client".to_owned(), Which::Direct)];
        for backend in Backend::available() {
            let name = format!("acp-gateway, {}", backend.name());
            fronts.push((name, Which::Gateway(backend, None)));
            let others: String = env_or(&var("BASELINE"), String::new());
            for other in others.split(',').filter(|o| !o.is_empty()) {
                let name = format!("acp-gateway {other}, {}", backend.name());
                fronts.push((name, Which::Gateway(backend, Some(other.into()))));
            }
            // `…_UNSYNCED=1`: on PostgreSQL, beside it, its commits not waiting for the disk.
            if backend == Backend::Postgres && env_or(&var("UNSYNCED"), 0) == 1 {
                let name = "acp-gateway, PostgreSQL, synchronous_commit off".to_owned();
                fronts.push((name, Which::Unsynced));
            }
            // `…_TRACED=1`: beside it, with its spans on, traces off and on (the collector
            // down), sampling none and all.
            if env_or(&var("TRACED"), 0) == 1 {
                let traced = [
                    (None, "spans on, traces off"),
                    (Some("0"), "traces on, sampling none"),
                    (Some("1"), "traces on, sampling all"),
                ];
                for (ratio, what) in traced {
                    let name = format!("acp-gateway {what}, {}", backend.name());
                    fronts.push((name, Which::Traced(backend, ratio)));
                }
            }
        }
        fronts.push((String::new(), Which::Peer(PeerKind::AcpHttpAdapter)));
        fronts.push((String::new(), Which::Peer(PeerKind::SandboxAgent)));
        // `…_FRONTS=sqlite,adapter` measures only the fronts whose name holds one of these
        // (for a profile of one front); the peers' names are their kinds' here.
        let only: String = env_or(&var("FRONTS"), String::new());
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
        Setup {
            secs: env_or(&var("SECS"), 5),
            rounds: env_or(&var("ROUNDS"), 2),
            agent,
            agent_name,
            counts,
            fronts,
        }
    }

    /// Measures every front with `n` sessions, `rounds` times, each started afresh, in the
    /// reverse order of the round before (so that no front always runs at the same point of
    /// the machine's other work); each front's name and figures, the rounds pooled, in the
    /// order of [`Setup::fronts`]. `every`: see [`measure`].
    pub async fn run(
        &self,
        n: usize,
        every: Option<Duration>,
        dir: &Path,
    ) -> Vec<(String, Figures)> {
        let plan = LoadPlan {
            concurrency: n,
            warmup: Duration::from_secs(1),
            window: Duration::from_secs(self.secs),
            rounds: 1,
        };
        let fronts = &self.fronts;
        let mut results: Vec<Option<(String, Figures)>> = fronts.iter().map(|_| None).collect();
        for round in 0..self.rounds {
            let mut order: Vec<usize> = (0..fronts.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (name, which) = &fronts[i];
                let state = dir.join(format!("{n}-{round}-{i}"));
                let front = Front::start(which, &self.agent, &state).await;
                let name = match &front {
                    Front::Peer(peer) => peer.name.clone(),
                    _ => name.clone(),
                };
                eprintln!("{n} sessions, round {}: {name}…", round + 1);
                let mut sessions = Vec::with_capacity(n);
                for _ in 0..n {
                    sessions.push(front.new_session().await);
                }
                let f = measure(&front, &sessions, plan, every).await;
                front.stop().await;
                match &mut results[i] {
                    Some((_, pooled)) => pooled.absorb(f),
                    slot => *slot = Some((name, f)),
                }
            }
        }
        results
            .into_iter()
            .map(|r| {
                let (name, mut f) = r.expect("every front measured");
                f.sort();
                (name, f)
            })
            .collect()
    }
}
