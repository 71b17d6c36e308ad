//! The durable, resumable event stream: every event exactly once and in order across random
//! disconnects and a gateway restart; a stalled subscriber slows nobody; retention gaps are
//! announced, never silent (what the agent's bytes become on the stream is `stream_bytes.rs`).

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

both_backends!(every_event_once_across_disconnects_and_a_restart);

/// A small deterministic PRNG (xorshift64*) so that disconnect points are random but repeatable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

const CHUNKS_PER_TURN: usize = 5000;
const CLIENTS: u64 = 3;
const DISCONNECTS: usize = 50;

/// Reads the stream as a reconnecting client would: from `Last-Event-ID`, dropping the
/// connection at its disconnect points and whenever the gateway goes away, until it has seen
/// event `final_seq`. Returns every id it was given, in order.
async fn client(
    base: Arc<RwLock<String>>,
    session: String,
    final_seq: Arc<AtomicI64>,
    seed: u64,
    max_seq: i64,
) -> (Vec<i64>, usize) {
    let mut rng = Rng(seed);
    let mut points: Vec<i64> = (0..DISCONNECTS)
        .map(|_| 1 + (rng.next() % (max_seq as u64 - 1)) as i64)
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut points = points.into_iter().peekable();
    let http = reqwest::Client::new();
    let (mut seen, mut last, mut connects) = (Vec::new(), 0i64, 0usize);
    let deadline = Instant::now() + Duration::from_secs(240);
    'outer: loop {
        assert!(Instant::now() < deadline, "client {seed} stuck at {last}");
        let fin = final_seq.load(Ordering::SeqCst);
        if fin > 0 && last == fin {
            return (seen, connects);
        }
        let url = format!("{}/sessions/{session}/events", base.read().unwrap());
        let Some(mut sse) = Sse::reopen(&http, &url, last).await else {
            continue;
        };
        connects += 1;
        loop {
            let fin = final_seq.load(Ordering::SeqCst);
            if fin > 0 && last == fin {
                return (seen, connects);
            }
            let next = tokio::time::timeout(Duration::from_millis(500), sse.next()).await;
            let event = match next {
                Ok(Some(e)) => e,
                Ok(None) => continue 'outer, // the gateway went away: reconnect
                Err(_) => continue,          // quiet: check whether we are done
            };
            assert_eq!(
                event.id,
                last + 1,
                "client {seed}: event {} after {last}",
                event.id
            );
            last = event.id;
            seen.push(event.id);
            if points.next_if(|p| *p <= last).is_some() {
                continue 'outer; // disconnect here and resume with Last-Event-ID
            }
        }
    }
}

/// 10,000+ events, 3 clients each disconnecting at 50 random points and reconnecting with
/// Last-Event-ID, one gateway restart in the middle: every client sees every event exactly once,
/// in order, and the same events as the log.
async fn every_event_once_across_disconnects_and_a_restart(backend: Backend) {
    let mut w = World::start(backend, Options::default()).await;
    let session = w.gw().create("/tmp").await;
    let base = Arc::new(RwLock::new(w.gw().base.clone()));
    let final_seq = Arc::new(AtomicI64::new(0));
    // Two turns: turn_started + chunks + session_info_update + turn_ended, then again without
    // the info update.
    let expected = (CHUNKS_PER_TURN as i64 + 3) + (CHUNKS_PER_TURN as i64 + 2);
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|seed| {
            tokio::spawn(client(
                base.clone(),
                session.clone(),
                final_seq.clone(),
                seed,
                expected,
            ))
        })
        .collect();

    let (status, _) = w
        .gw()
        .prompt(&session, &format!("/chunks {CHUNKS_PER_TURN}"))
        .await;
    assert_eq!(status, 200);
    w.restart().await;
    *base.write().unwrap() = w.gw().base.clone();
    let (status, _) = w
        .gw()
        .prompt(&session, &format!("/chunks {CHUNKS_PER_TURN}"))
        .await;
    assert_eq!(status, 200);
    let last = w
        .gw()
        .json(&format!(
            "/sessions/{session}/history?after={}&limit=10",
            expected - 1
        ))
        .await;
    assert_eq!(last["events"][0]["seq"], expected, "{last}");
    assert_eq!(last["events"][0]["event"], "turn_ended");
    final_seq.store(expected, Ordering::SeqCst);

    for c in clients {
        let (seen, connects) = c.await.unwrap();
        assert_eq!(
            seen,
            (1..=expected).collect::<Vec<_>>(),
            "exactly once, in order"
        );
        assert!(
            connects > DISCONNECTS / 2,
            "the client really reconnected ({connects} connections)"
        );
    }
    // What the clients saw is what the log holds: spot-check the content of a reconnecting read.
    let mut sse = w.gw().events(&session, Some(4999)).await;
    let e = sse.next().await.unwrap();
    assert_eq!((e.id, e.event.as_str()), (5000, "agent_message_chunk"));
    assert_eq!(e.data["update"]["content"]["text"], "c4999 ");
    w.finish().await;
}

