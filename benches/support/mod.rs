//! What the benchmarks share: the release binaries, a gateway process, a direct ACP client on
//! the agent's stdio (the baseline), SSE readers, a closed-loop HTTP load generator, a bare axum
//! route (the REST baseline), fresh PostgreSQL databases, and the run's commit and core count.
#![allow(dead_code)] // each benchmark uses part of it

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

pub fn release_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn echo_agent() -> PathBuf {
    let p = release_dir().join("examples/echo_agent");
    assert!(
        p.exists(),
        "{} is missing: run the bench/ script, which builds it",
        p.display()
    );
    p
}

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

pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Resident set size of a process, in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // In clock ticks: USER_HZ, which Linux fixes at 100 for this interface.
    Duration::from_millis(ticks * 10)
}

/// A JSON-RPC request for the agent, as the line to write to its stdin.
fn request_line(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string() + "\n"
}

/// Whether a line from the agent is a `session/update` notification (found without parsing it).
fn is_update(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"session/update\"").is_some()
}

/// The requests that make a fresh echo agent ready for prompts: the handshake, then one session
/// (its id is in the last response's `result.sessionId`).
fn handshake() -> [(&'static str, Value); 2] {
    [
        (
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        ),
        ("session/new", json!({"cwd": "/tmp", "mcpServers": []})),
    ]
}

/// The baseline: an ACP client on the echo agent's stdio that reads stdout in large blocks and
/// only counts update lines — the least work any client can do.
pub struct DirectAgent {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    buf: Vec<u8>,
    pending: Vec<u8>,
    next_id: u64,
    pub session: String,
}

impl DirectAgent {
    /// Starts the agent, initializes it and creates one session.
    pub fn start(state: &Path) -> DirectAgent {
        let mut child = std::process::Command::new(echo_agent())
            .env("ECHO_AGENT_DIR", state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut agent = DirectAgent {
            stdin: child.stdin.take().unwrap(),
            stdout: child.stdout.take().unwrap(),
            child,
            buf: vec![0u8; 1 << 20],
            pending: Vec::new(),
            next_id: 1,
            session: String::new(),
        };
        let mut created = Value::Null;
        for (method, params) in handshake() {
            created = agent.call(method, params).0;
        }
        agent.session = created["result"]["sessionId"].as_str().unwrap().to_owned();
        agent
    }

    /// Sends a request and reads until its response; returns it and the update lines before it.
    pub fn call(&mut self, method: &str, params: Value) -> (Value, usize) {
        let id = self.next_id;
        self.next_id += 1;
        let line = request_line(id, method, params);
        self.stdin.write_all(line.as_bytes()).unwrap();
        let mut updates = 0;
        loop {
            let mut start = 0;
            while let Some(nl) = memchr::memchr(b'\n', &self.pending[start..]) {
                let line = &self.pending[start..start + nl];
                start += nl + 1;
                if is_update(line) {
                    updates += 1;
                } else if let Ok(v) = serde_json::from_slice::<Value>(line)
                    && v["id"] == id
                {
                    self.pending.drain(..start);
                    return (v, updates);
                }
            }
            self.pending.drain(..start);
            let n = self.stdout.read(&mut self.buf).unwrap();
            assert!(n > 0, "the agent closed stdout");
            self.pending.extend_from_slice(&self.buf[..n]);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One prompt with `text`; returns the update lines it produced.
    pub fn prompt(&mut self, text: &str) -> usize {
        let params = json!({"sessionId": self.session, "prompt": [{"type": "text", "text": text}]});
        let (response, updates) = self.call("session/prompt", params);
        assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
        updates
    }
}

impl Drop for DirectAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pins every thread of `pid` to `cpus` (a taskset list such as "0" or "0-1").
pub fn pin(pid: u32, cpus: &str) {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("taskset (util-linux) runs");
    assert!(status.success(), "taskset pins pid {pid} to {cpus}");
}

/// Latency samples are taken in blocks of this many per side, the sides alternating.
pub const BLOCK: usize = 50;
const WARMUP: usize = 50;

/// Samples `samples` round trips per side (see [`Sides`]) in interleaved blocks, so that every
/// side sees the same machine. One client thread takes them all: a single-threaded runtime for
/// HTTP, so that requests do not hop between the client's own threads on the way out and in,
/// and plain blocking pipe I/O for the direct agent. With `pinned`, both agents run alone on
/// core 0 and the gateway and this process on core 1 for the duration.
pub fn prompt_latency(gw: &Gateway, state: &Path, pinned: bool, samples: usize) -> Sides {
    tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(measure(gw, state, pinned, samples))
                })
                .join()
                .unwrap()
        })
    })
}

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

