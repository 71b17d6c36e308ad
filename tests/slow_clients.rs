//! A client that stops reading its event stream is cut once the gateway's write to it has
//! waited the stall timeout, and resumes with `Last-Event-ID` from the last event it read,
//! missing nothing; a client reading the same session meanwhile is not held up.

use crate::support;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::*;

/// Turns of one large chunk each: more than the kernel's socket buffers hold, so that the
/// gateway's writes to a client that reads nothing wait.
const TURNS: usize = 3;
const CHUNK_BYTES: usize = 4_000_000;
/// Long enough that the reading client (a debug build parsing 4 MB frames on a loaded machine)
/// is never cut.
const STALL_SECS: &str = "3";

#[tokio::test]
async fn a_watcher_that_stops_reading_is_cut_and_resumes_where_it_was() {
    let options = Options {
        args: vec!["--stall-timeout".into(), STALL_SECS.into()],
        ..Options::default()
    };
    let (w, id) = World::with_session(Backend::Sqlite, options).await;
    let gw = w.gw();
    let events = gw.url(&format!("/sessions/{id}/events"));
    let mut reader = Sse::open(&gw.http, &events, None).await;
    let reading = tokio::spawn(async move {
        let mut read = Vec::new();
        for _ in 0..TURNS {
            read.extend(reader.until("turn_ended").await);
        }
        // Kept open: only the stalled stream is to end.
        (reader, read)
    });
    let address = gw.base.trim_start_matches("http://").to_owned();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(address.parse().unwrap()).await.unwrap();
    let request = format!(
        "GET /sessions/{id}/events HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n"
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    let id = id.as_str();
    gw.wait_until(|g| async move { streams(g, id).await == Some(2) })
        .await;

    for _ in 0..TURNS {
        let (status, body) = gw.prompt(id, &format!("/bytes {CHUNK_BYTES}")).await;
        assert_eq!(status, 200, "{body}");
    }
    let (_reader, read) = tokio::time::timeout(PATIENCE, reading)
        .await
        .expect("the reading client is not held up by the stalled one")
        .unwrap();
    gw.wait_until(|g| async move { streams(g, id).await == Some(1) })
        .await;

    // What reached the stalled client before the cut, then the end of its connection.
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, stalled.read_to_end(&mut got))
        .await
        .expect("the stalled client's connection is closed")
        .ok();
    let got = String::from_utf8_lossy(&got);
    let whole = got.rfind("\n\n").map_or("", |end| &got[..end]);
    let last: i64 = (whole.lines().rev())
        .find_map(|line| line.strip_prefix("id: "))
        .and_then(|id| id.trim().parse().ok())
        .expect("the stalled client read some events before the cut");
    let all: Vec<i64> = read.iter().map(|e| e.id).collect();
    let end = *all.last().unwrap();
    assert!(last < end, "cut before the end: read up to {last} of {end}");

    let mut resumed = Sse::open(&gw.http, &events, Some(last)).await;
    let mut ids = Vec::new();
    while ids.last() != Some(&end) {
        let e = resumed.next().await.expect("the resumed stream goes on");
        ids.push(e.id);
    }
    let missed: Vec<i64> = all.into_iter().filter(|&seq| seq > last).collect();
    assert_eq!(ids, missed, "the resumed stream starts right after {last}");
    w.finish().await;
}

/// How many streams the session's one watcher has open (none: no one watches).
async fn streams(gw: &Gateway, id: &str) -> Option<u64> {
    gw.json(&format!("/sessions/{id}/watchers")).await[0]["streams"].as_u64()
}