/// Opens an SSE request on a raw socket with a tiny receive buffer and never reads it.
fn stalled_subscriber(base: &str, path: &str) -> std::net::TcpStream {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, connect, setsockopt, socket, sockopt,
    };
    use std::os::fd::AsRawFd;
    let addr: std::net::SocketAddrV4 = base.trim_start_matches("http://").parse().unwrap();
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    setsockopt(&fd, sockopt::RcvBuf, &4096).unwrap();
    connect(fd.as_raw_fd(), &SockaddrIn::from(addr)).unwrap();
    let mut stream = std::net::TcpStream::from(fd);
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    stream
}

/// Reads a chunked SSE response from a raw socket until an event with `event: {name}`; returns
/// the ids seen.
fn read_raw_until(stream: std::net::TcpStream, name: &str) -> Vec<i64> {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break; // end of headers
        }
    }
    let (mut text, mut ids) = (String::new(), Vec::new());
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let size = usize::from_str_radix(line.trim(), 16).unwrap();
        let mut chunk = vec![0; size + 2];
        r.read_exact(&mut chunk).unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk[..size]));
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            let id = frame
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .map(|v| v.parse::<i64>().unwrap());
            if let Some(id) = id {
                ids.push(id);
            }
            if frame.lines().any(|l| l == format!("event: {name}")) {
                return ids;
            }
        }
    }
}

/// A subscriber that stops reading delays neither the turn nor another subscriber; when it
/// reads again it continues from the log with nothing missing.
#[tokio::test]
async fn stalled_subscriber_delays_nobody() {
    let (w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let stalled = stalled_subscriber(&gw.base, &format!("/sessions/{id}/events?after=0"));
    let mut reader = gw.events(&id, Some(0)).await;
    let chunks = 50_000;
    let (status, _) = gw.prompt(&id, &format!("/chunks {chunks}")).await;
    assert_eq!(
        status, 200,
        "the turn finished while a subscriber was stalled"
    );
    let events = reader.until("turn_ended").await;
    assert_eq!(events.len(), chunks + 3);
    assert!(events.iter().enumerate().all(|(i, e)| e.id == i as i64 + 1));
    let metrics = gw.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("\nacp_gateway_sse_subscribers 2\n"),
        "both streams are counted: {metrics}"
    );
    assert!(metrics.contains("\nacp_gateway_sse_lagged_total "));
    let ids = tokio::task::spawn_blocking(move || read_raw_until(stalled, "turn_ended"))
        .await
        .unwrap();
    assert_eq!(
        ids,
        (1..=(chunks as i64 + 3)).collect::<Vec<_>>(),
        "the stalled subscriber lost nothing"
    );
    w.finish().await;
}

