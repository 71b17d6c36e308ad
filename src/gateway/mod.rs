//! The service the HTTP handlers call: sessions, turns, permissions and status, on top of the
//! pool, the store and the event hub. It also handles upstream traffic for the pool
//! ([`UpstreamHandler`]): `session/update` into the log, permission requests into the pending
//! list, member exits into `agent_exited` events.

pub mod model;
mod permissions;
mod sync;

pub use sync::SyncReport;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::ToSchema;

use crate::acp::caps::{AgentInit, Capabilities};
use crate::acp::{Connection, ExitInfo};
use crate::api::auth::Caller;
use crate::cluster::{Cluster, ReplicaView};
use crate::config::PermissionPolicy;
use crate::error::ApiError;
use crate::events::EventHub;
use crate::pool::{MemberView, Pool, PoolConfig, UpstreamHandler};
use crate::store::{ListQuery, NewEvent, NewLifecycleEvent, Origin, SessionRecord, Store};
use model::*;
pub use permissions::{PermissionAnswer, PermissionView};

pub type ApiResult<T> = Result<T, ApiError>;

/// The tenant every session belongs to while the gateway is single-tenant.
pub const DEFAULT_TENANT: &str = "default";

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Bound on every upstream control call (new, load, resume, list, delete, status, close…).
    pub control_timeout: Duration,
    /// How long a cancelled turn may take to end before its member is restarted.
    pub cancel_grace: Duration,
    /// How long a permission request waits for an answer (`None`: forever).
    pub permission_timeout: Option<Duration>,
    pub permission_policy: PermissionPolicy,
    /// Live sessions per member (0: no limit).
    pub max_sessions_per_member: usize,
    /// Live sessions in the pool (0: no limit).
    pub max_sessions: usize,
    /// Idle live sessions are closed after this (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// What shutdown gives turns and sessions to cancel and close.
    pub shutdown_timeout: Duration,
    /// Canonical directories sessions must work in (empty: anywhere).
    pub workspace_roots: Vec<std::path::PathBuf>,
    /// The tenant that owns sessions discovered through `session/list` (the admin's).
    pub upstream_tenant: String,
    /// How often the cache is synced with `session/list` after the first sync at start
    /// (`None`: only at start and on `GET /sessions?refresh=true`).
    pub sync_interval: Option<Duration>,
}

/// `POST /sessions` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"cwd": "/home/me/project", "additionalDirectories": ["/home/me/shared"], "mcpServers": []}))]
pub struct CreateSession {
    /// Absolute, normalised working directory.
    pub cwd: String,
    /// ACP `McpServer` objects, passed through; default `[]`.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub mcp_servers: Vec<Value>,
    /// Extra workspace roots (absolute).
    #[serde(default)]
    pub additional_directories: Vec<String>,
}

/// `PATCH /sessions/{id}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"title": "Fix the flaky login test"}))]
pub struct PatchSession {
    /// New title; `null` clears it, except on an agent that keeps titles itself
    /// (`session/set_title` advertised), which cannot clear one: then 422.
    #[schema(value_type = Option<String>)]
    pub title: Option<String>,
}

/// `GET /sessions` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only sessions with exactly this working directory.
    pub cwd: Option<String>,
    /// `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1–200 (default 50).
    pub limit: Option<i64>,
    /// `true`: only archived sessions; default: only non-archived.
    pub archived: Option<bool>,
    /// `true`: sync the cache with the agent's `session/list` before answering.
    pub refresh: Option<bool>,
}

/// `POST /sessions/{id}/prompt` body: ACP content blocks, or plain text.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"prompt": [{"type": "text", "text": "Explain what src/main.rs does"}]}))]
pub struct PromptBody {
    /// ACP `ContentBlock[]`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt: Option<Vec<Value>>,
    /// Shorthand for one text block.
    pub text: Option<String>,
}

/// How a turn ended.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"stopReason": "end_turn", "result": {"stopReason": "end_turn"}}))]
pub struct TurnResult {
    /// `end_turn`, `max_tokens`, `max_turn_requests`, `refusal` or `cancelled`.
    pub stop_reason: String,
    /// The agent's whole `session/prompt` result.
    #[schema(value_type = Object)]
    pub result: Value,
}

/// What `/agent` shows.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"initialize": {"protocolVersion": 1, "agentInfo": {"name": "echo-agent", "version": "0.1.0"}, "authMethods": [], "capabilities": {"load": true, "list": true, "resume": true, "close": true, "delete": true, "status": false, "setTitle": false, "archive": false}, "rawCapabilities": {"loadSession": true, "sessionCapabilities": {"list": {}, "delete": {}, "resume": {}, "close": {}}}}, "members": [{"index": 0, "pid": 9830, "state": "ready", "sessions": 1, "restarts": 0, "lastExit": null, "lastError": null}], "replicas": [{"id": "5b0c1f0e-7d2a-4c55-9a43-0c9f2b61d1a7", "address": "http://127.0.0.1:8080", "startedAt": "2025-01-01T12:00:00Z", "heartbeatAt": "2025-01-01T12:05:00Z", "sessionsLive": 1, "live": true, "this": true}]}))]
pub struct AgentView {
    /// `null` until a member has answered `initialize`.
    pub initialize: Option<AgentInit>,
    pub members: Vec<MemberView>,
    /// The gateway replicas sharing the database, this one included (`this`), oldest first, as
    /// of this replica's last heartbeat.
    pub replicas: Vec<ReplicaView>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Busy {
    Idle,
    Attaching,
    Turn,
}

/// What the gateway knows of a session it has seen since start.
#[derive(Debug)]
struct Entry {
    /// The pool member holding it live, if any.
    member: Option<usize>,
    /// The owning tenant, known once attached (lets status answer without the store).
    tenant: Option<String>,
    /// Whether the cached record is archived, kept in step with every record update (lets a
    /// live session's prompt skip the store read).
    archived: bool,
    busy: Busy,
    /// When it was last attached, prompted or finished a turn (for the idle timeout).
    last_active: Instant,
    /// Closed when the running turn ends.
    turn_done: Option<watch::Receiver<TurnPhase>>,
}

impl Entry {
    fn new() -> Self {
        Entry {
            member: None,
            tenant: None,
            archived: false,
            busy: Busy::Idle,
            last_active: Instant::now(),
            turn_done: None,
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub turns_started: AtomicU64,
    pub turns_failed: AtomicU64,
    pub member_exits: AtomicU64,
}

pub(crate) struct Inner {
    store: Arc<dyn Store>,
    hub: Arc<EventHub>,
    cluster: Cluster,
    /// Forwards requests to the replica holding a session.
    forwarder: reqwest::Client,
    sessions: Mutex<HashMap<String, Entry>>,
    /// Sessions being loaded, and whether their log was empty (then replayed updates are kept).
    replaying: Mutex<HashMap<String, bool>>,
    permissions: permissions::Permissions,
    pub counters: Counters,
    config: GatewayConfig,
    /// Turns, permission timers and the idle reaper.
    tasks: TaskTracker,
    /// Stops the permission timers, the idle reaper and the list sync.
    stop: CancellationToken,
    /// One `session/list` sync at a time (held across the sync's awaits on purpose).
    sync_lock: tokio::sync::Mutex<()>,
    /// Held shared by a create from `session/new` until its row is stored; a sync takes it
    /// exclusively (and drops it at once) after listing, so an id the agent listed because
    /// the gateway just created it is never taken for an upstream session.
    creating: tokio::sync::RwLock<()>,
    /// Numbers the gateway's own changes to cached sessions ([`Inner::update_cached`]).
    touches: AtomicU64,
    /// The number of each session's latest own change, kept until a sync has begun after it.
    touched: Mutex<HashMap<String, u64>>,
    /// Bumped after every write to the session cache; invalidates `list_pages`.
    list_generation: AtomicU64,
    /// Recently read list pages (rows only: status is added per request) of the current
    /// `list_generation`. The gateway is the only writer of its store, so a page stays true
    /// until the generation moves.
    list_pages: Mutex<(u64, HashMap<String, Arc<PageJson>>)>,
}

/// The gateway service. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
    pool: Arc<Pool>,
}

impl Gateway {
    /// Starts the pool; members become ready in the background.
    pub fn start(
        store: Arc<dyn Store>,
        hub: Arc<EventHub>,
        cluster: Cluster,
        pool: PoolConfig,
        config: GatewayConfig,
    ) -> Self {
        let inner = Arc::new(Inner {
            store,
            hub,
            cluster,
            forwarder: reqwest::Client::new(),
            sessions: Mutex::default(),
            replaying: Mutex::default(),
            permissions: permissions::Permissions::default(),
            counters: Counters::default(),
            config,
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            sync_lock: tokio::sync::Mutex::new(()),
            creating: tokio::sync::RwLock::new(()),
            touches: AtomicU64::new(0),
            touched: Mutex::default(),
            list_generation: AtomicU64::new(0),
            list_pages: Mutex::default(),
        });
        let pool = Pool::start(pool, inner.clone());
        let gateway = Gateway { inner, pool };
        let (g, every) = (gateway.clone(), gateway.inner.config.sync_interval);
        gateway
            .inner
            .tasks
            .spawn(async move { g.sync_forever(every).await });
        {
            let g = gateway.clone();
            gateway
                .inner
                .tasks
                .spawn(async move { g.heartbeat_forever().await });
        }
        if let Some(idle) = gateway.inner.config.idle_timeout {
            let g = gateway.clone();
            gateway
                .inner
                .tasks
                .spawn(async move { g.reap_idle(idle).await });
        }
        gateway
    }

