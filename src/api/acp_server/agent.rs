//! One ACP connection's agent: the gateway's own operations behind ACP methods, for the
//! connection's caller. `session/new`, `prompt`, `cancel`, `set_mode`, `set_model`,
//! `set_config_option`, `close`, `delete` and `list` are the REST routes' use cases;
//! `session/new` takes `_meta.workspace` as `POST /sessions` takes `workspace` (and answers
//! with the workspace made as `_meta.workspace`); `session/load` replays the session's
//! durable log (whether or not the agent can load) and `session/resume` follows it from now.
//! A prompt's turn belongs to the gateway: a connection that drops does not stop it. A
//! session call for a session another replica serves is carried out there (`remote.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::Responder;
use agent_client_protocol::{
    Agent, Client, ConnectTo, Error as RpcError, UntypedMessage, on_receive_notification,
    on_receive_request,
};
use serde_json::{Value, json};
use tracing::Instrument as _;

use super::follow::{self, Attached, Ctx, Cx, Event};
use super::remote::Remote;
use crate::api::sessions::WorkspaceRequest;
use crate::gateway::input::SessionId;
use crate::gateway::{
    Caller, Error, EventKind, Gateway, NewSession, NewWorkspace, Prompt, SessionFilter,
};

/// How long a prompt's answer waits, once the turn has ended, for the turn's last updates to
/// have been sent to the client (they are normally there first).
const TAIL_WAIT: Duration = Duration::from_secs(5);

/// History page size when `session/load` replays a log.
const REPLAY_PAGE: i64 = 1000;

/// One connection's state.
struct Conn {
    gateway: Gateway,
    caller: Caller,
    /// Where calls for a session another replica serves go.
    remote: Remote,
    elicitation: Mutex<Option<Value>>,
    /// The sessions this connection follows.
    attached: Mutex<HashMap<String, Arc<Attached>>>,
}

/// The agent a new connection talks to.
pub(super) fn connection(
    gateway: Gateway,
    caller: Caller,
    remote: Remote,
) -> impl ConnectTo<Client> {
    let conn = Arc::new(Conn {
        gateway,
        caller,
        remote,
        elicitation: Mutex::default(),
        attached: Mutex::default(),
    });
    let notified = conn.clone();
    Agent
        .v1()
        .name("acp-gateway")
        .on_receive_request(
            move |msg: UntypedMessage, responder: Responder<Value>, cx: Cx| {
                let conn = conn.clone();
                async move { conn.request(msg, responder, cx) }
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            move |msg: UntypedMessage, _cx: Cx| {
                let conn = notified.clone();
                async move {
                    conn.notification(msg);
                    Ok(())
                }
            },
            on_receive_notification!(),
        )
}

/// A connection's agent that ends, and with it the connection, when its key is removed.
pub(super) struct Revocable<A> {
    pub agent: A,
    pub revoked: tokio_util::sync::CancellationToken,
}

impl<A: ConnectTo<Client>> ConnectTo<Client> for Revocable<A> {
    async fn connect_to(self, client: impl ConnectTo<Agent>) -> Result<(), RpcError> {
        tokio::select! {
            ended = self.agent.connect_to(client) => ended,
            () = self.revoked.cancelled() => Ok(()),
        }
    }
}

/// A service error as a JSON-RPC error: the codes ACP uses where one fits.
fn rpc_error(e: Error) -> RpcError {
    let mut error = match &e {
        Error::Malformed(_) | Error::Invalid(_) => RpcError::invalid_params(),
        Error::NotFound(_) => RpcError::new(-32002, ""),
        Error::NotSupported(_) => RpcError::method_not_found(),
        Error::AgentAuthRequired { .. } => RpcError::auth_required(),
        Error::Agent { code, .. } => RpcError::new(*code as i32, ""),
        _ => RpcError::internal_error(),
    };
    // The store's cause is in the log, never in an answer (its message says only "store").
    error.message = e.to_string();
    error
}

/// `answer` with the workspace the gateway made for the session, if any, as
/// `_meta.workspace` (its `GET /sessions/{id}` view's `workspace`).
fn with_workspace(mut answer: Value, made: &Value) -> Value {
    if !made.is_null() {
        answer["_meta"] = json!({"workspace": made});
    }
    answer
}

fn invalid(what: &str) -> RpcError {
    let mut error = RpcError::invalid_params();
    error.message = what.to_owned();
    error
}

/// The answer of `method` (about the session its `sessionId` names) from the replica that must
/// serve that session, when another must (see [`Remote`]); `None`: this one serves it.
async fn elsewhere(
    gateway: &Gateway,
    remote: &Remote,
    method: &str,
    params: &Value,
) -> Option<Result<Value, RpcError>> {
    let id = session_of(params).ok()?;
    match gateway.replica_for_session(id.as_str()).await {
        Ok(Some(address)) => remote.call(&address, method, &id, params).await,
        Ok(None) => None,
        Err(e) => Some(Err(rpc_error(e))),
    }
}

fn session_of(params: &Value) -> Result<SessionId, RpcError> {
    let id = params["sessionId"]
        .as_str()
        .ok_or_else(|| invalid("sessionId is required"))?;
    SessionId::parse(id).map_err(rpc_error)
}

fn str_of<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params[key]
        .as_str()
        .ok_or_else(|| invalid(&format!("{key} is required")))
}

