//! The client side of one agent connection ([`Connection`]): the gateway's own request ids and
//! the map of calls waiting for their answers ([`PendingCall`]), and the lines it writes to the
//! agent's stdin, serialized from borrowed parts ([`Outbound`]). Each request is a span of its
//! own (`acp` `METHOD`, to its answer) whose W3C trace context goes to the agent in the
//! request's `params._meta` (`traceparent`, `tracestate`, `baggage`) when traces are exported.
//! A call the gateway stops waiting for (its timeout) is cancelled with `$/cancel_request`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol_schema::v1::{
    CancelRequestNotification, PROTOCOL_LEVEL_METHOD_NAMES, RequestId,
};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::errors::{CallError, RpcError, answer_value};
use super::stdin;

/// `$/cancel_request`.
const CANCEL_REQUEST: &str = PROTOCOL_LEVEL_METHOD_NAMES.cancel_request;

/// How long a timed-out call waits for room in the agent's stdin to send its cancel.
const CANCEL_SEND_WAIT: Duration = Duration::from_millis(250);

type Reply = Result<Box<RawValue>, CallError>;
/// The calls waiting for their answers, by id; `None`: a call the gateway gave up on (its
/// timeout), whose late answer is dropped quietly rather than taken for garbage.
type Pending = Arc<Mutex<HashMap<u64, Option<oneshot::Sender<Reply>>>>>;

/// A request sent to the agent whose answer has not been awaited yet.
#[derive(Debug)]
pub struct PendingCall {
    id: u64,
    method: String,
    rx: oneshot::Receiver<Reply>,
    pending: Pending,
    started: std::time::Instant,
    member: Arc<str>,
    /// The call's span, ended with it.
    span: tracing::Span,
    /// Where `$/cancel_request` goes when the gateway stops waiting.
    out: Arc<stdin::AgentStdin>,
}

impl PendingCall {
    /// Waits for the answer, at most `timeout` (`None`: as long as the connection lives).
    pub async fn wait(self, timeout: Option<Duration>) -> Result<Value, CallError> {
        answer_value(&self.wait_raw(timeout).await?)
    }

    /// [`wait`](Self::wait), the result kept as the agent's text.
    pub async fn wait_raw(self, timeout: Option<Duration>) -> Reply {
        let PendingCall {
            id,
            method,
            rx,
            pending,
            started,
            member,
            span,
            out,
        } = self;
        let waited = match timeout {
            Some(t) => match tokio::time::timeout(t, rx).await {
                Ok(r) => r,
                Err(_) => {
                    if let Some(waiter) = pending.lock().expect("pending lock").get_mut(&id) {
                        *waiter = None;
                    }
                    // ACP's cancellation: the agent may stop the work nobody waits for. Best
                    // effort: an agent whose stdin is full does not hold up the timeout.
                    let cancel = CancelRequestNotification::new(RequestId::Number(id as i64));
                    let line = Outbound::notification(CANCEL_REQUEST, &cancel).line();
                    let _ = tokio::time::timeout(CANCEL_SEND_WAIT, out.send(line)).await;
                    Ok(Err(CallError::Timeout(method.clone())))
                }
            },
            None => rx.await,
        };
        let result = waited.unwrap_or_else(|_| Err(CallError::Closed("the agent exited".into())));
        let outcome = match &result {
            Ok(_) => "ok",
            Err(CallError::Rpc(_)) => "error",
            Err(CallError::Timeout(_)) => "timeout",
            Err(CallError::Closed(_) | CallError::NotSent(_)) => "closed",
            Err(CallError::Unsupported(_)) => "unsupported",
        };
        let elapsed = started.elapsed();
        span.record("outcome", outcome);
        if outcome != "ok" {
            span.record("otel.status_code", "ERROR");
        }
        crate::telemetry::upstream_call(&method, outcome, elapsed);
        tracing::debug!(
            method,
            id,
            %member,
            outcome,
            elapsed_ms = elapsed.as_millis() as u64,
            "upstream call"
        );
        result
    }
}

/// The client side of one agent connection. Cheap to share; calls are concurrent.
#[derive(Debug)]
pub struct Connection {
    out: Arc<stdin::AgentStdin>,
    pending: Pending,
    next_id: AtomicU64,
    /// Which agent process this is (`member-N`), for the logs.
    member: Arc<str>,
    /// Cancelled once nothing sent can be answered any more: the stdin pipe broke, stdout
    /// ended, or the process exited (see [`Connection::is_gone`]).
    gone: CancellationToken,
}

