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

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::model::SessionId;
use super::{Caller, Error, Gateway, Inner};
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

    /// This kind's table in the service.
    fn table(inner: &Inner) -> &Table<Self>;
    fn request_id(&self) -> &str;
    fn session_id(&self) -> &str;
    fn created_at(&self) -> DateTime<Utc>;
    /// Whether it has been resolved (the view then shows how).
    fn is_resolved(&self) -> bool;
    /// Records `answer` in the view.
    fn mark(&mut self, answer: &Self::Answer);
    /// The answer of a request cancelled with its turn, or whose member is gone.
    fn cancelled() -> Self::Answer;
    /// The `REQUESTED` event's payload.
    fn requested_payload(&self) -> Value;
    /// The `RESOLVED` event's payload, once the view is marked.
    fn resolved_payload(&self, reason: &str) -> Value;
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

impl Gateway {
    /// The session's pending requests of kind `V`, oldest first.
    pub(super) async fn pending_requests<V: Asked>(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<V>, Error> {
        self.record(caller, id).await?;
        Ok(V::table(&self.inner).pending_for(id.as_str()))
    }

    /// A client's answer to a request of the session: `decide` checks it against the request
    /// and makes the agent's answer.
    pub(super) async fn answer_request<V: Asked>(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        decide: impl FnOnce(&V, &V::Extra) -> Result<V::Answer, Error>,
    ) -> Result<V, Error> {
        self.record(caller, id).await?;
        self.inner
            .resolve_request(Some(id.as_str()), request_id, "answered", decide)
            .await
    }

    /// Resolves the session's pending requests as cancelled (before a cancel, close, archive or
    /// delete, and at shutdown), so that their resolution is logged before the turn's end.
    pub(super) async fn resolve_requests_cancelled(&self, session_id: &str) {
        self.inner
            .cancel_requests::<super::PermissionView>(session_id)
            .await;
        self.inner
            .cancel_requests::<super::ElicitationView>(session_id)
            .await;
    }
}

impl Inner {
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
        self.append(&session_id, V::REQUESTED, payload).await;
    }

    /// Resolves a request with the answer `decide` makes, logs `RESOLVED` with `reason` and
    /// answers the agent: in this order, so that what the agent does on the answer (end the
    /// turn) is logged after the resolution.
    pub(super) async fn resolve_request<V: Asked>(
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
        self.enqueue(view.session_id(), V::RESOLVED, payload).await;
    }

    async fn cancel_requests<V: Asked>(&self, session_id: &str) {
        for (view, request) in V::table(self).cancel_all(session_id) {
            self.log_resolved(&view, "cancelled").await;
            let _ = request.answer(&V::cancelled()).await;
        }
    }

    /// A member exited: its requests are gone, the pending ones logged as cancelled.
    pub(super) async fn drop_member_requests(&self, member: usize) {
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
        let after = self.config.permission_timeout?;
        chrono::Duration::from_std(after)
            .ok()
            .map(|d| super::model::now() + d)
    }

    /// Runs `expire` after `--permission-timeout` (never without one), unless the gateway
    /// stops first.
    pub(super) fn on_timeout<F, Fut>(self: &Arc<Self>, expire: F)
    where
        F: FnOnce(Arc<Inner>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(after) = self.config.permission_timeout else {
            return;
        };
        let inner = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(after) => expire(inner).await,
                _ = inner.stop.cancelled() => {}
            }
        });
    }
}