    /// Stops background turns and every pool member.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let deadline = self.inner.config.shutdown_timeout;
        if tokio::time::timeout(deadline, self.wind_down())
            .await
            .is_err()
        {
            tracing::warn!("turns or sessions did not end within the shutdown timeout");
        }
        self.pool.shutdown().await;
        self.inner.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.inner.tasks.wait()).await;
    }

    /// Cancels every running turn and closes every live session (when the agent can close).
    async fn wind_down(&self) {
        let live: Vec<String> = {
            let sessions = self.inner.sessions.lock().expect("sessions lock");
            sessions
                .iter()
                .filter(|(_, e)| e.member.is_some() || e.turn_done.is_some())
                .map(|(id, _)| id.clone())
                .collect()
        };
        let close = self.caps().close;
        let timeout = Some(self.inner.config.control_timeout);
        futures::future::join_all(live.into_iter().map(|id| async move {
            self.resolve_permissions_cancelled(&id).await;
            if let Some((member, mut done)) = self.running_turn(&id).await {
                if let Some(conn) = self.pool.conn(member) {
                    let _ = conn
                        .notify("session/cancel", json!({"sessionId": id}))
                        .await;
                }
                let _ = done.changed().await;
            }
            if let (true, Some(conn)) = (close, self.conn_if_live(&id)) {
                let _ = conn
                    .call("session/close", json!({"sessionId": id}), timeout)
                    .await;
            }
        }))
        .await;
    }

    fn caps(&self) -> Capabilities {
        self.pool.init().map(|i| i.capabilities).unwrap_or_default()
    }

    fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// Ready = the store answers and at least one member is ready.
    pub async fn ready(&self) -> Result<(), String> {
        self.store().ping().await.map_err(|e| {
            tracing::error!(error = %e, "readiness: the database does not answer");
            "the database does not answer".to_owned()
        })?;
        match self.pool.unready_reason() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    pub fn agent(&self) -> AgentView {
        AgentView {
            initialize: self.pool.init(),
            members: self.pool.members(),
            replicas: self.inner.cluster.view(),
        }
    }

    /// Sessions held live by a pool member.
    fn live_sessions(&self) -> usize {
        let sessions = self.inner.sessions.lock().expect("sessions lock");
        sessions.values().filter(|e| e.member.is_some()).count()
    }

    /// Sessions held by a replica whose lease expired are `saved` now: their logs get
    /// `agent_exited` (without a member, which was the dead replica's), and the next prompt
    /// resumes them on whichever replica receives it.
    async fn take_over_orphans(&self) {
        let orphans = match self.inner.cluster.release_orphans().await {
            Ok(orphans) => orphans,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for sessions of replicas that died");
                return;
            }
        };
        for id in orphans {
            tracing::warn!(
                session = id,
                "the replica holding the session stopped beating; the session is saved"
            );
            let payload = json!({"sessionId": id, "member": null, "code": null, "signal": null});
            self.inner.append(&id, "agent_exited", payload).await;
        }
    }

    /// Beats in the cluster every heartbeat interval until shutdown, then leaves it.
    async fn heartbeat_forever(&self) {
        let cluster = &self.inner.cluster;
        loop {
            let live = i64::try_from(self.live_sessions()).unwrap_or(i64::MAX);
            if let Err(e) = cluster.beat(live).await {
                tracing::warn!(error = %e, "replica heartbeat failed");
            }
            self.take_over_orphans().await;
            tokio::select! {
                _ = tokio::time::sleep(cluster.interval()) => {}
                _ = self.inner.stop.cancelled() => break,
            }
        }
        if let Err(e) = cluster.leave().await {
            tracing::warn!(error = %e, "could not unregister this replica");
        }
    }

    /// Prometheus text exposition.
    pub fn metrics(&self) -> String {
        use metrics::{counter, describe_counter, describe_gauge, gauge};
        let c = &self.inner.counters;
        let live = self.live_sessions();
        let members = self.pool.members();
        let restarts: u32 = members.iter().map(|m| m.restarts).sum();
        let handle = crate::telemetry::handle();
        // Values the gateway keeps itself are published as of this scrape.
        let set_gauge = |name: &'static str, help: &'static str, value: f64| {
            describe_gauge!(name, help);
            gauge!(name).set(value);
        };
        let set_counter = |name: &'static str, help: &'static str, value: u64| {
            describe_counter!(name, help);
            counter!(name).absolute(value);
        };
        set_gauge(
            "acp_gateway_members",
            "Pool members configured.",
            members.len() as f64,
        );
        set_gauge(
            "acp_gateway_members_ready",
            "Pool members ready.",
            self.pool.ready_count() as f64,
        );
        describe_gauge!("acp_gateway_members_by_state", "Pool members by state.");
        for state in [
            crate::pool::MemberState::Starting,
            crate::pool::MemberState::Ready,
            crate::pool::MemberState::Restarting,
            crate::pool::MemberState::CrashLoop,
            crate::pool::MemberState::Stopped,
        ] {
            let n = members.iter().filter(|m| m.state == state).count();
            let label = serde_json::to_value(state).expect("state serialises");
            let label = label.as_str().unwrap_or_default().to_owned();
            gauge!("acp_gateway_members_by_state", "state" => label).set(n as f64);
        }
        set_counter(
            "acp_gateway_member_restarts_total",
            "Member restarts.",
            u64::from(restarts),
        );
        set_counter(
            "acp_gateway_member_exits_total",
            "Member process exits.",
            c.member_exits.load(Ordering::Relaxed),
        );
        set_gauge(
            "acp_gateway_sessions_live",
            "Sessions loaded in a member.",
            live as f64,
        );
        let replicas = self.inner.cluster.view();
        set_gauge(
            "acp_gateway_replicas",
            "Replicas registered in the database (this one included), as of its last heartbeat.",
            replicas.len() as f64,
        );
        set_gauge(
            "acp_gateway_replicas_live",
            "Registered replicas that beat within three heartbeat intervals.",
            replicas.iter().filter(|r| r.live).count() as f64,
        );
        set_counter(
            "acp_gateway_events_appended_total",
            "Session events appended to the log.",
            self.inner.hub.appended(),
        );
        set_counter(
            "acp_gateway_event_commits_total",
            "Group commits of session events (appended ÷ commits is the mean batch).",
            self.inner.hub.commits(),
        );
        let streams = self.inner.hub.streams();
        set_gauge(
            "acp_gateway_sse_subscribers",
            "SSE streams open now (session and lifecycle).",
            streams.open.load(Ordering::Relaxed) as f64,
        );
        set_counter(
            "acp_gateway_sse_lagged_total",
            "Times an SSE subscriber fell behind the live broadcast and read from the log.",
            streams.lagged.load(Ordering::Relaxed),
        );
        set_counter(
            "acp_gateway_sse_closed_total",
            "SSE streams the gateway closed because the log could not be read (clients reconnect).",
            streams.closed.load(Ordering::Relaxed),
        );
        set_counter(
            "acp_gateway_turns_started_total",
            "Prompt turns started.",
            c.turns_started.load(Ordering::Relaxed),
        );
        set_counter(
            "acp_gateway_turns_failed_total",
            "Prompt turns that ended with an error.",
            c.turns_failed.load(Ordering::Relaxed),
        );
        set_gauge(
            "acp_gateway_permissions_pending",
            "Permission requests awaiting an answer.",
            self.inner.permissions.pending_count() as f64,
        );
        set_counter(
            "acp_gateway_agent_garbage_total",
            "Agent output lines or messages ignored as invalid.",
            crate::acp::garbage_count(),
        );
        handle.run_upkeep();
        handle.render()
    }

