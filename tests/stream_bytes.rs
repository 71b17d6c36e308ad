//! What the agent sends reaches the stream as it sent it, on both stores: a NUL character is
//! stored and streamed (PostgreSQL's `jsonb` refuses it), a lone surrogate is served as the
//! escape the agent wrote.

use crate::support;

use support::*;

both_backends!(
    a_nul_the_agent_sends_is_stored_and_streamed,
    a_lone_surrogate_the_agent_sends_is_served_as_it_sent_it
);

/// U+0000 in what the agent sends (here, echoed back from the prompt) is stored and read back
/// as sent, on PostgreSQL too (whose `jsonb` refuses it).
async fn a_nul_the_agent_sends_is_stored_and_streamed(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let id = gw.create("/tmp").await;
    let text = "before\u{0}after";
    let (status, body) = gw.prompt(&id, text).await;
    assert_eq!(status, 200, "{body}");
    let history = gw.json(&format!("/sessions/{id}/history")).await;
    let chunks: String = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "agent_message_chunk")
        .filter_map(|e| e["data"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(chunks, text, "{history}");
    let streamed = gw.first_turn(&id).await;
    assert_eq!(chunk_text(&streamed), text);
    w.finish().await;
}

/// The escapes `/surrogate` makes the echo agent write: a chunk and a title, each ending in a
/// lone high surrogate, as JavaScript's `JSON.stringify` writes a string cut inside a pair.
const LONE_CHUNK: &str = r#""text":"ab\ud83d""#;
const LONE_TITLE: &str = r#""title":"cut \ud83d""#;

/// The `data:` of each frame of `sse` (raw, unparsed: no JSON parser takes a lone surrogate)
/// up to and including the first for which `last` holds.
async fn raw_frames_until(sse: &mut Sse, last: impl Fn(&str, &str) -> bool) -> Vec<String> {
    let read = async {
        let mut frames = Vec::new();
        while let Some(frame) = sse.next_frame().await {
            let (event, data) = (frame.event().to_owned(), frame.data());
            let done = frame.id().is_some() && last(&event, &data);
            frames.push(data);
            if done {
                return frames;
            }
        }
        panic!("the stream ended after {frames:?}");
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the frame within PATIENCE")
}

/// What the gateway serves of a `/surrogate` turn — the session's stream from its start, its
/// `/history`, its view and the list, the lifecycle stream — holds the agent's very escapes.
async fn assert_served_as_sent(gw: &Gateway, id: &str) {
    let frames = raw_frames_until(&mut gw.events(id, Some(0)).await, |event, _| {
        event == "turn_ended"
    })
    .await;
    let streamed = frames.concat();
    assert!(streamed.contains(LONE_CHUNK), "{streamed}");
    assert!(streamed.contains(LONE_TITLE), "{streamed}");
    let history = gw
        .get(&format!("/sessions/{id}/history"))
        .await
        .text()
        .await
        .unwrap();
    assert!(history.contains(LONE_CHUNK), "{history}");
    assert!(history.contains(LONE_TITLE), "{history}");
    for path in [format!("/sessions/{id}"), "/sessions".to_owned()] {
        let r = gw.get(&path).await;
        assert_eq!(r.status(), 200, "GET {path}");
        let body = r.text().await.unwrap();
        assert!(body.contains(LONE_TITLE), "GET {path}: {body}");
    }
    let mut lifecycle = gw.sse("/events", Some(0)).await;
    raw_frames_until(&mut lifecycle, |event, data| {
        event == "session_updated" && data.contains(LONE_TITLE)
    })
    .await;
}

/// A lone UTF-16 surrogate in what the agent sends (a chunk, a title) is neither garbage nor
/// lost: every JSON the gateway serves carries the very escape the agent wrote, on both
/// backends, and still after a restart, from the store.
async fn a_lone_surrogate_the_agent_sends_is_served_as_it_sent_it(backend: Backend) {
    let mut w = World::start(backend, Options::default()).await;
    let id = w.gw().create("/tmp").await;
    let mut live = w.gw().events(&id, None).await;
    let (status, body) = w.gw().prompt(&id, "/surrogate then words").await;
    assert_eq!(status, 200, "{body}");
    let frames = raw_frames_until(&mut live, |event, _| event == "turn_ended").await;
    let streamed = frames.concat();
    assert!(streamed.contains(LONE_CHUNK), "{streamed}");
    assert!(streamed.contains(LONE_TITLE), "{streamed}");
    assert_served_as_sent(w.gw(), &id).await;
    assert_eq!(w.gw().metric("acp_gateway_agent_garbage_total").await, 0.0);
    w.restart().await;
    assert_served_as_sent(w.gw(), &id).await;
    assert_eq!(w.gw().metric("acp_gateway_agent_garbage_total").await, 0.0);
    w.finish().await;
}
