//! The requests that wait for a client, as the service keeps them: one table per kind
//! (`permissions`, `elicitations`), each request logged when it arrives and when it is resolved
//! — answered through the REST route, by the policy, by the `--permission-timeout` timer, or
//! cancelled with the turn — and forgotten when its member exits. The agent is answered after
//! the table's lock is released. A session has at most `--max-pending-requests` waiting at
//! once: the agent's request past it is refused at once (a JSON-RPC error), so that an agent
//! asking in a loop cannot fill the table.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol_schema::v1::{
    CancelRequestNotification, CompleteElicitationNotification,
};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::elicitations::{self, ElicitationReply, ElicitationView};
use super::log::Log;
use super::pending::{Asked, Table};
use super::permissions::{self, ALLOW, PermissionView, REJECT};
use super::records::Records;
use crate::agent_rpc::RpcError;
use crate::config::{PermissionPolicy, TenantFlags, WhoAnswers};
use crate::gateway::caller::{Author, Caller, owner_of};
use crate::gateway::error::Error;
use crate::gateway::event::{ElicitationCompleted, GatewayEvent};
use crate::gateway::input::SessionId;
use crate::pool::client::Incoming;

/// A kind of request with its table in [`Requests`].
pub(in crate::gateway) trait RequestKind: Asked {
    fn table(requests: &Requests) -> &Table<Self>;
}

impl RequestKind for PermissionView {
    fn table(requests: &Requests) -> &Table<Self> {
        &requests.permissions
    }
}

impl RequestKind for ElicitationView {
    fn table(requests: &Requests) -> &Table<Self> {
        &requests.elicitations
    }
}

/// How requests are answered: by whom, how soon, how many at once.
pub(in crate::gateway) struct Rules {
    /// Who answers: a client, or the policy at once.
    pub(in crate::gateway) policy: PermissionPolicy,
    /// How long a request waits for a client (`None`: forever).
    pub(in crate::gateway) timeout: Option<Duration>,
    /// Requests of one session waiting at once, both kinds together (0: no limit).
    pub(in crate::gateway) max_pending: usize,
    /// Which client: each tenant's default `who-answers` (a session may say otherwise).
    pub(in crate::gateway) tenants: TenantFlags,
}