    fn status_of(&self, session_id: &str) -> (Status, Option<Activity>) {
        self.inner.status_of(session_id)
    }

    fn view(&self, r: &SessionRecord) -> SessionView {
        self.inner.view(r)
    }

    /// A known, non-deleted session of the caller's, or 404 (another tenant's session is
    /// indistinguishable from an unknown one).
    async fn record(&self, caller: &Caller, id: &SessionId) -> ApiResult<SessionRecord> {
        match self.store().get_session(id.as_str()).await? {
            Some(r) if r.deleted_at.is_none() && caller.sees(&r.tenant) => Ok(r),
            _ => Err(ApiError::NotFound(format!("no session {}", id.as_str()))),
        }
    }

    async fn lifecycle(&self, r: &SessionRecord, kind: &str, extra: Value) {
        self.inner.lifecycle(r, kind, extra).await;
    }

    // ----- sessions -----

    /// `GET /sessions`: the page's JSON (a [`SessionPage`]).
    pub async fn list_sessions(
        &self,
        caller: &Caller,
        p: ListParams,
        fresh: bool,
    ) -> ApiResult<Vec<u8>> {
        let tenant = caller.scope().map(str::to_owned);
        let limit = p.limit.unwrap_or(50);
        if !(1..=200).contains(&limit) {
            return Err(ApiError::BadRequest(
                "limit must be between 1 and 200".into(),
            ));
        }
        if let Some(cwd) = &p.cwd {
            validate_abs_path("cwd", cwd)?;
        }
        if p.refresh == Some(true) {
            self.sync().await?;
        }
        let mut query = ListQuery {
            tenant,
            cwd: p.cwd,
            archived: p.archived,
            after: None,
            limit,
        };
        query.after = p
            .cursor
            .as_deref()
            .map(|c| decode_cursor(&query, c))
            .transpose()?;
        let page = self.inner.list_page(&query, fresh).await?;
        Ok(page.render(|id| self.inner.status_of(id)))
    }