/// With --retention-events, older events are pruned; a cursor into pruned history first gets a
/// `gap` event {from, to} whose id lets the client resume right after it.
#[tokio::test]
async fn retention_announces_gaps() {
    let opts = Options::default().args(&["--retention-events", "5"]);
    let (w, id) = World::with_session(Backend::Sqlite, opts).await;
    let gw = w.gw();
    assert_eq!(gw.prompt(&id, "/chunks 20").await.0, 200);
    // 1 turn_started + 20 chunks + 1 session_info_update + 1 turn_ended = 23 events; keep 19..=23.
    let path = format!("/sessions/{id}/history");
    gw.wait_until(|g| {
        let path = path.clone();
        async move { g.json(&path).await["events"].as_array().unwrap().len() == 5 }
    })
    .await;
    let mut sse = gw.events(&id, Some(0)).await;
    let gap = sse.next().await.unwrap();
    assert_eq!(gap.event, "gap");
    assert_eq!(gap.id, 18);
    assert_eq!(gap.data, json!({"sessionId": id, "from": 1, "to": 18}));
    let spec = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    check_union(&union_validator(&spec, "SessionEvent"), &gap);
    let rest = sse.until("turn_ended").await;
    assert_eq!(
        rest.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![19, 20, 21, 22, 23]
    );
    // Resuming inside the kept range has no gap.
    let mut sse = gw.events(&id, Some(20)).await;
    assert_eq!(sse.next().await.unwrap().id, 21);
    // New events continue the numbering.
    assert_eq!(gw.prompt(&id, "more").await.0, 200);
    let mut sse = gw.events(&id, Some(23)).await;
    let e = sse.next().await.unwrap();
    assert_eq!((e.id, e.event.as_str()), (24, "turn_started"));
    w.finish().await;
}

/// One stage histogram of `/metrics` (`acp_gateway_event_stage_seconds{stage}`): its cumulative
/// bucket counts, in order, and its count.
fn stage(metrics: &str, stage: &str) -> (Vec<u64>, u64) {
    let value = |line: &str| line.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap();
    let bucket = format!("acp_gateway_event_stage_seconds_bucket{{stage=\"{stage}\",");
    let count = format!("acp_gateway_event_stage_seconds_count{{stage=\"{stage}\"}} ");
    let buckets = metrics
        .lines()
        .filter(|l| l.starts_with(&bucket))
        .map(value);
    let total = metrics.lines().find(|l| l.starts_with(&count)).map(value);
    (
        buckets.collect(),
        total.unwrap_or_else(|| panic!("no {count} in {metrics}")),
    )
}

/// `/metrics` says how long events spend on their way to subscribers: every appended event is
/// counted once waiting for its write, every write once, and each committed run once per live
/// subscriber that took it.
#[tokio::test]
async fn stage_times_count_every_event_write_and_subscriber() {
    let (w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let mut subscribers = [gw.events(&id, None).await, gw.events(&id, None).await];
    assert_eq!(gw.prompt(&id, "/chunks 10").await.0, 200);
    for sse in &mut subscribers {
        sse.until("turn_ended").await;
    }
    let metrics = gw.get("/metrics").await.text().await.unwrap();
    let appended = gw.metric("acp_gateway_events_appended_total").await as u64;
    let (waited, waited_count) = stage(&metrics, "waited");
    let (written, written_count) = stage(&metrics, "written");
    let (handed, handed_count) = stage(&metrics, "handed");
    for buckets in [&waited, &written, &handed] {
        assert_eq!(buckets.len(), 18, "17 bounds and +Inf: {metrics}");
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "cumulative: {metrics}"
        );
    }
    assert_eq!(
        (waited[17], written[17], handed[17]),
        (waited_count, written_count, handed_count)
    );
    assert!(
        appended >= 12,
        "turn_started, 10 chunks, turn_ended: {appended}"
    );
    assert_eq!(waited_count, appended, "each event waited once: {metrics}");
    assert!((1..=appended).contains(&written_count), "{metrics}");
    assert!(
        handed_count >= 2 && handed_count % 2 == 0,
        "each run to both: {metrics}"
    );
    w.finish().await;
}

