//! How databases record the gateway replicas using them: the registry (PostgreSQL) and the
//! sessions held by a gateway alone on its database (SQLite).

use super::*;

/// Replica `id`'s heartbeat, reached at `address`, started at `started_at`, holding
/// `sessions_live` sessions live and running `agents`.
pub fn beat(
    id: &str,
    address: &str,
    started_at: DateTime<Utc>,
    sessions_live: i64,
    agents: &[&str],
) -> Heartbeat {
    Heartbeat {
        id: id.to_owned(),
        address: address.to_owned(),
        started_at,
        sessions_live,
        agents: agents.iter().map(|a| a.to_string()).collect(),
    }
}

/// Replicas register by heartbeat (with the agents they run), are listed oldest first with how
/// long they have been silent, are forgotten once silent for longer than asked, and unregister.
pub async fn check_replicas(registry: Arc<dyn ReplicaRegistry>) {
    use std::time::Duration as StdDuration;
    let hour = StdDuration::from_secs(3600);
    assert!(registry.replicas().await.unwrap().is_empty());
    registry
        .heartbeat_replica(
            &beat("b", "http://127.0.0.1:2", ts(T0 + 1), 3, &["x", "y"]),
            hour,
        )
        .await
        .unwrap();
    registry
        .heartbeat_replica(&beat("a", "http://127.0.0.1:1", ts(T0), 0, &[]), hour)
        .await
        .unwrap();
    let replicas = registry.replicas().await.unwrap();
    let ids: Vec<&str> = replicas.iter().map(|r| r.beat.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"], "oldest start first");
    assert_eq!(replicas[1].beat.address, "http://127.0.0.1:2");
    assert_eq!(replicas[1].beat.started_at, ts(T0 + 1));
    assert_eq!(replicas[1].beat.sessions_live, 3);
    assert_eq!(replicas[1].beat.agents, ["x", "y"], "in the order given");
    assert!(replicas[0].beat.agents.is_empty());
    assert!(
        replicas
            .iter()
            .all(|r| r.silent_for < StdDuration::from_secs(60))
    );
    let first_beat = replicas[1].heartbeat_at;

    // A later beat updates the row in place.
    tokio::time::sleep(StdDuration::from_millis(5)).await;
    registry
        .heartbeat_replica(
            &beat("b", "http://127.0.0.1:22", ts(T0 + 1), 7, &["y"]),
            hour,
        )
        .await
        .unwrap();
    let b = registry.replicas().await.unwrap().remove(1);
    assert_eq!(
        (
            b.beat.address.as_str(),
            b.beat.sessions_live,
            b.beat.agents.as_slice()
        ),
        ("http://127.0.0.1:22", 7, ["y".to_owned()].as_slice())
    );
    assert!(b.heartbeat_at > first_beat);

    // A beat forgets whoever has been silent longer than asked.
    tokio::time::sleep(StdDuration::from_millis(20)).await;
    registry
        .heartbeat_replica(
            &beat("b", "http://127.0.0.1:22", ts(T0 + 1), 7, &["y"]),
            StdDuration::from_millis(10),
        )
        .await
        .unwrap();
    let ids: Vec<String> = registry
        .replicas()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.beat.id)
        .collect();
    assert_eq!(ids, ["b"]);

    assert!(registry.remove_replica("b").await.unwrap());
    assert!(!registry.remove_replica("b").await.unwrap());
    assert!(registry.replicas().await.unwrap().is_empty());
}

