//! HTTP/2 beside HTTP/1.1 on the same port: a client that opens with HTTP/2's preface (cleartext,
//! prior knowledge, as a proxy in front does) gets every route over it, and many watchers of one
//! session share one connection; a connection that never sends a byte does not hold up a stop.

use crate::support;

use std::time::{Duration, Instant};

use support::*;

/// Streams opened on one connection: more than hyper's default limit of 200 concurrent streams,
/// beyond which a client's new streams would wait for ever.
const WATCHERS: usize = 300;

fn http2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
}

/// Every watcher reads the same turn, in order, over HTTP/2, on one connection.
#[tokio::test]
async fn many_watchers_follow_one_session_over_one_http2_connection() {
    let (w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let http = http2_client();
    let res = http
        .get(gw.url(&format!("/sessions/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.version(), reqwest::Version::HTTP_2);
    assert_eq!(res.status(), 200);
    let url = gw.url(&format!("/sessions/{id}/events"));
    let opened = futures::future::join_all((0..WATCHERS).map(|_| async {
        let res = Sse::request(&http, &url, None).send().await.unwrap();
        assert_eq!(res.version(), reqwest::Version::HTTP_2);
        assert_eq!(res.status(), 200);
        Sse::from_response(res)
    }));
    let mut watchers = tokio::time::timeout(PATIENCE, opened)
        .await
        .expect("every watcher's stream opens on the one connection");
    let (status, body) = gw.prompt(&id, "/chunks 30").await;
    assert_eq!(status, 200, "{body}");
    let read = futures::future::join_all(watchers.iter_mut().map(|sse| sse.until("turn_ended")));
    let read = read.await;
    let ids = |events: &[SseEvent]| events.iter().map(|e| e.id).collect::<Vec<_>>();
    let first = ids(&read[0]);
    assert!(
        first.len() >= 32,
        "turn_started, 30 chunks, turn_ended: {first:?}"
    );
    assert!(first.windows(2).all(|w| w[1] == w[0] + 1), "{first:?}");
    assert!(read.iter().all(|events| ids(events) == first));
    let said: String = (read[WATCHERS - 1].iter())
        .filter(|e| e.event == "agent_message_chunk")
        .filter_map(|e| e.data["update"]["content"]["text"].as_str())
        .collect();
    let words: Vec<String> = (1..=30).map(|i| format!("c{i}")).collect();
    assert_eq!(said.split_whitespace().collect::<Vec<_>>(), words, "{said}");
    w.finish().await;
}

/// A stop is not held up by a client that connected and sent nothing (the gateway peeks at a
/// connection's first bytes to tell the protocol), nor by an HTTP/2 stream left open.
#[tokio::test]
async fn a_silent_connection_does_not_hold_up_a_stop() {
    let (mut w, id) = World::with_session(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let address = gw.base.trim_start_matches("http://").to_owned();
    let silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(&address).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut half, b"PRI * HT")
        .await
        .unwrap();
    let http = http2_client();
    let mut open = Sse::open(&http, &gw.url(&format!("/sessions/{id}/events")), None).await;
    let stopping = Instant::now();
    let status = w.gw.take().unwrap().stop().await;
    assert!(status.success(), "{status:?}");
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "stopped in {:?}",
        stopping.elapsed()
    );
    assert!(open.next().await.is_none(), "the open stream ended");
    drop((silent, half));
    w.finish().await;
}