/// Every payload a real session writes to both streams matches its schema in the OpenAPI
/// document: required properties present, no undocumented property on the gateway's own
/// events, and the documented JSON types.
#[tokio::test]
async fn stream_payloads_match_the_spec() {
    let spec = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let mut lifecycle = gw.sse("/events", Some(0)).await;
    let id = gw.create("/tmp").await;
    let mut stream = gw.events(&id, Some(0)).await;
    // Turns that ask the client something, each answered through its route.
    let mut events = Vec::new();
    for (prompt, requested, route, answer) in [
        (
            "/permission /unknown hello",
            "permission_requested",
            "permissions",
            json!({"optionId": "allow"}),
        ),
        (
            "/elicit",
            "elicitation_requested",
            "elicitations",
            json!({"action": "accept", "content": {"name": "Ada", "age": 36}}),
        ),
        (
            "/elicit-url",
            "elicitation_requested",
            "elicitations",
            json!({"action": "accept"}),
        ),
    ] {
        gw.prompt_async(&id, prompt).await;
        let asked = stream.until(requested).await;
        let request_id = asked.last().unwrap().data["requestId"]
            .as_str()
            .unwrap()
            .to_owned();
        events.extend(asked);
        let r = gw
            .post(&format!("/sessions/{id}/{route}/{request_id}"), answer)
            .await;
        assert_eq!(r.status(), 200, "{prompt}");
        events.extend(stream.until("turn_ended").await);
    }
    gw.prompt_async(&id, "/crash").await;
    events.extend(stream.until("agent_exited").await);
    gw.wait_members_ready().await;
    let r = gw
        .patch(&format!("/sessions/{id}"), json!({"title": "t"}))
        .await;
    assert_eq!(r.status(), 200);
    // A snapshot stream's first event, the session's `state`.
    let session_events = union_validator(&spec, "SessionEvent");
    let mut snapshot = gw
        .sse(&format!("/sessions/{id}/events?snapshot=true"), None)
        .await;
    let state = snapshot.next().await.unwrap();
    assert_eq!(state.event, "state");
    check_schema(&spec, "StateSnapshot", &state.data, "state");
    check_union(&session_events, &state);
    drop(snapshot);
    // The same session's history, as a typed client reads it: one page of `SessionEvent`s.
    let history = json!({"events": gw.history(&id).await});
    if let Err(error) = union_validator(&spec, "HistoryPage").validate(&history) {
        panic!("the history page does not match HistoryPage: {error}: {history}");
    }
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);

    events.extend(stream.until("session_deleted").await);
    let kinds: std::collections::HashSet<&str> = events.iter().map(|e| e.event.as_str()).collect();
    for kind in [
        "turn_started",
        "agent_message_chunk",
        "future_variant_x",
        "permission_requested",
        "permission_resolved",
        "elicitation_requested",
        "elicitation_resolved",
        "elicitation_completed",
        "turn_ended",
        "agent_exited",
        "session_deleted",
    ] {
        assert!(kinds.contains(kind), "no {kind} in {kinds:?}");
    }
    for e in &events {
        let schema =
            data_schema(&spec, "KnownSessionEvent", &e.event).unwrap_or("SessionUpdateData");
        check_schema(&spec, schema, &e.data, &e.event);
        check_union(&session_events, e);
    }
    let events = lifecycle.until("session_deleted").await;
    let lifecycle_events = union_validator(&spec, "LifecycleEvent");
    for e in &events {
        let schema = data_schema(&spec, "LifecycleEvent", &e.event)
            .unwrap_or_else(|| panic!("undocumented lifecycle event {}", e.event));
        check_schema(&spec, schema, &e.data, &e.event);
        check_union(&lifecycle_events, e);
    }
    w.finish().await;
}