/// What the client learns of a session's state in ACP's answers (`modes`, `models`,
/// `configOptions`).
fn with_state(mut answer: Value, state: Option<&crate::gateway::SessionState>) -> Value {
    if let Some(state) = state {
        for (key, value) in [
            ("modes", &state.modes),
            ("models", &state.models),
            ("configOptions", &state.config_options),
        ] {
            if let Some(v) = value {
                answer[key] = v.clone();
            }
        }
    }
    answer
}

impl Conn {
    fn ctx(&self, cx: &Cx) -> Ctx {
        Ctx {
            gateway: self.gateway.clone(),
            caller: self.caller.clone(),
            cx: cx.clone(),
            remote: self.remote.clone(),
            elicitation: self.elicitation.lock().expect("elicitation lock").clone(),
        }
    }

    /// Every request is answered from a task of its own: the connection keeps reading (a
    /// `session/cancel` during a prompt, a permission answer).
    fn request(
        self: Arc<Self>,
        msg: UntypedMessage,
        responder: Responder<Value>,
        cx: Cx,
    ) -> Result<(), RpcError> {
        // The call as a span of the trace the client's `_meta.traceparent` names, if any.
        let span = tracing::info_span!(
            "acp_server",
            "otel.name" = msg.method.as_str(),
            "otel.kind" = "server",
            "rpc.system" = "jsonrpc",
            "rpc.method" = msg.method.as_str(),
        );
        crate::telemetry::traces::continue_from_meta(&span, &msg.params);
        cx.clone().spawn(async move {
            let ctx = self.ctx(&cx);
            let answered = self
                .answer(&ctx, &msg.method, &msg.params)
                .instrument(span)
                .await;
            match answered {
                Ok((answer, follow)) => {
                    responder.respond(answer)?;
                    // Followed only now: the client knows the session before its updates.
                    if let Some((attached, stream)) = follow {
                        self.attach(&ctx, attached, stream, msg.method == "session/load");
                    }
                    Ok(())
                }
                Err(e) => responder.respond_with_error(e),
            }
        })
    }

    fn notification(&self, msg: UntypedMessage) {
        if msg.method != "session/cancel" {
            return;
        }
        let Ok(id) = session_of(&msg.params) else {
            return;
        };
        let (gateway, caller) = (self.gateway.clone(), self.caller.clone());
        let remote = self.remote.clone();
        // A cancel is the gateway's, not the connection's: it happens even if the client goes.
        tokio::spawn(async move {
            let cancelled = match elsewhere(&gateway, &remote, &msg.method, &msg.params).await {
                Some(done) => done.map(drop),
                None => gateway
                    .turns()
                    .cancel(&caller, &id)
                    .await
                    .map_err(rpc_error),
            };
            if let Err(e) = cancelled {
                tracing::debug!(error = %e, "an ACP session/cancel failed");
            }
        });
    }

