//! Chaos: a seeded, bounded run of faults while turns stream through two gateway replicas on a
//! PostgreSQL cluster of the test's own. Agent members are SIGKILLed, the cluster is stopped and
//! started again, a replica is SIGKILLed (and replaced), SSE clients are dropped mid-stream;
//! ACP clients prompt sessions of their own through a round-robin balancer ([`acp`]).
//! Afterwards every event any client was sent is in the log exactly once, in order, as sent;
//! every turn that started has ended; every prompt got an answer (no 500, no hang; a lost
//! connection only from a replica that was killed); every session answers a last prompt; no
//! session is marked deleted (every replica syncs the agent's list every second, three sessions
//! to a page, whose pages shift as turns move sessions to the front); and once the replicas
//! stop, no agent process is left.
//!
//! `CHAOS_SEED` picks the run (printed; random when unset), `CHAOS_FAULTS` how many faults
//! (default 8, each kind at least once). `scripts/chaos.sh N` runs N seeds of a longer run.

#[path = "chaos/acp.rs"]
mod acp;
mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::balancer::RoundRobin;
use support::*;
use tokio::sync::Notify;

/// Sessions, each with a client prompting it in a closed loop and an SSE follower.
const SESSIONS: usize = 4;

/// ACP clients through the balancer, each prompting a session of its own in a closed loop.
const ACP_CLIENTS: usize = 2;

/// The gateway replicas alive now, each with a generation number; the generations killed; and
/// a round-robin balancer in front of those alive.
struct Replicas {
    alive: Mutex<Vec<(u64, Arc<Gateway>)>>,
    killed: Mutex<HashSet<u64>>,
    /// Killed gateways, kept until the end so that their processes are reaped.
    dead: Mutex<Vec<Arc<Gateway>>>,
    next: AtomicU64,
    balancer: RoundRobin,
}

impl Replicas {
    async fn new() -> Replicas {
        Replicas {
            alive: Mutex::default(),
            killed: Mutex::default(),
            dead: Mutex::default(),
            next: AtomicU64::default(),
            balancer: RoundRobin::start(&[]).await,
        }
    }

    /// Points the balancer at the replicas alive.
    fn balance(&self, alive: &[(u64, Arc<Gateway>)]) {
        let bases: Vec<&str> = alive.iter().map(|(_, g)| g.base.as_str()).collect();
        self.balancer.set_backends(&bases);
    }

    /// How many replicas were killed so far.
    fn kills(&self) -> usize {
        self.killed.lock().unwrap().len()
    }

    /// Starts a replica on `db`; its log is `dir/r<generation>/gateway.log`, its agents' state
    /// the one all replicas share, `dir/agent`.
    async fn start(&self, db: &str, dir: &std::path::Path) {
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        let agent = dir.join("agent").display().to_string();
        let opts = Options::default()
            .pool(2)
            .args(&["--heartbeat-interval", "1", "--sync-interval", "1"])
            .env("ECHO_AGENT_DIR", &agent)
            .env("ECHO_AGENT_PAGE_SIZE", "3");
        let gw = Gateway::spawn(db, &dir.join(format!("r{generation}")), &opts).await;
        let mut alive = self.alive.lock().unwrap();
        alive.push((generation, Arc::new(gw)));
        self.balance(&alive);
    }

    fn pick(&self, rng: &mut fastrand::Rng) -> (u64, Arc<Gateway>) {
        let alive = self.alive.lock().unwrap();
        let (generation, gw) = &alive[rng.usize(..alive.len())];
        (*generation, gw.clone())
    }

    /// SIGKILLs one replica, marked killed first, so that a client that loses its connection
    /// to it finds it so.
    fn kill_one(&self, rng: &mut fastrand::Rng) {
        let (generation, gw) = {
            let mut alive = self.alive.lock().unwrap();
            let victim = rng.usize(..alive.len());
            let out = alive.remove(victim);
            self.balance(&alive);
            out
        };
        self.killed.lock().unwrap().insert(generation);
        signal(gw.pid(), nix::sys::signal::Signal::SIGKILL);
        self.dead.lock().unwrap().push(gw);
    }

