//! The floor under the concurrent bench's figures: what storing the events alone costs on this
//! machine. The store's own log writer (the one the gateway's writer thread uses) appends N
//! sessions' turns for a bounded time with nothing else running, as many turns of each session
//! per commit as fill the gateway's largest batch (the cheapest shape per event, the one its
//! writer takes under load): the CPU it takes per event (this process's, and for PostgreSQL also the
//! server's processes') is what any front that keeps the log must spend before it does anything
//! else. With the agent's and the load generator's CPU per prompt it bounds the prompts per
//! second that the machine's cores can carry with the durable log on.
//!
//! [`commit_latency`] is the floor under the open-loop bench's fresh delivery: how long the
//! commit that holds a turn's last chunk takes on this machine, at the bench's rate, and how
//! long a whole turn's commit takes there with nothing else running.

use std::path::Path;
use std::time::{Duration, Instant};

use acp_gateway::events::MAX_BATCH;
use acp_gateway::store::{NewEvent, Origin, Payload, SessionRecord};
use chrono::Utc;

use super::shared::process::{cpu_time, cpu_time_if_running};
use super::shared::{Backend, Database};

/// Events of one turn, as the gateway logs a 20-chunk prompt: `turn_started`, the chunks,
/// `turn_ended`.
pub const EVENTS_PER_TURN: usize = 22;

/// What storing cost.
pub struct Floor {
    pub events: u64,
    /// CPU time over the run: this process's and, for PostgreSQL, the server's.
    pub cpu: Duration,
}

impl Floor {
    pub fn per_event(&self) -> Duration {
        self.cpu / self.events.max(1) as u32
    }
}

/// A fresh database through `backend` with `sessions` sessions: the database, its store and
/// the sessions' ids.
async fn sessions_in(
    backend: Backend,
    dir: &Path,
    sessions: usize,
) -> (
    Database,
    std::sync::Arc<dyn acp_gateway::store::Store>,
    Vec<String>,
) {
    let db = Database::create(backend, dir, "floor").await;
    let store = acp_gateway::store::connect(&db.url, "bench-floor")
        .await
        .expect("the floor's store opens")
        .store;
    let ids: Vec<String> = (0..sessions).map(|i| format!("sess_{i:032}")).collect();
    let now = Utc::now();
    let records: Vec<SessionRecord> = (ids.iter())
        .map(|id| {
            let (tenant, cwd, agent) = (String::new(), "/tmp".into(), "default".into());
            SessionRecord::new(id.clone(), tenant, cwd, agent, Origin::Gateway, now)
        })
        .collect();
    store.put_sessions(&records).await.unwrap();
    (db, store, ids)
}

/// Appends turns of `sessions` sessions through `backend`'s log writer for `secs`.
pub async fn measure(backend: Backend, dir: &Path, sessions: usize, secs: Duration) -> Floor {
    let (mut db, store, ids) = sessions_in(backend, dir, sessions).await;
    let per_commit = (MAX_BATCH / (sessions * EVENTS_PER_TURN)).max(1);
    let turns: Vec<Vec<NewEvent>> = (ids.iter())
        .map(|id| (0..per_commit).flat_map(|_| turn(id)).collect())
        .collect();
    let mut writer = store.log_writer();
    let server = || server_cpu(backend);
    let (cpu_before, server_before) = (cpu_time(std::process::id()), server());
    let (mut events, end) = (0u64, Instant::now() + secs);
    while Instant::now() < end {
        let at = Some(Utc::now());
        let groups: Vec<_> = (ids.iter().zip(&turns))
            .map(|(id, turn)| (id.as_str(), turn.as_slice(), at))
            .collect();
        match writer.append_all(&groups).await {
            Some(stored) => {
                stored.expect("the floor's append");
            }
            None => {
                for (id, turn, at) in groups {
                    writer.append(id, turn, at).await.unwrap();
                }
            }
        }
        events += (sessions * EVENTS_PER_TURN * per_commit) as u64;
    }
    let cpu = cpu_time(std::process::id()) - cpu_before + (server() - server_before);
    drop(writer);
    drop(store);
    db.remove().await;
    Floor { events, cpu }
}