    async fn answer(
        &self,
        ctx: &Ctx,
        method: &str,
        params: &Value,
    ) -> Result<(Value, Option<Follow>), RpcError> {
        let plain = |v: Value| Ok((v, None));
        match method {
            "initialize" => plain(self.initialize(params)),
            "authenticate" => plain(json!({})),
            "session/new" => self.new_session(ctx, params).await,
            "session/load" => self.load(ctx, params).await,
            "session/resume" => self.followed(ctx, &session_of(params)?, None).await,
            "session/prompt" => plain(self.prompt(ctx, params).await?),
            "session/list" => plain(self.list(params).await?),
            "session/close" | "session/delete" => {
                let id = session_of(params)?;
                let attached = self
                    .attached
                    .lock()
                    .expect("attached lock")
                    .remove(id.as_str());
                if let Some(a) = attached {
                    a.stop();
                }
                if let Some(answer) = self.elsewhere(method, params).await {
                    return plain(answer?);
                }
                let done = if method == "session/close" {
                    // Closing a session the agent cannot close only detaches this client.
                    match self.gateway.sessions().close(&self.caller, &id).await {
                        Err(Error::NotSupported(_)) => Ok(()),
                        other => other,
                    }
                } else {
                    self.gateway
                        .sessions()
                        .delete_session(&self.caller, &id)
                        .await
                };
                done.map_err(rpc_error)?;
                plain(json!({}))
            }
            "session/set_mode" | "session/set_model" | "session/set_config_option"
                if let Some(answer) = self.elsewhere(method, params).await =>
            {
                plain(answer?)
            }
            "session/set_mode" | "session/set_model" => {
                let id = session_of(params)?;
                let controls = self.gateway.controls();
                let done = if method == "session/set_mode" {
                    let mode = str_of(params, "modeId")?;
                    controls.set_mode(&self.caller, &id, mode).await
                } else {
                    let model = str_of(params, "modelId")?;
                    controls.set_model(&self.caller, &id, model).await
                };
                done.map_err(rpc_error)?;
                plain(json!({}))
            }
            "session/set_config_option" => {
                let id = session_of(params)?;
                let config = str_of(params, "configId")?;
                let value = params
                    .get("value")
                    .ok_or_else(|| invalid("value is required"))?;
                let at = self
                    .gateway
                    .controls()
                    .set_config(&self.caller, &id, config, value)
                    .await
                    .map_err(rpc_error)?;
                plain(
                    json!({"configOptions": at.state.config_options.unwrap_or_else(|| json!([]))}),
                )
            }
            _ => Err(RpcError::method_not_found()),
        }
    }

    /// What the gateway serves, whatever its agents can: load (from the log), list, resume,
    /// close and delete; prompts and MCP servers as the default agent takes them.
    fn initialize(&self, params: &Value) -> Value {
        let elicitation = params
            .pointer("/clientCapabilities/elicitation")
            .filter(|e| e.is_object());
        *self.elicitation.lock().expect("elicitation lock") = elicitation.cloned();
        let raw = self
            .gateway
            .system()
            .agent()
            .initialize
            .map(|i| i.raw_capabilities)
            .unwrap_or(Value::Null);
        let mut caps = json!({
            "loadSession": true,
            "sessionCapabilities": {"list": {}, "resume": {}, "close": {}, "delete": {}},
        });
        for key in ["promptCapabilities", "mcpCapabilities"] {
            if let Some(v) = raw.get(key).filter(|v| v.is_object()) {
                caps[key] = v.clone();
            }
        }
        json!({
            "protocolVersion": 1,
            "agentCapabilities": caps,
            "authMethods": [],
            "agentInfo": {"name": "acp-gateway", "title": "acp-gateway", "version": env!("CARGO_PKG_VERSION")},
        })
    }