    fn was_killed(&self, generation: u64) -> bool {
        self.killed.lock().unwrap().contains(&generation)
    }
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
}

/// What became of one prompt.
#[derive(Debug)]
enum Outcome {
    Answered(u16, Value),
    /// The connection was lost; `killed`: the replica asked had been killed.
    Lost {
        killed: bool,
        error: String,
    },
    /// No answer within the bound.
    Hung,
}

/// A client prompting one session in a closed loop through random replicas until `stop`.
async fn prompter(
    id: String,
    replicas: Arc<Replicas>,
    stop: Arc<AtomicBool>,
    mut rng: fastrand::Rng,
) -> Vec<Outcome> {
    let mut outcomes = vec![];
    while !stop.load(Ordering::Relaxed) {
        let (generation, gw) = replicas.pick(&mut rng);
        let text = format!("/chunks {} /delay {}", rng.usize(20..200), rng.u64(0..3));
        let sent = gw
            .http
            .post(gw.prompt_url(&id))
            .json(&json!({ "text": text }))
            .send();
        let outcome = match tokio::time::timeout(PATIENCE, sent).await {
            Err(_) => Outcome::Hung,
            Ok(Err(e)) => Outcome::Lost {
                killed: replicas.was_killed(generation),
                error: e.to_string(),
            },
            Ok(Ok(r)) => {
                let status = r.status().as_u16();
                match tokio::time::timeout(PATIENCE, r.json::<Value>()).await {
                    Err(_) => Outcome::Hung,
                    Ok(body) => Outcome::Answered(status, body.unwrap_or(Value::Null)),
                }
            }
        };
        if !matches!(outcome, Outcome::Answered(200, _)) {
            // Come back shortly, as a client told to retry does.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        outcomes.push(outcome);
    }
    outcomes
}

/// Follows one session's stream through random replicas, reconnecting from `Last-Event-ID`
/// whenever the stream ends, is quiet, or `drop` is notified, until `stop` and the log's end
/// (`until`) was reached. Returns every event it was sent and what it saw out of order.
async fn follower(
    id: String,
    replicas: Arc<Replicas>,
    drop: Arc<Notify>,
    until: Arc<AtomicU64>,
    mut rng: fastrand::Rng,
) -> (Vec<SseEvent>, Vec<String>, usize) {
    let mut seen: Vec<SseEvent> = vec![];
    let mut disorder = vec![];
    let mut connects = 0;
    let deadline = Instant::now() + PATIENCE * 6;
    loop {
        let last = seen.last().map_or(0, |e| e.id);
        let end = until.load(Ordering::Relaxed);
        if end != 0 && last >= end as i64 || Instant::now() > deadline {
            return (seen, disorder, connects);
        }
        let (_, gw) = replicas.pick(&mut rng);
        let url = gw.url(&format!("/sessions/{id}/events"));
        let Some(mut sse) = Sse::reopen(&gw.http, &url, last).await else {
            continue;
        };
        connects += 1;
        loop {
            let next = tokio::select! {
                _ = drop.notified() => break,
                next = tokio::time::timeout(Duration::from_secs(3), sse.next()) => next,
            };
            let Ok(Some(e)) = next else { break };
            let last = seen.last().map_or(0, |e| e.id);
            if e.id != last + 1 {
                disorder.push(format!("event {} after {last}", e.id));
            }
            seen.push(e);
        }
    }
}

/// The faults of a run: each kind once, then random ones, in a seeded order.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillMember,
    RestartDatabase,
    KillReplica,
    DropStreams,
}

