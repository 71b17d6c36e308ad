//! Requests the agent sent that wait for a client — permission requests (`permissions`) and
//! elicitations (`elicitations`) — and their one lifecycle: kept under a gateway id and logged
//! (`*_requested`) when they arrive, listed while pending, resolved exactly once (answered
//! through the REST route, by a policy, by the `--permission-timeout` timer, or cancelled with
//! the turn) with the agent answered and the resolution logged (`*_resolved`), forgotten when
//! their member exits. Each kind says, through [`Asked`], what its view, its answer and its
//! events are. The table has one lock, never held across an await: the agent is answered after
//! it is released.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::elicitations::ElicitationView;
use super::error::Error;
use super::log::Log;
use super::permissions::PermissionView;
use super::records::Records;
use crate::config::PermissionPolicy;
use crate::pool::client::Incoming;

/// A kind of request that waits for a client, by the view clients see of one.
pub(super) trait Asked: Clone + Send + Sync + 'static {
    /// What the gateway keeps beside the view (an elicitation's parsed schema).
    type Extra: Send + Sync + 'static;
    /// The ACP response the agent is answered with.
    type Answer: Serialize + Send + Sync;
    /// What one request is called in errors ("permission request").
    const NOUN: &'static str;
    /// The events logged when one arrives and when it is resolved.
    const REQUESTED: &'static str;
    const RESOLVED: &'static str;

    /// This kind's table.
    fn table(requests: &Requests) -> &Table<Self>;
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
    /// The `REQUESTED` event's payload: `{sessionId, requestId, request, deadline?}`.
    fn requested_payload(&self) -> Value {
        let a = self.asked();
        let mut payload =
            json!({"sessionId": a.session_id, "requestId": a.request_id, "request": a.request});
        if let Some(deadline) = a.deadline {
            payload["deadline"] = json!(deadline);
        }
        payload
    }
    /// The `RESOLVED` event's payload, once the view is marked.
    fn resolved_payload(&self, reason: &str) -> Value;
}

/// The fields every kind of request has.
pub(super) struct Asking<'a> {
    pub(super) request_id: &'a str,
    pub(super) session_id: &'a str,
    pub(super) created_at: DateTime<Utc>,
    /// The agent's request, as it sent it.
    pub(super) request: &'a Value,
    /// When it fails closed, if it does.
    pub(super) deadline: Option<DateTime<Utc>>,
}

struct Entry<V: Asked> {
    view: V,
    member: usize,
    /// The agent's request, to be answered once.
    request: Incoming,
    extra: V::Extra,
}

/// Pending and resolved requests of one kind, by gateway id.
pub(super) struct Table<V: Asked> {
    map: Mutex<HashMap<String, Entry<V>>>,
}