    async fn new_session(
        &self,
        ctx: &Ctx,
        params: &Value,
    ) -> Result<(Value, Option<Follow>), RpcError> {
        let strings = |key: &str| -> Vec<String> {
            params[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        let mut meta = params.get("_meta").filter(|m| !m.is_null()).cloned();
        // `_meta.workspace` asks for a workspace of the gateway's, as `POST /sessions`'s
        // `workspace` does (a front gateway asks so for its client): a scratch one is the cwd.
        let asked = meta
            .as_mut()
            .and_then(|m| m.as_object_mut()?.remove("workspace"));
        let workspace = (asked.clone().map(WorkspaceRequest::checked).transpose())
            .map_err(|e| invalid(&format!("_meta.workspace: {e}")))?;
        let cwd = str_of(params, "cwd")?.to_owned();
        let new = NewSession {
            cwd: (workspace != Some(NewWorkspace::Scratch)).then_some(cwd),
            workspace,
            additional_directories: strings("additionalDirectories"),
            mcp_servers: params["mcpServers"].as_array().cloned().unwrap_or_default(),
            // `_meta.agent` names the gateway's agent to start it in.
            agent: meta
                .as_ref()
                .and_then(|m| m["agent"].as_str())
                .map(str::to_owned),
            meta,
            ..NewSession::default()
        };
        // An agent only another replica runs: the session is made there.
        if let Some(address) = self.gateway.runner_elsewhere(new.agent.as_deref()) {
            let body = json!({"cwd": new.cwd, "additionalDirectories": new.additional_directories,
                              "mcpServers": new.mcp_servers, "agent": new.agent, "_meta": new.meta,
                              "workspace": asked});
            let view = self.remote.create(&address, body).await?;
            let id = view["sessionId"].as_str().unwrap_or_default();
            let id = SessionId::parse(id).map_err(rpc_error)?;
            let follow = follow::open(ctx, &id, Some(0)).await.map_err(rpc_error)?;
            let state = serde_json::from_value(view["state"].clone()).ok();
            let answer = with_state(json!({"sessionId": id.as_str()}), state.as_ref());
            return Ok((with_workspace(answer, &view["workspace"]), Some(follow)));
        }
        let view = self
            .gateway
            .create()
            .create_session(&self.caller, new)
            .await
            .map_err(rpc_error)?;
        let id = SessionId::parse(&view.session_id).map_err(rpc_error)?;
        // From the log's start: what the agent sent right after `session/new` (its commands).
        let follow = follow::open(ctx, &id, Some(0)).await.map_err(rpc_error)?;
        let answer = with_state(json!({"sessionId": view.session_id}), view.state.as_deref());
        let made = serde_json::to_value(&view.workspace).unwrap_or_default();
        Ok((with_workspace(answer, &made), Some(follow)))
    }

    /// `session/load`: the session's log as the agent would replay it (its updates, the users'
    /// prompts as `user_message_chunk`s; a fork's parent's history first), then the session
    /// followed from there.
    async fn load(&self, ctx: &Ctx, params: &Value) -> Result<(Value, Option<Follow>), RpcError> {
        let id = session_of(params)?;
        let end = replay(ctx, &id, id.as_str(), None)
            .await
            .map_err(rpc_error)?;
        self.followed(ctx, &id, Some(end)).await
    }

    /// The answer of `session/resume` and `session/load`: the session's state, with the session
    /// followed after `after` (`None`: from now on).
    async fn followed(
        &self,
        ctx: &Ctx,
        id: &SessionId,
        after: Option<i64>,
    ) -> Result<(Value, Option<Follow>), RpcError> {
        let view = self
            .gateway
            .sessions()
            .get_session(&self.caller, id)
            .await
            .map_err(rpc_error)?;
        let follow = follow::open(ctx, id, after).await.map_err(rpc_error)?;
        Ok((with_state(json!({}), view.state.as_deref()), Some(follow)))
    }

    async fn prompt(&self, ctx: &Ctx, params: &Value) -> Result<Value, RpcError> {
        let id = session_of(params)?;
        let blocks = params["prompt"].as_array();
        // The blocks are logged as given (`turn_started`), which is how the turn is known.
        let prompt = Prompt::new(blocks.cloned(), None).map_err(rpc_error)?;
        let attached = self.attached(ctx, &id).await?;
        let ended = attached.expect_turn(blocks.map_or(&[][..], Vec::as_slice));
        let turn = match self.elsewhere("session/prompt", params).await {
            Some(answered) => answered,
            None => match self
                .gateway
                .turns()
                .prompt(&self.caller, &id, prompt, true)
                .await
            {
                Ok(Some(turn)) => Ok(turn.result),
                Ok(None) => Ok(json!({"stopReason": "end_turn"})),
                Err(e) => Err(rpc_error(e)),
            },
        };
        let result = turn.inspect_err(|_| attached.forget_turn())?;
        let _ = tokio::time::timeout(TAIL_WAIT, ended).await;
        Ok(result)
    }

    /// The answer of `method` from the replica that must serve its session, when another must.
    async fn elsewhere(&self, method: &str, params: &Value) -> Option<Result<Value, RpcError>> {
        elsewhere(&self.gateway, &self.remote, method, params).await
    }

    async fn list(&self, params: &Value) -> Result<Value, RpcError> {
        let filter = SessionFilter {
            cwd: params["cwd"].as_str().map(str::to_owned),
            cursor: params["cursor"].as_str().map(str::to_owned),
            ..SessionFilter::default()
        };
        let page = self
            .gateway
            .sessions()
            .list_sessions(&self.caller, filter, false)
            .await
            .map_err(rpc_error)?;
        let page: Value = serde_json::from_slice(&page).map_err(RpcError::into_internal_error)?;
        let sessions: Vec<Value> = page["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let mut info = json!({"sessionId": s["sessionId"], "cwd": s["cwd"], "updatedAt": s["updatedAt"]});
                for key in ["title", "additionalDirectories", "_meta"] {
                    if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
                        info[key] = v.clone();
                    }
                }
                info
            })
            .collect();
        let mut answer = json!({"sessions": sessions});
        if let Some(next) = page.get("nextCursor").filter(|c| c.is_string()) {
            answer["nextCursor"] = next.clone();
        }
        Ok(answer)
    }