/// The schema of `data` for `event` in the union `name`, by its discriminator's mapping.
fn data_schema<'a>(spec: &'a Value, name: &str, event: &str) -> Option<&'a str> {
    let schemas = &spec["components"]["schemas"];
    let variant = schemas[name]["discriminator"]["mapping"][event].as_str()?;
    let variant = variant.rsplit('/').next().unwrap();
    schemas[variant]["properties"]["data"]["$ref"]
        .as_str()
        .map(|r| r.rsplit('/').next().unwrap())
}

/// A JSON Schema validator of the spec's schema `name`.
fn union_validator(spec: &Value, name: &str) -> jsonschema::Validator {
    let mut root = spec.clone();
    root["$ref"] = format!("#/components/schemas/{name}").into();
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&root)
        .unwrap()
}

/// The event, as a client decodes it (`seq` is the SSE id), is exactly one variant of the union.
fn check_union(union: &jsonschema::Validator, e: &support::sse::SseEvent) {
    let decoded = json!({"seq": e.id, "event": e.event, "data": e.data});
    if let Err(error) = union.validate(&decoded) {
        panic!(
            "{}: not one variant of the union: {error}: {decoded}",
            e.event
        );
    }
}

/// A small check of `value` against a component schema of the spec: required properties,
/// property types, and (except where the agent's own objects pass through) no extras.
fn check_schema(spec: &Value, name: &str, value: &Value, event: &str) {
    let schema = &spec["components"]["schemas"][name];
    let props = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no schema {name}"));
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("{event}: not an object: {value}"));
    for required in schema["required"].as_array().into_iter().flatten() {
        let key = required.as_str().unwrap();
        assert!(
            object.contains_key(key),
            "{event}: {key} missing from {value}"
        );
    }
    for (key, v) in object {
        let Some(prop) = props.get(key) else {
            assert_eq!(
                name, "SessionUpdateData",
                "{event}: {key} is not in {name}: {value}"
            );
            continue;
        };
        let types: Vec<&str> = match &prop["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            // `$ref` or `oneOf` (a nested schema, possibly null): objects or null.
            _ => vec!["object", "null"],
        };
        let actual = match v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        assert!(
            types.contains(&actual) || (actual == "integer" && types.contains(&"number")),
            "{event}: {key} is {actual}, documented {types:?}: {value}"
        );
    }
}

/// Two replicas on one PostgreSQL database: a client of one follows, live, in order and exactly
/// once, a session that the other creates and prompts, and sees its lifecycle on `GET /events`.
#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn subscribers_follow_sessions_another_replica_writes() {
    let w = World::start(Backend::Postgres, Options::default()).await;
    let here = w.gw();
    let there_dir = tempfile::tempdir().unwrap();
    let there = Gateway::spawn(&w.db.url, there_dir.path(), &Options::default()).await;
    let mut lifecycle = here.sse("/events", Some(0)).await;

    let id = there.create("/tmp").await;
    let created = lifecycle.until("session_created").await;
    assert_eq!(
        created.last().unwrap().data["session"]["sessionId"],
        id.as_str()
    );
    let mut stream = here.events(&id, Some(0)).await;
    let mut seen = Vec::new();
    for text in ["/chunks 300", "hello from there"] {
        let (status, body) = there.prompt(&id, text).await;
        assert_eq!(status, 200, "{body}");
        seen.extend(stream.until("turn_ended").await);
    }
    let seqs: Vec<i64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(
        seqs,
        (1..=seen.len() as i64).collect::<Vec<_>>(),
        "in order, each once"
    );
    assert_eq!(positions(&seen), there.logged(&id).await);
    assert_eq!(chunk_text(&seen).matches("c300").count(), 1);
    there.stop().await;
    w.finish().await;
}
