//! The log writer, the one connection every append of a gateway goes through: its appends
//! (one at a time and all at once) and how it reconnects after its connection is cut.

use super::*;

/// A log writer's append can raise the session's `updated_at` in the same commit: never back in
/// time, never on a tombstoned or unknown session, and the list order follows.
pub async fn check_log_writer(store: Arc<dyn Store>) {
    let (a, b) = ("touch-a", "touch-b");
    for (id, at) in [(a, T0), (b, T0 + 1_000_000)] {
        let mut r = record(id, "touch");
        r.updated_at = ts(at);
        assert!(store.put_session(&r).await.unwrap());
    }
    let updated_at = async |id: &str| {
        let row = store.get_session(id).await.unwrap().expect("a row");
        row.updated_at
    };
    let listed = async || {
        let query = ListQuery {
            tenant: Some("touch".into()),
            ..ListQuery::default()
        };
        ids(&paginate(store.as_ref(), query, 10).await)
    };
    assert_eq!(listed().await, [b, a]);

    let mut log = store.log_writer();
    let later = ts(T0 + 5_000_000);
    let stored = log
        .append(a, &[event("turn_started", json!({"n": 1}))], Some(later))
        .await
        .unwrap();
    assert_eq!(stored[0].seq, 1);
    assert_eq!(updated_at(a).await, later, "touched with the append");
    assert_eq!(
        listed().await,
        [a, b],
        "the touched session moves to the top"
    );

    log.append(a, &[event("turn_started", json!({"n": 2}))], Some(ts(T0)))
        .await
        .unwrap();
    assert_eq!(updated_at(a).await, later, "never back in time");
    log.append(a, &[event("chunk", json!({"n": 3}))], None)
        .await
        .unwrap();
    assert_eq!(updated_at(a).await, later, "no touch asked, none made");

    assert!(
        store
            .tombstone_session(a, "touch", ts(T0 + 6_000_000))
            .await
            .unwrap()
    );
    log.append(
        a,
        &[event("late", json!({"n": 4}))],
        Some(ts(T0 + 9_000_000)),
    )
    .await
    .unwrap();
    let row = store.get_session(a).await.unwrap().expect("the tombstone");
    assert_eq!(row.updated_at, later, "a tombstone is not touched");

    log.append("touch-unknown", &[event("x", json!(null))], Some(later))
        .await
        .unwrap();
    assert!(
        store.get_session("touch-unknown").await.unwrap().is_none(),
        "a touch creates no row"
    );
    let back = store.read_events(a, 0, 100).await.unwrap();
    assert_eq!(
        back.iter()
            .map(|e| e.payload.to_value()["n"].as_i64())
            .collect::<Vec<_>>(),
        [Some(1), Some(2), Some(3), Some(4)]
    );
    assert_eq!(back.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
}

/// PostgreSQL: the log writer's own connection, closed by the server between two appends (a
/// restart, `pg_terminate_backend`), is replaced without losing the append.
pub async fn check_log_writer_reconnects(store: Arc<dyn Store>, url: &str) {
    const S: &str = "reconnect-log";
    let mut log = store.log_writer();
    log.append(S, &[event("before", json!(1))], None)
        .await
        .unwrap();
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1 AND datname = current_database()) t",
    )
    .bind(store::PG_LOG_WRITER_NAME)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(killed, 1, "the log writer's connection is the one named so");
    let stored = log
        .append(S, &[event("after", json!(2))], None)
        .await
        .expect("the append goes through on a new connection");
    assert_eq!(stored[0].seq, 2);
    let back = store.read_events(S, 0, 10).await.unwrap();
    assert_eq!(back.len(), 2, "nothing lost, nothing doubled");
}

/// The log writer appends several sessions' events in one go (`append_all`, where a backend can:
/// PostgreSQL in one statement, SQLite in one transaction): each session's events are numbered
/// after what its log holds, read back as returned, and each touch applies to its own session
/// only.
pub async fn check_log_writer_append_all(store: Arc<dyn Store>) {
    let (a, b, c) = ("all-a", "all-b", "all-c");
    for id in [a, b] {
        assert!(store.put_session(&record(id, "all")).await.unwrap());
    }
    store
        .append_events(a, &[event("x", json!({"n": 0}))])
        .await
        .unwrap();
    let mut log = store.log_writer();
    let later = ts(T0 + 7_000_000);
    let for_a = [event("x", json!({"n": 1})), event("y", json!({"n": 2}))];
    let for_b = [event("z", json!({"nul": "a\u{0}b", "n": 1}))];
    let for_c: Vec<NewEvent> = (1..=3).map(|n| event("w", json!({"n": n}))).collect();
    let groups = [
        (c, &for_c[..], None),
        (a, &for_a[..], Some(later)),
        (b, &for_b[..], None),
    ];
    let Some(stored) = log.append_all(&groups).await else {
        return; // this writer appends each session alone (SQLite in memory)
    };
    let stored = stored.unwrap();
    let seqs = |events: &[StoredEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&stored[0]), [1, 2, 3], "{c}");
    assert_eq!(
        seqs(&stored[1]),
        [2, 3],
        "{a} continues after its first event"
    );
    assert_eq!(seqs(&stored[2]), [1], "{b}");
    for (id, stored) in [c, a, b].into_iter().zip(&stored) {
        let back = store.read_events(id, 0, 100).await.unwrap();
        assert_eq!(&back[back.len() - stored.len()..], &stored[..], "{id}");
    }
    let updated_at = async |id: &str| store.get_session(id).await.unwrap().unwrap().updated_at;
    assert_eq!(updated_at(a).await, later, "touched");
    assert_eq!(updated_at(b).await, ts(T0), "not touched");
}