/// How long a turn's commits take, each list sorted, and what storing cost in all (CPU per
/// event, as [`measure`]'s): `sessions` sessions each given a turn every `period` (spread over
/// it) for `secs`, through `backend`'s log writer with nothing else running. Turns alternate
/// between the two shapes a writer with nothing else to do commits them in:
/// - [`Commits::last`]: as the turn comes, its first events (with the session's touch) in one
///   append, then its last chunk with its `turn_ended` in another, the one timed. No front that
///   stores an event before a subscriber reads it can hand a turn's last chunk over faster.
/// - [`Commits::whole`]: the whole turn, with the touch, in one append, timed: how the gateway
///   commits a turn whose agent answers at once (its opening waits for the answer), the write
///   that the stage table's "written" times under load.
pub async fn commit_latency(
    backend: Backend,
    dir: &Path,
    sessions: usize,
    period: Duration,
    secs: Duration,
) -> Commits {
    let (mut db, store, ids) = sessions_in(backend, dir, sessions).await;
    let server = || server_cpu(backend);
    let (cpu_before, server_before) = (cpu_time(std::process::id()), server());
    let turns: Vec<Vec<NewEvent>> = ids.iter().map(|id| turn(id)).collect();
    let mut writer = store.log_writer();
    let mut tick = tokio::time::interval(period / sessions as u32);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last, mut whole, end) = (Vec::new(), Vec::new(), Instant::now() + secs);
    for (i, (id, turn)) in ids.iter().zip(&turns).cycle().enumerate() {
        if Instant::now() >= end {
            break;
        }
        tick.tick().await;
        if i % 2 == 1 {
            let started = Instant::now();
            writer.append(id, turn, Some(Utc::now())).await.unwrap();
            whole.push(started.elapsed());
            continue;
        }
        let (head, tail) = turn.split_at(EVENTS_PER_TURN - 2);
        writer.append(id, head, Some(Utc::now())).await.unwrap();
        let started = Instant::now();
        writer.append(id, tail, None).await.unwrap();
        last.push(started.elapsed());
    }
    let cpu = cpu_time(std::process::id()) - cpu_before + (server() - server_before);
    let events = ((last.len() + whole.len()) * EVENTS_PER_TURN) as u64;
    drop(writer);
    drop(store);
    db.remove().await;
    last.sort();
    whole.sort();
    Commits {
        last,
        whole,
        storing: Floor { events, cpu },
    }
}

/// What [`commit_latency`] measured.
pub struct Commits {
    /// A turn's last commit (its last chunk and `turn_ended`), its first events committed
    /// before; sorted.
    pub last: Vec<Duration>,
    /// A whole turn in one commit, with the session's touch; sorted.
    pub whole: Vec<Duration>,
    /// What storing both shapes cost.
    pub storing: Floor,
}

/// One turn's events, with the bench agent's own update text.
fn turn(id: &str) -> Vec<NewEvent> {
    let event = |kind: &str, text: String| NewEvent {
        kind: kind.into(),
        payload: Payload::from_text(text).unwrap(),
    };
    let mut events = vec![event(
        "turn_started",
        format!(r#"{{"sessionId":"{id}","prompt":[{{"type":"text","text":"/chunks 20"}}]}}"#),
    )];
    for i in 1..=EVENTS_PER_TURN - 2 {
        events.push(event(
            "agent_message_chunk",
            format!(
                r#"{{"sessionId":"{id}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"c{i} "}}}}}}"#
            ),
        ));
    }
    events.push(event(
        "turn_ended",
        format!(r#"{{"sessionId":"{id}","stopReason":"end_turn"}}"#),
    ));
    events
}

/// CPU time used so far by `backend`'s server processes (none for SQLite, which runs in ours).
fn server_cpu(backend: Backend) -> Duration {
    match backend {
        Backend::Postgres => postgres_cpu(),
        Backend::Sqlite => Duration::ZERO,
    }
}

/// CPU time used so far by every PostgreSQL server process on this machine (the bench's
/// database is the only busy one).
fn postgres_cpu() -> Duration {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(cpu_time_if_running)
        .sum()
}
