//! What the chaos run's faults may cost its clients, and the check that they cost no more. A
//! prompt that fails falls in a [`Class`], which names the faults that cause it and for how long
//! after one such fault it may still happen; a failure outside every such window, or of no
//! class at all, is a problem, and so is a class failing more often than its faults explain
//! (each client fails at most once per fault for a request cut mid-turn, and at most once per
//! [`RETRY`] while the fault lasts otherwise).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Fault;

/// How long a client waits before it sends a prompt again after one failed.
pub const RETRY: Duration = Duration::from_millis(200);

/// A fault the run caused, from when it began to when it was done (a database stopped and
/// started again, a replica killed and its replacement ready), since the run started.
#[derive(Debug, Clone, Copy)]
pub struct Caused {
    pub fault: Fault,
    pub from: Duration,
    pub to: Duration,
}

/// The ways a prompt may fail under the run's faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Its connection ended with no answer: the replica asked (or the one holding the
    /// connection) was killed.
    Lost,
    /// 502 `agent-unavailable`, or over ACP "the agent exited" (or "the agent's stdin is
    /// closed", for a call sent as it died): the member running its turn was killed.
    AgentGone,
    /// 503 `pool-exhausted`: no member ready while a killed one restarts.
    NoMember,
    /// 503 `replica-unavailable`, or over ACP "cannot be reached" / "live on another
    /// replica": the session's replica was killed and its lease has not yet run out, or it
    /// could not beat while the database was down and its lease ran out meanwhile.
    ReplicaGone,
    /// 503 `store-unavailable`, or over ACP "store unavailable": the database is down.
    StoreDown,
    /// 409 `conflict`, or over ACP "already running", after a prompt of the same client that
    /// failed: its turn went on (or is being resumed) after the client lost its answer.
    Busy,
}

impl Class {
    /// The faults that cause it; for how long after one is done a prompt may still fail so;
    /// and how often at most per client and fault (`None`: once per [`RETRY`] meanwhile).
    fn cause(self) -> (&'static [Fault], Duration, Option<usize>) {
        use Fault::*;
        let s = Duration::from_secs;
        match self {
            Class::Lost => (&[KillReplica], s(1), Some(1)),
            Class::AgentGone => (&[KillMember], s(1), Some(1)),
            // A member restarts within a second or two.
            Class::NoMember => (&[KillMember], s(5), None),
            // Three heartbeats of a second make a lease; the session is then taken over (a
            // take-over needs the database: see `Class::paused_by`), or its replica beats again.
            Class::ReplicaGone => (&[KillReplica, RestartDatabase], s(8), None),
            // The pool connects again within its acquire timeout.
            Class::StoreDown => (&[RestartDatabase], s(5), None),
            // The orphaned turn ends (at most 200 chunks) or its resume finishes.
            Class::Busy => (&[KillReplica, KillMember, RestartDatabase], s(8), None),
        }
    }

    /// The faults during which the time after a cause does not count: a killed replica's
    /// sessions are taken over through the database, so while it is down they wait.
    fn paused_by(self) -> &'static [Fault] {
        match self {
            Class::ReplicaGone => &[Fault::RestartDatabase],
            _ => &[],
        }
    }

    /// The class of a REST answer's status and problem `type` (`None`: no fault causes it).
    pub fn of_problem(status: u16, kind: &str) -> Option<Class> {
        let kind = kind.rsplit(':').next().unwrap_or_default();
        Some(match (status, kind) {
            (502, "agent-unavailable") => Class::AgentGone,
            (503, "pool-exhausted") => Class::NoMember,
            (503, "replica-unavailable") => Class::ReplicaGone,
            (503, "store-unavailable") => Class::StoreDown,
            (409, "conflict") => Class::Busy,
            _ => return None,
        })
    }

    /// The class of an `/acp` error's message (`None`: no fault causes it).
    pub fn of_message(message: &str) -> Option<Class> {
        let has = |s: &str| message.contains(s);
        // A call that finds the member's stdin closed never reached it: the member died.
        Some(
            if message.starts_with("the agent exited") || message == "the agent's stdin is closed" {
                Class::AgentGone
            } else if has("no agent member is ready")
                || message.starts_with("no member of the agent")
            {
                Class::NoMember
            } else if has("cannot be reached") || has("is live on another gateway replica") {
                Class::ReplicaGone
            } else if message == "store unavailable" {
                Class::StoreDown
            } else if has("a turn is already running") {
                Class::Busy
            } else {
                return None;
            },
        )
    }
}

/// A prompt (or, over ACP, a connection) that failed: its client, its class, and when it was
/// sent and answered since the run started.
#[derive(Debug, Clone)]
pub struct Failure {
    pub client: String,
    pub class: Class,
    pub sent: Duration,
    pub answered: Duration,
}

/// What is wrong with `failures` under the faults `caused` of a run with `clients` clients.
pub fn check(failures: &[Failure], caused: &[Caused], clients: usize) -> Vec<String> {
    let mut problems = vec![];
    // Per class: how many, and the longest a failure came after the end of its fault.
    let mut counts = BTreeMap::<Class, (usize, Duration)>::new();
    for f in failures {
        let (kinds, after, _) = f.class.cause();
        let lag = (caused.iter())
            .filter(|c| kinds.contains(&c.fault) && f.answered >= c.from)
            .map(|c| f.sent.saturating_sub(c.to) - paused(caused, f.class, c.to, f.sent))
            .min();
        let seen = counts.entry(f.class).or_default();
        seen.0 += 1;
        seen.1 = seen.1.max(lag.unwrap_or_default());
        if lag.is_none_or(|lag| lag > after) {
            problems.push(format!(
                "{}: {:?} sent at {:?}, answered at {:?}, outside every {kinds:?} and the {after:?} after it; the faults: {}",
                f.client,
                f.class,
                f.sent,
                f.answered,
                timeline(caused)
            ));
        }
    }
    for (class, (n, lag)) in &counts {
        let (kinds, after, each) = class.cause();
        let (mut faults, mut bound) = (0, 0);
        for c in caused.iter().filter(|c| kinds.contains(&c.fault)) {
            let window = c.to - c.from + after;
            faults += 1;
            bound += clients
                * each.unwrap_or(window.as_millis().div_ceil(RETRY.as_millis()) as usize + 1);
        }
        eprintln!(
            "chaos: {class:?}: {n} failures (at most {bound} from {faults} {kinds:?}), the last {lag:?} after its fault (at most {after:?})"
        );
        if *n > bound {
            problems.push(format!(
                "{n} prompts failed {class:?}: more than the {bound} that {faults} faults of {kinds:?} explain ({clients} clients, {} per fault and client)",
                match each {
                    Some(e) => format!("{e}"),
                    None => format!("one per {RETRY:?} until {after:?} after it"),
                }
            ));
        }
    }
    problems
}

/// How long, between `from` and `until`, the faults that pause `class`'s windows lasted.
fn paused(caused: &[Caused], class: Class, from: Duration, until: Duration) -> Duration {
    (caused.iter())
        .filter(|c| class.paused_by().contains(&c.fault))
        .map(|c| c.to.min(until).saturating_sub(c.from.max(from)))
        .sum()
}

fn timeline(caused: &[Caused]) -> String {
    let spans: Vec<String> = caused
        .iter()
        .map(|c| format!("{:?} {:?}..{:?}", c.fault, c.from, c.to))
        .collect();
    spans.join(", ")
}
