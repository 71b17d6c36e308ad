//! Sessions written whole: the row, the events with their own numbers and times (a payload
//! holding U+0000 and a kind escaped on PostgreSQL among them), the state, all or nothing; an
//! id in use refused, except a session found in the agent's list whose log is empty, which an
//! adopting import fills; appends go on after the imported events.

use super::*;
use acp_gateway::store::Payload;

fn imported(seq: i64, kind: &str, text: &str) -> StoredEvent {
    StoredEvent {
        session_id: String::new(),
        seq,
        kind: kind.to_owned(),
        payload: Payload::from(json!({"text": text})),
        created_at: ts(T0 + seq * 1_000_003),
    }
}

pub async fn check_session_imports(store: Arc<dyn Store>) {
    let events = vec![
        imported(4, "agent_message_chunk", "a\u{0}b"),
        imported(5, "_x/\u{0}kind", "c"),
        imported(9, "turn_ended", "d"),
    ];
    let state = json!({"plan": [{"content": "x"}]});
    let copy = record("imp_1", "acme");
    assert!(
        store
            .import_session(&copy, &events, Some((9, &state)), false)
            .await
            .unwrap()
    );
    assert_eq!(
        store.get_session("imp_1").await.unwrap(),
        Some(copy.clone())
    );
    let read = store.read_events("imp_1", 0, 100).await.unwrap();
    let want: Vec<StoredEvent> = events
        .iter()
        .map(|e| StoredEvent {
            session_id: "imp_1".into(),
            ..e.clone()
        })
        .collect();
    assert_eq!(read, want);
    assert_eq!(store.last_event_seq("imp_1").await.unwrap(), 9);
    assert_eq!(
        store.session_state("imp_1").await.unwrap(),
        Some((9, state.clone()))
    );
    let appended = store
        .append_events("imp_1", &[event("turn_started", json!({}))])
        .await
        .unwrap();
    assert_eq!(appended[0].seq, 10);

    // An id in use is refused whole, adopting or not, and leaves the row and log as they were.
    for adopt in [false, true] {
        let other = record("imp_1", "globex");
        assert!(
            !store
                .import_session(&other, &events, None, adopt)
                .await
                .unwrap()
        );
    }
    assert_eq!(store.get_session("imp_1").await.unwrap(), Some(copy));
    assert_eq!(store.read_events("imp_1", 0, 100).await.unwrap().len(), 4);

    // A session found in the agent's list with an empty log is filled by an adopting import.
    let mut listed = record("imp_2", "admin");
    listed.origin = Origin::Upstream;
    store.put_sessions(&[listed]).await.unwrap();
    let fill = record("imp_2", "admin");
    assert!(
        !store
            .import_session(&fill, &events, None, false)
            .await
            .unwrap()
    );
    assert!(
        store
            .import_session(&fill, &events, None, true)
            .await
            .unwrap()
    );
    assert_eq!(
        store.get_session("imp_2").await.unwrap(),
        Some(fill.clone())
    );
    assert_eq!(store.read_events("imp_2", 0, 100).await.unwrap().len(), 3);
    // Once it has events, or once deleted, it is not filled again.
    let mut listed = record("imp_3", "admin");
    listed.origin = Origin::Upstream;
    store.put_sessions(&[listed]).await.unwrap();
    store
        .append_events("imp_3", &[event("turn_started", json!({}))])
        .await
        .unwrap();
    let fill = record("imp_3", "admin");
    assert!(
        !store
            .import_session(&fill, &events, None, true)
            .await
            .unwrap()
    );
    assert_eq!(store.read_events("imp_3", 0, 100).await.unwrap().len(), 1);
    store
        .tombstone_session("imp_3", "admin", ts(T0))
        .await
        .unwrap();

    // An import that fails half-way (two events of one seq) leaves nothing.
    let twice = vec![imported(1, "a", "x"), imported(1, "b", "y")];
    assert!(
        store
            .import_session(&record("imp_4", "acme"), &twice, None, false)
            .await
            .is_err()
    );
    assert_eq!(store.get_session("imp_4").await.unwrap(), None);
    assert!(store.read_events("imp_4", 0, 100).await.unwrap().is_empty());
}
