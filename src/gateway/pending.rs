//! The table of requests the agent sent that wait for a client — permission requests
//! (`permissions`) and elicitations (`elicitations`): each kept under a gateway id until it is
//! resolved once (answered through the REST route, by a policy, a timeout or a cancel) and
//! forgotten when its member exits. One lock, never held across an await: callers answer the
//! agent after it is released. Also the timer that fails a request closed after
//! `--permission-timeout`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use super::{Error, Inner};
use crate::pool::client::Incoming;

/// What the table reads of the view clients see of a request.
pub(super) trait Asked: Clone {
    fn request_id(&self) -> &str;
    fn session_id(&self) -> &str;
    fn created_at(&self) -> DateTime<Utc>;
    /// Whether it has been resolved (the view then shows how).
    fn is_resolved(&self) -> bool;
}

struct Entry<V, X> {
    view: V,
    member: usize,
    /// The agent's request, to be answered once.
    request: Incoming,
    /// What the kind of request keeps beside its view (an elicitation's parsed schema).
    extra: X,
}

/// Pending and resolved requests of one kind, by gateway id.
pub(super) struct Table<V, X = ()> {
    map: Mutex<HashMap<String, Entry<V, X>>>,
    /// What one request is called in errors ("permission request").
    noun: &'static str,
}

/// A request just resolved: its view, the agent's request to answer, and what the resolver
/// returned.
pub(super) type Resolved<V, R> = (V, Incoming, R);

impl<V: Asked, X> Table<V, X> {
    pub(super) fn new(noun: &'static str) -> Self {
        Table {
            map: Mutex::new(HashMap::new()),
            noun,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry<V, X>>> {
        self.map.lock().expect("pending table lock")
    }

    /// Records a new request.
    pub(super) fn insert(&self, view: V, member: usize, request: Incoming, extra: X) {
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
    pub(super) fn pending_for(&self, session_id: &str) -> Vec<V> {
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

    /// Resolves request `request_id` (of `session_id` when given) with `resolve`, which checks
    /// the resolution against the request and marks the view resolved. 404 when unknown (or of
    /// another session), 409 when already resolved, and `resolve`'s error as it is.
    pub(super) fn resolve<R>(
        &self,
        session_id: Option<&str>,
        request_id: &str,
        resolve: impl FnOnce(&mut V, &X) -> Result<R, Error>,
    ) -> Result<Resolved<V, R>, Error> {
        let noun = self.noun;
        let mut map = self.lock();
        let entry = map
            .get_mut(request_id)
            .filter(|e| session_id.is_none_or(|s| e.view.session_id() == s))
            .ok_or_else(|| Error::NotFound(format!("no {noun} {request_id} on this session")))?;
        if entry.view.is_resolved() {
            return Err(Error::Conflict(format!("this {noun} is already resolved")));
        }
        let out = resolve(&mut entry.view, &entry.extra)?;
        Ok((entry.view.clone(), entry.request.clone(), out))
    }

    /// Resolves every pending request of a session with `mark`; returns them, to be answered.
    pub(super) fn resolve_all(
        &self,
        session_id: &str,
        mark: impl Fn(&mut V),
    ) -> Vec<(V, Incoming)> {
        self.lock()
            .values_mut()
            .filter(|e| e.view.session_id() == session_id && !e.view.is_resolved())
            .map(|e| {
                mark(&mut e.view);
                (e.view.clone(), e.request.clone())
            })
            .collect()
    }

    /// Forgets the requests of an exited member; returns the ones that were pending, marked
    /// resolved by `mark` (there is no one left to answer).
    pub(super) fn drop_member(&self, member: usize, mark: impl Fn(&mut V)) -> Vec<V> {
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
                mark(&mut e.view);
                e.view
            })
            .collect()
    }
}

impl Inner {
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

    /// Whether a request of the session waits for a client (permission or elicitation).
    pub(super) fn awaits_client(&self, session_id: &str) -> bool {
        self.permissions.has_pending(session_id) || self.elicitations.has_pending(session_id)
    }

    /// A member exited: its requests are gone, the pending ones logged as cancelled.
    pub(super) async fn drop_member_requests(&self, member: usize) {
        self.drop_member_permissions(member).await;
        self.drop_member_elicitations(member).await;
    }
}

impl super::Gateway {
    /// Resolves the session's pending requests as cancelled (before a cancel, close, archive or
    /// delete, and at shutdown), so that their resolution is logged before the turn's end.
    pub(super) async fn resolve_requests_cancelled(&self, session_id: &str) {
        self.resolve_permissions_cancelled(session_id).await;
        self.resolve_elicitations_cancelled(session_id).await;
    }
}
