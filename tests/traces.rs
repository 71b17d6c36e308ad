//! OpenTelemetry traces: a real OTLP/HTTP receiver on loopback (decoding what it is sent with the
//! published `opentelemetry-proto` messages) collects what the gateway exports. A prompt sent
//! with a `traceparent` continues that trace: its request span is the caller's child, the ACP
//! call to the agent is a span of the same trace within the turn's, and the agent receives the
//! call's trace context in `params._meta`; a request forwarded to the replica that holds the
//! session carries the trace there, with the turn's permission wait and log writes in it, as
//! does an `/acp` client's `_meta.traceparent`; JSON log
//! lines name their trace. With the collector gone,
//! requests are answered as before and the dropped spans are counted.

use crate::support;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};
use support::*;

/// What the receiver was sent: each span with its resource's `service.name`.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP receiver on a loopback port: its base URL and what it receives.
async fn receiver() -> (String, Received, tokio::task::JoinHandle<()>) {
    let received = Received::default();
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| kv.value.as_ref()?.value.clone());
                    let service = match service {
                        Some(AnyValue::StringValue(s)) => s,
                        _ => String::new(),
                    };
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            kept.lock().unwrap().push((service.clone(), span));
                        }
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, received, server)
}

/// `POST url` with `body`, as a child of span `parent` of trace `trace`.
async fn post_traced(
    gw: &Gateway,
    url: &str,
    trace: &str,
    parent: &str,
    body: Value,
) -> reqwest::Response {
    let traceparent = format!("00-{trace}-{parent}-01");
    let request = gw.http.post(url).header("traceparent", traceparent);
    request.json(&body).send().await.unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A string attribute of `span`.
fn attribute(span: &Span, key: &str) -> Option<String> {
    match span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// An integer attribute of `span` (0 when it has none).
fn int_attribute(span: &Span, key: &str) -> i64 {
    let value = span.attributes.iter().find(|kv| kv.key == key);
    match value.and_then(|kv| kv.value.as_ref()?.value.as_ref()) {
        Some(AnyValue::IntValue(n)) => *n,
        _ => 0,
    }
}

/// Waits until a span matching `wanted` has been received; returns it.
async fn span_where(received: &Received, wanted: impl Fn(&Span) -> bool) -> (String, Span) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = received.lock().unwrap().iter().find(|(_, s)| wanted(s)) {
            return found.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such span among {:?}",
            received
                .lock()
                .unwrap()
                .iter()
                .map(|(_, s)| s.name.clone())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_continues_the_callers_trace_into_the_agent() {
    let (url, received, server) = receiver().await;
    let opts = Options::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_SERVICE_NAME", "gateway-under-test");
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let r = post_traced(
        gw,
        &gw.prompt_url(&id),
        trace,
        parent,
        json!({"text": "/meta hi"}),
    )
    .await;
    assert_eq!(r.status(), 200);

    // The request's span is the caller's child, named by its route.
    let (service, request) = span_where(&received, |s| {
        hex(&s.trace_id) == trace && s.name == "POST /sessions/{id}/prompt"
    })
    .await;
    assert_eq!(service, "gateway-under-test");
    assert_eq!(hex(&request.parent_span_id), parent);
    // It says whose request it was, about which session, and how it was answered.
    assert_eq!(
        attribute(&request, "session_id").as_deref(),
        Some(id.as_str())
    );
    assert_eq!(attribute(&request, "tenant").as_deref(), Some("default"));
    assert_eq!(int_attribute(&request, "http.response.status_code"), 200);
    // The ACP call to the agent is a span of the same trace, within the request's.
    let (_, call) = span_where(&received, |s| {
        hex(&s.trace_id) == trace && s.name == "session/prompt"
    })
    .await;
    assert_eq!(
        attribute(&call, "rpc.method").as_deref(),
        Some("session/prompt")
    );
    assert_eq!(attribute(&call, "outcome").as_deref(), Some("ok"));
    assert!(call.start_time_unix_nano >= request.start_time_unix_nano);
    // Within the turn, which the request's span holds, and which says how it ended.
    let (_, turn) = span_where(&received, |s| hex(&s.trace_id) == trace && s.name == "turn").await;
    assert_eq!(hex(&call.parent_span_id), hex(&turn.span_id));
    assert_eq!(hex(&turn.parent_span_id), hex(&request.span_id));
    assert_eq!(attribute(&turn, "stop_reason").as_deref(), Some("end_turn"));
    assert_eq!(attribute(&turn, "session_id").as_deref(), Some(id.as_str()));
    // The agent was handed the call's trace context in `_meta`.
    let history = gw.json(&format!("/sessions/{id}/history")).await;
    let said = history.to_string();
    let meta = said
        .split("meta: ")
        .nth(1)
        .unwrap_or_else(|| panic!("the agent reported no _meta: {history}"));
    let expected = format!("00-{trace}-{}-01", hex(&call.span_id));
    assert!(
        meta.contains(&expected),
        "the agent's _meta carries the call's traceparent {expected}: {meta}"
    );
    // A create waits for a member in a span of its own, within the create's.
    let created = "d4cda95b652f4a1592b449d5929fda1b";
    let r = post_traced(
        gw,
        &gw.url("/sessions"),
        created,
        parent,
        json!({"cwd": "/tmp"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let (_, create) = span_where(&received, |s| {
        hex(&s.trace_id) == created && s.name == "POST /sessions"
    })
    .await;
    let (_, waited) = span_where(&received, |s| {
        hex(&s.trace_id) == created && s.name == "acquire member"
    })
    .await;
    assert_eq!(waited.parent_span_id, create.span_id);
    assert_eq!(attribute(&waited, "agent").as_deref(), Some("default"));
    // The log still has every line, in its request's span (one filter serves both).
    let log = w.log();
    let logged = log
        .lines()
        .find(|l| l.contains("upstream call method=\"session/prompt\""))
        .unwrap_or_else(|| panic!("the call is logged: {log}"));
    assert!(logged.contains("request{"), "{logged}");
    w.finish().await;
    server.abort();
}

/// Two replicas exporting to one receiver: a prompt sent to the replica that does not hold the
/// session is forwarded to the one that does, and the trace goes on there, as a child of the
/// forwarding hop: the turn, its ACP call (whose context the agent is handed), the permission
/// the agent asks for while the turn waits for a client, and the log writes of its events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_forwarded_turn_is_one_trace_from_the_caller_to_the_agent_and_the_log() {
    let (url, received, server) = receiver().await;
    let opts = Options::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let (w, b, _c) = support::cluster::three_replicas(opts).await;
    let gw = w.gw();
    let id = gw.create_here("/tmp").await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let prompt = {
        let (b_url, http) = (b.prompt_url(&id), b.http.clone());
        let traceparent = format!("00-{trace}-b7ad6b7169203331-01");
        let request = http.post(b_url).header("traceparent", traceparent);
        tokio::spawn(
            request
                .json(&json!({"text": "/permission /meta hi"}))
                .send(),
        )
    };
    // The agent asks; a client of the replica that holds the session answers.
    let pending = gw.pending_permission(&id).await;
    let r = gw
        .post(
            &format!("/sessions/{id}/permissions/{pending}"),
            json!({"optionId": "allow"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = prompt.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    // (Read whole: the request's span ends with its body.)
    r.bytes().await.unwrap();
    let in_trace = |name: &'static str| {
        let received = received.clone();
        async move { span_where(&received, |s| hex(&s.trace_id) == trace && s.name == name).await }
    };
    let (_, hop) = in_trace("forward").await;
    // The owner's request span is the hop's child, and the turn ran there.
    let (_, there) = span_where(&received, |s| {
        hex(&s.trace_id) == trace
            && s.name == "POST /sessions/{id}/prompt"
            && s.parent_span_id == hop.span_id
    })
    .await;
    let (_, turn) = in_trace("turn").await;
    assert_eq!(turn.parent_span_id, there.span_id);
    // The ACP call is the turn's child, and the agent was handed its context.
    let (_, call) = in_trace("session/prompt").await;
    assert_eq!(call.parent_span_id, turn.span_id);
    let said = gw
        .json(&format!("/sessions/{id}/history"))
        .await
        .to_string();
    let expected = format!("00-{trace}-{}-01", hex(&call.span_id));
    assert!(
        said.contains(&expected),
        "the agent was sent {expected}: {said}"
    );
    // The wait for the permission's answer is the turn's, and says how it ended.
    let (_, waited) = in_trace("permission request pending").await;
    assert_eq!(waited.parent_span_id, turn.span_id);
    assert_eq!(attribute(&waited, "request_id").as_deref(), Some(&*pending));
    assert_eq!(attribute(&waited, "reason").as_deref(), Some("answered"));
    // The turn's events were stored in log writes of its own trace, its children.
    let (_, write) = in_trace("log write").await;
    assert_eq!(write.parent_span_id, turn.span_id);
    assert_eq!(
        attribute(&write, "session_id").as_deref(),
        Some(id.as_str())
    );
    let writes: Vec<Span> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, s)| hex(&s.trace_id) == trace && s.name == "log write")
        .map(|(_, s)| s.clone())
        .collect();
    assert!(writes.iter().all(|s| s.parent_span_id == turn.span_id));
    // Together they wrote every event of the turn, from `turn_started` to `turn_ended`.
    let logged: Vec<String> = gw.logged(&id).await.into_iter().map(|(_, e)| e).collect();
    let from = logged.iter().position(|e| e == "turn_started").unwrap();
    let to = logged.iter().position(|e| e == "turn_ended").unwrap();
    let written: i64 = writes.iter().map(|s| int_attribute(s, "events")).sum();
    assert_eq!(written as usize, to - from + 1, "{logged:?}");
    assert!(
        writes
            .iter()
            .all(|s| s.start_time_unix_nano >= turn.start_time_unix_nano)
    );
    w.finish().await;
    server.abort();
}

/// JSON log lines carry the `trace_id` and `span_id` of the span they were written in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_name_their_trace() {
    let (url, _received, server) = receiver().await;
    let opts = Options::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .args(&["--log-format", "json"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let trace = "5b8aa5a2d2c872e8321cf37308d69df2";
    let r = post_traced(
        gw,
        &gw.prompt_url(&id),
        trace,
        "051581bf3cb55c13",
        json!({"text": "hi"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let lines: Vec<Value> = w
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let call = lines
        .iter()
        .find(|l| l["fields"]["method"] == "session/prompt")
        .unwrap_or_else(|| panic!("the call is logged: {lines:?}"));
    assert_eq!(call["trace_id"], trace, "{call}");
    let span_id = call["span_id"].as_str().unwrap();
    assert!(
        span_id.len() == 16 && span_id != "0000000000000000",
        "{call}"
    );
    let start = lines
        .iter()
        .find(|l| l["fields"]["message"] == "effective configuration")
        .unwrap();
    assert!(start.get("trace_id").is_none(), "outside any span: {start}");
    w.finish().await;
    server.abort();
}

/// An `/acp` client's `_meta.traceparent` is continued: its `session/prompt` is a server span
/// of that trace, holding the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_clients_meta_traceparent_is_continued() {
    let (url, received, server) = receiver().await;
    let opts = Options::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let w = World::start(Backend::Sqlite, opts).await;
    let client = support::acp::AcpClient::start(&w.gw().base, None, false).await;
    let id = client.new_session("/tmp").await;
    let (trace, parent) = ("80f198ee56343ba864fe8b2a57d3eff7", "e457b5a2e4d86bd1");
    let prompt = json!({
        "sessionId": id,
        "prompt": [{"type": "text", "text": "hi"}],
        "_meta": {"traceparent": format!("00-{trace}-{parent}-01"), "editor": "kept"},
    });
    let answer = client.call("session/prompt", prompt).await.unwrap();
    assert_eq!(answer["stopReason"], "end_turn");
    const SERVER: i32 = 2;
    let (_, call) = span_where(&received, |s| {
        hex(&s.trace_id) == trace && s.name == "session/prompt" && s.kind == SERVER
    })
    .await;
    assert_eq!(hex(&call.parent_span_id), parent);
    let (_, turn) = span_where(&received, |s| hex(&s.trace_id) == trace && s.name == "turn").await;
    assert_eq!(turn.parent_span_id, call.span_id);
    client.close().await;
    w.finish().await;
    server.abort();
}

/// Each webhook attempt is a span of its own, with the answer's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_attempt_is_a_span() {
    let (url, received, server) = receiver().await;
    let hooks = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", hooks.local_addr().unwrap());
    let hook_server = tokio::spawn(async move {
        let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
        let _ = axum::serve(hooks, app).await;
    });
    let opts = Options::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .args(&["--webhook-allow-private", "--webhook-poll-ms", "100"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let r = gw
        .post("/webhooks", json!({"url": hook_url, "events": ["*"]}))
        .await;
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    gw.create("/tmp").await;
    let (_, attempt) = span_where(&received, |s| s.name == "webhook attempt").await;
    assert_eq!(
        attribute(&attempt, "webhook").as_deref(),
        created["id"].as_str()
    );
    let status = attempt
        .attributes
        .iter()
        .find(|kv| kv.key == "http.response.status_code")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(status, Some(AnyValue::IntValue(200)));
    w.finish().await;
    server.abort();
    hook_server.abort();
}

/// What the echo agent says of its OTLP variables.
async fn agents_otel_variables(gw: &Gateway, id: &str) -> String {
    let (status, _) = gw
        .prompt(
            id,
            "/env OTEL_EXPORTER_OTLP_ENDPOINT /env OTEL_SERVICE_NAME hi",
        )
        .await;
    assert_eq!(status, 200);
    gw.json(&format!("/sessions/{id}/history"))
        .await
        .to_string()
}

/// `--agent-otel`: the agent's process gets the gateway's collector and a service name of its
/// own; without it, the gateway's `OTEL_*` variables do not reach the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_export_to_the_collector_only_when_asked() {
    let (url, _received, server) = receiver().await;
    let opts = Options::default().args(&["--otlp-endpoint", &url, "--agent-otel"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let text = agents_otel_variables(w.gw(), &id).await;
    assert!(
        text.contains(&format!("OTEL_EXPORTER_OTLP_ENDPOINT={url}")),
        "{text}"
    );
    assert!(
        text.contains("OTEL_SERVICE_NAME=acp-agent-default"),
        "{text}"
    );
    w.finish().await;

    let opts = Options::default()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_SERVICE_NAME", "the-gateway");
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let text = agents_otel_variables(w.gw(), &id).await;
    assert!(text.contains("OTEL_EXPORTER_OTLP_ENDPOINT unset"), "{text}");
    assert!(text.contains("OTEL_SERVICE_NAME unset"), "{text}");
    w.finish().await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_out_of_reach_costs_only_the_spans() {
    let (_held, port) = refusing_port();
    let url = format!("http://127.0.0.1:{port}");
    let opts = Options::default()
        .args(&["--otlp-endpoint", &url])
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "500");
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    for _ in 0..3 {
        let (status, _) = gw.prompt(&id, "hi").await;
        assert_eq!(status, 200);
    }
    let failed = |text: &str| -> f64 {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("acp_gateway_otel_spans_total{result=\"failed\"} ")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    gw.wait_until(|g| async move {
        let text = g.get("/metrics").await.text().await.unwrap();
        failed(&text) > 0.0
    })
    .await;
    assert!(
        w.log().contains("spans could not be exported"),
        "{}",
        w.log()
    );
    let (status, body) = gw.prompt(&id, "still answered").await;
    assert_eq!(status, 200, "{body}");
    let _: Value = body;
    w.finish().await;
}

/// A loopback port that refuses connections for as long as the socket returned is held: bound
/// and never listening, so no other process can listen there meanwhile (as it could on a port
/// found free and let go).
fn refusing_port() -> (std::os::fd::OwnedFd, u16) {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname};
    use std::os::fd::AsRawFd;
    let socket = nix::sys::socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(socket.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
    let port = getsockname::<SockaddrIn>(socket.as_raw_fd())
        .unwrap()
        .port();
    (socket, port)
}
