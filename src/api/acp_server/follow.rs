//! A connection following a session: the session's log, from a position, turned into what an
//! ACP client expects (`session/update` notifications, the permission requests and elicitations
//! the agent asks), whoever started the turn. Every connection attached to a session and every
//! REST client sees the same events; a request goes to all of them and the first answer wins,
//! the other ACP clients' requests being cancelled (`$/cancel_request`) when it is resolved.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Client, RequestCancellationHandle, UntypedMessage};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::remote::Remote;
use crate::events::Run;
use crate::gateway::input::SessionId;
use crate::gateway::{Caller, ElicitationReply, EventKind, Gateway};

/// The connection to the ACP client.
pub(super) type Cx = ConnectionTo<Client>;

/// What a connection acts with: the service, its caller, what its client can be asked.
#[derive(Clone)]
pub(super) struct Ctx {
    pub gateway: Gateway,
    pub caller: Caller,
    pub cx: Cx,
    /// Where an answer goes when another replica holds the request's session.
    pub remote: Remote,
    /// The client's `elicitation` capability (`{form, url}`), if it declared one.
    pub elicitation: Option<Value>,
}

/// A session's events, in batches as the hub delivers them.
pub(super) type RunStream = std::pin::Pin<Box<dyn Stream<Item = Vec<Arc<Run>>> + Send>>;

/// One event of a session's log.
pub(super) struct Event<'a> {
    /// Its kind as logged (an agent's may be one the gateway does not know).
    pub name: &'a str,
    /// Its kind, if the gateway knows it.
    pub kind: Option<EventKind>,
    pub data: Value,
}

impl<'a> Event<'a> {
    /// The event of kind `name` logged with payload `data`.
    pub fn new(name: &'a str, data: Value) -> Self {
        Event {
            name,
            kind: EventKind::parse(name),
            data,
        }
    }
}

/// The `session/update` notifications (and extension notifications) a log event is to an ACP
/// client, for session `session_id` (a fork replays its parent's events as its own). `live`:
/// followed as it happens, rather than replayed by `session/load`, whose answer carries the
/// state instead of the state changes.
pub(super) fn notifications(event: &Event, session_id: &str, live: bool) -> Vec<(String, Value)> {
    let update = |update: Value| {
        let mut params = json!({"sessionId": session_id, "update": update});
        if let Some(meta) = event.data.get("_meta").filter(|m| !m.is_null()) {
            params["_meta"] = meta.clone();
        }
        ("session/update".to_owned(), params)
    };
    let data = &event.data;
    match event.kind {
        _ if data
            .get("update")
            .is_some_and(|u| u.get("sessionUpdate").is_some()) =>
        {
            vec![update(data["update"].clone())]
        }
        // Each block of a prompt, as a user message naming its author in `_meta.author`.
        Some(EventKind::TurnStarted) => {
            let tag = EventKind::UserMessageChunk.name();
            let author = data.get("author").filter(|a| a.is_object());
            data["prompt"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|block| {
                    let (method, mut params) =
                        update(json!({"sessionUpdate": tag, "content": block}));
                    if let Some(author) = author {
                        params["_meta"] = json!({"author": author});
                    }
                    (method, params)
                })
                .collect()
        }
        Some(EventKind::StateChanged) if live => {
            let mut out = Vec::new();
            if let Some(mode) = data.pointer("/modes/currentModeId") {
                let tag = EventKind::CurrentModeUpdate.name();
                out.push(update(json!({"sessionUpdate": tag, "currentModeId": mode})));
            }
            if let Some(options) = data.get("configOptions").filter(|o| o.is_array()) {
                let tag = EventKind::ConfigOptionUpdate.name();
                out.push(update(
                    json!({"sessionUpdate": tag, "configOptions": options}),
                ));
            }
            out
        }
        None if live && event.name.starts_with('_') => {
            vec![(event.name.to_owned(), data.clone())]
        }
        _ => Vec::new(),
    }
}

/// The prompt this connection sent, waiting for its turn in the log.
struct OwnTurn {
    prompt: Value,
    started: bool,
    ended: Option<oneshot::Sender<()>>,
}

/// The requests this connection's client was asked: by the gateway's request id, the handle
/// that cancels it (taken when it is resolved elsewhere).
#[derive(Default)]
struct Asks {
    asked: HashSet<String>,
    open: HashMap<String, RequestCancellationHandle>,
}

