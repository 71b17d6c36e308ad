//! The session event logs and the lifecycle log: appends (also concurrent), open turns, the
//! stored state, retention (the log writer is `log_writer.rs`, payloads `payloads.rs`).

use super::*;

pub async fn check_append_events(store: Arc<dyn Store>) {
    let s = "ev-1";
    assert_eq!(store.last_event_seq(s).await.unwrap(), 0);
    let first = store
        .append_events(
            s,
            &[
                event("agent_message_chunk", json!({"text": "hel"})),
                event("agent_message_chunk", json!({"text": "lo"})),
                event("tool_call", json!({"id": "t1", "status": "pending"})),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(first.iter().all(|e| e.session_id == s));
    assert_eq!(first[2].kind, "tool_call");
    assert_eq!(first[1].payload, json!({"text": "lo"}));
    for e in &first {
        assert_fresh_timestamp(e.created_at);
    }
    let second = store
        .append_events(
            s,
            &[
                event(
                    "tool_call_update",
                    json!({"id": "t1", "status": "completed"}),
                ),
                event("turn_end", json!({"stopReason": "end_turn"})),
            ],
        )
        .await
        .unwrap();
    assert_eq!(second.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    assert!(store.append_events(s, &[]).await.unwrap().is_empty());
    assert_eq!(store.last_event_seq(s).await.unwrap(), 5);

    // Reading back gives exactly what the appends returned, created_at included.
    let all: Vec<StoredEvent> = first.iter().chain(&second).cloned().collect();
    assert_eq!(store.read_events(s, 0, 100).await.unwrap(), all);
    assert_eq!(
        store.read_events(s, 2, 2).await.unwrap(),
        all[2..4].to_vec()
    );
    assert_eq!(
        store.read_events(s, 3, 100).await.unwrap(),
        all[3..].to_vec()
    );
    assert!(store.read_events(s, 5, 100).await.unwrap().is_empty());
    assert!(store.read_events(s, 0, 0).await.unwrap().is_empty());

    // Another session has its own sequence.
    let other = store
        .append_events("ev-2", &[event("x", json!(1))])
        .await
        .unwrap();
    assert_eq!(other[0].seq, 1);
    assert_eq!(other[0].session_id, "ev-2");
    assert_eq!(store.last_event_seq("ev-2").await.unwrap(), 1);
    assert_eq!(store.last_event_seq(s).await.unwrap(), 5);
    assert_eq!(store.read_events("ev-2", 0, 100).await.unwrap(), other);

    // A batch larger than any single-statement chunking stays consecutive and atomic.
    let big: Vec<NewEvent> = (0..2500).map(|i| event("bulk", json!({"i": i}))).collect();
    let stored = store.append_events("ev-big", &big).await.unwrap();
    assert_eq!(
        stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=2500).collect::<Vec<i64>>()
    );
    let back = store.read_events("ev-big", 0, 10_000).await.unwrap();
    assert_eq!(back, stored);
    let next = store
        .append_events("ev-big", &[event("after", json!(null))])
        .await
        .unwrap();
    assert_eq!(next[0].seq, 2501);
    assert_eq!(store.last_event_seq("ev-big").await.unwrap(), 2501);
}

/// 8 tasks × 50 batches × 3 events on one session: exactly 1..=1200, no gap, no duplicate.
/// A turn is open from its `turn_started` until a `turn_ended`, whatever comes between; each
/// session has its own.
pub async fn check_turn_open(store: Arc<dyn Store>) {
    let (s, other) = ("turns-1", "turns-2");
    assert!(
        !store.turn_open(s).await.unwrap(),
        "an empty log has no turn"
    );
    let append = |kind: &'static str, session: &'static str| {
        let store = store.clone();
        async move {
            store
                .append_events(session, &[event(kind, json!({"sessionId": session}))])
                .await
                .unwrap();
        }
    };
    append("turn_started", s).await;
    assert!(store.turn_open(s).await.unwrap());
    append("agent_message_chunk", s).await;
    append("agent_exited", s).await;
    assert!(
        store.turn_open(s).await.unwrap(),
        "other events do not end it"
    );
    assert!(
        !store.turn_open(other).await.unwrap(),
        "another session's turn"
    );
    append("turn_ended", s).await;
    assert!(!store.turn_open(s).await.unwrap());
    append("turn_started", s).await;
    assert!(store.turn_open(s).await.unwrap(), "the next turn");
}

/// A state snapshot is read back as stored, never replaced by one made earlier in the log, and
/// the log after it is read by kind, up to a position.
pub async fn check_session_state(store: Arc<dyn Store>) {
    let s = "state-1";
    assert_eq!(store.session_state(s).await.unwrap(), None);
    let kinds = ["plan", "agent_message_chunk", "usage_update", "plan"];
    for kind in kinds {
        let payload = json!({"sessionId": s, "update": {"sessionUpdate": kind}});
        store
            .append_events(s, &[event(kind, payload)])
            .await
            .unwrap();
    }
    let seqs = |events: Vec<StoredEvent>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let read = |after, upto, kinds: &'static [&'static str]| {
        let store = store.clone();
        async move {
            store
                .read_events_of_kinds(s, (after, upto), kinds)
                .await
                .unwrap()
        }
    };
    assert_eq!(seqs(read(0, 4, &["plan", "usage_update"]).await), [1, 3, 4]);
    assert_eq!(seqs(read(1, 3, &["plan", "usage_update"]).await), [3]);
    assert_eq!(seqs(read(0, 4, &[]).await), Vec::<i64>::new());
    let plan = read(3, 4, &["plan"]).await;
    assert_eq!(
        plan[0].payload,
        json!({"sessionId": s, "update": {"sessionUpdate": "plan"}})
    );

    let state = json!({"plan": [{"content": "ünïcode \u{0} ok", "status": "pending"}]});
    store.put_session_state(s, 3, &state).await.unwrap();
    assert_eq!(
        store.session_state(s).await.unwrap(),
        Some((3, state.clone()))
    );
    store
        .put_session_state(s, 2, &json!({"older": true}))
        .await
        .unwrap();
    assert_eq!(
        store.session_state(s).await.unwrap(),
        Some((3, state)),
        "an earlier snapshot never wins"
    );
    store
        .put_session_state(s, 4, &json!({"newer": true}))
        .await
        .unwrap();
    assert_eq!(
        store.session_state(s).await.unwrap(),
        Some((4, json!({"newer": true})))
    );
    assert_eq!(
        store.session_state("state-2").await.unwrap(),
        None,
        "another session's"
    );
}

pub async fn check_concurrent_appends(store: Arc<dyn Store>) {
    const S: &str = "ev-concurrent";
    const TASKS: i64 = 8;
    const BATCHES: i64 = 50;
    const PER_BATCH: i64 = 3;
    let mut tasks = JoinSet::new();
    for task in 0..TASKS {
        let store = store.clone();
        tasks.spawn(async move {
            // Half the appenders use a log writer (a connection of its own), half the store.
            let mut log = (task % 2 == 0).then(|| store.log_writer());
            let mut seqs = Vec::new();
            for batch in 0..BATCHES {
                let events: Vec<NewEvent> = (0..PER_BATCH)
                    .map(|i| event("chunk", json!({"task": task, "batch": batch, "i": i})))
                    .collect();
                let stored = match &mut log {
                    Some(log) => log.append(S, &events, None).await,
                    None => store.append_events(S, &events).await,
                }
                .expect("append");
                assert_eq!(stored.len(), PER_BATCH as usize);
                for (k, e) in stored.iter().enumerate() {
                    assert_eq!(e.seq, stored[0].seq + k as i64, "a batch is consecutive");
                    assert_eq!(e.payload, events[k].payload);
                }
                seqs.extend(stored.iter().map(|e| e.seq));
            }
            seqs
        });
    }
    let mut seqs = Vec::new();
    while let Some(done) = tasks.join_next().await {
        seqs.extend(done.expect("append task panicked"));
    }
    let total = TASKS * BATCHES * PER_BATCH;
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=total).collect::<Vec<i64>>(), "returned seqs");

    let back = store.read_events(S, 0, 10_000).await.unwrap();
    assert_eq!(
        back.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<i64>>(),
        "stored seqs"
    );
    // Every (task, batch, i) exactly once, and each batch's events adjacent and in order.
    let mut where_is: BTreeMap<(i64, i64, i64), i64> = BTreeMap::new();
    for e in &back {
        let key = (
            e.payload.to_value()["task"].as_i64().unwrap(),
            e.payload.to_value()["batch"].as_i64().unwrap(),
            e.payload.to_value()["i"].as_i64().unwrap(),
        );
        assert!(where_is.insert(key, e.seq).is_none(), "duplicate {key:?}");
    }
    assert_eq!(where_is.len() as i64, total);
    for task in 0..TASKS {
        for batch in 0..BATCHES {
            let s0 = where_is[&(task, batch, 0)];
            for i in 1..PER_BATCH {
                assert_eq!(where_is[&(task, batch, i)], s0 + i);
            }
        }
    }
    assert_eq!(store.last_event_seq(S).await.unwrap(), total);
}