impl Connection {
    /// Wraps the agent's stdin; `gone` is the token the stdin cancels when its pipe breaks.
    pub(super) fn new(out: Arc<stdin::AgentStdin>, gone: CancellationToken, member: &str) -> Self {
        Connection {
            out,
            pending: Arc::default(),
            next_id: AtomicU64::new(1),
            member: member.into(),
            gone,
        }
    }

    /// True once the agent can no longer answer: a write found its stdin broken (EPIPE), its
    /// stdout ended, or its process exited — whichever was first. Nothing is sent any more
    /// ([`CallError::NotSent`]).
    pub fn is_gone(&self) -> bool {
        self.gone.is_cancelled()
    }

    /// Resolves when the connection is gone (see [`Connection::is_gone`]).
    pub async fn gone(&self) {
        self.gone.cancelled().await
    }

    /// Marks the connection gone: its stdout ended or its process exited.
    pub fn set_gone(&self) {
        self.gone.cancel()
    }

    /// Calls `method`, waiting at most `timeout` (`None`: as long as the connection lives).
    pub async fn call<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        timeout: Option<Duration>,
    ) -> Result<Value, CallError> {
        self.send_request(method, params).await?.wait(timeout).await
    }

    /// Sends a request and returns its pending answer. Once this returns, the request is queued
    /// for the agent ahead of anything sent later on this connection.
    pub async fn send_request<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<PendingCall, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .expect("pending lock")
            .insert(id, Some(tx));
        let span = tracing::info_span!(
            "acp",
            "otel.name" = method,
            "otel.kind" = "client",
            "rpc.system" = "jsonrpc",
            "rpc.method" = method,
            member = %self.member,
            outcome = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        let id_value = Value::from(id);
        let line = match crate::telemetry::traces::context_of(&span) {
            Some(carrier) => {
                Outbound::request(&id_value, method, &with_meta(params, carrier)).line()
            }
            None => Outbound::request(&id_value, method, params).line(),
        };
        if let Err(closed) = self.send_line(line).await {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(closed);
        }
        Ok(PendingCall {
            member: self.member.clone(),
            id,
            method: method.to_owned(),
            rx,
            pending: self.pending.clone(),
            started: std::time::Instant::now(),
            span,
            out: self.out.clone(),
        })
    }

    /// Sends a notification.
    pub async fn notify<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<(), CallError> {
        self.send_line(Outbound::notification(method, params).line())
            .await
    }

    /// Answers a request the agent sent to us.
    pub async fn respond<R: Serialize>(
        &self,
        id: &Value,
        result: Result<&R, &RpcError>,
    ) -> Result<(), CallError> {
        self.send_line(Outbound::response(id, result).line()).await
    }

    async fn send_line(&self, line: String) -> Result<(), CallError> {
        self.out
            .send(line)
            .await
            .map_err(|stdin::Closed| CallError::NotSent("the agent's stdin is closed".into()))
    }

    /// Delivers a response to its waiter (or drops the late answer to a call given up on).
    /// Returns false for an id the gateway never sent.
    pub fn resolve(&self, id: u64, result: Result<Box<RawValue>, RpcError>) -> bool {
        let waiter = self.pending.lock().expect("pending lock").remove(&id);
        match waiter {
            Some(Some(tx)) => {
                let _ = tx.send(result.map_err(CallError::Rpc));
                true
            }
            Some(None) => {
                tracing::debug!(id, member = %self.member, "the late answer to a call given up on; dropped");
                true
            }
            None => false,
        }
    }

    /// Fails every pending call: the agent is gone.
    pub fn fail_all(&self, reason: &str) {
        let waiters: Vec<_> = self.pending.lock().expect("pending lock").drain().collect();
        for tx in waiters.into_iter().filter_map(|(_, tx)| tx) {
            let _ = tx.send(Err(CallError::Closed(reason.to_owned())));
        }
    }
}

/// `params` with the trace context `carrier` merged into its `_meta` (what the client put there
/// kept beside it).
fn with_meta<P: Serialize + ?Sized>(params: &P, carrier: HashMap<String, String>) -> Value {
    let mut params = serde_json::to_value(params).unwrap_or(Value::Null);
    if let Some(object) = params.as_object_mut() {
        let meta = object
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()));
        if !meta.is_object() {
            *meta = Value::Object(Default::default());
        }
        if let Some(meta) = meta.as_object_mut() {
            meta.extend(carrier.into_iter().map(|(k, v)| (k, Value::from(v))));
        }
    }
    params
}

/// One line to the agent, serialized straight from borrowed parts (building a `json!` object
/// first would copy the params). `P` is whatever the params or the result are: a typed ACP
/// request, or JSON passed through.
#[serde_with::skip_serializing_none]
#[derive(Serialize)]
struct Outbound<'a, P: ?Sized> {
    jsonrpc: &'static str,
    id: Option<&'a Value>,
    method: Option<&'a str>,
    params: Option<&'a P>,
    result: Option<&'a P>,
    error: Option<&'a RpcError>,
}

