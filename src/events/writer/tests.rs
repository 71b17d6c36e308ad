//! The log writer's pace: what shares a commit, and what ends the pause.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::events::hub::{EventHub, Retention};
use crate::store::Store;

/// A store on an SQLite file of its own (a file, so that the log writer has its own
/// connection, as in production), and the directory to keep while it is used.
async fn file_store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let store = crate::store::connect(&url, "test-replica")
        .await
        .unwrap()
        .store;
    (dir, store)
}

/// `flush` returns once everything queued before it is stored. On this single-threaded
/// runtime the writer cannot run between the enqueues and the read unless `flush` waits.
#[tokio::test]
async fn flush_waits_for_everything_queued_before_it() {
    let (_dir, store) = file_store().await;
    let hub = EventHub::new(
        store.clone(),
        CancellationToken::new(),
        Retention::default(),
    );
    for i in 0..100 {
        hub.enqueue("s", event(i)).await;
    }
    hub.flush().await;
    assert_eq!(store.read_events("s", 0, 1000).await.unwrap().len(), 100);
    hub.close().await;
}

async fn appended(store: &Arc<dyn Store>, session: &str) -> usize {
    store.read_events(session, 0, 1000).await.unwrap().len()
}

fn event(i: usize) -> NewEvent {
    NewEvent {
        kind: "x".into(),
        payload: serde_json::json!({"i": i}).into(),
    }
}

/// After a commit the writer pauses: what is queued meanwhile waits and then goes into one
/// commit. An event queued while the writer is idle is committed at once, and a `flush`
/// or an awaited `append` ends the pause instead of waiting it out. The pace here is far
/// longer than the test, so that no timing decides the outcome.
#[tokio::test]
async fn events_queued_during_the_pause_share_one_commit() {
    let (_dir, store) = file_store().await;
    let pace = Duration::from_secs(600);
    let hub = EventHub::with_pace(
        store.clone(),
        CancellationToken::new(),
        Retention::default(),
        pace,
    );
    hub.enqueue("s", event(0)).await;
    // The counter moves just after the commit becomes readable: wait for both.
    let committed = async {
        while appended(&store, "s").await == 0 || hub.commits() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), committed)
        .await
        .expect("an event queued while the writer is idle is committed without a pause");
    assert_eq!(hub.commits(), 1);

    for i in 1..50 {
        hub.enqueue("s", event(i)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        appended(&store, "s").await,
        1,
        "the writer pauses after a commit"
    );
    tokio::time::timeout(Duration::from_secs(30), hub.flush())
        .await
        .expect("a flush ends the pause");
    assert_eq!(appended(&store, "s").await, 50);
    assert_eq!(
        hub.commits(),
        2,
        "what was queued during the pause is one commit"
    );

    hub.enqueue("s", event(50)).await;
    let seq = tokio::time::timeout(Duration::from_secs(30), hub.append("s", event(51)))
        .await
        .expect("an awaited append ends the pause")
        .unwrap();
    assert_eq!(seq, 52);
    assert_eq!(hub.commits(), 3);
    tokio::time::timeout(Duration::from_secs(30), hub.close())
        .await
        .expect("closing ends the pause");
}

/// Waits until `store` holds `n` events of "s".
async fn until_appended(store: &Arc<dyn Store>, n: usize, what: &str) {
    let stored = async {
        while appended(store, "s").await < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), stored)
        .await
        .expect(what);
}

/// A turn's end (`enqueue_now`) in a session someone follows is committed without waiting
/// out the pause while the writer is quiet, and waits for it after a commit of a busy
/// writer ([`QUIET_BATCH`] events or more); in a session nobody follows it always waits.
/// The pace is far longer than the test.
#[tokio::test]
async fn a_turns_end_cuts_the_pause_of_a_quiet_writer_only() {
    let (_dir, store) = file_store().await;
    let hub = EventHub::with_pace(
        store.clone(),
        CancellationToken::new(),
        Retention::default(),
        Duration::from_secs(600),
    );
    hub.enqueue("s", event(0)).await;
    until_appended(&store, 1, "an idle writer commits at once").await;
    hub.enqueue_now("s", event(1)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        appended(&store, "s").await,
        1,
        "the end of a turn nobody follows waits for the pace"
    );
    let follower = hub.session_stream("s", None).await.unwrap();
    hub.enqueue_now("s", event(2)).await;
    until_appended(
        &store,
        3,
        "a followed turn's end cuts a quiet writer's pause",
    )
    .await;

    // A busy writer: one commit of QUIET_BATCH events, queued before it wakes (an awaited
    // append ends the pause), then a turn's end, which waits for the pace.
    for i in 0..QUIET_BATCH - 1 {
        hub.enqueue("s", event(3 + i)).await;
    }
    hub.append("s", event(2 + QUIET_BATCH)).await.unwrap();
    let busy = 3 + QUIET_BATCH;
    hub.enqueue_now("s", event(busy)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        appended(&store, "s").await,
        busy,
        "after a large commit a turn's end waits for the pace"
    );
    hub.flush().await;
    assert_eq!(appended(&store, "s").await, busy + 1);
    drop(follower);
    hub.close().await;
}

/// A turn's opening, queued while the writer is idle, is not committed at once: the writer
/// waits for the turn's first answer, and the updates queued meanwhile, the turn's end (in a
/// session someone follows) and the opening are one commit. A flush ends the wait too, and
/// with no answer the opening is committed once the pace is out. The first two paces are far
/// longer than the test, so that no timing decides the outcome.
#[tokio::test]
async fn a_turns_opening_waits_for_the_turns_first_answer() {
    let (_dir, store) = file_store().await;
    let hub = paced(&store, Duration::from_secs(600));
    let follower = hub.session_stream("s", None).await.unwrap();
    let now = chrono::Utc::now();
    hub.enqueue_opening("s", event(0), now).await;
    hub.enqueue("s", event(1)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        appended(&store, "s").await,
        0,
        "a turn's opening waits for the turn's first answer"
    );
    hub.enqueue_now("s", event(2)).await;
    until_appended(&store, 3, "the turn's end ends the wait").await;
    assert_eq!(hub.commits(), 1, "the turn is one commit");

    drop(follower);
    hub.close().await;

    let hub = paced(&store, Duration::from_secs(600));
    hub.enqueue_opening("s", event(3), now).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(appended(&store, "s").await, 3, "the opening waits");
    tokio::time::timeout(Duration::from_secs(30), hub.flush())
        .await
        .expect("a flush ends the wait");
    assert_eq!(appended(&store, "s").await, 4);
    hub.close().await;

    let hub = paced(&store, Duration::from_millis(20));
    hub.enqueue_opening("s", event(4), now).await;
    until_appended(
        &store,
        5,
        "unanswered, the opening is committed after the pace",
    )
    .await;
    hub.close().await;
}

/// A hub on `store` whose writer pauses `pace` after each commit.
fn paced(store: &Arc<dyn Store>, pace: Duration) -> Arc<EventHub> {
    EventHub::with_pace(
        store.clone(),
        CancellationToken::new(),
        Retention::default(),
        pace,
    )
}
