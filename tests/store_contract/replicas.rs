//! How databases record the gateway replicas using them: the registry (PostgreSQL) and the
//! sessions held by a gateway alone on its database (SQLite).

use super::*;

/// Replicas register by heartbeat, are listed oldest first with how long they have been silent,
/// are forgotten once silent for longer than asked, and unregister.
pub async fn check_replicas(registry: Arc<dyn ReplicaRegistry>) {
    use std::time::Duration as StdDuration;
    let hour = StdDuration::from_secs(3600);
    assert!(registry.replicas().await.unwrap().is_empty());
    registry
        .heartbeat_replica("b", "http://127.0.0.1:2", ts(T0 + 1), 3, hour)
        .await
        .unwrap();
    registry
        .heartbeat_replica("a", "http://127.0.0.1:1", ts(T0), 0, hour)
        .await
        .unwrap();
    let replicas = registry.replicas().await.unwrap();
    let ids: Vec<&str> = replicas.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"], "oldest start first");
    assert_eq!(replicas[1].address, "http://127.0.0.1:2");
    assert_eq!(replicas[1].started_at, ts(T0 + 1));
    assert_eq!(replicas[1].sessions_live, 3);
    assert!(
        replicas
            .iter()
            .all(|r| r.silent_for < StdDuration::from_secs(60))
    );
    let first_beat = replicas[1].heartbeat_at;

    // A later beat updates the row in place.
    tokio::time::sleep(StdDuration::from_millis(5)).await;
    registry
        .heartbeat_replica("b", "http://127.0.0.1:22", ts(T0 + 1), 7, hour)
        .await
        .unwrap();
    let b = registry.replicas().await.unwrap().remove(1);
    assert_eq!(
        (b.address.as_str(), b.sessions_live),
        ("http://127.0.0.1:22", 7)
    );
    assert!(b.heartbeat_at > first_beat);

    // A beat forgets whoever has been silent longer than asked.
    tokio::time::sleep(StdDuration::from_millis(20)).await;
    registry
        .heartbeat_replica(
            "b",
            "http://127.0.0.1:22",
            ts(T0 + 1),
            7,
            StdDuration::from_millis(10),
        )
        .await
        .unwrap();
    let ids: Vec<String> = registry
        .replicas()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["b"]);

    assert!(registry.remove_replica("b").await.unwrap());
    assert!(!registry.remove_replica("b").await.unwrap());
    assert!(registry.replicas().await.unwrap().is_empty());
}

/// Alone on its database, a gateway records the sessions it holds live; the next one finds
/// those a dead one left, once.
pub async fn check_held_sessions(held: Arc<dyn HeldSessions>) {
    held.hold("held-a", "r1").await.unwrap();
    held.hold("held-b", "r1").await.unwrap();
    held.hold("held-c", "r2").await.unwrap();
    // Another replica's release leaves the session to its holder.
    held.release("held-b", "r2").await.unwrap();
    assert_eq!(held.release_left("r1").await.unwrap(), ["held-c"]);
    assert!(held.release_left("r1").await.unwrap().is_empty(), "once");
    held.release("held-b", "r1").await.unwrap();
    assert_eq!(held.release_left("r2").await.unwrap(), ["held-a"]);
    // Holding a session takes it over; a clean shutdown forgets everything held.
    held.hold("held-d", "r2").await.unwrap();
    held.hold("held-d", "r1").await.unwrap();
    held.hold("held-e", "r1").await.unwrap();
    held.release_all("r1").await.unwrap();
    assert!(held.release_left("r3").await.unwrap().is_empty());
}