/// Retention keeps each session's latest events and recent ones; numbering continues after it.
pub async fn check_prune_events(store: Arc<dyn Store>) {
    let (a, b) = ("prune-a", "prune-b");
    for i in 0..10 {
        store
            .append_events(a, &[event("chunk", json!({"i": i}))])
            .await
            .unwrap();
    }
    for i in 0..3 {
        store
            .append_events(b, &[event("chunk", json!({"i": i}))])
            .await
            .unwrap();
    }
    let deleted = store.prune_events(Some(4), None).await.unwrap();
    assert!(
        deleted >= 6,
        "at least a's 6 oldest were deleted, got {deleted}"
    );
    let kept: Vec<i64> = store
        .read_events(a, 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(kept, vec![7, 8, 9, 10]);
    let kept_b = store.read_events(b, 0, 100).await.unwrap().len();
    assert_eq!(kept_b, 3, "a session under the limit keeps everything");
    assert_eq!(
        store.last_event_seq(a).await.unwrap(),
        10,
        "the counter survives pruning"
    );
    let next = store
        .append_events(a, &[event("chunk", json!({}))])
        .await
        .unwrap();
    assert_eq!(next[0].seq, 11, "numbering continues after pruned events");

    // By age: everything created before a cut-off goes, whatever the count.
    let cutoff = chrono::Utc::now() + chrono::Duration::seconds(1);
    store.prune_events(None, Some(cutoff)).await.unwrap();
    assert!(store.read_events(a, 0, 100).await.unwrap().is_empty());
    assert!(store.read_events(b, 0, 100).await.unwrap().is_empty());
    assert_eq!(store.last_event_seq(a).await.unwrap(), 11);
    assert_eq!(store.prune_events(Some(1), Some(cutoff)).await.unwrap(), 0);
}

pub async fn check_lifecycle(store: Arc<dyn Store>) {
    let base = store.last_lifecycle_seq().await.unwrap();
    let mut stored = Vec::new();
    for i in 0..6 {
        let tenant = if i % 2 == 0 { "lc-a" } else { "lc-b" };
        let new = NewLifecycleEvent {
            session_id: format!("lc-session-{i}"),
            tenant: tenant.to_owned(),
            kind: ["created", "info_updated", "status_changed", "deleted"][i % 4].to_owned(),
            payload: json!({"i": i, "title": "ünïcode 🚀", "nested": {"list": [i]}}),
        };
        let e = store
            .append_lifecycle(std::slice::from_ref(&new))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(e.session_id, new.session_id);
        assert_eq!(e.tenant, new.tenant);
        assert_eq!(e.kind, new.kind);
        assert_eq!(e.payload, new.payload);
        assert_fresh_timestamp(e.created_at);
        stored.push(e);
    }
    for pair in stored.windows(2) {
        assert!(pair[1].seq > pair[0].seq, "lifecycle seqs increase");
    }
    assert!(stored[0].seq > base);
    let last = stored.last().unwrap().seq;
    assert_eq!(store.last_lifecycle_seq().await.unwrap(), last);

    assert_eq!(store.read_lifecycle(None, base, 100).await.unwrap(), stored);
    let only_a: Vec<_> = stored
        .iter()
        .filter(|e| e.tenant == "lc-a")
        .cloned()
        .collect();
    assert_eq!(
        store.read_lifecycle(Some("lc-a"), base, 100).await.unwrap(),
        only_a
    );
    assert_eq!(
        store.read_lifecycle(None, stored[1].seq, 2).await.unwrap(),
        stored[2..4].to_vec()
    );
    assert_eq!(
        store
            .read_lifecycle(Some("lc-b"), stored[1].seq, 1)
            .await
            .unwrap(),
        vec![stored[3].clone()]
    );
    assert!(
        store
            .read_lifecycle(None, last, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .read_lifecycle(None, base, 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .read_lifecycle(Some("lc-nobody"), 0, 100)
            .await
            .unwrap()
            .is_empty()
    );

    // Concurrent appenders get distinct numbers, all readable in ascending order.
    let mut tasks = JoinSet::new();
    for task in 0..8 {
        let store = store.clone();
        tasks.spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..20 {
                let e = store
                    .append_lifecycle(&[NewLifecycleEvent {
                        session_id: format!("lc-conc-{task}"),
                        tenant: "lc-conc".to_owned(),
                        kind: "info_updated".to_owned(),
                        payload: json!({"task": task, "i": i}),
                    }])
                    .await
                    .expect("append_lifecycle");
                seqs.push(e[0].seq);
            }
            seqs
        });
    }
    let mut seqs = Vec::new();
    while let Some(done) = tasks.join_next().await {
        seqs.extend(done.expect("lifecycle task panicked"));
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 160, "duplicate lifecycle seqs");
    assert!(seqs[0] > last);
    let back = store
        .read_lifecycle(Some("lc-conc"), last, 1000)
        .await
        .unwrap();
    assert_eq!(back.iter().map(|e| e.seq).collect::<Vec<_>>(), seqs);
    let last = *seqs.last().unwrap();
    assert_eq!(store.last_lifecycle_seq().await.unwrap(), last);

    // Many in one append (more than one SQLite statement binds): numbered in their order,
    // after everything before, and returned in that order.
    let many: Vec<NewLifecycleEvent> = (0..7_000)
        .map(|i| NewLifecycleEvent {
            session_id: format!("lc-many-{i}"),
            tenant: "lc-many".to_owned(),
            kind: "session_created".to_owned(),
            payload: json!({"i": i}),
        })
        .collect();
    let stored = store.append_lifecycle(&many).await.unwrap();
    assert_eq!(stored.len(), many.len());
    for (e, new) in stored.iter().zip(&many) {
        assert_eq!((&e.session_id, &e.payload), (&new.session_id, &new.payload));
    }
    assert!(stored[0].seq > last);
    assert!(
        stored.windows(2).all(|w| w[1].seq > w[0].seq),
        "numbered in order"
    );
    let back = store
        .read_lifecycle(Some("lc-many"), last, 10_000)
        .await
        .unwrap();
    assert_eq!(back, stored);
    assert!(store.append_lifecycle(&[]).await.unwrap().is_empty());
}