    /// `POST /sessions`.
    pub async fn create_session(
        &self,
        caller: &Caller,
        body: CreateSession,
    ) -> ApiResult<SessionView> {
        let roots = &self.inner.config.workspace_roots;
        validate_abs_path("cwd", &body.cwd)?;
        confine("cwd", &body.cwd, roots)?;
        for d in &body.additional_directories {
            validate_abs_path("additionalDirectories[]", d)?;
            confine("additionalDirectories[]", d, roots)?;
        }
        let (member, conn) = self.place()?;
        let mut params = json!({"cwd": body.cwd, "mcpServers": body.mcp_servers});
        if !body.additional_directories.is_empty() {
            params["additionalDirectories"] = json!(body.additional_directories);
        }
        let creating = self.inner.creating.read().await;
        let result = conn
            .call(
                "session/new",
                params,
                Some(self.inner.config.control_timeout),
            )
            .await?;
        let session_id = result
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::Agent {
                code: -32603,
                message: "session/new returned no sessionId".into(),
            })?
            .to_owned();
        let at = now();
        let record = SessionRecord {
            session_id: session_id.clone(),
            tenant: caller.tenant.clone(),
            cwd: body.cwd,
            additional_directories: body.additional_directories,
            title: None,
            updated_at: at,
            created_at: at,
            meta: None,
            archived: false,
            origin: Origin::Gateway,
            deleted_at: None,
            synced_at: None,
        };
        self.store().put_session(&record).await?;
        drop(creating);
        self.inner.sessions_changed();
        self.attach(&record, member);
        self.inner.hold(&record.session_id).await;
        self.lifecycle(
            &record,
            "session_created",
            json!({"session": self.view(&record)}),
        )
        .await;
        Ok(self.view(&record))
    }

    /// `GET /sessions/{id}`.
    pub async fn get_session(&self, caller: &Caller, id: &SessionId) -> ApiResult<SessionView> {
        Ok(self.view(&self.record(caller, id).await?))
    }

    /// `PATCH /sessions/{id}`: the title, through `session/set_title` when advertised.
    pub async fn patch_session(
        &self,
        caller: &Caller,
        id: &SessionId,
        body: PatchSession,
    ) -> ApiResult<SessionView> {
        self.record(caller, id).await?;
        let mut title = body.title;
        if self.caps().set_title && title.is_none() {
            // session/set_title takes a string, and the agent's list would bring the old
            // title back at the next sync: clearing it only here would be a lie.
            return Err(ApiError::Validation(
                "this agent keeps session titles itself and cannot clear one: set another title"
                    .into(),
            ));
        }
        if let (true, Some(t)) = (self.caps().set_title, &title) {
            let conn = self.conn_for(id.as_str()).ok_or_else(|| self.no_member())?;
            let params = json!({"sessionId": id.as_str(), "title": t});
            let result = conn
                .call(
                    "session/set_title",
                    params,
                    Some(self.inner.config.control_timeout),
                )
                .await?;
            if let Some(stored) = result.get("title").and_then(Value::as_str) {
                title = Some(stored.to_owned());
            }
        }
        let update = json!({ "title": title });
        let at = now();
        let record = self
            .inner
            .update_cached(id.as_str(), &|r| apply_info_update(r, &update, at))
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no session {}", id.as_str())))?;
        self.inner.updated(&record).await;
        Ok(self.view(&record))
    }

    /// `DELETE /sessions/{id}`: idempotent.
    pub async fn delete_session(&self, caller: &Caller, id: &SessionId) -> ApiResult<()> {
        // Another tenant's session, or (for a tenant) an id the cache does not know: exactly
        // as for an unknown id, 204 and no effect.
        let existing = self.store().get_session(id.as_str()).await?;
        match &existing {
            Some(r) if !caller.sees(&r.tenant) => return Ok(()),
            None if !caller.admin => return Ok(()),
            _ => {}
        }
        let caps = self.caps();
        self.resolve_permissions_cancelled(id.as_str()).await;
        let live_conn = self.detach(id.as_str()).and_then(|m| self.pool.conn(m));
        if let Some(conn) = live_conn {
            if caps.close {
                let params = json!({"sessionId": id.as_str()});
                if let Err(e) = conn
                    .call(
                        "session/close",
                        params,
                        Some(self.inner.config.control_timeout),
                    )
                    .await
                {
                    tracing::warn!(session = id.as_str(), error = %e, "session/close before delete failed");
                }
            } else {
                let _ = conn
                    .notify("session/cancel", json!({"sessionId": id.as_str()}))
                    .await;
            }
        }
        let tenant = existing
            .as_ref()
            .map_or(caller.tenant.as_str(), |r| r.tenant.as_str());
        let tombstoned = self
            .store()
            .tombstone_session(id.as_str(), tenant, now())
            .await?;
        self.inner.sessions_changed();
        if tombstoned {
            self.append(
                id.as_str(),
                "session_deleted",
                json!({"sessionId": id.as_str()}),
            )
            .await;
            if let Some(r) = &existing {
                self.lifecycle(r, "session_deleted", json!({})).await;
            }
        }
        if caps.delete {
            let conn = self
                .pool
                .pick()
                .map(|(_, c)| c)
                .ok_or_else(|| self.no_member())?;
            let params = json!({"sessionId": id.as_str()});
            match conn
                .call(
                    "session/delete",
                    params,
                    Some(self.inner.config.control_timeout),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// `GET /sessions/{id}/status`: never loads, resumes or creates anything.
    pub async fn status(&self, caller: &Caller, id: &SessionId) -> ApiResult<StatusView> {
        let view = |status, activity| StatusView {
            session_id: id.as_str().to_owned(),
            status,
            activity,
        };
        // A live session's owner is in memory: no store read (the common, hot case).
        let (status, activity) = self.inner.status_if_owner(id.as_str(), |t| caller.sees(t));
        if status == Status::Live {
            return Ok(view(status, activity));
        }
        let record = self.store().get_session(id.as_str()).await?;
        // Another tenant's session is not_found; so is, for a tenant, an id the cache does not
        // know (sessions only the agent knows belong to the admin).
        let visible = match &record {
            Some(r) => caller.sees(&r.tenant),
            None => caller.admin,
        };
        if !visible || record.as_ref().is_some_and(|r| r.deleted_at.is_some()) {
            return Ok(view(Status::NotFound, None));
        }
        let (status, activity) = self.status_of(id.as_str());
        if status == Status::Live {
            return Ok(view(status, activity));
        }
        let probe = self.caps().status.then(|| self.pool.pick()).flatten();
        if let Some((_, conn)) = probe {
            let params = json!({"sessionId": id.as_str()});
            match conn
                .call(
                    "session/status",
                    params,
                    Some(self.inner.config.control_timeout),
                )
                .await
            {
                Ok(r) => {
                    let status = match r.get("status").and_then(Value::as_str) {
                        Some("open") => Status::Live,
                        _ => Status::Saved,
                    };
                    let activity = (status == Status::Live).then_some(Activity::Idle);
                    return Ok(view(status, activity));
                }
                Err(e) if e.is_not_found() => return Ok(view(Status::NotFound, None)),
                Err(e) => {
                    tracing::warn!(error = %e, "session/status failed; answering from the cache")
                }
            }
        }
        Ok(match record {
            Some(_) => view(Status::Saved, None),
            None => view(Status::NotFound, None),
        })
    }

    /// `POST /sessions/{id}/resume`.
    pub async fn resume(&self, caller: &Caller, id: &SessionId) -> ApiResult<SessionView> {
        let record = self.record(caller, id).await?;
        if self.status_of(id.as_str()).0 != Status::Live {
            let _claim = self.claim(id.as_str(), Busy::Attaching)?;
            self.ensure_live(&record).await?;
        }
        Ok(self.view(&record))
    }

    /// `POST /sessions/{id}/close`.
    pub async fn close(&self, caller: &Caller, id: &SessionId) -> ApiResult<()> {
        let record = self.record(caller, id).await?;
        let member = {
            self.inner
                .sessions
                .lock()
                .expect("sessions lock")
                .get(id.as_str())
                .and_then(|e| e.member)
        };
        let Some(member) = member else { return Ok(()) };
        if !self.caps().close {
            return Err(ApiError::NotSupported(
                "the agent does not support session/close".into(),
            ));
        }
        // Pending permission requests are answered first, so that their `permission_resolved`
        // comes before the `turn_ended` that closing causes.
        self.resolve_permissions_cancelled(id.as_str()).await;
        if let Some(conn) = self.pool.conn(member) {
            conn.call(
                "session/close",
                json!({"sessionId": id.as_str()}),
                Some(self.inner.config.control_timeout),
            )
            .await?;
        }
        self.detach(id.as_str());
        self.lifecycle(&record, "session_status", json!({"status": Status::Saved}))
            .await;
        Ok(())
    }

    /// `POST /sessions/{id}/archive` and `/unarchive`. Archived sessions are listed only with
    /// `archived=true` and must be unarchived before they are prompted or resumed. Through
    /// `session/archive`/`session/unarchive` when the agent advertises them (archiving frees
    /// the session on the agent, as a close); else in the cache only, a live session being
    /// closed when the agent can close. A running turn must end first (409).
    pub async fn set_archived(
        &self,
        caller: &Caller,
        id: &SessionId,
        archived: bool,
    ) -> ApiResult<SessionView> {
        self.record(caller, id).await?;
        let _claim = self.claim(id.as_str(), Busy::Attaching)?;
        let caps = self.caps();
        let live = self.conn_if_live(id.as_str());
        if archived && live.is_some() {
            self.resolve_permissions_cancelled(id.as_str()).await;
        }
        let timeout = Some(self.inner.config.control_timeout);
        let params = json!({"sessionId": id.as_str()});
        if caps.archive {
            let conn = self.conn_for(id.as_str()).ok_or_else(|| self.no_member())?;
            let method = if archived {
                "session/archive"
            } else {
                "session/unarchive"
            };
            conn.call(method, params, timeout).await?;
        } else if let (true, Some(conn), true) = (archived, &live, caps.close) {
            conn.call("session/close", params, timeout).await?;
        }
        let freed = archived && (caps.archive || caps.close) && self.detach(id.as_str()).is_some();
        let record = self
            .inner
            .update_cached(id.as_str(), &|r| r.archived = archived)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no session {}", id.as_str())))?;
        if freed {
            self.lifecycle(&record, "session_status", json!({"status": Status::Saved}))
                .await;
        }
        self.inner.updated(&record).await;
        Ok(self.view(&record))
    }

    // ----- turns -----

    /// `POST /sessions/{id}/prompt`. With `wait = false` the turn runs in the background and
    /// this returns once it has started.
    pub async fn prompt(
        &self,
        caller: &Caller,
        id: &SessionId,
        body: PromptBody,
        wait: bool,
    ) -> ApiResult<Option<TurnResult>> {
        let prompt = match (body.prompt, body.text) {
            (Some(p), None) if !p.is_empty() => p,
            (None, Some(t)) => vec![json!({"type": "text", "text": t})],
            _ => {
                return Err(ApiError::Validation(
                    "give exactly one of `prompt` (non-empty ContentBlock[]) or `text`".into(),
                ));
            }
        };
        if prompt
            .iter()
            .any(|b| b.get("type").and_then(Value::as_str).is_none())
        {
            return Err(ApiError::Validation(
                "every prompt block needs a string `type`".into(),
            ));
        }
        // A live session's owner and archived flag are in memory: no store read (the hot case).
        let sees = |t: &str| caller.sees(t);
        let record = match self.inner.live_member(id.as_str(), sees) {
            Some(_) => None,
            None => Some(self.record(caller, id).await?),
        };
        let claim = self.claim(id.as_str(), Busy::Turn)?;
        let member = match (self.inner.live_member(id.as_str(), sees), record) {
            (Some(m), _) => m,
            (None, Some(r)) => self.ensure_live(&r).await?,
            (None, None) => self.ensure_live(&self.record(caller, id).await?).await?,
        };
        let conn = self.pool.conn(member).ok_or_else(|| self.no_member())?;
        self.inner
            .counters
            .turns_started
            .fetch_add(1, Ordering::Relaxed);
        // Queued, not awaited: the log's order is the queue's, so it precedes every update the
        // agent sends for this turn, and the prompt goes out without waiting for a commit. The
        // session's `updatedAt` moves with it, in the same commit.
        self.inner
            .enqueue_touching(
                id.as_str(),
                "turn_started",
                json!({"sessionId": id.as_str(), "prompt": prompt}),
            )
            .await;
        // A client hanging up never leaves the turn without its `turn_ended` event: waited for,
        // the turn finishes in a task of its own if the request is dropped; not waited for, it
        // runs in one from the start. Its events are queued in order, not awaited: the answer
        // does not wait for a commit, and log readers (`/history`) flush the queue first.
        let this = self.clone();
        let sid = id.as_str().to_owned();
        let params = json!({"sessionId": sid, "prompt": prompt});
        let sent = conn.send_request("session/prompt", params).await;
        claim.mark_sent();
        let turn = async move {
            let _claim = claim;
            let outcome = match sent {
                Ok(call) => call.wait(None).await,
                Err(e) => Err(e),
            };
            let ended = match &outcome {
                Ok(result) => {
                    let stop = result.get("stopReason").cloned().unwrap_or(Value::Null);
                    json!({"sessionId": sid, "stopReason": stop})
                }
                Err(e) => {
                    this.inner
                        .counters
                        .turns_failed
                        .fetch_add(1, Ordering::Relaxed);
                    let problem = ApiError::from_call(e.clone()).problem();
                    json!({"sessionId": sid, "error": problem})
                }
            };
            this.inner.enqueue(&sid, "turn_ended", ended).await;
            outcome
        };
        if !wait {
            self.inner.tasks.spawn(turn);
            return Ok(None);
        }
        let result = FinishOnDrop::new(turn, &self.inner.tasks).await?;
        let stop_reason = result
            .get("stopReason")
            .and_then(Value::as_str)
            .unwrap_or("end_turn")
            .to_owned();
        Ok(Some(TurnResult {
            stop_reason,
            result,
        }))
    }

    /// `POST /sessions/{id}/cancel`.
    pub async fn cancel(&self, caller: &Caller, id: &SessionId) -> ApiResult<()> {
        self.record(caller, id).await?;
        self.resolve_permissions_cancelled(id.as_str()).await;
        let Some((member, mut done)) = self.running_turn(id.as_str()).await else {
            return Ok(());
        };
        if let Some(conn) = self.pool.conn(member) {
            conn.notify("session/cancel", json!({"sessionId": id.as_str()}))
                .await?;
        }
        // The turn must end promptly: an agent that ignores the cancel is restarted, which
        // fails the turn (and its waiter) with `agent_exited`. The watch runs in its own task so
        // that it happens even if this request is dropped (client gone, request timeout).
        let (pool, grace, bound) = (
            self.pool.clone(),
            self.inner.config.cancel_grace,
            self.inner.config.control_timeout,
        );
        let watch = self.inner.tasks.spawn(async move {
            if tokio::time::timeout(grace, done.changed()).await.is_err() {
                pool.restart_member(member, "a turn ignored session/cancel");
                let _ = tokio::time::timeout(bound, done.changed()).await;
            }
        });
        let _ = watch.await;
        Ok(())
    }

    /// For a running turn: waits (bounded) until its prompt is on its way to the agent, so that a
    /// cancel cannot overtake it; returns its member and a receiver that closes when it ends.
    async fn running_turn(&self, session_id: &str) -> Option<(usize, watch::Receiver<TurnPhase>)> {
        let mut done = {
            let sessions = self.inner.sessions.lock().expect("sessions lock");
            sessions.get(session_id)?.turn_done.clone()?
        };
        let bound = self.inner.config.control_timeout;
        let sent = tokio::time::timeout(bound, done.wait_for(|p| *p == TurnPhase::Sent))
            .await
            .is_ok_and(|r| r.is_ok());
        if !sent {
            return None;
        }
        let sessions = self.inner.sessions.lock().expect("sessions lock");
        let member = sessions.get(session_id)?.member?;
        Some((member, done))
    }

    // ----- permissions -----

    /// `GET /sessions/{id}/permissions`.
    pub async fn permissions(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> ApiResult<Vec<PermissionView>> {
        self.record(caller, id).await?;
        Ok(self.inner.permissions.pending_for(id.as_str()))
    }

    /// `POST /sessions/{id}/permissions/{requestId}`.
    pub async fn answer_permission(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        answer: PermissionAnswer,
    ) -> ApiResult<PermissionView> {
        self.record(caller, id).await?;
        let (view, conn, upstream_id, outcome) =
            self.inner
                .permissions
                .answer(id.as_str(), request_id, answer)?;
        let _ = conn
            .respond(upstream_id, Ok(json!({"outcome": outcome.clone()})))
            .await;
        let payload = json!({"sessionId": id.as_str(), "requestId": request_id, "outcome": outcome, "reason": "answered"});
        self.append(id.as_str(), "permission_resolved", payload)
            .await;
        Ok(view)
    }

    async fn resolve_permissions_cancelled(&self, session_id: &str) {
        for (request_id, conn, upstream_id) in self.inner.permissions.cancel_all(session_id) {
            let outcome = json!({"outcome": "cancelled"});
            let _ = conn
                .respond(upstream_id, Ok(json!({"outcome": outcome.clone()})))
                .await;
            let payload = json!({"sessionId": session_id, "requestId": request_id, "outcome": outcome, "reason": "cancelled"});
            self.append(session_id, "permission_resolved", payload)
                .await;
        }
    }

    // ----- placement -----

    /// Where a session that becomes live goes: the least-loaded ready member below the
    /// per-member cap, if the global cap allows another live session.
    fn place(&self) -> ApiResult<(usize, Arc<Connection>)> {
        let cfg = &self.inner.config;
        if cfg.max_sessions > 0 && self.inner.live_count() >= cfg.max_sessions {
            return Err(ApiError::PoolExhausted(format!(
                "the gateway already holds its maximum of {} live sessions; close some or try again later",
                cfg.max_sessions
            )));
        }
        let cap = match cfg.max_sessions_per_member {
            0 => usize::MAX,
            n => n,
        };
        self.pool.pick_below(cap).ok_or_else(|| match self.pool.unready_reason() {
            Some(why) => ApiError::PoolExhausted(why),
            None => ApiError::PoolExhausted(format!(
                "every ready agent member already holds its maximum of {cap} live sessions; close some or try again later"
            )),
        })
    }

    fn no_member(&self) -> ApiError {
        ApiError::PoolExhausted(
            self.pool
                .unready_reason()
                .unwrap_or_else(|| "no agent member is ready".into()),
        )
    }

    /// Closes live sessions that have been idle longer than `idle`, when the agent can close.
    async fn reap_idle(&self, idle: Duration) {
        let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = self.inner.stop.cancelled() => return,
            }
            if !self.caps().close {
                continue;
            }
            let idle_sessions: Vec<(String, usize)> = {
                let sessions = self.inner.sessions.lock().expect("sessions lock");
                sessions
                    .iter()
                    .filter(|(_, e)| e.busy == Busy::Idle && e.last_active.elapsed() >= idle)
                    .filter_map(|(id, e)| e.member.map(|m| (id.clone(), m)))
                    .collect()
            };
            for (id, member) in idle_sessions {
                if self.inner.permissions.has_pending(&id) {
                    continue;
                }
                let Ok(_claim) = self.claim(&id, Busy::Attaching) else {
                    continue;
                };
                if let Some(conn) = self.pool.conn(member) {
                    let params = json!({"sessionId": id});
                    let timeout = Some(self.inner.config.control_timeout);
                    if let Err(e) = conn.call("session/close", params, timeout).await {
                        tracing::warn!(session = id, error = %e, "closing an idle session failed");
                        continue;
                    }
                }
                self.detach(&id);
                tracing::info!(session = id, "closed an idle session");
                if let Ok(Some(record)) = self.store().get_session(&id).await {
                    self.lifecycle(
                        &record,
                        "session_status",
                        json!({"status": Status::Saved, "reason": "idle"}),
                    )
                    .await;
                }
            }
        }
    }

    /// Marks the session busy (409 if it already is); the guard frees it on drop.
    fn claim(&self, session_id: &str, what: Busy) -> ApiResult<Claim> {
        let mut sessions = self.inner.sessions.lock().expect("sessions lock");
        let entry = sessions
            .entry(session_id.to_owned())
            .or_insert_with(Entry::new);
        if entry.busy != Busy::Idle {
            return Err(ApiError::Conflict(
                "a turn is already running on this session (or it is being resumed)".into(),
            ));
        }
        entry.busy = what;
        entry.last_active = Instant::now();
        let done = (what == Busy::Turn).then(|| {
            let (tx, rx) = watch::channel(TurnPhase::Starting);
            entry.turn_done = Some(rx);
            tx
        });
        Ok(Claim {
            inner: self.inner.clone(),
            session_id: session_id.to_owned(),
            _done: done,
        })
    }

    /// Returns the member holding the session, attaching it (resume, else load) if needed.
    /// The caller holds a [`Claim`].
    async fn ensure_live(&self, record: &SessionRecord) -> ApiResult<usize> {
        let id = record.session_id.as_str();
        let held = {
            self.inner
                .sessions
                .lock()
                .expect("sessions lock")
                .get(id)
                .and_then(|e| e.member)
        };
        // Before the live shortcut: an agent that can neither archive nor close keeps an
        // archived session in memory, and it still must not be prompted.
        if record.archived {
            return Err(ApiError::Conflict(format!(
                "session {id} is archived: unarchive it (POST /sessions/{id}/unarchive) first"
            )));
        }
        if let Some(m) = held {
            return Ok(m);
        }
        if !self.inner.cluster.claim(id).await? {
            return Err(ApiError::ReplicaUnavailable(format!(
                "session {id} is live on another gateway replica; retry"
            )));
        }
        let attached = self.attach_here(record).await;
        if attached.is_err() {
            self.inner.release(id).await;
        }
        attached
    }

    /// Resumes (else loads) the session on a member of this replica's pool.
    async fn attach_here(&self, record: &SessionRecord) -> ApiResult<usize> {
        let id = record.session_id.as_str();
        let caps = self.caps();
        let (member, conn) = self.place()?;
        let params = json!({"sessionId": id, "cwd": record.cwd, "mcpServers": []});
        if caps.resume {
            conn.call(
                "session/resume",
                params,
                Some(self.inner.config.control_timeout),
            )
            .await?;
        } else if caps.load {
            let log_empty = self.store().last_event_seq(id).await? == 0;
            self.inner
                .replaying
                .lock()
                .expect("replaying lock")
                .insert(id.to_owned(), log_empty);
            let r = conn
                .call(
                    "session/load",
                    params,
                    Some(self.inner.config.control_timeout),
                )
                .await;
            self.inner
                .replaying
                .lock()
                .expect("replaying lock")
                .remove(id);
            r?;
        } else {
            return Err(ApiError::NotSupported(
                "the session is not live and the agent supports neither session/resume nor session/load".into(),
            ));
        }
        self.attach(record, member);
        self.lifecycle(record, "session_status", json!({"status": Status::Live}))
            .await;
        Ok(member)
    }

    fn attach(&self, record: &SessionRecord, member: usize) {
        let mut sessions = self.inner.sessions.lock().expect("sessions lock");
        let entry = sessions
            .entry(record.session_id.clone())
            .or_insert_with(Entry::new);
        entry.last_active = Instant::now();
        entry.tenant = Some(record.tenant.clone());
        entry.archived = record.archived;
        if entry.member.is_none() {
            self.pool.adjust_sessions(member, true);
        }
        entry.member = Some(member);
    }

    /// Forgets where the session is live; returns the member it was on.
    fn detach(&self, session_id: &str) -> Option<usize> {
        let mut sessions = self.inner.sessions.lock().expect("sessions lock");
        let entry = sessions.get_mut(session_id)?;
        let member = entry.member.take();
        if let Some(m) = member {
            self.pool.adjust_sessions(m, false);
        }
        if entry.busy == Busy::Idle {
            sessions.remove(session_id);
        }
        drop(sessions);
        if member.is_some() {
            let (inner, id) = (self.inner.clone(), session_id.to_owned());
            self.inner
                .tasks
                .spawn(async move { inner.release(&id).await });
        }
        member
    }

    /// The address of the other replica holding `session_id` live, if one does.
    pub async fn owner_elsewhere(&self, session_id: &str) -> ApiResult<Option<String>> {
        let here = {
            let sessions = self.inner.sessions.lock().expect("sessions lock");
            sessions
                .get(session_id)
                .is_some_and(|e| e.member.is_some() || e.busy != Busy::Idle)
        };
        if here {
            return Ok(None);
        }
        Ok(self.inner.cluster.owner_elsewhere(session_id).await?)
    }

    /// The other replica a new session should be created on, if one holds fewer sessions.
    pub fn place_elsewhere(&self) -> Option<String> {
        let here = i64::try_from(self.live_sessions()).unwrap_or(i64::MAX);
        self.inner.cluster.place_elsewhere(here)
    }

    /// The HTTP client that forwards requests to other replicas.
    pub fn forwarder(&self) -> &reqwest::Client {
        &self.inner.forwarder
    }

    fn conn_if_live(&self, session_id: &str) -> Option<Arc<Connection>> {
        let member = self
            .inner
            .sessions
            .lock()
            .expect("sessions lock")
            .get(session_id)
            .and_then(|e| e.member)?;
        self.pool.conn(member)
    }

    /// The member holding the session, or any ready member.
    fn conn_for(&self, session_id: &str) -> Option<Arc<Connection>> {
        self.conn_if_live(session_id)
            .or_else(|| self.pool.pick().map(|(_, c)| c))
    }

    async fn append(&self, session_id: &str, kind: &str, payload: Value) {
        self.inner.append(session_id, kind, payload).await;
    }
}

/// Option kinds a permission policy of `allow` picks, in order of preference.
const ALLOW: [&str; 2] = ["allow_once", "allow_always"];
/// Option kinds chosen when refusing (policy `reject`, or a timeout), in order of preference.
const REJECT: [&str; 2] = ["reject_once", "reject_always"];

/// A future run by its caller that, if dropped unfinished (the client hung up), is finished in
/// a task of `tasks` instead. Unlike spawning it from the start, this costs no task and no
/// wake-up of another runtime thread in the common case.
struct FinishOnDrop<T: Send + 'static> {
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    tasks: TaskTracker,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    fn new(future: impl Future<Output = T> + Send + 'static, tasks: &TaskTracker) -> Self {
        FinishOnDrop {
            future: Some(Box::pin(future)),
            tasks: tasks.clone(),
        }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let future = self
            .future
            .as_mut()
            .expect("FinishOnDrop polled after it finished");
        let out = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let (Some(future), Ok(runtime)) =
            (self.future.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        self.tasks.spawn_on(
            async move {
                future.await;
            },
            &runtime,
        );
    }
}

/// Frees a session's busy mark when dropped.
struct Claim {
    inner: Arc<Inner>,
    session_id: String,
    /// For a turn: dropping it tells `cancel` (and shutdown) that the turn ended.
    _done: Option<watch::Sender<TurnPhase>>,
}

impl Claim {
    /// The turn's `session/prompt` is on its way to the agent: a cancel can follow it now.
    fn mark_sent(&self) {
        if let Some(tx) = &self._done {
            tx.send_replace(TurnPhase::Sent);
        }
    }
}

/// Where a turn is; the channel closes when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TurnPhase {
    /// Attaching the session, or not yet sent.
    Starting,
    /// `session/prompt` is queued for (or at) the agent.
    Sent,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut sessions = self.inner.sessions.lock().expect("sessions lock");
        if let Some(entry) = sessions.get_mut(&self.session_id) {
            entry.busy = Busy::Idle;
            entry.turn_done = None;
            entry.last_active = Instant::now();
            if entry.member.is_none() {
                sessions.remove(&self.session_id);
            }
        }
    }
}