/// The requests that wait for a client, of both kinds, and how they are resolved without one.
pub struct Requests {
    /// Permission requests, pending and resolved.
    permissions: Table<PermissionView>,
    /// Elicitations, pending and resolved, each with its requested schema (none in URL mode).
    elicitations: Table<ElicitationView>,
    policy: PermissionPolicy,
    timeout: Option<Duration>,
    max_pending: usize,
    tenants: TenantFlags,
    /// The author of each session's running turn: who may answer what it asks, under
    /// `who-answers = author`.
    turn_authors: Mutex<HashMap<String, Author>>,
    /// The sessions whose agent was refused a request since one was last accepted: warned of
    /// once, not at every refusal of a flood.
    refusing: Mutex<HashSet<String>>,
    log: Log,
    /// Whose sessions a caller may answer for.
    records: Arc<Records>,
    /// The spans of the requests pending in a traced turn, by request id, ended with their
    /// resolution.
    waits: Mutex<HashMap<String, tracing::Span>>,
    /// The timers.
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Requests {
    pub(in crate::gateway) fn new(
        rules: Rules,
        log: Log,
        records: Arc<Records>,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        Requests {
            records,
            permissions: Table::default(),
            elicitations: Table::default(),
            policy: rules.policy,
            timeout: rules.timeout,
            max_pending: rules.max_pending,
            tenants: rules.tenants,
            turn_authors: Mutex::default(),
            refusing: Mutex::default(),
            log,
            waits: Mutex::default(),
            tasks,
            stop,
        }
    }

    /// The session's pending requests of kind `V`, oldest first.
    pub(in crate::gateway) fn pending<V: RequestKind>(&self, session_id: &str) -> Vec<V> {
        V::table(self).pending_for(session_id)
    }

    /// Whether the session may have one more request waiting; if not, the agent's `request` is
    /// refused now (a JSON-RPC error), counted as garbage and, the first time since one was
    /// accepted, warned of.
    async fn admits(&self, session_id: &str, method: &str, request: &Incoming) -> bool {
        let waiting =
            self.permissions.pending_in(session_id) + self.elicitations.pending_in(session_id);
        if self.max_pending == 0 || waiting < self.max_pending {
            self.refusing
                .lock()
                .expect("refusing lock")
                .remove(session_id);
            return true;
        }
        crate::agent_rpc::count_garbage();
        let first = (self.refusing.lock().expect("refusing lock")).insert(session_id.to_owned());
        if first {
            tracing::warn!(
                session = session_id,
                method,
                bound = self.max_pending,
                "an agent asked for more requests to wait for a client than --max-pending-requests; refused"
            );
        }
        let why = format!(
            "{waiting} requests of this session already wait for a client (--max-pending-requests)"
        );
        let _ = request.refuse(RpcError::refused(why)).await;
        false
    }

    /// Records a new request and logs its `REQUESTED` event.
    pub(in crate::gateway) async fn track<V: RequestKind>(
        &self,
        view: V,
        member: usize,
        request: Incoming,
        extra: V::Extra,
    ) {
        let (session_id, requested) = (view.session_id().to_owned(), view.requested());
        // In a traced turn, the wait for an answer is a span of the turn's.
        if let Some(turn) = self.log.hub().traced().of(&session_id) {
            let span = tracing::info_span!(
                parent: &turn,
                "pending",
                "otel.name" = format!("{} pending", V::NOUN),
                request_id = view.request_id(),
                member = member as i64,
                reason = tracing::field::Empty,
            );
            let mut waits = self.waits.lock().expect("request spans lock");
            waits.insert(view.request_id().to_owned(), span);
        }
        let author = (self.turn_authors.lock().expect("turn authors lock"))
            .get(&session_id)
            .cloned();
        V::table(self).insert(view, member, request, extra, author);
        self.log.append(&session_id, requested).await;
    }

    /// Resolves a request with the answer `decide` makes, logs `RESOLVED` with `reason` and
    /// answers the agent: in this order, so that what the agent does on the answer (end the
    /// turn) is logged after the resolution.
    pub(in crate::gateway) async fn resolve<V: RequestKind>(
        &self,
        session_id: Option<&str>,
        request_id: &str,
        reason: &str,
        decide: impl FnOnce(&V, &V::Extra) -> Result<V::Answer, Error>,
    ) -> Result<V, Error> {
        let auto = Answerer::Gateway(reason);
        self.resolve_by(session_id, request_id, auto, decide).await
    }

    /// [`Requests::resolve`], by `answerer`: a client who may answer, or the gateway.
    async fn resolve_by<V: RequestKind>(
        &self,
        session_id: Option<&str>,
        request_id: &str,
        answerer: Answerer<'_>,
        decide: impl FnOnce(&V, &V::Extra) -> Result<V::Answer, Error>,
    ) -> Result<V, Error> {
        let may = |asker: Option<&Author>| match &answerer {
            Answerer::Client {
                caller,
                rule,
                owner,
            } => may_answer(caller, *rule, owner, asker),
            Answerer::Gateway(_) => Ok(()),
        };
        let (view, request, answer) =
            V::table(self).resolve(session_id, request_id, may, decide)?;
        let (reason, by) = match &answerer {
            Answerer::Client { caller, .. } => ("answered", Some(caller.author())),
            Answerer::Gateway(reason) => (*reason, None),
        };
        self.log_resolved(&view, reason, by).await;
        let _ = request.answer(&answer).await;
        Ok(view)
    }

    async fn log_resolved<V: RequestKind>(&self, view: &V, reason: &str, by: Option<Author>) {
        let waited = self
            .waits
            .lock()
            .expect("request spans lock")
            .remove(view.request_id());
        if let Some(span) = waited {
            span.record("reason", reason);
        }
        self.log
            .enqueue(view.session_id(), view.resolved(reason, by))
            .await;
    }

    async fn cancel_all<V: RequestKind>(&self, session_id: &str) {
        for (view, request) in V::table(self).cancel_all(session_id) {
            self.log_resolved(&view, "cancelled", None).await;
            let _ = request.answer(&V::cancelled()).await;
        }
    }

    /// Resolves the session's pending requests as cancelled (before a cancel, close, archive or
    /// delete, and at shutdown), so that their resolution is logged before the turn's end.
    pub(in crate::gateway) async fn cancel_session(&self, session_id: &str) {
        self.cancel_all::<PermissionView>(session_id).await;
        self.cancel_all::<ElicitationView>(session_id).await;
    }

    /// The agent withdrew a request it sent (`$/cancel_request`): the request is resolved as
    /// `withdrawn`, and answered with ACP's "cancelled" error as the protocol asks.
    pub(in crate::gateway) async fn withdrawn(&self, member: usize, params: &str) {
        let Ok(cancel) = serde_json::from_str::<CancelRequestNotification>(params) else {
            crate::agent_rpc::count_garbage();
            return;
        };
        let id = serde_json::to_value(&cancel.request_id).unwrap_or(Value::Null);
        let _ = self.withdraw::<PermissionView>(member, &id).await
            || self.withdraw::<ElicitationView>(member, &id).await;
    }

    async fn withdraw<V: RequestKind>(&self, member: usize, id: &Value) -> bool {
        let Some((view, request)) = V::table(self).withdraw(member, id) else {
            return false;
        };
        self.log_resolved(&view, "withdrawn", None).await;
        let _ = request.refuse(RpcError::cancelled()).await;
        true
    }

    /// A member exited: its requests are gone, the pending ones logged as cancelled.
    pub(in crate::gateway) async fn drop_member(&self, member: usize) {
        for view in self.permissions.drop_member(member) {
            self.log_resolved(&view, "cancelled", None).await;
        }
        for view in self.elicitations.drop_member(member) {
            self.log_resolved(&view, "cancelled", None).await;
        }
    }

    /// Whether a request of the session waits for a client (permission or elicitation).
    pub(in crate::gateway) fn awaits_client(&self, session_id: &str) -> bool {
        self.permissions.has_pending(session_id) || self.elicitations.has_pending(session_id)
    }

    /// When a request made now fails closed (`--permission-timeout`), if it does.
    pub(in crate::gateway) fn deadline(&self) -> Option<DateTime<Utc>> {
        let after = self.timeout?;
        chrono::Duration::from_std(after)
            .ok()
            .map(|d| crate::gateway::clock::now() + d)
    }

    /// Runs `expire` after `--permission-timeout` (never without one), unless the gateway
    /// stops first.
    pub(in crate::gateway) fn on_timeout<F, Fut>(self: &Arc<Self>, expire: F)
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

impl Requests {
    /// Whether a permission request of the session waits for a client.
    pub(in crate::gateway) fn awaits_permission(&self, session_id: &str) -> bool {
        self.permissions.has_pending(session_id)
    }

    /// Whether an elicitation of the session waits for a client.
    pub(in crate::gateway) fn awaits_input(&self, session_id: &str) -> bool {
        self.elicitations.has_pending(session_id)
    }

    /// Permission requests and elicitations waiting for a client, across sessions.
    pub(in crate::gateway) fn pending_counts(&self) -> (usize, usize) {
        (
            self.permissions.pending_count(),
            self.elicitations.pending_count(),
        )
    }

    /// `GET /sessions/{id}/permissions`.
    pub async fn permissions(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<PermissionView>, Error> {
        self.listed(caller, id).await
    }

    /// `POST /sessions/{id}/permissions/{requestId}`: `option_id`, or `outcome` `"cancelled"`.
    pub async fn answer_permission(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        option_id: Option<String>,
        outcome: Option<&str>,
    ) -> Result<PermissionView, Error> {
        self.answered(caller, id, request_id, |view, ()| {
            permissions::answered(view, option_id, outcome)
        })
        .await
    }

    /// `GET /sessions/{id}/elicitations`.
    pub async fn elicitations(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<ElicitationView>, Error> {
        self.listed(caller, id).await
    }

    /// `POST /sessions/{id}/elicitations/{requestId}`: `accept` with `content`, `decline` or
    /// `cancel`.
    pub async fn answer_elicitation(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        reply: ElicitationReply,
        content: Option<&Value>,
    ) -> Result<ElicitationView, Error> {
        self.answered(caller, id, request_id, |_: &ElicitationView, schema| {
            elicitations::answered(schema.as_ref(), reply, content)
        })
        .await
    }

    /// The session's pending requests of kind `V`, for a caller who may see the session.
    async fn listed<V: RequestKind>(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<V>, Error> {
        self.records.get(caller, id).await?;
        Ok(self.pending(id.as_str()))
    }

    /// A caller's answer to a request of kind `V` of the session: `decide` checks it against
    /// the request and makes the agent's answer.
    async fn answered<V: RequestKind>(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        decide: impl FnOnce(&V, &V::Extra) -> Result<V::Answer, Error>,
    ) -> Result<V, Error> {
        let record = self.records.get(caller, id).await?;
        let rule = (record.people.who_answers.as_deref())
            .and_then(WhoAnswers::parse)
            .unwrap_or_else(|| self.tenants.who_answers(&record.tenant));
        let owner = owner_of(&record);
        let answerer = Answerer::Client {
            caller,
            rule,
            owner: &owner,
        };
        self.resolve_by(Some(id.as_str()), request_id, answerer, decide)
            .await
    }

    /// The session's turn by `author` has started: what it asks, `author` may answer.
    pub(in crate::gateway) fn turn_began(&self, session_id: &str, author: Author) {
        let mut authors = self.turn_authors.lock().expect("turn authors lock");
        authors.insert(session_id.to_owned(), author);
    }

    /// The session's turn has ended.
    pub(in crate::gateway) fn turn_over(&self, session_id: &str) {
        let mut authors = self.turn_authors.lock().expect("turn authors lock");
        authors.remove(session_id);
    }
}

/// Who resolves a request: a client answering (under the session's rule), or the gateway
/// (its policy, its timeout), for `reason`.
enum Answerer<'a> {
    Client {
        caller: &'a Caller,
        rule: WhoAnswers,
        owner: &'a Author,
    },
    Gateway(&'a str),
}

/// Whether `caller` may answer a request of a session of `owner` under `rule`, `asker` being
/// the author of the turn that asked (the owner when it came outside a turn); 403 if not.
fn may_answer(
    caller: &Caller,
    rule: WhoAnswers,
    owner: &Author,
    asker: Option<&Author>,
) -> Result<(), Error> {
    let (who, whom) = match rule {
        WhoAnswers::Anyone => return Ok(()),
        WhoAnswers::Owner => ("the session's owner", owner),
        WhoAnswers::Author => ("the author of the turn that asked", asker.unwrap_or(owner)),
    };
    if caller.is(whom) {
        return Ok(());
    }
    let name = whom.name.as_deref().or(whom.user.as_deref());
    let shown = name.map_or_else(|| format!("tenant {}", whom.tenant), |n| n.to_owned());
    Err(Error::Forbidden(format!(
        "only {who} ({shown}) may answer in this session (whoAnswers: {})",
        rule.as_str()
    )))
}

impl Requests {
    /// A permission request from the agent: pending until answered, or resolved now by the
    /// policy, or later by the timeout.
    pub(in crate::gateway) async fn permission_requested(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        session_id: &str,
        params: Value,
    ) {
        let method = "session/request_permission";
        if !self.admits(session_id, method, &request).await {
            return;
        }
        let view = PermissionView {
            request_id: format!("perm_{}", uuid::Uuid::new_v4().simple()),
            session_id: session_id.to_owned(),
            request: params,
            created_at: crate::gateway::clock::now(),
            deadline: match self.policy {
                PermissionPolicy::Ask => self.deadline(),
                _ => None,
            },
            outcome: None,
        };
        let request_id = view.request_id.clone();
        self.track(view, member, request, ()).await;
        match self.policy {
            PermissionPolicy::Allow => {
                self.resolve_auto(&request_id, &ALLOW, "policy").await;
            }
            PermissionPolicy::Reject => {
                self.resolve_auto(&request_id, &REJECT, "policy").await;
            }
            PermissionPolicy::Ask => self.on_timeout(move |requests| async move {
                requests.resolve_auto(&request_id, &REJECT, "timeout").await;
            }),
        }
    }

    /// Resolves a still-pending permission request without a client: the first offered option
    /// of the preferred kinds, else `cancelled`.
    async fn resolve_auto(&self, request_id: &str, prefer: &[&str], reason: &str) {
        let _ = self
            .resolve(None, request_id, reason, |view: &PermissionView, ()| {
                Ok(match permissions::preferred_option(&view.request, prefer) {
                    Some(option) => permissions::selected(option),
                    None => PermissionView::cancelled(),
                })
            })
            .await;
    }
}

impl Requests {
    /// An elicitation from the agent: refused when the gateway cannot serve it, else pending
    /// until answered, or declined now by the policy, or later by the timeout.
    pub(in crate::gateway) async fn elicitation_requested(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        params: Value,
    ) {
        let (session_id, schema) = match elicitations::accepted(&params) {
            Ok(accepted) => accepted,
            Err(why) => {
                tracing::warn!(member, why, "elicitation/create refused");
                let _ = request.refuse(RpcError::invalid_params(why)).await;
                return;
            }
        };
        if !self
            .admits(&session_id, "elicitation/create", &request)
            .await
        {
            return;
        }
        let ask = self.policy == PermissionPolicy::Ask;
        let view = ElicitationView {
            request_id: format!("elic_{}", uuid::Uuid::new_v4().simple()),
            session_id,
            request: params,
            created_at: crate::gateway::clock::now(),
            deadline: if ask { self.deadline() } else { None },
            response: None,
        };
        let request_id = view.request_id.clone();
        self.track(view, member, request, schema).await;
        if ask {
            self.on_timeout(move |requests| async move {
                requests.decline_unanswered(&request_id, "timeout").await;
            });
        } else {
            self.decline_unanswered(&request_id, "policy").await;
        }
    }

    /// `elicitation/complete`: the agent says the interaction a URL elicitation sent the user to
    /// is over. Logged as `elicitation_completed` on the session of the request with that
    /// `elicitationId` from the same member; ignored (with a warning) when there is none.
    pub(in crate::gateway) async fn elicitation_completed(&self, member: usize, params: &str) {
        let id = match serde_json::from_str::<CompleteElicitationNotification>(params) {
            Ok(done) => done.elicitation_id.0,
            Err(e) => {
                tracing::warn!(member, error = %e, "invalid elicitation/complete; ignored");
                return;
            }
        };
        let of_id = |v: &ElicitationView| v.request["elicitationId"].as_str() == Some(&*id);
        let Some(view) = self.elicitations.find(member, of_id) else {
            tracing::warn!(
                member,
                elicitation = &*id,
                "elicitation/complete for no known elicitation; ignored"
            );
            return;
        };
        let completed = ElicitationCompleted {
            session_id: view.session_id.clone(),
            request_id: view.request_id.clone(),
            elicitation_id: id.to_string(),
        };
        self.log
            .enqueue(
                &view.session_id,
                GatewayEvent::ElicitationCompleted(completed),
            )
            .await;
    }

    /// Declines an elicitation still pending (fail closed): nobody answered, or nobody will.
    async fn decline_unanswered(&self, request_id: &str, reason: &str) {
        let _ = self
            .resolve(None, request_id, reason, |_: &ElicitationView, _| {
                Ok(elicitations::decline())
            })
            .await;
    }
}
