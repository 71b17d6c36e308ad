//! The live-session table: which sessions this replica holds in a pool member, which are busy
//! (a turn, or being attached), and since when they are idle. [`LiveTable`] is the only owner of
//! its lock, and the only place that decides when an entry goes: when it is neither held by a
//! member nor busy. A [`Claim`] marks a session busy and frees it when dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::gateway::error::Error;
use crate::gateway::output::{Activity, Status};
use crate::pool::Agents;
use crate::store::SessionRecord;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::gateway) enum Busy {
    Idle,
    Attaching,
    Turn,
}

/// Where a turn is; the channel closes when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::gateway) enum TurnPhase {
    /// Attaching the session, or not yet admitted by its tenant's quota.
    Starting,
    /// Admitted (counted among its tenant's turns, on every replica), not yet sent: from here
    /// on the session's activity is `running`.
    Admitted,
    /// `session/prompt` is queued for (or at) the agent.
    Sent,
    /// Its `turn_ended` is being queued: the session is free a moment later.
    Ending,
}

/// Whether an agent's update is within its turn's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::gateway) enum Updates {
    Within,
    /// Past the bound: dropped; `first` the first one of the turn.
    Beyond {
        first: bool,
    },
}

/// What the gateway knows of a session it holds or works on.
#[derive(Debug)]
struct LiveEntry {
    /// The pool member holding it live, if any.
    member: Option<usize>,
    /// The owning tenant, known once attached (lets status answer without the store).
    tenant: Option<String>,
    /// Where it works, known once attached (lets a turn's end tell a workspace of the
    /// gateway's without the store).
    cwd: Option<Arc<str>>,
    /// Whether the cached record is archived, kept in step with every record update (lets a
    /// live session's prompt skip the store read).
    archived: bool,
    busy: Busy,
    /// When it was last attached, prompted or finished a turn (for the idle timeout).
    last_active: Instant,
    /// When this replica last knew the hold was its own: attached then, or the registry said
    /// so (see [`LiveTable::held_since`]).
    confirmed: Instant,
    /// Closed when the running turn ends.
    turn_done: Option<watch::Receiver<TurnPhase>>,
    /// The agent's `session/update`s since the last turn began, and whether one past the
    /// bound was already warned of.
    updates: (u64, bool),
}

impl LiveEntry {
    fn new() -> Self {
        LiveEntry {
            member: None,
            tenant: None,
            cwd: None,
            archived: false,
            busy: Busy::Idle,
            last_active: Instant::now(),
            confirmed: Instant::now(),
            turn_done: None,
            updates: (0, false),
        }
    }

    /// An entry neither held nor busy says nothing: it is removed.
    fn needed(&self) -> bool {
        self.member.is_some() || self.busy != Busy::Idle
    }
}

/// The table. Its lock is never held across an await.
#[derive(Default)]
pub(in crate::gateway) struct LiveTable {
    sessions: Mutex<HashMap<String, LiveEntry>>,
    /// Woken whenever a session stops being busy (see [`LiveTable::claim_waiting`]).
    freed: tokio::sync::Notify,
    /// Sessions being loaded, and whether their log was empty (then replayed updates are kept).
    replaying: Mutex<HashMap<String, bool>>,
}