impl Inner {
    /// Records that this replica holds a session it made live.
    async fn hold(&self, session_id: &str) {
        if let Err(e) = self.cluster.claim(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot record that this replica holds the session");
        }
    }

    /// Records that this replica no longer holds a session.
    async fn release(&self, session_id: &str) {
        if let Err(e) = self.cluster.release(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot record that this replica gave the session up");
        }
    }

    /// Changes a cached session on the gateway's own authority (not from a listing). The
    /// change is noted so that a sync whose listing began earlier does not undo it.
    async fn update_cached(
        &self,
        session_id: &str,
        mutate: crate::store::SessionMutation<'_>,
    ) -> crate::store::StoreResult<Option<SessionRecord>> {
        self.mark_touched(session_id);
        let updated = self.store.update_session(session_id, mutate).await;
        self.sessions_changed();
        if let Ok(Some(r)) = &updated {
            self.record_changed(r);
        }
        updated
    }

    /// Notes a change of the gateway's own to a cached session, before it is written, so that
    /// a list sync running meanwhile does not undo it with what the agent had before.
    fn mark_touched(&self, session_id: &str) {
        let n = self.touches.fetch_add(1, Ordering::SeqCst) + 1;
        self.touched
            .lock()
            .expect("touched lock")
            .insert(session_id.to_owned(), n);
    }