/// Claims of live sessions: one replica owns a session while it beats; once its lease is
/// over, the session is an orphan, taken by one claimer only, which is told so.
pub async fn check_claims(registry: Arc<dyn ReplicaRegistry>) {
    use std::time::Duration as StdDuration;
    let hour = StdDuration::from_secs(3600);
    for id in ["a", "b"] {
        registry
            .heartbeat_replica(&beat(id, "http://127.0.0.1:1", ts(T0), 0, &[]), hour)
            .await
            .unwrap();
    }
    assert_eq!(
        registry.claim_session("s1", "a", hour).await.unwrap(),
        Claimed::Taken
    );
    assert_eq!(
        registry.claim_session("s1", "a", hour).await.unwrap(),
        Claimed::Taken
    );
    assert_eq!(
        registry.claim_session("s1", "b", hour).await.unwrap(),
        Claimed::Refused
    );
    let owner = registry.session_owner("s1", hour).await.unwrap();
    assert_eq!(owner.map(|(id, _)| id).as_deref(), Some("a"));
    assert!(registry.orphans(hour).await.unwrap().is_empty());

    // a's lease (as short as asked) is over: s1 is an orphan until one claim takes it.
    tokio::time::sleep(StdDuration::from_millis(20)).await;
    let short = StdDuration::from_millis(10);
    assert_eq!(registry.session_owner("s1", short).await.unwrap(), None);
    assert_eq!(registry.orphans(short).await.unwrap(), ["s1"]);
    registry
        .heartbeat_replica(&beat("b", "http://127.0.0.1:1", ts(T0), 0, &[]), hour)
        .await
        .unwrap();
    assert_eq!(
        registry.claim_session("s1", "b", short).await.unwrap(),
        Claimed::Orphan
    );
    assert_eq!(
        registry.claim_session("s1", "b", short).await.unwrap(),
        Claimed::Taken
    );
    let owner = registry.session_owner("s1", hour).await.unwrap();
    assert_eq!(owner.map(|(id, _)| id).as_deref(), Some("b"));
    // What each holds, as a replica that was silent meanwhile finds it.
    registry.claim_session("s2", "a", hour).await.unwrap();
    assert_eq!(registry.sessions_held_by("a").await.unwrap(), ["s2"]);
    assert_eq!(registry.sessions_held_by("b").await.unwrap(), ["s1"]);
    let mut owned = registry
        .owned_among(&["s1", "s2", "s3"], hour)
        .await
        .unwrap();
    owned.sort();
    assert_eq!(owned, ["s1", "s2"]);
    tokio::time::sleep(StdDuration::from_millis(20)).await;
    assert!(
        registry
            .owned_among(&["s1", "s2"], short)
            .await
            .unwrap()
            .is_empty(),
        "owned by replicas past their lease: by nobody"
    );
    registry.release_session("s2", "a").await.unwrap();
    assert!(registry.sessions_held_by("a").await.unwrap().is_empty());
    // Released, it is nobody's: the next claim takes it plainly.
    registry.release_session("s1", "a").await.unwrap();
    assert_eq!(
        registry.claim_session("s1", "a", hour).await.unwrap(),
        Claimed::Refused
    );
    registry.release_session("s1", "b").await.unwrap();
    assert_eq!(
        registry.claim_session("s1", "a", hour).await.unwrap(),
        Claimed::Taken
    );
}

/// Alone on its database, a gateway records the sessions it holds live; the next one finds
/// those a dead one left, and holding one of them says it was another's.
pub async fn check_held_sessions(held: Arc<dyn HeldSessions>) {
    assert!(!held.hold("held-a", "r1").await.unwrap());
    assert!(!held.hold("held-b", "r1").await.unwrap());
    assert!(!held.hold("held-c", "r2").await.unwrap());
    // Another replica's release leaves the session to its holder.
    held.release("held-b", "r2").await.unwrap();
    assert_eq!(held.left("r1").await.unwrap(), ["held-c"]);
    assert!(held.hold("held-c", "r1").await.unwrap(), "taken from r2");
    assert!(!held.hold("held-c", "r1").await.unwrap(), "already r1's");
    assert!(held.left("r1").await.unwrap().is_empty());
    held.release("held-b", "r1").await.unwrap();
    let mut left = held.left("r2").await.unwrap();
    left.sort();
    assert_eq!(left, ["held-a", "held-c"]);
    // A clean shutdown forgets everything held.
    held.hold("held-e", "r1").await.unwrap();
    held.release_all("r1").await.unwrap();
    assert!(held.left("r3").await.unwrap().is_empty());
}