async fn timed<F: Future>(f: F) -> Duration {
    let started = Instant::now();
    f.await;
    started.elapsed()
}

async fn measure(gw: &Gateway, state: &Path, pinned: bool, samples: usize) -> Sides {
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
    let proxy = BareProxy::start(&state.join(if pinned { "proxy-pinned" } else { "proxy" }));
    let proxy_url = format!("http://{}/prompt", proxy.addr);
    let all = format!("0-{}", cores() - 1);
    let agents = [direct.pid(), proxy.agent_pid, gw.agent_pid().await];
    let placed = |cpus: &str, rest: &str| {
        for pid in agents {
            pin(pid, cpus);
        }
        pin(gw.pid(), rest);
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

/// A release gateway in front of the release echo agent, on an ephemeral loopback port.
pub struct Gateway {
    pub base: String,
    pub child: tokio::process::Child,
    /// Spawn to `/readyz` 200.
    pub ready_after: Duration,
}

impl Gateway {
    pub async fn start(db: &str, state: &Path) -> Gateway {
        Self::start_with(db, state, &[]).await
    }

    pub async fn start_with(db: &str, state: &Path, args: &[&str]) -> Gateway {
        Self::start_binary(
            Path::new(env!("CARGO_BIN_EXE_acp-gateway")),
            db,
            state,
            args,
        )
        .await
    }

    /// As [`Gateway::start_with`], with another build of the gateway.
    pub async fn start_binary(binary: &Path, db: &str, state: &Path, args: &[&str]) -> Gateway {
        std::fs::create_dir_all(state).unwrap();
        let started = Instant::now();
        let mut child = tokio::process::Command::new(binary)
            .args(["--listen", "127.0.0.1:0", "--database-url", db, "--agent"])
            .arg(echo_agent())
            .args(args)
            .env("ECHO_AGENT_DIR", state)
            // tower_http logs the 503s of /readyz while the agent starts as errors.
            .env("RUST_LOG", "warn,tower_http=off")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = out.next_line().await.unwrap().unwrap();
        let base = first.strip_prefix("listening on ").unwrap().to_owned();
        let http = reqwest::Client::new();
        for _ in 0..30_000 {
            if http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                let ready_after = started.elapsed();
                return Gateway {
                    base,
                    child,
                    ready_after,
                };
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("the gateway did not become ready");
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// The pid of the gateway's (first) agent process.
    pub async fn agent_pid(&self) -> u32 {
        let agent = send_json(reqwest::Client::new().get(format!("{}/agent", self.base))).await;
        agent["members"][0]["pid"]
            .as_u64()
            .expect("a running agent") as u32
    }

    pub async fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }

    /// Creates a session; returns its id.
    pub async fn create(&self, http: &reqwest::Client) -> String {
        let created = send_json(
            http.post(format!("{}/sessions", self.base))
                .json(&json!({"cwd": "/tmp"})),
        )
        .await;
        created["sessionId"].as_str().unwrap().to_owned()
    }

    /// Prompts and waits for the turn; returns how long it took.
    pub async fn prompt(&self, http: &reqwest::Client, id: &str, text: &str) -> Duration {
        prompt_at(http.clone(), self.prompt_url(id), text.to_owned()).await
    }

    pub fn prompt_url(&self, id: &str) -> String {
        format!("{}/sessions/{id}/prompt", self.base)
    }

    /// The time from a session's first `turn_started` to its first `turn_ended`, by the log's
    /// timestamps: how long the agent took as the gateway saw it (both are stored as the
    /// gateway reads them from the agent, however late its subscribers are).
    pub async fn agent_turn(&self, id: &str) -> Duration {
        let http = reqwest::Client::new();
        let (mut after, mut started, mut ended) = (0, None, None);
        while ended.is_none() {
            let url = format!(
                "{}/sessions/{id}/history?after={after}&limit=1000",
                self.base
            );
            let page = send_json(http.get(url)).await;
            let events = page["events"].as_array().expect("a history page");
            assert!(!events.is_empty(), "no turn_ended in the history of {id}");
            for e in events {
                let at = || {
                    chrono::DateTime::parse_from_rfc3339(e["createdAt"].as_str().unwrap()).unwrap()
                };
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

    /// A value of `/metrics` (an unlabelled series).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    }
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

/// The echo agent's time spent writing to its stdout so far, in its answer to a one-word
/// prompt on session `id` (`_meta.echoAgent.stdoutWriteMicros`; the figure is per process).
/// Time the agent waited for the gateway to read shows up here.
pub async fn agent_stdout_writing(http: &reqwest::Client, url: &str) -> Duration {
    let answer = send_json(http.post(url).json(&json!({"text": "probe"}))).await;
    let micros = answer["result"]["_meta"]["echoAgent"]["stdoutWriteMicros"].as_u64();
    Duration::from_micros(micros.unwrap_or_else(|| panic!("no stdoutWriteMicros in {answer}")))
}

/// Best of `rounds` turns of `chunks` updates: updates per second from the agent to one SSE
/// subscriber of session `id`, timed from the prompt to the last event read.
pub async fn sse_event_rate(gw: &Gateway, id: &str, chunks: usize, rounds: usize) -> f64 {
    let http = reqwest::Client::new();
    let events = format!("{}/sessions/{id}/events", gw.base);
    let mut best = 0.0f64;
    for _ in 0..rounds {
        let reader = Reader::open(&http, &events).await;
        let started = Instant::now();
        let turn = tokio::spawn(prompt_at(
            http.clone(),
            gw.prompt_url(id),
            format!("/chunks {chunks}"),
        ));
        assert!(reader.until_turns_end(&http, &events, 1).await >= chunks);
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

/// An SSE subscriber that, like a browser's EventSource, reconnects with `Last-Event-ID` when
/// its stream ends.
pub struct Reader {
    res: reqwest::Response,
}

impl Reader {
    pub async fn open(http: &reqwest::Client, url: &str) -> Reader {
        Reader {
            res: http.get(url).send().await.unwrap(),
        }
    }

    /// Reads until `turns` `turn_ended` events have arrived; returns how many events arrived,
    /// over all connections. Frames are scanned as bytes in place, so that a thousand readers
    /// cost their clients as little CPU as possible.
    pub async fn until_turns_end(self, http: &reqwest::Client, url: &str, turns: usize) -> usize {
        let frame_end = memchr::memmem::Finder::new(b"\n\n");
        let (mut res, mut events, mut ended, mut last) = (self.res, 0usize, 0, None::<String>);
        loop {
            let mut body = res.bytes_stream();
            let mut buf: Vec<u8> = Vec::new();
            while let Some(Ok(bytes)) = body.next().await {
                buf.extend_from_slice(&bytes);
                let mut start = 0;
                while let Some(end) = frame_end.find(&buf[start..]) {
                    let frame = &buf[start..start + end];
                    start += end + 2;
                    let Some(rest) = frame.strip_prefix(b"id: ") else {
                        continue; // keep-alive comment
                    };
                    let id_end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
                    events += 1;
                    last = Some(String::from_utf8_lossy(&rest[..id_end]).into_owned());
                    if rest[id_end..].starts_with(b"\nevent: turn_ended\n") {
                        ended += 1;
                        if ended == turns {
                            return events;
                        }
                    }
                }
                buf.drain(..start);
            }
            let mut req = http.get(url);
            if let Some(id) = &last {
                req = req.header("last-event-id", id);
            }
            res = req.send().await.unwrap();
        }
    }
}

/// Requests per second of `gateway` and of `bare` (both answering `expected_len` bytes), each
/// measured `rounds` times with [`load`], the two alternated and the one going first switched
/// every round; the best of each.
pub async fn best_alternated(
    (gateway, bare): (&str, &str),
    expected_len: usize,
    concurrency: usize,
    times: (Duration, Duration),
    rounds: usize,
) -> (f64, f64) {
    let (mut gateway_best, mut bare_best) = (0.0f64, 0.0f64);
    for round in 0..rounds {
        let mut sides = [(gateway, &mut gateway_best), (bare, &mut bare_best)];
        if round % 2 == 1 {
            sides.reverse();
        }
        for (url, best) in sides {
            *best = best.max(load(url, expected_len, concurrency, times, false).await);
        }
    }
    (gateway_best, bare_best)
}

/// Requests per second of `GET url` from `concurrency` closed-loop clients over `window`,
/// after `warmup`; every answer must be 200 with a body of `expected_len` bytes. `no_cache`
/// sends `Cache-Control: no-cache` (the gateway then reads its store, not its page cache).
pub async fn load(
    url: &str,
    expected_len: usize,
    concurrency: usize,
    times: (Duration, Duration),
    no_cache: bool,
) -> f64 {
    load_spread(
        &[(url.to_owned(), expected_len)],
        concurrency,
        times,
        no_cache,
    )
    .await
}

/// [`load`] over several `(url, expected_len)` targets: client `k` asks `targets[k % n]`.
pub async fn load_spread(
    targets: &[(String, usize)],
    concurrency: usize,
    (warmup, window): (Duration, Duration),
    no_cache: bool,
) -> f64 {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let window_start = Instant::now() + warmup;
    let window_end = window_start + window;
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..concurrency)
        .map(|k| {
            let (url, expected_len) = targets[k % targets.len()].clone();
            let (http, done) = (http.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < window_end {
                    let mut req = http.get(&url);
                    if no_cache {
                        req = req.header("cache-control", "no-cache");
                    }
                    let r = req.send().await.unwrap();
                    assert_eq!(r.status(), 200, "GET {url}");
                    assert_eq!(r.bytes().await.unwrap().len(), expected_len, "GET {url}");
                    let now = Instant::now();
                    if now >= window_start && now < window_end {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
}

/// A bare axum route answering `path` (any method) with `body` as JSON, on its own multi-threaded tokio
/// runtime (on its own thread, alive until the process exits).
pub fn bare_server(path: &'static str, body: Bytes) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let app = axum::Router::new().route(
                path,
                axum::routing::any(move || {
                    let body = body.clone();
                    async move {
                        (
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            body,
                        )
                    }
                }),
            );
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// The floor of any HTTP front for a stdio agent, measured beside the gateway: an axum route,
/// in this process on a runtime of its own, that writes a prompt line to its own echo agent's
/// stdin and answers with the `result` of the matching response line, skipping update lines
/// unread. No log, no validation, no state beyond the next request id: what is left is HTTP,
/// two pipes and the wake-ups between the processes. Stopped, its agent with it, when dropped.
pub struct BareProxy {
    pub addr: SocketAddr,
    pub agent_pid: u32,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The agent behind [`BareProxy`]: its pipes and the next request id.
struct ProxiedAgent {
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
}

impl ProxiedAgent {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        use tokio::io::AsyncWriteExt;
        let id = self.next_id;
        self.next_id += 1;
        let line = request_line(id, method, params);
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        loop {
            let line = self
                .stdout
                .next_line()
                .await
                .unwrap()
                .expect("agent output");
            if is_update(line.as_bytes()) {
                continue;
            }
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    }
}

impl BareProxy {
    pub fn start(state: &Path) -> BareProxy {
        let state = state.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut child = tokio::process::Command::new(echo_agent())
                    .env("ECHO_AGENT_DIR", &state)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .unwrap();
                let mut agent = ProxiedAgent {
                    stdin: child.stdin.take().unwrap(),
                    stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
                    next_id: 1,
                };
                let mut created = Value::Null;
                for (method, params) in handshake() {
                    created = agent.call(method, params).await;
                }
                let session = created["result"]["sessionId"].clone();
                let agent = Arc::new(tokio::sync::Mutex::new(agent));
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                ready_tx.send((addr, child.id().unwrap())).unwrap();
                let app = axum::Router::new().route(
                    "/prompt",
                    axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                        let (agent, session) = (agent.clone(), session.clone());
                        async move {
                            let params = json!({
                                "sessionId": session,
                                "prompt": [{"type": "text", "text": body["text"]}],
                            });
                            let answer = agent.lock().await.call("session/prompt", params).await;
                            axum::Json(answer["result"].clone())
                        }
                    }),
                );
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
                // Also reaps it; an agent that already exited is fine.
                let _ = child.kill().await;
            });
        });
        let (addr, agent_pid) = ready_rx.recv().unwrap();
        BareProxy {
            addr,
            agent_pid,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for BareProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The stores to measure: an SQLite file in `dir`, and with `DATABASE_URL` set a fresh
/// PostgreSQL database. Each is (name, URL, for PostgreSQL the admin URL and database name to
/// drop afterwards).
pub async fn backends(dir: &Path) -> Vec<(&'static str, String, Option<(String, String)>)> {
    let mut backends = vec![(
        "SQLite",
        format!("sqlite:{}", dir.join("bench.db").display()),
        None,
    )];
    if let Some(admin) = std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()) {
        let (url, name) = fresh_postgres(&admin).await;
        backends.push(("PostgreSQL", url, Some((admin, name))));
    }
    backends
}

/// A new database on the server of `admin`; returns its URL and name.
pub async fn fresh_postgres(admin: &str) -> (String, String) {
    use sqlx::Connection;
    let name = format!("acpgw_bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("DATABASE_URL unreachable");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let base = admin.rsplit_once('/').unwrap().0;
    (format!("{base}/{name}"), name)
}

pub async fn drop_postgres(admin: &str, name: &str) {
    use sqlx::Connection;
    if let Ok(mut conn) = sqlx::PgConnection::connect(admin).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await;
    }
}