impl<'a, P: Serialize + ?Sized> Outbound<'a, P> {
    fn request(id: &'a Value, method: &'a str, params: &'a P) -> Self {
        Outbound {
            id: Some(id),
            ..Outbound::notification(method, params)
        }
    }

    fn notification(method: &'a str, params: &'a P) -> Self {
        Outbound {
            jsonrpc: "2.0",
            id: None,
            method: Some(method),
            params: Some(params),
            result: None,
            error: None,
        }
    }

    fn response(id: &'a Value, result: Result<&'a P, &'a RpcError>) -> Self {
        let (result, error) = match result {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e)),
        };
        Outbound {
            jsonrpc: "2.0",
            id: Some(id),
            method: None,
            params: None,
            result,
            error,
        }
    }

    /// The line, with the lone surrogates its strings hold written as the escapes they came as.
    fn line(&self) -> String {
        let line =
            serde_json::to_string(self).expect("a JSON-RPC message of JSON values serializes");
        crate::surrogates::restore_string(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_rpc::{Inbound, parse_line};

    /// A lone surrogate (a JavaScript agent's string cut inside a pair) is no garbage, and goes
    /// back to the agent as the escape it came as.
    #[test]
    fn a_lone_surrogate_is_parsed_and_written_back_as_it_came() {
        let line = r#"{"jsonrpc":"2.0","method":"session/update","params":{"text":"ab\ud83d"}}"#;
        let Ok(Inbound::Notification { params, .. }) = parse_line(line) else {
            panic!("not parsed: {line}");
        };
        let params: Value = serde_json::from_str(params.get()).unwrap();
        let out = Outbound::notification("session/update", &params).line();
        assert_eq!(out, line);
    }

    /// A request to an agent whose stdin has no reader any more fails as never sent, and the
    /// connection says it is gone, so that placement skips it and the call can go elsewhere.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_pipe_fails_calls_as_not_sent_and_marks_the_connection_gone() {
        use std::io::{BufRead, BufReader};
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        let gone = CancellationToken::new();
        let stdin = stdin::AgentStdin::new(write, &mut tasks, gone.clone()).unwrap();
        let conn = Connection::new(stdin, gone, "member-0");
        // A first line goes through, as `initialize` does: the pipe is known to be writable.
        conn.notify("hello", &serde_json::json!({})).await.unwrap();
        let first = tokio::task::spawn_blocking(move || {
            let mut reader = BufReader::new(std::fs::File::from(read));
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            line
        });
        let first = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("the first line arrives")
            .unwrap();
        assert!(first.contains("hello"), "{first}");
        // The reader is gone with its thread: the agent has exited.
        assert!(!conn.is_gone());
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            conn.call("session/new", &serde_json::json!({}), None),
        )
        .await
        .expect("a call on a broken pipe fails at once");
        assert!(matches!(r, Err(CallError::NotSent(_))), "{r:?}");
        assert!(conn.is_gone());
        assert!(
            conn.pending.lock().unwrap().is_empty(),
            "nothing left waiting"
        );
        let again = conn.notify("session/cancel", &serde_json::json!({})).await;
        assert!(matches!(again, Err(CallError::NotSent(_))), "{again:?}");
    }

    #[test]
    fn outbound_lines_are_json_rpc_messages_that_parse_back() {
        let params =
            serde_json::json!({"sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]});
        let request = Outbound::request(&Value::from(3), "session/prompt", &params).line();
        assert_eq!(
            serde_json::from_str::<Value>(&request).unwrap(),
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": params})
        );
        let note = Outbound::notification("session/cancel", &params).line();
        assert!(matches!(
            parse_line(&note),
            Ok(Inbound::Notification { method, params: p, .. })
                if method == "session/cancel" && serde_json::from_str::<Value>(p.get()).unwrap() == params
        ));
        let id = Value::from("req-1");
        let ok = Outbound::response(&id, Ok(&params)).line();
        assert_eq!(
            serde_json::from_str::<Value>(&ok).unwrap(),
            serde_json::json!({"jsonrpc": "2.0", "id": "req-1", "result": params})
        );
        let err = RpcError::method_not_found("fs/write_text_file");
        let refused = Outbound::<Value>::response(&id, Err(&err)).line();
        assert_eq!(
            serde_json::from_str::<Value>(&refused).unwrap(),
            serde_json::json!({"jsonrpc": "2.0", "id": "req-1", "error": err})
        );
        assert!(
            !request.contains('\n') && !refused.contains('\n'),
            "one line each"
        );
    }
}