    /// Keeps the in-memory entry in step with a changed cached record.
    fn record_changed(&self, r: &SessionRecord) {
        if let Some(e) = self
            .sessions
            .lock()
            .expect("sessions lock")
            .get_mut(&r.session_id)
        {
            e.archived = r.archived;
        }
    }

    /// The member holding a session live, when `owner_ok` accepts its tenant and it is not
    /// archived: everything a prompt needs to know, without a store read.
    fn live_member(&self, session_id: &str, owner_ok: impl FnOnce(&str) -> bool) -> Option<usize> {
        match self.sessions.lock().expect("sessions lock").get(session_id) {
            Some(Entry {
                member: Some(m),
                tenant: Some(tenant),
                archived: false,
                ..
            }) if owner_ok(tenant) => Some(*m),
            _ => None,
        }
    }

    /// Moves after every committed write to the session cache: the gateway's own, counted
    /// here, and prompts' `updatedAt`, committed by the event writer.
    fn list_generation(&self) -> u64 {
        self.list_generation.load(Ordering::SeqCst) + self.hub.touches()
    }

    /// Call after every write to the session cache (once it has committed).
    fn sessions_changed(&self) {
        self.list_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// One page of the session list, from `list_pages` when it holds the page (unless
    /// `fresh`), else from the store.
    async fn list_page(
        &self,
        query: &ListQuery,
        fresh: bool,
    ) -> crate::store::StoreResult<Arc<PageJson>> {
        /// Pages kept per generation; beyond it the cache starts over.
        const MAX_PAGES: usize = 1024;
        let key = format!("{query:?}");
        let generation = self.list_generation();
        if !fresh {
            let pages = self.list_pages.lock().expect("list cache lock");
            if let Some(page) = pages.1.get(&key).filter(|_| pages.0 == generation) {
                return Ok(page.clone());
            }
        }
        let list = self.store.list_sessions(query).await?;
        let next_cursor = list.next.as_ref().map(|n| encode_cursor(query, n));
        let page = Arc::new(PageJson::new(&list.sessions, next_cursor));
        let mut pages = self.list_pages.lock().expect("list cache lock");
        // Only a page read entirely within one generation may be kept for it.
        if self.list_generation() == generation {
            if pages.0 != generation || pages.1.len() >= MAX_PAGES {
                *pages = (generation, HashMap::new());
            }
            pages.1.insert(key, page.clone());
        }
        Ok(page)
    }

    fn live_count(&self) -> usize {
        let sessions = self.sessions.lock().expect("sessions lock");
        sessions.values().filter(|e| e.member.is_some()).count()
    }

    fn status_of(&self, session_id: &str) -> (Status, Option<Activity>) {
        self.status_if_owner(session_id, |_| true)
    }

    /// The session's status, as live only if it is live and `owner_ok` accepts its owner.
    fn status_if_owner(
        &self,
        session_id: &str,
        owner_ok: impl FnOnce(&str) -> bool,
    ) -> (Status, Option<Activity>) {
        let sessions = self.sessions.lock().expect("sessions lock");
        match sessions.get(session_id) {
            Some(Entry {
                member: Some(_),
                tenant: Some(tenant),
                busy,
                ..
            }) if owner_ok(tenant) => {
                let activity = if self.permissions.has_pending(session_id) {
                    Activity::AwaitingPermission
                } else if *busy == Busy::Turn {
                    Activity::Running
                } else {
                    Activity::Idle
                };
                (Status::Live, Some(activity))
            }
            _ => (Status::Saved, None),
        }
    }

    fn view(&self, r: &SessionRecord) -> SessionView {
        let (status, activity) = self.status_of(&r.session_id);
        SessionView::new(r, status, activity)
    }

    /// The `session_updated` lifecycle event of a changed cached session.
    async fn updated(&self, r: &SessionRecord) {
        self.lifecycle(r, "session_updated", json!({"session": self.view(r)}))
            .await;
    }

    async fn lifecycle(&self, r: &SessionRecord, kind: &str, extra: Value) {
        let mut payload = json!({"sessionId": r.session_id});
        if let (Value::Object(p), Value::Object(e)) = (&mut payload, extra) {
            p.extend(e);
        }
        let ev = NewLifecycleEvent {
            session_id: r.session_id.clone(),
            tenant: r.tenant.clone(),
            kind: kind.into(),
            payload,
        };
        if let Err(e) = self.hub.lifecycle(ev).await {
            tracing::error!(error = %e, kind, "cannot append a lifecycle event");
        }
    }

    async fn append(&self, session_id: &str, kind: &str, payload: Value) {
        let event = NewEvent {
            kind: kind.to_owned(),
            payload,
        };
        // Errors are logged by the writer.
        let _ = self.hub.append(session_id, event).await;
    }

    /// Appends without waiting for the store: used on the dispatch loop so that a streaming
    /// agent is read at the writer's pace, not one commit per update. Order is kept.
    async fn enqueue(&self, session_id: &str, kind: &str, payload: Value) {
        let event = NewEvent {
            kind: kind.to_owned(),
            payload,
        };
        self.hub.enqueue(session_id, event).await;
    }

    /// As [`Inner::enqueue`], and the session's `updatedAt` becomes now, in the same commit (a
    /// change of the gateway's own, see [`Inner::mark_touched`]).
    async fn enqueue_touching(&self, session_id: &str, kind: &str, payload: Value) {
        self.mark_touched(session_id);
        let event = NewEvent {
            kind: kind.to_owned(),
            payload,
        };
        self.hub.enqueue_touching(session_id, event, now()).await;
    }

    /// Resolves a still-pending permission request without a client: the first offered option
    /// of the preferred kinds, else `cancelled`.
    async fn resolve_auto(&self, request_id: &str, prefer: &[&str], reason: &str) {
        let Some(done) = self.permissions.resolve_auto(request_id, prefer) else {
            return;
        };
        let _ = done
            .conn
            .respond(
                done.upstream_id,
                Ok(json!({"outcome": done.outcome.clone()})),
            )
            .await;
        let payload = json!({"sessionId": done.session_id, "requestId": request_id, "outcome": done.outcome, "reason": reason});
        self.append(&done.session_id, "permission_resolved", payload)
            .await;
    }

    async fn on_session_update(&self, params: Value) {
        let Some(session_id) = params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            crate::acp::count_garbage();
            tracing::warn!("session/update without a sessionId; ignored");
            return;
        };
        let kind = params
            .pointer("/update/sessionUpdate")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned();
        let replay = self
            .replaying
            .lock()
            .expect("replaying lock")
            .get(&session_id)
            .copied();
        match replay {
            Some(false) => return, // already in the log: a load replays what we stored live
            Some(true) => {
                let mut payload = params;
                payload["replay"] = json!(true);
                self.enqueue(&session_id, &kind, payload).await;
                return;
            }
            None => {}
        }
        // Only an info update is needed after it is queued: the others are moved, not copied.
        let info = (kind == "session_info_update")
            .then(|| params.get("update").cloned().unwrap_or(Value::Null));
        self.enqueue(&session_id, &kind, params).await;
        if let Some(update) = info {
            let at = now();
            match self
                .update_cached(&session_id, &|r| apply_info_update(r, &update, at))
                .await
            {
                Ok(Some(r)) => {
                    self.updated(&r).await;
                }
                Ok(None) => tracing::debug!(
                    session = session_id,
                    "session_info_update for a session not in the cache"
                ),
                Err(e) => tracing::error!(error = %e, "cannot apply session_info_update"),
            }
        }
    }
}

