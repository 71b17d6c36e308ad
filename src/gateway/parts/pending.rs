//! What every kind of request that waits for a client has (permission requests in
//! `permissions`, elicitations in `elicitations`): through [`Asked`], its view, its answer and
//! its events; and [`Table`], the requests of one kind by gateway id — pending until resolved
//! exactly once, forgotten when their member exits — with one lock, never held across an
//! await. `requests` keeps a table of each kind and runs their lifecycle.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::gateway::caller::Author;
use crate::gateway::error::Error;
use crate::gateway::event::GatewayEvent;
use crate::pool::client::Incoming;

/// A kind of request that waits for a client, by the view clients see of one.
pub(in crate::gateway) trait Asked: Clone + Send + Sync + 'static {
    /// What the gateway keeps beside the view (an elicitation's parsed schema).
    type Extra: Send + Sync + 'static;
    /// The ACP response the agent is answered with.
    type Answer: Serialize + Send + Sync;
    /// What one request is called in errors ("permission request").
    const NOUN: &'static str;

    /// What every request has.
    fn asked(&self) -> Asking<'_>;
    fn request_id(&self) -> &str {
        self.asked().request_id
    }
    fn session_id(&self) -> &str {
        self.asked().session_id
    }
    fn created_at(&self) -> DateTime<Utc> {
        self.asked().created_at
    }
    /// Whether it has been resolved (the view then shows how).
    fn is_resolved(&self) -> bool;
    /// Records `answer` in the view.
    fn mark(&mut self, answer: &Self::Answer);
    /// The answer of a request cancelled with its turn, or whose member is gone.
    fn cancelled() -> Self::Answer;
    /// The event logged when one arrives.
    fn requested(&self) -> GatewayEvent;
    /// The event logged when it is resolved, once the view is marked, `by` whom when a client
    /// answered.
    fn resolved(&self, reason: &str, by: Option<Author>) -> GatewayEvent;
}

/// The fields every kind of request has.
pub(in crate::gateway) struct Asking<'a> {
    pub(in crate::gateway) request_id: &'a str,
    pub(in crate::gateway) session_id: &'a str,
    pub(in crate::gateway) created_at: DateTime<Utc>,
}

/// [`Asked::asked`] of a view whose fields are named as [`Asking`]'s: every kind's view is.
macro_rules! asked_from_fields {
    () => {
        fn asked(&self) -> $crate::gateway::parts::pending::Asking<'_> {
            $crate::gateway::parts::pending::Asking {
                request_id: &self.request_id,
                session_id: &self.session_id,
                created_at: self.created_at,
            }
        }
    };
}

pub(in crate::gateway) use asked_from_fields;

struct PendingEntry<V: Asked> {
    view: V,
    member: usize,
    /// The agent's request, to be answered once.
    request: Incoming,
    extra: V::Extra,
    /// The author of the turn that asked, if it came in one.
    asker: Option<Author>,
}

/// The resolved requests of one session a table keeps (so that a late answer is told 409 and a
/// URL elicitation's completion finds its request); older ones are forgotten (404), so that an
/// agent asking in a loop, answered by the policy, cannot grow the table without bound.
pub(in crate::gateway) const RESOLVED_KEPT: usize = 256;

/// Pending and resolved requests of one kind, by gateway id.
pub(in crate::gateway) struct Table<V: Asked> {
    map: Mutex<HashMap<String, PendingEntry<V>>>,
}

