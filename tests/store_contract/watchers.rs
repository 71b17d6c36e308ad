//! Who is watching: rows added and removed, listed per session oldest first, an id added twice
//! counted once, each change answering its watcher's streams of the session (a replica's that
//! does not beat not counted; when many change at once, each count answered once), and a gone
//! replica's rows forgotten.

use super::*;
use acp_gateway::store::WatcherRecord;

/// How long a replica's rows count after its last beat.
const LEASE: std::time::Duration = std::time::Duration::from_secs(15);

fn watcher(id: &str, session: &str, replica: &str, since: i64) -> WatcherRecord {
    WatcherRecord {
        watcher_id: id.to_owned(),
        session_id: session.to_owned(),
        replica: replica.to_owned(),
        author: r#"{"tenant":"acme","user":"ann ö"}"#.to_owned(),
        since,
    }
}

pub async fn check_watchers(store: Arc<dyn Store>) {
    let (a, b, c) = (
        watcher("w-a", "s1", "r1", 20),
        watcher("w-b", "s1", "r2", 10),
        watcher("w-c", "s2", "r1", 5),
    );
    let bob = WatcherRecord {
        watcher_id: "w-d".into(),
        author: r#"{"tenant":"acme","user":"bob"}"#.into(),
        ..a.clone()
    };
    let a2 = watcher("w-a2", "s1", "r1", 30);
    let mut streams = Vec::new();
    for w in [&b, &a, &c, &a, &a2, &bob] {
        streams.push(store.add_watcher(w, LEASE).await.unwrap());
    }
    // Ann's on r2 (no replica beats as r2 here: a dead one's rows are not counted from r1),
    // then hers on r1 of s1, of s2, the same id again, a second of s1; then Bob's first.
    assert_eq!(streams, [1, 1, 1, 1, 2, 1]);
    assert_eq!(
        store.watchers_of("s1").await.unwrap(),
        [b.clone(), a.clone(), bob.clone(), a2.clone()]
    );
    assert_eq!(store.remove_watcher(&b, LEASE).await.unwrap(), 0);
    let unknown = watcher("w-unknown", "s1", "r1", 1);
    assert_eq!(store.remove_watcher(&unknown, LEASE).await.unwrap(), 2);
    assert_eq!(store.remove_watcher(&a2, LEASE).await.unwrap(), 1);
    assert_eq!(store.remove_watcher(&bob, LEASE).await.unwrap(), 0);
    assert_eq!(store.watchers_of("s1").await.unwrap(), [a]);
    store.forget_watchers_of("r1").await.unwrap();
    assert!(store.watchers_of("s1").await.unwrap().is_empty());
    assert!(store.watchers_of("s2").await.unwrap().is_empty());
}

/// 24 streams of one watcher opened at once, then ended at once: the counts answered are each
/// of 1..=24, then each of 0..24, once (exactly one change is the first, one the last).
pub async fn check_watchers_counted_at_once(store: Arc<dyn Store>) {
    let rows: Vec<WatcherRecord> = (0..24)
        .map(|i| watcher(&format!("w-{i}"), "s1", "r1", i))
        .collect();
    let mut set = JoinSet::new();
    for row in rows.clone() {
        let store = store.clone();
        set.spawn(async move { store.add_watcher(&row, LEASE).await.unwrap() });
    }
    let mut opened: Vec<u64> = set.join_all().await;
    opened.sort_unstable();
    assert_eq!(opened, (1..=24).collect::<Vec<u64>>());
    let mut set = JoinSet::new();
    for row in rows {
        let store = store.clone();
        set.spawn(async move { store.remove_watcher(&row, LEASE).await.unwrap() });
    }
    let mut ended: Vec<u64> = set.join_all().await;
    ended.sort_unstable();
    assert_eq!(ended, (0..24).collect::<Vec<u64>>());
}