impl LiveTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LiveEntry>> {
        self.sessions.lock().expect("live sessions lock")
    }

    /// Marks the session busy, or fails with what keeps it busy. A turn gets the sender whose
    /// closing tells `cancel` and shutdown that it ended.
    fn claim(
        &self,
        session_id: &str,
        what: Busy,
    ) -> Result<Option<watch::Sender<TurnPhase>>, Busy> {
        let mut sessions = self.lock();
        let entry = sessions
            .entry(session_id.to_owned())
            .or_insert_with(LiveEntry::new);
        if entry.busy != Busy::Idle {
            return Err(entry.busy);
        }
        entry.busy = what;
        entry.last_active = Instant::now();
        if what == Busy::Turn {
            entry.updates = (0, false);
        }
        Ok((what == Busy::Turn).then(|| {
            let (tx, rx) = watch::channel(TurnPhase::Starting);
            entry.turn_done = Some(rx);
            tx
        }))
    }

    fn unclaim(&self, session_id: &str) {
        let mut sessions = self.lock();
        if let Some(entry) = sessions.get_mut(session_id) {
            entry.busy = Busy::Idle;
            entry.turn_done = None;
            entry.last_active = Instant::now();
            if !entry.needed() {
                sessions.remove(session_id);
            }
        }
        drop(sessions);
        self.freed.notify_waiters();
    }

    /// Counts a `session/update` of the session's agent against `bound` updates per turn (from
    /// the start of one turn to the start of the next; 0: no bound). A session this replica
    /// does not hold is not counted.
    pub(in crate::gateway) fn count_update(&self, session_id: &str, bound: u64) -> Updates {
        let mut sessions = self.lock();
        let Some(entry) = sessions.get_mut(session_id).filter(|_| bound > 0) else {
            return Updates::Within;
        };
        let (count, warned) = &mut entry.updates;
        *count = count.saturating_add(1);
        if *count <= bound {
            return Updates::Within;
        }
        Updates::Beyond {
            first: !std::mem::replace(warned, true),
        }
    }

    /// Records that `member` holds the session (counted on the member once).
    pub(in crate::gateway) fn attach(&self, record: &SessionRecord, member: usize, pool: &Agents) {
        let mut sessions = self.lock();
        let entry = sessions
            .entry(record.session_id.clone())
            .or_insert_with(LiveEntry::new);
        entry.last_active = Instant::now();
        entry.tenant = Some(record.tenant.clone());
        entry.cwd = Some(record.cwd.as_str().into());
        entry.archived = record.archived;
        if entry.member.is_none() {
            pool.adjust_sessions(member, true);
        }
        entry.member = Some(member);
        entry.confirmed = Instant::now();
    }

    /// Forgets where the session is live; returns the member it was on.
    pub(in crate::gateway) fn detach(&self, session_id: &str, pool: &Agents) -> Option<usize> {
        let mut sessions = self.lock();
        let entry = sessions.get_mut(session_id)?;
        let member = entry.member.take();
        if let Some(m) = member {
            pool.adjust_sessions(m, false);
        }
        if !entry.needed() {
            sessions.remove(session_id);
        }
        member
    }

    /// A member exited: its sessions are held no more. Returns them.
    pub(in crate::gateway) fn drop_member(&self, member: usize) -> Vec<String> {
        let mut sessions = self.lock();
        let ids: Vec<String> = sessions
            .iter()
            .filter(|(_, e)| e.member == Some(member))
            .map(|(k, _)| k.clone())
            .collect();
        for id in &ids {
            if let Some(e) = sessions.get_mut(id) {
                e.member = None;
            }
        }
        sessions.retain(|_, e| e.needed());
        ids
    }

    /// The member holding the session live.
    pub(in crate::gateway) fn member(&self, session_id: &str) -> Option<usize> {
        self.lock().get(session_id).and_then(|e| e.member)
    }

    /// For a session a member holds live: since when this replica has known the hold is its
    /// own (another replica may take it over after that, if this one stops beating).
    pub(in crate::gateway) fn held_since(&self, session_id: &str) -> Option<Instant> {
        let sessions = self.lock();
        let entry = sessions.get(session_id)?;
        entry.member.map(|_| entry.confirmed)
    }

    /// The registry said, as of `at`, that the session is this replica's.
    pub(in crate::gateway) fn confirm(&self, session_id: &str, at: Instant) {
        if let Some(entry) = self.lock().get_mut(session_id) {
            entry.confirmed = entry.confirmed.max(at);
        }
    }

    /// Where the session works, if this replica knows it.
    /// The tenant of a session held here.
    pub(in crate::gateway) fn tenant(&self, session_id: &str) -> Option<String> {
        self.lock().get(session_id).and_then(|e| e.tenant.clone())
    }

    pub(in crate::gateway) fn cwd(&self, session_id: &str) -> Option<Arc<str>> {
        self.lock().get(session_id).and_then(|e| e.cwd.clone())
    }

    /// Whether this replica holds the session or is working on it.
    pub(in crate::gateway) fn here(&self, session_id: &str) -> bool {
        self.lock().get(session_id).is_some_and(LiveEntry::needed)
    }

    /// Sessions held live or running a turn.
    pub(in crate::gateway) fn active(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.member.is_some() || e.turn_done.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Every session a member holds, with its member.
    pub(in crate::gateway) fn held(&self) -> Vec<(String, usize)> {
        self.lock()
            .iter()
            .filter_map(|(id, e)| e.member.map(|m| (id.clone(), m)))
            .collect()
    }

    /// Live sessions that have not been busy for `idle`, with their members.
    pub(in crate::gateway) fn idle_for(&self, idle: Duration) -> Vec<(String, usize)> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.busy == Busy::Idle && e.last_active.elapsed() >= idle)
            .filter_map(|(id, e)| e.member.map(|m| (id.clone(), m)))
            .collect()
    }

    /// The running turn's end, if a turn runs.
    pub(in crate::gateway) fn turn_done(
        &self,
        session_id: &str,
    ) -> Option<watch::Receiver<TurnPhase>> {
        self.lock().get(session_id)?.turn_done.clone()
    }

    /// Sessions held live by a pool member.
    pub(in crate::gateway) fn live_count(&self) -> usize {
        self.live_count_where(|_| true)
    }

    /// Live sessions on the members `on` accepts.
    pub(in crate::gateway) fn live_count_where(&self, on: impl Fn(usize) -> bool) -> usize {
        self.lock()
            .values()
            .filter(|e| e.member.is_some_and(&on))
            .count()
    }

    /// Keeps the entry in step with a changed cached record.
    pub(in crate::gateway) fn record_changed(&self, r: &SessionRecord) {
        if let Some(e) = self.lock().get_mut(&r.session_id) {
            e.archived = r.archived;
        }
    }

    /// The member holding a session live, when `owner_ok` accepts its tenant and it is not
    /// archived: everything a prompt needs to know, without a store read.
    pub(in crate::gateway) fn live_member(
        &self,
        session_id: &str,
        owner_ok: impl FnOnce(&str) -> bool,
    ) -> Option<usize> {
        match self.lock().get(session_id) {
            Some(LiveEntry {
                member: Some(m),
                tenant: Some(tenant),
                archived: false,
                ..
            }) if owner_ok(tenant) => Some(*m),
            _ => None,
        }
    }

    /// The session's status, as live only if it is live and `owner_ok` accepts its owner;
    /// `awaiting` says whether a request waits for a client (and which kind).
    pub(in crate::gateway) fn status_if_owner(
        &self,
        session_id: &str,
        owner_ok: impl FnOnce(&str) -> bool,
        awaiting: impl FnOnce() -> Option<Activity>,
    ) -> (Status, Option<Activity>) {
        match self.lock().get(session_id) {
            Some(LiveEntry {
                member: Some(_),
                tenant: Some(tenant),
                busy,
                turn_done,
                ..
            }) if owner_ok(tenant) => {
                let activity = if let Some(awaiting) = awaiting() {
                    awaiting
                } else if *busy == Busy::Turn && admitted(turn_done.as_ref()) {
                    Activity::Running
                } else {
                    Activity::Idle
                };
                (Status::Live, Some(activity))
            }
            _ => (Status::Saved, None),
        }
    }
}

