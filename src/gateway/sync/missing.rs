//! What a list sync makes of a session its listing missed, and of one it tombstoned that comes
//! back.
//!
//! An agent's `session/list` is not a snapshot: agents list newest first and every turn moves
//! its session to the front, so a walk through the pages while sessions are busy skips some.
//! A miss is no evidence on its own. A session missed is tombstoned only when it is in use
//! nowhere — no live replica holds it (the store's leases), its log has no open turn and no
//! event since the sync began, nothing here works on it — and the agent, asked about that one
//! session, does not know it (`session/status`, else a `session/resume` closed again at once).
//! Of an agent that can be asked neither, a session must be missed by two syncs of this replica
//! at least [`MISSED_APART`] apart, and found in use by neither.
//!
//! A session so tombstoned is logged at WARN, counted (`acp_gateway_sessions_vanished_total`)
//! and not gone for good: its row is marked vanished and its log kept, and it comes back when
//! the agent lists it again or a client makes it live.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::gateway::clock::now;
use crate::gateway::error::Error;
use crate::gateway::event::{GatewayEvent, GatewayLifecycleEvent, SessionDeleted};
use crate::gateway::parts::counters::Counters;
use crate::gateway::parts::log::Log;
use crate::gateway::parts::placement::Placement;
use crate::gateway::parts::records::Records;
use crate::store::SessionRecord;

/// Of an agent that cannot be asked about one session, how far apart two syncs must miss it.
pub(in crate::gateway) const MISSED_APART: Duration = Duration::from_secs(5);

/// How much earlier than a sync's start an event still counts as use while it ran: replicas'
/// clocks differ a little, and each stamps the events it appends.
const CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

/// The sessions this replica's last sync of each agent missed and could not ask about: when
/// a sync first missed each.
#[derive(Default)]
pub(in crate::gateway) struct Misses(Mutex<HashMap<String, HashMap<String, Instant>>>);

impl Misses {
    fn take(&self, agent: &str) -> HashMap<String, Instant> {
        let mut misses = self.0.lock().expect("misses lock");
        misses.remove(agent).unwrap_or_default()
    }

    fn keep(&self, agent: &str, missed: HashMap<String, Instant>) {
        let mut misses = self.0.lock().expect("misses lock");
        misses.insert(agent.to_owned(), missed);
    }
}

/// What the sync knows of the moment it began: its own changes up to then (`touches`), and
/// the time (`began`).
#[derive(Clone, Copy)]
pub(in crate::gateway) struct SyncStart {
    pub(in crate::gateway) touches: u64,
    pub(in crate::gateway) began: DateTime<Utc>,
}

/// What settling a sync's misses takes of the service's parts.
pub(in crate::gateway) struct Missing<'a> {
    pub(in crate::gateway) placement: &'a Placement,
    pub(in crate::gateway) records: &'a Records,
    pub(in crate::gateway) log: &'a Log,
    pub(in crate::gateway) counters: &'a Counters,
    pub(in crate::gateway) misses: &'a Misses,
}

impl Missing<'_> {
    /// Tombstones those of `missing` (sessions of `agent` listed by an earlier sync and not by
    /// this one) that the agent no longer knows, and no one uses; returns how many.
    pub(in crate::gateway) async fn settle(
        &self,
        agent: &str,
        missing: Vec<String>,
        start: SyncStart,
    ) -> Result<usize, Error> {
        let before = self.misses.take(agent);
        let mut still = HashMap::new();
        let mut vanished = 0;
        for id in missing {
            let Some(record) = self.records.rows().get_session(&id).await? else {
                continue;
            };
            if record.deleted_at.is_some() || self.in_use(&id, start).await? {
                continue;
            }
            let gone = match self.placement.agent_knows(&record).await {
                Some(known) => !known,
                None => {
                    let first = before.get(&id).copied().unwrap_or_else(Instant::now);
                    let apart = first.elapsed() >= MISSED_APART;
                    if !apart {
                        still.insert(id, first);
                    }
                    apart
                }
            };
            if gone && self.vanish(&record, start).await? {
                vanished += 1;
            }
        }
        self.misses.keep(agent, still);
        Ok(vanished)
    }

    /// Whether anyone uses the session: held by a live replica (any), busy or changed here
    /// since the sync began, a turn open in its log, or an event since the sync began.
    async fn in_use(&self, id: &str, start: SyncStart) -> Result<bool, Error> {
        if self.placement.live().here(id) || self.records.touched_since(id, start.touches) {
            return Ok(true);
        }
        if self.placement.cluster().holder(id).await?.is_some() {
            return Ok(true);
        }
        let log = self.log.events();
        if log.turn_open(id).await? {
            return Ok(true);
        }
        let last = log.last_event_at(id).await?;
        Ok(last.is_some_and(|at| at >= start.began - CLOCK_SKEW))
    }

    /// Tombstones a session the agent no longer knows; `true` if it was live in the cache. A
    /// client that made it live between the checks and the tombstone keeps it.
    async fn vanish(&self, record: &SessionRecord, start: SyncStart) -> Result<bool, Error> {
        let id = record.session_id.as_str();
        let store = self.records.rows();
        if !store.vanish_session(id, now()).await? {
            return Ok(false);
        }
        self.records.sessions_changed();
        if self.in_use(id, start).await? {
            store.revive_session(id).await?;
            self.records.sessions_changed();
            return Ok(false);
        }
        tracing::warn!(
            session = id,
            agent = record.agent,
            reason = "vanished_upstream",
            "the agent no longer knows the session: marked deleted"
        );
        self.counters.session_vanished();
        let reason = "vanished_upstream";
        let deleted = SessionDeleted {
            session_id: id.to_owned(),
            agent: None,
            reason: Some(reason.to_owned()),
        };
        self.log
            .append(id, GatewayEvent::SessionDeleted(deleted))
            .await;
        let deleted = GatewayLifecycleEvent::deleted(record, Some(reason));
        self.log.lifecycle(record, deleted).await;
        Ok(true)
    }
}
