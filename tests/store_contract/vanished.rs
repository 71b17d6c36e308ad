//! What the list sync tombstones: a vanished session comes back, with its log, when the agent
//! lists it again; a deleted one never does; the time of a log's latest event.

use super::*;

pub async fn check_vanish_and_revive(store: Arc<dyn Store>) {
    let (gone, deleted) = ("van-1", "van-deleted");
    for id in [gone, deleted] {
        assert!(store.put_session(&record(id, "van-t")).await.unwrap());
    }
    assert_eq!(store.last_event_at(gone).await.unwrap(), None);
    let logged = store
        .append_events(gone, &[event("turn_started", json!({"n": 1}))])
        .await
        .unwrap();
    assert_eq!(
        store.last_event_at(gone).await.unwrap(),
        Some(logged[0].created_at)
    );

    let at = ts(T0 + 5) + Duration::nanoseconds(700);
    assert!(store.vanish_session(gone, at).await.unwrap());
    assert!(
        !store.vanish_session(gone, ts(T0 + 9)).await.unwrap(),
        "a tombstone is not vanished again"
    );
    assert!(store.tombstone_session(deleted, "van-t", at).await.unwrap());
    assert!(
        !store.vanish_session("van-unknown", at).await.unwrap(),
        "an unknown id is not vanished"
    );
    assert_eq!(store.get_session("van-unknown").await.unwrap(), None);
    let row = store.get_session(gone).await.unwrap().unwrap();
    assert_eq!(row.deleted_at, Some(ts(T0 + 5)));
    assert!(listed(&*store, "van-t").await.is_empty());
    assert_eq!(
        store.last_event_at(gone).await.unwrap(),
        Some(logged[0].created_at),
        "the log outlives the tombstone"
    );

    // Listed again: the vanished row is one to look at (with its tombstone), the deleted one
    // is not, whatever its digest.
    let page: Vec<ListedSession> = [gone, deleted]
        .iter()
        .map(|id| ListedSession {
            session_id: (*id).to_owned(),
            digest: 7,
        })
        .collect();
    let to_sync = store.sessions_to_sync(&page).await.unwrap();
    assert_eq!(to_sync.len(), 1, "{to_sync:?}");
    assert_eq!(to_sync[0].session_id, gone);
    assert_eq!(
        to_sync[0].cached.as_ref().unwrap().deleted_at,
        Some(ts(T0 + 5))
    );

    assert!(
        !store.revive_session(deleted).await.unwrap(),
        "deleted stays"
    );
    assert!(!store.revive_session("van-unknown").await.unwrap());
    assert!(store.revive_session(gone).await.unwrap());
    assert!(!store.revive_session(gone).await.unwrap(), "once");
    let back = store.get_session(gone).await.unwrap().unwrap();
    assert_eq!(
        back,
        SessionRecord {
            listed: None,
            ..record(gone, "van-t")
        }
    );
    assert_eq!(ids(&listed(&*store, "van-t").await), [gone]);
    assert_eq!(store.read_events(gone, 0, 10).await.unwrap().len(), 1);
    assert!(
        store
            .get_session(deleted)
            .await
            .unwrap()
            .unwrap()
            .deleted_at
            .is_some(),
        "a deletion is for good"
    );

    // Revived, then deleted by a client: deleted for good, not vanished.
    assert!(store.tombstone_session(gone, "van-t", at).await.unwrap());
    assert!(!store.revive_session(gone).await.unwrap());
    assert!(store.sessions_to_sync(&page).await.unwrap().is_empty());
}