impl<V: Asked> Default for Table<V> {
    fn default() -> Self {
        Table {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<V: Asked> Table<V> {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry<V>>> {
        self.map.lock().expect("pending table lock")
    }

    fn insert(&self, view: V, member: usize, request: Incoming, extra: V::Extra) {
        let id = view.request_id().to_owned();
        let entry = Entry {
            view,
            member,
            request,
            extra,
        };
        self.lock().insert(id, entry);
    }

    /// The session's pending requests, oldest first.
    fn pending_for(&self, session_id: &str) -> Vec<V> {
        let mut out: Vec<V> = self
            .lock()
            .values()
            .filter(|e| e.view.session_id() == session_id && !e.view.is_resolved())
            .map(|e| e.view.clone())
            .collect();
        out.sort_by_key(Asked::created_at);
        out
    }

    pub(super) fn has_pending(&self, session_id: &str) -> bool {
        self.lock()
            .values()
            .any(|e| e.view.session_id() == session_id && !e.view.is_resolved())
    }

    pub(super) fn pending_count(&self) -> usize {
        self.lock()
            .values()
            .filter(|e| !e.view.is_resolved())
            .count()
    }

    /// The first request of `member`, pending or resolved, that `pred` picks.
    pub(super) fn find(&self, member: usize, pred: impl Fn(&V) -> bool) -> Option<V> {
        self.lock()
            .values()
            .find(|e| e.member == member && pred(&e.view))
            .map(|e| e.view.clone())
    }

    /// Resolves request `request_id` (of `session_id` when given) with the answer `decide`
    /// makes of it. 404 when unknown (or of another session), 409 when already resolved, and
    /// `decide`'s error as it is (the request then stays pending).
    fn resolve(
        &self,
        session_id: Option<&str>,
        request_id: &str,
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
        let answer = decide(&entry.view, &entry.extra)?;
        entry.view.mark(&answer);
        Ok((entry.view.clone(), entry.request.clone(), answer))
    }

    /// Resolves every pending request of a session as cancelled; returns them, to be answered.
    fn cancel_all(&self, session_id: &str) -> Vec<(V, Incoming)> {
        self.lock()
            .values_mut()
            .filter(|e| e.view.session_id() == session_id && !e.view.is_resolved())
            .map(|e| {
                e.view.mark(&V::cancelled());
                (e.view.clone(), e.request.clone())
            })
            .collect()
    }

    /// Forgets the requests of an exited member; returns the ones that were pending, marked
    /// cancelled (there is no one left to answer).
    fn drop_member(&self, member: usize) -> Vec<V> {
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

/// The requests that wait for a client, of both kinds, and how they are resolved without one.
pub struct Requests {
    /// Permission requests, pending and resolved.
    pub(super) permissions: Table<PermissionView>,
    /// Elicitations, pending and resolved, each with its requested schema (none in URL mode).
    pub(super) elicitations: Table<ElicitationView>,
    /// Who answers: a client, or the policy at once.
    pub(super) policy: PermissionPolicy,
    /// How long a request waits for a client (`None`: forever).
    timeout: Option<Duration>,
    pub(super) log: Log,
    /// Whose sessions a caller may answer for.
    pub(super) records: Arc<Records>,
    /// The timers.
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Requests {
    pub(super) fn new(
        policy: PermissionPolicy,
        timeout: Option<Duration>,
        log: Log,
        records: Arc<Records>,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        Requests {
            records,
            permissions: Table::default(),
            elicitations: Table::default(),
            policy,
            timeout,
            log,
            tasks,
            stop,
        }
    }

    /// The session's pending requests of kind `V`, oldest first.
    pub(super) fn pending<V: Asked>(&self, session_id: &str) -> Vec<V> {
        V::table(self).pending_for(session_id)
    }

    /// Records a new request and logs its `REQUESTED` event.
    pub(super) async fn track<V: Asked>(
        &self,
        view: V,
        member: usize,
        request: Incoming,
        extra: V::Extra,
    ) {
        let (session_id, payload) = (view.session_id().to_owned(), view.requested_payload());
        V::table(self).insert(view, member, request, extra);
        self.log.append(&session_id, V::REQUESTED, payload).await;
    }

    /// Resolves a request with the answer `decide` makes, logs `RESOLVED` with `reason` and
    /// answers the agent: in this order, so that what the agent does on the answer (end the
    /// turn) is logged after the resolution.
    pub(super) async fn resolve<V: Asked>(
        &self,
        session_id: Option<&str>,
        request_id: &str,
        reason: &str,
        decide: impl FnOnce(&V, &V::Extra) -> Result<V::Answer, Error>,
    ) -> Result<V, Error> {
        let (view, request, answer) = V::table(self).resolve(session_id, request_id, decide)?;
        self.log_resolved(&view, reason).await;
        let _ = request.answer(&answer).await;
        Ok(view)
    }

    async fn log_resolved<V: Asked>(&self, view: &V, reason: &str) {
        let payload = view.resolved_payload(reason);
        self.log
            .enqueue(view.session_id(), V::RESOLVED, payload)
            .await;
    }

    async fn cancel_all<V: Asked>(&self, session_id: &str) {
        for (view, request) in V::table(self).cancel_all(session_id) {
            self.log_resolved(&view, "cancelled").await;
            let _ = request.answer(&V::cancelled()).await;
        }
    }

    /// Resolves the session's pending requests as cancelled (before a cancel, close, archive or
    /// delete, and at shutdown), so that their resolution is logged before the turn's end.
    pub(super) async fn cancel_session(&self, session_id: &str) {
        self.cancel_all::<PermissionView>(session_id).await;
        self.cancel_all::<ElicitationView>(session_id).await;
    }

    /// A member exited: its requests are gone, the pending ones logged as cancelled.
    pub(super) async fn drop_member(&self, member: usize) {
        for view in self.permissions.drop_member(member) {
            self.log_resolved(&view, "cancelled").await;
        }
        for view in self.elicitations.drop_member(member) {
            self.log_resolved(&view, "cancelled").await;
        }
    }

    /// Whether a request of the session waits for a client (permission or elicitation).
    pub(super) fn awaits_client(&self, session_id: &str) -> bool {
        self.permissions.has_pending(session_id) || self.elicitations.has_pending(session_id)
    }

    /// When a request made now fails closed (`--permission-timeout`), if it does.
    pub(super) fn deadline(&self) -> Option<DateTime<Utc>> {
        let after = self.timeout?;
        chrono::Duration::from_std(after)
            .ok()
            .map(|d| super::model::now() + d)
    }

    /// Runs `expire` after `--permission-timeout` (never without one), unless the gateway
    /// stops first.
    pub(super) fn on_timeout<F, Fut>(self: &Arc<Self>, expire: F)
    where
        F: FnOnce(Arc<Requests>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(after) = self.timeout else {
            return;
        };
        let requests = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(after) => expire(requests.clone()).await,
                _ = requests.stop.cancelled() => {}
            }
        });
    }
}