impl<V: Asked> Default for Table<V> {
    fn default() -> Self {
        Table {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<V: Asked> Table<V> {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, PendingEntry<V>>> {
        self.map.lock().expect("pending table lock")
    }

    /// Adds a request; of its session's resolved ones, only the [`RESOLVED_KEPT`] latest stay.
    pub(in crate::gateway) fn insert(
        &self,
        view: V,
        member: usize,
        request: Incoming,
        extra: V::Extra,
        asker: Option<Author>,
    ) {
        let id = view.request_id().to_owned();
        let session_id = view.session_id().to_owned();
        let entry = PendingEntry {
            view,
            member,
            request,
            extra,
            asker,
        };
        let mut map = self.lock();
        map.insert(id, entry);
        let mut resolved: Vec<(DateTime<Utc>, String)> = map
            .iter()
            .filter(|(_, e)| e.view.session_id() == session_id && e.view.is_resolved())
            .map(|(id, e)| (e.view.created_at(), id.clone()))
            .collect();
        if let Some(excess) = resolved.len().checked_sub(RESOLVED_KEPT) {
            resolved.sort_unstable();
            for (_, id) in &resolved[..excess] {
                map.remove(id);
            }
        }
    }

    /// The session's pending requests, oldest first.
    pub(in crate::gateway) fn pending_for(&self, session_id: &str) -> Vec<V> {
        let mut out: Vec<V> = self
            .lock()
            .values()
            .filter(|e| e.view.session_id() == session_id && !e.view.is_resolved())
            .map(|e| e.view.clone())
            .collect();
        out.sort_by_key(Asked::created_at);
        out
    }

    /// How many of the session's requests wait for a client.
    pub(in crate::gateway) fn pending_in(&self, session_id: &str) -> usize {
        self.lock()
            .values()
            .filter(|e| e.view.session_id() == session_id && !e.view.is_resolved())
            .count()
    }

    pub(in crate::gateway) fn has_pending(&self, session_id: &str) -> bool {
        self.lock()
            .values()
            .any(|e| e.view.session_id() == session_id && !e.view.is_resolved())
    }

    pub(in crate::gateway) fn pending_count(&self) -> usize {
        self.lock()
            .values()
            .filter(|e| !e.view.is_resolved())
            .count()
    }

    /// The first request of `member`, pending or resolved, that `pred` picks.
    pub(in crate::gateway) fn find(&self, member: usize, pred: impl Fn(&V) -> bool) -> Option<V> {
        self.lock()
            .values()
            .find(|e| e.member == member && pred(&e.view))
            .map(|e| e.view.clone())
    }

    /// Resolves request `request_id` (of `session_id` when given) with the answer `decide`
    /// makes of it, if `may` allows it given the author of the turn that asked. 404 when
    /// unknown (or of another session), 409 when already resolved, and `may`'s or `decide`'s
    /// error as it is (the request then stays pending).
    pub(in crate::gateway) fn resolve(
        &self,
        session_id: Option<&str>,
        request_id: &str,
        may: impl FnOnce(Option<&Author>) -> Result<(), Error>,
        decide: impl FnOnce(&V, &V::Extra) -> Result<V::Answer, Error>,
    ) -> Result<(V, Incoming, V::Answer), Error> {
        let noun = V::NOUN;
        let mut map = self.lock();
        let entry = map
            .get_mut(request_id)
            .filter(|e| session_id.is_none_or(|s| e.view.session_id() == s))
            .ok_or_else(|| Error::NotFound(format!("no {noun} {request_id} on this session")))?;
        if entry.view.is_resolved() {
            return Err(Error::Conflict(format!("this {noun} is already resolved")));
        }
        may(entry.asker.as_ref())?;
        let answer = decide(&entry.view, &entry.extra)?;
        entry.view.mark(&answer);
        Ok((entry.view.clone(), entry.request.clone(), answer))
    }

    /// Resolves every pending request of a session as cancelled; returns them, to be answered.
    pub(in crate::gateway) fn cancel_all(&self, session_id: &str) -> Vec<(V, Incoming)> {
        self.lock()
            .values_mut()
            .filter(|e| e.view.session_id() == session_id && !e.view.is_resolved())
            .map(|e| {
                e.view.mark(&V::cancelled());
                (e.view.clone(), e.request.clone())
            })
            .collect()
    }

    /// Resolves as cancelled the pending request `member` sent with JSON-RPC id `id`, if one
    /// is; returns it, to be answered.
    pub(in crate::gateway) fn withdraw(&self, member: usize, id: &Value) -> Option<(V, Incoming)> {
        let mut map = self.lock();
        let entry = map
            .values_mut()
            .find(|e| e.member == member && e.request.id() == id && !e.view.is_resolved())?;
        entry.view.mark(&V::cancelled());
        Some((entry.view.clone(), entry.request.clone()))
    }

    /// Forgets the requests of an exited member; returns the ones that were pending, marked
    /// cancelled (there is no one left to answer).
    pub(in crate::gateway) fn drop_member(&self, member: usize) -> Vec<V> {
        let mut map = self.lock();
        let gone: Vec<String> = map
            .iter()
            .filter(|(_, e)| e.member == member)
            .map(|(k, _)| k.clone())
            .collect();
        gone.iter()
            .filter_map(|k| map.remove(k))
            .filter(|e| !e.view.is_resolved())
            .map(|mut e| {
                e.view.mark(&V::cancelled());
                e.view
            })
            .collect()
    }
}