#[async_trait]
impl UpstreamHandler for Inner {
    async fn on_notification(&self, member: usize, method: &str, params: Value) {
        if method == "session/update" {
            self.on_session_update(params).await;
        } else {
            tracing::debug!(member, method, "notification from the agent ignored");
        }
    }

    async fn on_permission_request(
        self: Arc<Self>,
        member: usize,
        conn: Arc<Connection>,
        id: Value,
        params: Value,
    ) {
        let Some(session_id) = params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            let err = crate::acp::RpcError {
                code: -32602,
                message: "sessionId is required".into(),
                data: None,
            };
            let _ = conn.respond(id, Err(err)).await;
            return;
        };
        let view = self.permissions.add(&session_id, member, conn, id, params);
        let payload =
            json!({"sessionId": session_id, "requestId": view.request_id, "request": view.request});
        self.append(&session_id, "permission_requested", payload)
            .await;
        let request_id = view.request_id;
        match self.config.permission_policy {
            PermissionPolicy::Allow => {
                self.resolve_auto(&request_id, &ALLOW, "policy").await;
            }
            PermissionPolicy::Reject => {
                self.resolve_auto(&request_id, &REJECT, "policy").await;
            }
            PermissionPolicy::Ask => {
                if let Some(after) = self.config.permission_timeout {
                    let inner = self.clone();
                    self.tasks.spawn(async move {
                        tokio::select! {
                            _ = tokio::time::sleep(after) => {
                                inner.resolve_auto(&request_id, &REJECT, "timeout").await;
                            }
                            _ = inner.stop.cancelled() => {}
                        }
                    });
                }
            }
        }
    }

    async fn on_member_exit(&self, member: usize, exit: &ExitInfo) {
        self.counters.member_exits.fetch_add(1, Ordering::Relaxed);
        let affected: Vec<String> = {
            let mut sessions = self.sessions.lock().expect("sessions lock");
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
            sessions.retain(|_, e| e.member.is_some() || e.busy != Busy::Idle);
            ids
        };
        for (session_id, request_id) in self.permissions.drop_member(member) {
            let payload = json!({"sessionId": session_id, "requestId": request_id, "outcome": {"outcome": "cancelled"}, "reason": "cancelled"});
            self.append(&session_id, "permission_resolved", payload)
                .await;
        }
        for id in affected {
            let payload = json!({"sessionId": id, "member": member, "code": exit.code, "signal": exit.signal});
            self.append(&id, "agent_exited", payload).await;
            self.release(&id).await;
        }
    }
}

