//! What a database keeps across closing and opening it again.

use super::*;

/// What [`check_reopen_write`] left behind, for [`check_reopen_read`].
pub struct Reopen {
    session: SessionRecord,
    events: Vec<StoredEvent>,
    lifecycle_seq: i64,
    concurrent_last: i64,
}

/// A lifecycle event of the session this check keeps.
fn lifecycle(kind: &str) -> NewLifecycleEvent {
    NewLifecycleEvent {
        session_id: "reopen-1".to_owned(),
        tenant: "tenant-reopen".to_owned(),
        kind: kind.to_owned(),
        payload: json!({}),
    }
}

pub async fn check_reopen_write(store: Arc<dyn Store>) -> Reopen {
    let session = SessionRecord {
        title: Some("survives".to_owned()),
        meta: Some(json!({"persist": true})),
        additional_directories: vec!["/x".to_owned()],
        ..record("reopen-1", "tenant-reopen")
    };
    assert!(store.put_session(&session).await.unwrap());
    let events = store
        .append_events(
            "reopen-1",
            &(0..4)
                .map(|i| event("persist", json!({"i": i})))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert_eq!(events.last().unwrap().seq, 4);
    let lifecycle_seq = store
        .append_lifecycle(&[lifecycle("created")])
        .await
        .unwrap()[0]
        .seq;
    assert!(
        !store
            .tombstone_session("reopen-dead", "tenant-reopen", ts(T0))
            .await
            .unwrap(),
        "an unknown id is tombstoned but reported as not live"
    );
    let concurrent_last = store.last_event_seq("ev-concurrent").await.unwrap();
    Reopen {
        session,
        events,
        lifecycle_seq,
        concurrent_last,
    }
}

pub async fn check_reopen_read(store: Arc<dyn Store>, before: &Reopen) {
    assert_eq!(
        store.get_session("reopen-1").await.unwrap().as_ref(),
        Some(&before.session)
    );
    assert_eq!(
        store.read_events("reopen-1", 0, 100).await.unwrap(),
        before.events
    );
    assert_eq!(store.last_event_seq("reopen-1").await.unwrap(), 4);
    let next = store
        .append_events("reopen-1", &[event("persist", json!({"i": 4}))])
        .await
        .unwrap();
    assert_eq!(next[0].seq, 5, "the sequence continues after reopening");
    assert_eq!(
        store.last_event_seq("ev-concurrent").await.unwrap(),
        before.concurrent_last
    );
    assert_eq!(
        store.last_lifecycle_seq().await.unwrap(),
        before.lifecycle_seq
    );
    let lc = store
        .append_lifecycle(&[lifecycle("info_updated")])
        .await
        .unwrap()
        .remove(0);
    assert!(lc.seq > before.lifecycle_seq);
    // The tombstone survived too.
    assert!(
        !store
            .put_session(&record("reopen-dead", "tenant-reopen"))
            .await
            .unwrap()
    );
}