    /// The session as this connection follows it, followed from now if it was not yet.
    async fn attached(&self, ctx: &Ctx, id: &SessionId) -> Result<Arc<Attached>, RpcError> {
        if let Some(a) = self
            .attached
            .lock()
            .expect("attached lock")
            .get(id.as_str())
        {
            return Ok(a.clone());
        }
        let (attached, stream) = follow::open(ctx, id, None).await.map_err(rpc_error)?;
        Ok(self.attach(ctx, attached, stream, false))
    }

    /// Follows the session with `attached`, unless it is followed already (a resume racing a
    /// prompt): then the one there stays, or, with `replace` (a load, which replayed up to its
    /// own position), makes way. Returns the attachment in use.
    fn attach(
        &self,
        ctx: &Ctx,
        attached: Arc<Attached>,
        stream: follow::RunStream,
        replace: bool,
    ) -> Arc<Attached> {
        let id = attached.session_id().to_owned();
        let mut map = self.attached.lock().expect("attached lock");
        match map.get(&id) {
            Some(there) if !replace => return there.clone(),
            Some(there) => there.stop(),
            None => {}
        }
        map.insert(id, attached.clone());
        drop(map);
        follow::follow(ctx.clone(), attached.clone(), stream);
        attached
    }
}

/// A session to follow once the answer is sent.
type Follow = (Arc<Attached>, follow::RunStream);

/// Sends the client the log of `id` as `session_id`'s history, up to `upto` (all of it when
/// `None`); returns the last position sent.
async fn replay(
    ctx: &Ctx,
    id: &SessionId,
    session_id: &str,
    upto: Option<i64>,
) -> Result<i64, Error> {
    let (mut after, mut last) = (0, 0);
    loop {
        let page = ctx
            .gateway
            .history()
            .history(&ctx.caller, id, after, REPLAY_PAGE)
            .await?;
        for e in page.events {
            if upto.is_some_and(|u| e.seq > u) {
                return Ok(last);
            }
            last = e.seq;
            let event = Event::new(&e.event, e.data.to_value());
            if event.kind == Some(EventKind::Forked) {
                let parent = event.data["parentSessionId"]
                    .as_str()
                    .and_then(|p| SessionId::parse(p).ok());
                if let (Some(parent), Some(at)) = (parent, event.data["parentSeq"].as_i64()) {
                    // A parent since deleted leaves the fork's own history only.
                    let _ = Box::pin(replay(ctx, &parent, session_id, Some(at))).await;
                }
                continue;
            }
            for (method, params) in follow::notifications(&event, session_id, false) {
                let sent =
                    UntypedMessage::new(&method, params).and_then(|m| ctx.cx.send_notification(m));
                if sent.is_err() {
                    return Ok(last);
                }
            }
        }
        match page.next_after {
            Some(next) => after = next,
            None => return Ok(last),
        }
    }
}