/// One stored event as `GET /sessions/{id}/history` returns it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEvent {
    /// The event's sequence number (the SSE `id`).
    pub seq: i64,
    /// The SSE `event` name.
    pub event: String,
    /// The SSE `data`.
    #[schema(value_type = Object)]
    pub data: Value,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A page of history.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"events": [{"seq": 1, "event": "turn_started", "data": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "prompt": [{"type": "text", "text": "hi"}]}, "createdAt": "2026-11-22T12:47:51.068421Z"}, {"seq": 2, "event": "agent_message_chunk", "data": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}, "createdAt": "2026-11-22T12:47:51.073427Z"}], "nextAfter": 2}))]
pub struct HistoryPage {
    pub events: Vec<HistoryEvent>,
    /// Pass as `after` for the next page; absent when this page reached the end of the log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<i64>,
}

impl Gateway {
    /// `GET /sessions/{id}/events`: the SSE stream from `after` (`None`: live tail).
    pub async fn session_events(
        &self,
        caller: &Caller,
        id: &SessionId,
        after: Option<i64>,
    ) -> ApiResult<impl futures::Stream<Item = bytes::Bytes> + Send + use<>> {
        self.record(caller, id).await?;
        Ok(self.inner.hub.session_sse(id.as_str(), after).await?)
    }

    /// `GET /events`: lifecycle events from `after` (`None`: live tail).
    pub async fn lifecycle_events(
        &self,
        caller: &Caller,
        after: Option<i64>,
    ) -> ApiResult<impl futures::Stream<Item = bytes::Bytes> + Send + use<>> {
        Ok(self
            .inner
            .hub
            .lifecycle_sse(caller.scope().map(str::to_owned), after)
            .await?)
    }

    /// `GET /sessions/{id}/history`.
    pub async fn history(
        &self,
        caller: &Caller,
        id: &SessionId,
        after: i64,
        limit: i64,
    ) -> ApiResult<HistoryPage> {
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::BadRequest(
                "limit must be between 1 and 1000".into(),
            ));
        }
        if after < 0 {
            return Err(ApiError::BadRequest("after must be >= 0".into()));
        }
        self.record(caller, id).await?;
        // Events queued before this request (a turn just answered) are read too.
        self.inner.hub.flush().await;
        let rows = self
            .store()
            .read_events(id.as_str(), after, limit + 1)
            .await?;
        let more = rows.len() as i64 > limit;
        let events: Vec<HistoryEvent> = rows
            .into_iter()
            .take(limit as usize)
            .map(|e| HistoryEvent {
                seq: e.seq,
                event: e.kind,
                data: e.payload,
                created_at: e.created_at,
            })
            .collect();
        let next_after = if more {
            events.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(HistoryPage { events, next_after })
    }
}
