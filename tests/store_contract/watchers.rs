//! Who is watching: rows added and removed, listed per session oldest first, an id added twice
//! counted once, and a gone replica's rows forgotten.

use super::*;
use acp_gateway::store::WatcherRecord;

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
    for w in [&a, &b, &c, &a] {
        store.add_watcher(w).await.unwrap();
    }
    assert_eq!(
        store.watchers_of("s1").await.unwrap(),
        [b.clone(), a.clone()]
    );
    store.remove_watcher("w-b").await.unwrap();
    store.remove_watcher("w-unknown").await.unwrap();
    assert_eq!(store.watchers_of("s1").await.unwrap(), [a]);
    store.forget_watchers_of("r1").await.unwrap();
    assert!(store.watchers_of("s1").await.unwrap().is_empty());
    assert!(store.watchers_of("s2").await.unwrap().is_empty());
}