/// Frees a session's busy mark when dropped.
pub(in crate::gateway) struct Claim {
    live: Arc<LiveTable>,
    session_id: String,
    /// For a turn: dropping it (after the mark is freed) tells `cancel` and shutdown that the
    /// turn ended.
    done: Option<watch::Sender<TurnPhase>>,
}

/// Whether a turn is past its admission: a turn still waiting for its tenant's quota may yet
/// be refused, and is not shown as running, so that a client that has seen `running` knows
/// the turn counts against the quota on every replica.
fn admitted(turn: Option<&watch::Receiver<TurnPhase>>) -> bool {
    turn.is_some_and(|phase| *phase.borrow() != TurnPhase::Starting)
}

impl Claim {
    /// The turn is counted among its tenant's turns: it shows as running.
    pub(in crate::gateway) fn mark_admitted(&self) {
        if let Some(tx) = &self.done {
            tx.send_replace(TurnPhase::Admitted);
        }
    }

    /// The turn's `session/prompt` is on its way to the agent: a cancel can follow it now.
    pub(in crate::gateway) fn mark_sent(&self) {
        if let Some(tx) = &self.done {
            tx.send_replace(TurnPhase::Sent);
        }
    }
}

impl Claim {
    /// The turn is over and its `turn_ended` about to be queued: a client that has seen it
    /// and prompts again waits for the session to be free rather than being refused.
    pub(in crate::gateway) fn mark_ending(&self) {
        if let Some(tx) = &self.done {
            tx.send_replace(TurnPhase::Ending);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.live.unclaim(&self.session_id);
    }
}

impl LiveTable {
    /// Marks the session busy (409 if it already is); the guard frees it on drop.
    pub(in crate::gateway) fn busy(
        self: &Arc<Self>,
        session_id: &str,
        what: Busy,
    ) -> Result<Claim, Error> {
        let done = self.claim(session_id, what).map_err(|_| conflict())?;
        Ok(Claim {
            live: self.clone(),
            session_id: session_id.to_owned(),
            done,
        })
    }