/// A session this connection follows, until [`Attached::stop`] (or the connection's end).
pub(super) struct Attached {
    session_id: SessionId,
    stop: CancellationToken,
    own: Mutex<Option<OwnTurn>>,
    asks: Mutex<Asks>,
}

impl Attached {
    fn new(session_id: SessionId) -> Arc<Self> {
        Arc::new(Attached {
            session_id,
            stop: CancellationToken::new(),
            own: Mutex::default(),
            asks: Mutex::default(),
        })
    }

    pub(super) fn session_id(&self) -> &str {
        self.session_id.as_str()
    }

    /// Stops following (a prompt waiting for its turn's end then answers after a bounded wait).
    pub(super) fn stop(&self) {
        self.stop.cancel();
    }

    /// This connection is about to send `prompt`: its `turn_started` is not echoed to it as a
    /// user message, and the receiver fires once its `turn_ended` has been followed (every
    /// update of the turn sent before the answer).
    pub(super) fn expect_turn(&self, prompt: &[Value]) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        *self.own.lock().expect("own turn lock") = Some(OwnTurn {
            prompt: Value::from(prompt.to_vec()),
            started: false,
            ended: Some(tx),
        });
        rx
    }

    /// The prompt was refused: nothing to wait for.
    pub(super) fn forget_turn(&self) {
        self.own.lock().expect("own turn lock").take();
    }

    /// Whether `event` is this connection's own turn (handled, then not sent).
    fn own_turn(&self, event: &Event) -> bool {
        let mut own = self.own.lock().expect("own turn lock");
        let Some(turn) = own.as_mut() else {
            return false;
        };
        match event.kind {
            Some(EventKind::TurnStarted)
                if !turn.started && event.data["prompt"] == turn.prompt =>
            {
                turn.started = true;
                true
            }
            Some(EventKind::TurnEnded) if turn.started => {
                if let Some(tx) = own.take().and_then(|t| t.ended) {
                    let _ = tx.send(());
                }
                true
            }
            _ => false,
        }
    }
}

/// Opens the session's stream from `after` (`None`: from now) and returns what follows it; the
/// caller starts [`follow`] once the client knows the session.
pub(super) async fn open(
    ctx: &Ctx,
    id: &SessionId,
    after: Option<i64>,
) -> Result<(Arc<Attached>, RunStream), crate::gateway::Error> {
    let stream = ctx
        .gateway
        .history()
        .session_events(&ctx.caller, id, after, false)
        .await?;
    Ok((Attached::new(id.clone()), Box::pin(stream)))
}

/// Follows the session until the attachment is dropped, the session deleted or the gateway
/// shut down; first asks the client what is pending now.
pub(super) fn follow(ctx: Ctx, attached: Arc<Attached>, mut stream: RunStream) {
    let cx = ctx.cx.clone();
    let task = async move {
        ask_pending(&ctx, &attached).await;
        loop {
            let batch = tokio::select! {
                () = attached.stop.cancelled() => break,
                batch = stream.next() => batch,
            };
            let Some(batch) = batch else { break };
            for e in batch.iter().flat_map(|run| run.events()) {
                let event = Event::new(&e.kind, e.payload.to_value());
                if !on_event(&ctx, &attached, &event) {
                    return Ok(());
                }
            }
        }
        Ok(())
    };
    if let Err(e) = cx.spawn(task) {
        tracing::debug!(error = %e, "the ACP connection closed before following a session");
    }
}

/// One live event; `false` once there is nothing more to follow.
fn on_event(ctx: &Ctx, attached: &Arc<Attached>, event: &Event) -> bool {
    if attached.own_turn(event) {
        return true;
    }
    let request_id = event.data["requestId"].as_str().unwrap_or_default();
    match event.kind {
        Some(kind @ (EventKind::PermissionRequested | EventKind::ElicitationRequested)) => {
            ask(ctx, attached, kind, request_id, &event.data["request"]);
        }
        Some(EventKind::PermissionResolved | EventKind::ElicitationResolved) => {
            resolved(attached, request_id);
        }
        Some(EventKind::SessionDeleted) => return false,
        _ => {}
    }
    let sid = attached.session_id.as_str();
    notifications(event, sid, true)
        .into_iter()
        .all(|(method, params)| {
            UntypedMessage::new(&method, params)
                .and_then(|m| ctx.cx.send_notification(m))
                .is_ok()
        })
}