fn faults(rng: &mut fastrand::Rng, n: usize) -> Vec<Fault> {
    let kinds = [
        Fault::KillMember,
        Fault::RestartDatabase,
        Fault::KillReplica,
        Fault::DropStreams,
    ];
    let mut out: Vec<Fault> = kinds.to_vec();
    while out.len() < n {
        out.push(kinds[rng.usize(..kinds.len())]);
    }
    rng.shuffle(&mut out);
    out
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(initdb), ignore = "needs PostgreSQL's initdb: /usr/lib/postgresql")]
async fn faults_lose_no_event_and_leave_no_agent() {
    let cluster = PgCluster::start();
    let seed = env_number("CHAOS_SEED").unwrap_or_else(|| fastrand::u64(..));
    let count = env_number("CHAOS_FAULTS").unwrap_or(8) as usize;
    eprintln!("chaos: CHAOS_SEED={seed} CHAOS_FAULTS={count}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let replicas = Arc::new(Replicas::new().await);
    for _ in 0..2 {
        replicas.start(&cluster.url(), dir.path()).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut ids = vec![];
    let mut prompters = vec![];
    let mut followers = vec![];
    let mut drops = vec![];
    let mut ends = vec![];
    for _ in 0..SESSIONS {
        let id = replicas.pick(&mut rng).1.create("/tmp").await;
        let (drop, end) = (Arc::new(Notify::new()), Arc::new(AtomicU64::new(0)));
        followers.push(tokio::spawn(follower(
            id.clone(),
            replicas.clone(),
            drop.clone(),
            end.clone(),
            rng.fork(),
        )));
        prompters.push(tokio::spawn(prompter(
            id.clone(),
            replicas.clone(),
            stop.clone(),
            rng.fork(),
        )));
        ids.push(id);
        drops.push(drop);
        ends.push(end);
    }

    let acp_clients: Vec<_> = (0..ACP_CLIENTS)
        .map(|_| tokio::spawn(acp::prompter(replicas.clone(), stop.clone(), rng.fork())))
        .collect();

    let started = Instant::now();
    for fault in faults(&mut rng, count) {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..1200))).await;
        eprintln!("chaos: {:?} at {:?}", fault, started.elapsed());
        match fault {
            Fault::KillMember => {
                let (_, gw) = replicas.pick(&mut rng);
                let agent = gw.json("/agent").await;
                let pids: Vec<u32> = agent["members"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|m| m["pid"].as_u64())
                    .map(|p| p as u32)
                    .collect();
                if !pids.is_empty() {
                    signal(
                        pids[rng.usize(..pids.len())],
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            Fault::RestartDatabase => {
                let down = Duration::from_millis(rng.u64(200..1500));
                let cluster = &cluster;
                tokio::task::block_in_place(|| {
                    cluster.pg_ctl("stop");
                    std::thread::sleep(down);
                    cluster.pg_ctl("start");
                });
            }
            Fault::KillReplica => {
                replicas.kill_one(&mut rng);
                replicas.start(&cluster.url(), dir.path()).await;
            }
            Fault::DropStreams => {
                for drop in &drops {
                    if rng.bool() {
                        drop.notify_one();
                    }
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = vec![];
    for p in prompters {
        outcomes.extend(p.await.unwrap());
    }
    let mut problems = vec![];
    let mut acp_ids = vec![];
    for client in acp_clients {
        let run = client.await.unwrap();
        eprintln!(
            "chaos: ACP client of {:?}: {} turns answered end_turn over {} connections; {:?}",
            run.session, run.answered, run.connects, run.tally
        );
        problems.extend(run.problems);
        match run.session {
            Some(id) => acp_ids.push(id),
            None => problems.push("an ACP client never made its session".into()),
        }
    }
    eprintln!("chaos: faults done at {:?}", started.elapsed());

    // After the faults, every session answers a prompt (once the dead replica's lease is over).
    for id in ids.iter().chain(&acp_ids) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, gw) = replicas.pick(&mut rng);
            let (status, body) = gw.prompt(id, "/chunks 20 after the storm").await;
            if status == 200 {
                assert_eq!(body["stopReason"], "end_turn", "{body}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} answers no prompt after the faults: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // The logs, and what the followers were sent.
    // Where each log ends now; the followers stop once they got there. (A log may still grow:
    // a late take-over of a killed replica's session appends to it.)
    let reader = replicas.pick(&mut rng).1;
    for (id, end) in ids.iter().zip(&ends) {
        end.store(reader.history(id).await.len() as u64, Ordering::Relaxed);
    }
    for drop in &drops {
        drop.notify_one(); // a follower waiting on a quiet stream looks at `end` again
    }
    for id in &acp_ids {
        problems.extend(check_log(id, &reader.history(id).await));
    }
    let mut streamed_total = 0;
    for ((id, end), follower) in ids.iter().zip(&ends).zip(followers) {
        let (seen, disorder, connects) = follower.await.unwrap();
        let log = reader.history(id).await;
        streamed_total += seen.len();
        eprintln!(
            "chaos: {id}: {} events logged, {} streamed over {connects} connections",
            log.len(),
            seen.len()
        );
        problems.extend(disorder.into_iter().map(|d| format!("{id}: streamed {d}")));
        problems.extend(check_log(id, &log));
        for e in &seen {
            let logged = usize::try_from(e.id - 1).ok().and_then(|i| log.get(i));
            match logged {
                Some(l) if l["event"] == e.event.as_str() && l["data"] == e.data => {}
                _ => problems.push(format!(
                    "{id}: streamed event {} {} is not logged so: {logged:?}",
                    e.id, e.event
                )),
            }
        }
        let end = end.load(Ordering::Relaxed) as usize;
        if seen.len() < end {
            problems.push(format!(
                "{id}: the follower got {} of {end} logged events",
                seen.len()
            ));
        }
    }

    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for o in &outcomes {
        let key = match o {
            Outcome::Answered(status, body) => {
                let what = body["stopReason"].as_str().or(body["type"].as_str());
                let detail = if *status == 409 {
                    body["detail"].as_str()
                } else {
                    None
                };
                format!("{status} {} {}", what.unwrap_or(""), detail.unwrap_or(""))
            }
            Outcome::Lost { killed, .. } => format!("lost (replica killed: {killed})"),
            Outcome::Hung => "hung".into(),
        };
        *tally.entry(key).or_default() += 1;
        match o {
            Outcome::Answered(500, body) => problems.push(format!("a prompt answered 500: {body}")),
            Outcome::Lost {
                killed: false,
                error,
            } => problems.push(format!("a live replica dropped a prompt: {error}")),
            Outcome::Hung => problems.push("a prompt was not answered".into()),
            _ => {}
        }
    }
    eprintln!("chaos: prompt answers {tally:?}; {streamed_total} events streamed");

    let generations = replicas.next.load(Ordering::Relaxed);
    let logs: Vec<String> = (0..generations)
        .map(|g| {
            std::fs::read_to_string(dir.path().join(format!("r{g}/gateway.log")))
                .unwrap_or_default()
        })
        .collect();
    for (g, log) in logs.iter().enumerate() {
        problems.extend(
            log.lines()
                .filter(|l| l.contains("panicked"))
                .map(|l| format!("replica r{g} panicked: {l}")),
        );
    }
    // What each replica logged about a session with a problem.
    for id in ids
        .iter()
        .filter(|id| problems.iter().any(|p| p.starts_with(id.as_str())))
    {
        for (g, log) in logs.iter().enumerate() {
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(id.as_str()) && !l.contains("session/update"))
                .collect();
            if !lines.is_empty() {
                eprintln!("----- r{g} about {id} -----\n{}", lines.join("\n"));
            }
        }
    }

    // Stop the replicas; their agents go with them.
    drop(reader);
    let alive: Vec<_> = replicas.alive.lock().unwrap().drain(..).collect();
    for (_, gw) in alive {
        let gw = Arc::into_inner(gw).expect("no client holds the gateway any more");
        assert!(gw.stop().await.success(), "a replica exits cleanly");
    }
    replicas.dead.lock().unwrap().clear();
    let needle = dir.path().join("agent").display().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = processes_with_env(&needle);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = processes_with_env(&needle);
    }
    if !left.is_empty() {
        problems.push(format!("agent processes left: {left:?}"));
    }
    assert!(
        problems.is_empty(),
        "CHAOS_SEED={seed}: {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    drop(cluster);
}

/// What must hold in one session's log: seqs 1..n; every `turn_started` followed by its
/// `turn_ended` before the next; a turn that ended `end_turn` holds the chunks it asked for,
/// `c1 `…`cN`, once each, in order; no `session_deleted` (nobody deletes a session).
fn check_log(id: &str, log: &[Value]) -> Vec<String> {
    let mut problems = vec![];
    for (i, e) in log.iter().enumerate() {
        if e["seq"].as_i64() != Some(i as i64 + 1) {
            problems.push(format!("{id}: event {i} has seq {}", e["seq"]));
        }
    }
    let mut open: Option<(usize, Vec<&str>)> = None;
    for e in log {
        let data = &e["data"];
        match e["event"].as_str().unwrap_or("") {
            "turn_started" => {
                if open.is_some() {
                    problems.push(format!(
                        "{id}: turn at {} started before one ended",
                        e["seq"]
                    ));
                }
                let text = data["prompt"][0]["text"].as_str().unwrap_or("");
                let asked = text
                    .strip_prefix("/chunks ")
                    .and_then(|t| t.split(' ').next()?.parse().ok())
                    .unwrap_or(0);
                open = Some((asked, vec![]));
            }
            "session_deleted" => problems.push(format!(
                "{id}: marked deleted at {} though nobody deleted it: {data}",
                e["seq"]
            )),
            "agent_message_chunk" => match &mut open {
                Some((_, chunks)) => {
                    chunks.push(data["update"]["content"]["text"].as_str().unwrap_or(""))
                }
                None => problems.push(format!("{id}: chunk {} outside a turn", e["seq"])),
            },
            "turn_ended" => match open.take() {
                None => problems.push(format!("{id}: turn_ended {} without a turn", e["seq"])),
                Some((asked, chunks)) if data["stopReason"] == "end_turn" => {
                    let expected = (1..=asked).map(|i| {
                        if i == asked {
                            format!("c{i}")
                        } else {
                            format!("c{i} ")
                        }
                    });
                    if !expected.eq(chunks.iter().map(|c| c.to_string())) {
                        problems.push(format!(
                            "{id}: the turn ended at {} asked for {asked} chunks and holds {} ({:?}…)",
                            e["seq"],
                            chunks.len(),
                            &chunks[..chunks.len().min(5)]
                        ));
                    }
                }
                Some(_) => {}
            },
            _ => {}
        }
    }
    if open.is_some() {
        problems.push(format!("{id}: the last turn never ended"));
    }
    if problems.len() > 10 {
        let n = problems.len();
        problems.truncate(10);
        problems.push(format!("{id}: … {} more", n - 10));
    }
    if !problems.is_empty() {
        problems.push(format!("{id}: the log's turns:\n{}", outline(log)));
    }
    problems
}

/// The log without its chunks: one line per other event, a count for each run of chunks.
fn outline(log: &[Value]) -> String {
    let mut out = String::new();
    let mut chunks = 0;
    for e in log {
        if e["event"] == "agent_message_chunk" {
            chunks += 1;
            continue;
        }
        if chunks > 0 {
            out += &format!("    … {chunks} chunks\n");
            chunks = 0;
        }
        let mut data = e["data"].clone();
        data.as_object_mut().map(|d| d.remove("sessionId"));
        out += &format!("    {} {} {data}\n", e["seq"], e["event"]);
    }
    if chunks > 0 {
        out += &format!("    … {chunks} chunks\n");
    }
    out
}