    /// [`busy`](Self::busy) for a request: a session being attached, closed when idle or
    /// taken over from a replica that died, or whose turn is ending, is waited for (up to
    /// `bound`) rather than refused; only a running turn answers 409 at once.
    pub(in crate::gateway) async fn busy_waiting(
        self: &Arc<Self>,
        session_id: &str,
        what: Busy,
        bound: Duration,
    ) -> Result<Claim, Error> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before trying, so that a release in between is not missed.
            freed.as_mut().enable();
            match self.claim(session_id, what) {
                Ok(done) => {
                    return Ok(Claim {
                        live: self.clone(),
                        session_id: session_id.to_owned(),
                        done,
                    });
                }
                Err(Busy::Turn) if !self.turn_ending(session_id) => return Err(conflict()),
                Err(_) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return Err(conflict());
                    }
                }
            }
        }
    }

    /// Whether the session's turn is queueing its `turn_ended`.
    fn turn_ending(&self, session_id: &str) -> bool {
        self.turn_done(session_id)
            .is_some_and(|done| *done.borrow() == TurnPhase::Ending)
    }

    /// For a running turn: waits (up to `bound`) until its prompt is on its way to the agent,
    /// so that a cancel cannot overtake it; returns its member and a receiver that closes when
    /// it ends.
    pub(in crate::gateway) async fn running_turn(
        &self,
        session_id: &str,
        bound: Duration,
    ) -> Option<(usize, watch::Receiver<TurnPhase>)> {
        let mut done = self.turn_done(session_id)?;
        let sent = tokio::time::timeout(bound, done.wait_for(|p| *p == TurnPhase::Sent))
            .await
            .is_ok_and(|r| r.is_ok());
        if !sent {
            return None;
        }
        let member = self.member(session_id)?;
        Some((member, done))
    }

    /// Whether the session is being loaded, and if so whether its log was empty before.
    pub(in crate::gateway) fn replaying(&self, session_id: &str) -> Option<bool> {
        let replaying = self.replaying.lock().expect("replaying lock");
        replaying.get(session_id).copied()
    }

    /// Marks the session as being loaded (`log_empty`: replayed updates are kept), until
    /// [`LiveTable::loaded`].
    pub(in crate::gateway) fn loading(&self, session_id: &str, log_empty: bool) {
        let mut replaying = self.replaying.lock().expect("replaying lock");
        replaying.insert(session_id.to_owned(), log_empty);
    }

    pub(in crate::gateway) fn loaded(&self, session_id: &str) {
        self.replaying
            .lock()
            .expect("replaying lock")
            .remove(session_id);
    }
}

/// The 409 for a session already busy.
fn conflict() -> Error {
    Error::Conflict("a turn is already running on this session (or it is being resumed)".into())
}