/// Asks the client what is pending when it attaches (events before its position are not
/// followed): on the replica where the session's turn runs.
async fn ask_pending(ctx: &Ctx, attached: &Arc<Attached>) {
    let (requests, caller, id) = (ctx.gateway.requests(), &ctx.caller, &attached.session_id);
    let pending = match ctx.gateway.replica_for_session(id.as_str()).await {
        Ok(Some(address)) => ctx.remote.pending(&address, id).await,
        _ => {
            // A list that cannot be read now is not asked about.
            let permissions = requests.permissions(caller, id).await.unwrap_or_default();
            let elicitations = requests.elicitations(caller, id).await.unwrap_or_default();
            let permissions = permissions
                .into_iter()
                .map(|p| (EventKind::PermissionRequested, p.request_id, p.request));
            let elicitations = elicitations
                .into_iter()
                .map(|e| (EventKind::ElicitationRequested, e.request_id, e.request));
            permissions.chain(elicitations).collect()
        }
    };
    for (kind, request_id, request) in &pending {
        ask(ctx, attached, *kind, request_id, request);
    }
}

/// Asks the client a request of `kind` (a permission request or an elicitation).
fn ask(ctx: &Ctx, attached: &Arc<Attached>, kind: EventKind, request_id: &str, params: &Value) {
    let permission = kind == EventKind::PermissionRequested;
    if !permission {
        // Only in a mode the client said it handles.
        let mode = params["mode"].as_str().unwrap_or("form");
        if ctx
            .elicitation
            .as_ref()
            .is_none_or(|c| c.get(mode).is_none())
        {
            return;
        }
    }
    if request_id.is_empty()
        || !attached
            .asks
            .lock()
            .expect("asks lock")
            .asked
            .insert(request_id.to_owned())
    {
        return;
    }
    let method = if permission {
        "session/request_permission"
    } else {
        "elicitation/create"
    };
    let Ok(message) = UntypedMessage::new(method, params) else {
        return;
    };
    let sent = ctx.cx.send_request(message);
    attached
        .asks
        .lock()
        .expect("asks lock")
        .open
        .insert(request_id.to_owned(), sent.cancellation_handle());
    let (ctx2, attached, request_id) = (ctx.clone(), attached.clone(), request_id.to_owned());
    let task = async move {
        let answer = sent.block_task().await;
        // Resolved elsewhere meanwhile (and cancelled here): this answer came second.
        if attached
            .asks
            .lock()
            .expect("asks lock")
            .open
            .remove(&request_id)
            .is_none()
        {
            return Ok(());
        }
        let Ok(answer) = answer else {
            return Ok(()); // this client could not answer; another may
        };
        let (gateway, caller, id) = (&ctx2.gateway, &ctx2.caller, &attached.session_id);
        let option = answer["outcome"]["optionId"].as_str().map(str::to_owned);
        let reply = match answer["action"].as_str() {
            Some("accept") => ElicitationReply::Accept,
            Some("decline") => ElicitationReply::Decline,
            _ => ElicitationReply::Cancel,
        };
        let content = answer.get("content").filter(|c| !c.is_null());
        // The turn that asked runs where the session is held.
        let done = match gateway.replica_for_session(id.as_str()).await {
            Ok(Some(address)) => {
                let body = if permission {
                    match &option {
                        Some(option) => json!({"optionId": option}),
                        None => json!({"outcome": "cancelled"}),
                    }
                } else {
                    json!({"action": reply, "content": content})
                };
                ctx2.remote
                    .answer(&address, id, permission, &request_id, body)
                    .await
                    .map_err(|e| e.to_string())
            }
            Ok(None) if permission => {
                let cancelled = option.is_none().then_some("cancelled");
                gateway
                    .requests()
                    .answer_permission(caller, id, &request_id, option, cancelled)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Ok(None) => gateway
                .requests()
                .answer_elicitation(caller, id, &request_id, reply, content)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = done {
            tracing::debug!(request = %request_id, error = %e, "an ACP client's answer was not taken");
        }
        Ok(())
    };
    if let Err(e) = ctx.cx.spawn(task) {
        tracing::debug!(error = %e, "the ACP connection closed before an answer");
    }
}

/// Resolved (by another client, the policy, a timeout or a cancel): the client's request is
/// cancelled, and an answer it still sends is ignored.
fn resolved(attached: &Attached, request_id: &str) {
    let handle = attached
        .asks
        .lock()
        .expect("asks lock")
        .open
        .remove(request_id);
    if let Some(handle) = handle {
        let _ = handle.cancel();
    }
}
