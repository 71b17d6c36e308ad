//! Chaos: a seeded, bounded run of faults while turns stream through two gateway replicas on a
//! PostgreSQL cluster of the test's own. Agent members are SIGKILLed, the cluster is stopped and
//! started again, a replica is SIGKILLed (and replaced), SSE clients are dropped mid-stream;
//! ACP clients prompt sessions of their own through a round-robin balancer ([`acp`]).
//! Afterwards every event any client was sent is in the log exactly once, in order, as sent;
//! every turn that started has ended; every prompt got an answer, and every answer but
//! `end_turn` is one a fault of the run causes, while it lasts, no more often than the faults
//! explain ([`bounds`]: no 500, no hang, a lost connection only from a replica that was
//! killed); every client had turns answered `end_turn` meanwhile; every session answers a last
//! prompt; no
//! session is marked deleted (every replica syncs the agent's list every second, three sessions
//! to a page, whose pages shift as turns move sessions to the front); and once the replicas
//! stop, no agent process is left.
//!
//! `CHAOS_SEED` picks the run (printed; random when unset), `CHAOS_FAULTS` how many faults
//! (default 8, each kind at least once). `scripts/chaos.sh N` runs N seeds of a longer run.

#[path = "chaos/acp.rs"]
mod acp;
#[path = "chaos/bounds.rs"]
mod bounds;
#[path = "chaos/log.rs"]
mod log;
#[path = "chaos/rest.rs"]
mod rest;
use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bounds::{Caused, Class};
use log::check_log;
use support::balancer::RoundRobin;
use support::*;
use tokio::sync::Notify;

/// Sessions, each with a client prompting it in a closed loop and an SSE follower.
const SESSIONS: usize = 4;

/// ACP clients through the balancer, each prompting a session of its own in a closed loop.
const ACP_CLIENTS: usize = 2;

/// The fewest turns the clients of each kind (REST, ACP), counted together, must have had
/// answered `end_turn` while the faults ran, per client: a run where prompts only fail proves
/// nothing. (One client may be answered none: its replica killed, then the database restarted
/// before the take-over, can keep its session out of reach for the whole run; its failures
/// are still each bounded by the fault that explains it.)
const ANSWERED_FLOOR: usize = 1;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    let started = Instant::now();
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
        prompters.push(tokio::spawn(rest::prompter(
            id.clone(),
            replicas.clone(),
            stop.clone(),
            started,
            rng.fork(),
        )));
        ids.push(id);
        drops.push(drop);
        ends.push(end);
    }

    let acp_clients: Vec<_> = (0..ACP_CLIENTS)
        .map(|_| {
            let (replicas, stop) = (replicas.clone(), stop.clone());
            tokio::spawn(acp::prompter(replicas, stop, started, rng.fork()))
        })
        .collect();

    let mut caused = vec![];
    for fault in faults(&mut rng, count) {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..1200))).await;
        let from = started.elapsed();
        eprintln!("chaos: {:?} at {from:?}", fault);
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
                if pids.is_empty() {
                    continue; // no member to kill: no fault
                }
                signal(
                    pids[rng.usize(..pids.len())],
                    nix::sys::signal::Signal::SIGKILL,
                );
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
        let to = started.elapsed();
        caused.push(Caused { fault, from, to });
    }
    stop.store(true, Ordering::Relaxed);
    let mut problems = vec![];
    let mut failures = vec![];
    let mut answered = [0, 0];
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for (id, p) in ids.iter().zip(prompters) {
        let run = p.await.unwrap();
        eprintln!(
            "chaos: REST client of {id}: {} turns answered end_turn",
            run.answered
        );
        answered[0] += run.answered;
        for (k, n) in run.tally {
            *tally.entry(k).or_default() += n;
        }
        failures.extend(run.failures);
        problems.extend(run.problems);
    }
    let mut acp_ids = vec![];
    for client in acp_clients {
        let run = client.await.unwrap();
        eprintln!(
            "chaos: ACP client of {:?}: {} turns answered end_turn over {} connections; {:?}",
            run.session, run.answered, run.connects, run.tally
        );
        answered[1] += run.answered;
        failures.extend(run.failures);
        problems.extend(run.problems);
        match run.session {
            Some(id) => acp_ids.push(id),
            None => problems.push("an ACP client never made its session".into()),
        }
    }
    eprintln!(
        "chaos: faults done at {:?}; turns answered end_turn: {} over REST, {} over ACP; REST answers {tally:?}",
        started.elapsed(),
        answered[0],
        answered[1]
    );
    for (kind, n, clients) in [
        ("REST", answered[0], SESSIONS),
        ("ACP", answered[1], ACP_CLIENTS),
    ] {
        if n < ANSWERED_FLOOR * clients {
            problems.push(format!(
                "{n} {kind} prompts answered end_turn during the faults, fewer than {} for {clients} clients",
                ANSWERED_FLOOR * clients
            ));
        }
    }
    problems.extend(bounds::check(&failures, &caused, SESSIONS + ACP_CLIENTS));

    // After the faults, every session answers a prompt (once the dead replica's lease is over,
    // and a turn whose client lost its answer has ended): refused meanwhile only so.
    for id in ids.iter().chain(&acp_ids) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, gw) = replicas.pick(&mut rng);
            let (status, body) = gw.prompt(id, "/chunks 20 after the storm").await;
            if status == 200 {
                assert_eq!(body["stopReason"], "end_turn", "{body}");
                break;
            }
            let kind = body["type"].as_str().unwrap_or_default();
            assert!(
                matches!(
                    Class::of_problem(status, kind),
                    Some(Class::ReplicaGone | Class::NoMember | Class::Busy)
                ),
                "CHAOS_SEED={seed}: {id} refuses a prompt after the faults, not as a fault's aftermath does: {status} {body}"
            );
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

    eprintln!("chaos: {streamed_total} events streamed");

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
    // The problems first (a long output is cut in the middle), then what each replica logged
    // last about a session with a problem.
    for p in &problems {
        eprintln!("chaos: problem: {p}");
    }
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
                let last = &lines[lines.len().saturating_sub(20)..];
                eprintln!(
                    "----- r{g} about {id}, last lines -----\n{}",
                    last.join("\n")
                );
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
    if !problems.is_empty() {
        // The replicas' whole logs stay for whoever looks into it.
        eprintln!(
            "chaos: the replicas' logs are kept in {}",
            dir.keep().display()
        );
    }
    assert!(
        problems.is_empty(),
        "CHAOS_SEED={seed}: {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    drop(cluster);
}
