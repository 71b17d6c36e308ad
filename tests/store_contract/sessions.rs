//! The session cache: a fresh database, rows round-tripped, updated (also concurrently) and
//! tombstoned (a list sync's pages are `bulk.rs`).

use super::*;

pub async fn check_fresh_database(store: Arc<dyn Store>) {
    store.ping().await.expect("ping");
    assert_eq!(store.last_lifecycle_seq().await.unwrap(), 0);
    assert_eq!(store.last_event_seq("no-such-session").await.unwrap(), 0);
    assert!(
        store
            .read_events("no-such-session", 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.read_lifecycle(None, 0, 100).await.unwrap().is_empty());
    assert_eq!(store.get_session("no-such-session").await.unwrap(), None);
    let all = ListQuery {
        limit: 100,
        ..ListQuery::default()
    };
    assert!(store.list_sessions(&all).await.unwrap().sessions.is_empty());
}

pub async fn check_session_round_trip(store: Arc<dyn Store>) {
    // Every field set, with awkward values.
    let full = SessionRecord {
        session_id: "rt-full".to_owned(),
        tenant: "tenant-rt".to_owned(),
        cwd: "/home/zoë/projects/with space/日本".to_owned(),
        additional_directories: vec![
            "/srv/shared".to_owned(),
            "/home/zoë/notes \"quoted\"".to_owned(),
            "C:\\Windows\\path".to_owned(),
        ],
        title: Some("Fix the \"bug\" — ünïcødé 🚀\nsecond line".to_owned()),
        updated_at: ts(T0 + 1),
        created_at: ts(T0 - 3_600_000_000 + 7),
        meta: Some(json!({
            "source": "test",
            "nested": {"list": [1, 2.5, null, true, "x", {"deep": []}], "empty": {}},
            "emoji": "🦀",
            "big": u64::MAX,
            "negative": i64::MIN,
        })),
        archived: true,
        origin: Origin::Upstream,
        deleted_at: None,
        synced_at: Some(ts(T0 + 999_999)),
        listed: Some(i64::MIN + 7),
        agent: "codex".into(),
        people: acp_gateway::store::People {
            owner: Some("zoë@example.com".into()),
            owner_name: Some("Zoë \"Z\" 🦀".into()),
            who_answers: Some("owner".into()),
        },
    };
    assert!(
        store.put_session(&full).await.unwrap(),
        "insert must succeed"
    );
    assert_eq!(
        store.get_session("rt-full").await.unwrap().as_ref(),
        Some(&full)
    );

    // The minimal record: options stay `None` (no `Some(Value::Null)`), the list stays empty.
    let minimal = record("rt-min", "tenant-rt");
    assert!(store.put_session(&minimal).await.unwrap());
    assert_eq!(
        store.get_session("rt-min").await.unwrap().as_ref(),
        Some(&minimal)
    );

    // `meta: Some(null)` is not the same as no meta.
    let null_meta = SessionRecord {
        meta: Some(Value::Null),
        ..record("rt-null-meta", "tenant-rt")
    };
    assert!(store.put_session(&null_meta).await.unwrap());
    assert_eq!(
        store.get_session("rt-null-meta").await.unwrap().as_ref(),
        Some(&null_meta)
    );

    // Timestamps keep exactly microseconds: nanoseconds are cut, not rounded.
    let precise = SessionRecord {
        updated_at: ts(T0) + Duration::nanoseconds(999),
        created_at: ts(T0 - 1) + Duration::nanoseconds(1),
        synced_at: Some(ts(T0 + 5) + Duration::nanoseconds(500)),
        ..record("rt-nanos", "tenant-rt")
    };
    assert!(store.put_session(&precise).await.unwrap());
    let got = store.get_session("rt-nanos").await.unwrap().unwrap();
    assert_eq!(got.updated_at, ts(T0));
    assert_eq!(got.created_at, ts(T0 - 1));
    assert_eq!(got.synced_at, Some(ts(T0 + 5)));

    // Putting an existing live id (of its tenant, agent and origin) replaces the whole row.
    let replaced = SessionRecord {
        cwd: "/elsewhere".to_owned(),
        additional_directories: vec!["/only-one".to_owned()],
        title: None,
        updated_at: ts(T0 + 10_000_000),
        meta: None,
        archived: false,
        synced_at: None,
        ..full.clone()
    };
    assert!(
        store.put_session(&replaced).await.unwrap(),
        "replace a live row"
    );
    assert_eq!(
        store.get_session("rt-full").await.unwrap().as_ref(),
        Some(&replaced)
    );

    // Putting a tombstoned id changes nothing and says so.
    let deleted_at = ts(T0 + 20_000_000);
    assert!(
        store
            .tombstone_session("rt-min", "tenant-rt", deleted_at)
            .await
            .unwrap()
    );
    let resurrect = SessionRecord {
        title: Some("I am back".to_owned()),
        ..minimal.clone()
    };
    assert!(
        !store.put_session(&resurrect).await.unwrap(),
        "put on a tombstone must return false"
    );
    let still_dead = store.get_session("rt-min").await.unwrap().unwrap();
    assert_eq!(
        still_dead,
        SessionRecord {
            deleted_at: Some(deleted_at),
            ..minimal
        }
    );
}

/// An id names one session: inserting a new session never touches a row of its id (another
/// tenant's, another agent's, a tombstone), and an upsert (a list sync's) never changes a row's
/// tenant, agent or origin.
pub async fn check_session_identity(store: Arc<dyn Store>) {
    let alice = SessionRecord {
        title: Some("alice secret plan".to_owned()),
        ..record("m1", "alice")
    };
    assert!(
        store.insert_session(&alice).await.unwrap(),
        "a new id is inserted"
    );
    for taker in [
        record("m1", "bob"),
        SessionRecord {
            agent: "other-agent".to_owned(),
            ..record("m1", "alice")
        },
        SessionRecord {
            title: Some("same tenant, same agent".to_owned()),
            ..record("m1", "alice")
        },
    ] {
        assert!(
            !store.insert_session(&taker).await.unwrap(),
            "an insert of a taken id must say so: {taker:?}"
        );
        assert_eq!(
            store.get_session("m1").await.unwrap().as_ref(),
            Some(&alice),
            "an insert of a taken id changed its row"
        );
    }
    for taker in [
        record("m1", "bob"),
        SessionRecord {
            agent: "other-agent".to_owned(),
            ..record("m1", "alice")
        },
        SessionRecord {
            origin: Origin::Upstream,
            ..record("m1", "alice")
        },
    ] {
        assert!(
            store
                .put_sessions(std::slice::from_ref(&taker))
                .await
                .unwrap()
                .is_empty(),
            "an upsert took another tenant's, agent's or origin's row: {taker:?}"
        );
        assert_eq!(
            store.get_session("m1").await.unwrap().as_ref(),
            Some(&alice)
        );
    }
    assert!(
        store
            .tombstone_session("m1", "alice", ts(T0 + 1))
            .await
            .unwrap()
    );
    assert!(
        !store.insert_session(&record("m1", "bob")).await.unwrap(),
        "a tombstoned id is not reused"
    );
    let tombstone = store.get_session("m1").await.unwrap().unwrap();
    assert_eq!(tombstone.tenant, "alice");
    assert!(tombstone.deleted_at.is_some());
}

pub async fn check_update_session(store: Arc<dyn Store>) {
    let original = SessionRecord {
        title: Some("before".to_owned()),
        ..record("upd-1", "tenant-upd")
    };
    assert!(store.put_session(&original).await.unwrap());

    let new_time = ts(T0 + 42_000_000) + Duration::nanoseconds(123);
    let updated = store
        .update_session("upd-1", &|r: &mut SessionRecord| {
            r.title = Some("after".to_owned());
            r.archived = true;
            r.updated_at = new_time;
            r.meta = Some(json!({"step": 2}));
            r.additional_directories.push("/added".to_owned());
            // The id is the key; changing it must not move or copy the row.
            r.session_id = "upd-1-renamed".to_owned();
        })
        .await
        .unwrap()
        .expect("update of a live row returns it");
    let expected = SessionRecord {
        title: Some("after".to_owned()),
        archived: true,
        updated_at: ts(T0 + 42_000_000),
        meta: Some(json!({"step": 2})),
        additional_directories: vec!["/added".to_owned()],
        ..original
    };
    assert_eq!(updated, expected, "the returned row is the stored row");
    assert_eq!(store.get_session("upd-1").await.unwrap(), Some(expected));
    assert_eq!(store.get_session("upd-1-renamed").await.unwrap(), None);

    // Unknown ids.
    let none = store
        .update_session("upd-unknown", &|r: &mut SessionRecord| {
            r.title = Some("x".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(none, None);
    assert_eq!(store.get_session("upd-unknown").await.unwrap(), None);

    // Tombstoned ids.
    let doomed = record("upd-2", "tenant-upd");
    assert!(store.put_session(&doomed).await.unwrap());
    assert!(
        store
            .tombstone_session("upd-2", "tenant-upd", ts(T0 + 1))
            .await
            .unwrap()
    );
    let none = store
        .update_session("upd-2", &|r: &mut SessionRecord| {
            r.title = Some("zombie".to_owned());
            r.deleted_at = None;
        })
        .await
        .unwrap();
    assert_eq!(none, None, "a tombstoned row cannot be updated");
    let row = store.get_session("upd-2").await.unwrap().unwrap();
    assert_eq!(row.title, None);
    assert_eq!(row.deleted_at, Some(ts(T0 + 1)));
}

/// Read-modify-write through `update_session` from many tasks loses no update.
pub async fn check_concurrent_updates(store: Arc<dyn Store>) {
    let counter = SessionRecord {
        meta: Some(json!({"n": 0})),
        ..record("upd-counter", "tenant-upd")
    };
    assert!(store.put_session(&counter).await.unwrap());
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.spawn(async move {
            for _ in 0..10 {
                store
                    .update_session("upd-counter", &|r: &mut SessionRecord| {
                        let n = r
                            .meta
                            .as_ref()
                            .and_then(|m| m["n"].as_i64())
                            .unwrap_or(-1000);
                        r.meta = Some(json!({"n": n + 1}));
                    })
                    .await
                    .expect("update_session")
                    .expect("row exists");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("update task panicked");
    }
    let row = store.get_session("upd-counter").await.unwrap().unwrap();
    assert_eq!(row.meta, Some(json!({"n": 80})), "lost updates");
}

pub async fn check_tombstone(store: Arc<dyn Store>) {
    let live = SessionRecord {
        title: Some("doomed".to_owned()),
        ..record("tomb-1", "tomb-t")
    };
    assert!(store.put_session(&live).await.unwrap());
    let at = ts(T0 + 77) + Duration::nanoseconds(900);
    assert!(
        store
            .tombstone_session("tomb-1", "tomb-t", at)
            .await
            .unwrap(),
        "first tombstone of a live row returns true"
    );
    assert!(
        !store
            .tombstone_session("tomb-1", "tomb-t", ts(T0 + 99_000_000))
            .await
            .unwrap(),
        "second tombstone returns false"
    );
    let row = store.get_session("tomb-1").await.unwrap().unwrap();
    assert_eq!(
        row,
        SessionRecord {
            deleted_at: Some(ts(T0 + 77)),
            ..live.clone()
        },
        "the first deletion time stays, nothing else changes"
    );
    assert!(!store.put_session(&live).await.unwrap(), "no resurrection");
    assert_eq!(
        store
            .get_session("tomb-1")
            .await
            .unwrap()
            .unwrap()
            .deleted_at,
        Some(ts(T0 + 77))
    );
    assert!(listed(&*store, "tomb-t").await.is_empty());

    // An unknown id gets a bare tombstone that blocks a later put.
    let at = ts(T0 + 5_000_000);
    assert!(
        !store
            .tombstone_session("tomb-unknown", "tomb-t2", at)
            .await
            .unwrap(),
        "tombstoning an unknown id returns false"
    );
    let bare = store
        .get_session("tomb-unknown")
        .await
        .unwrap()
        .expect("a tombstone row was written");
    assert_eq!(bare.deleted_at, Some(at));
    assert_eq!(bare.tenant, "tomb-t2");
    assert_eq!(bare.cwd, "");
    let synced = SessionRecord {
        origin: Origin::Upstream,
        ..record("tomb-unknown", "tomb-t2")
    };
    assert!(
        !store.put_session(&synced).await.unwrap(),
        "a sync cannot bring back a deleted id"
    );
    let still = store.get_session("tomb-unknown").await.unwrap().unwrap();
    assert_eq!(still.deleted_at, Some(at));
    assert_eq!(still.cwd, "");
    assert!(
        !store
            .tombstone_session("tomb-unknown", "tomb-t2", ts(T0 + 6_000_000))
            .await
            .unwrap()
    );
    assert!(listed(&*store, "tomb-t2").await.is_empty());
}

/// Every session belongs to an agent: stored and read back, listed by agent, and the rows
/// written before agents had names (`''`) given to the default one, once.
pub async fn check_session_agents(store: Arc<dyn Store>) {
    let with = |id: &str, agent: &str| SessionRecord {
        agent: agent.to_owned(),
        ..record(id, "agents-t")
    };
    let rows = [
        with("ag-1", ""),
        with("ag-2", "claude"),
        with("ag-3", "codex"),
        with("ag-4", ""),
    ];
    store.put_sessions(&rows).await.unwrap();
    assert_eq!(
        store.get_session("ag-2").await.unwrap().unwrap().agent,
        "claude"
    );
    assert_eq!(store.adopt_sessions("claude").await.unwrap(), 2);
    assert_eq!(store.adopt_sessions("claude").await.unwrap(), 0, "once");
    assert_eq!(
        store.get_session("ag-4").await.unwrap().unwrap().agent,
        "claude"
    );
    let listed = |agent: Option<&str>| {
        let store = store.clone();
        let query = ListQuery {
            tenant: Some("agents-t".to_owned()),
            agent: agent.map(str::to_owned),
            limit: 50,
            ..ListQuery::default()
        };
        async move {
            let mut ids: Vec<String> = store
                .list_sessions(&query)
                .await
                .unwrap()
                .sessions
                .into_iter()
                .map(|r| r.session_id)
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(listed(Some("claude")).await, ["ag-1", "ag-2", "ag-4"]);
    assert_eq!(listed(Some("codex")).await, ["ag-3"]);
    assert_eq!(listed(Some("gemini")).await, Vec::<String>::new());
    assert_eq!(listed(None).await.len(), 4);

    // An upsert replaces the row but never moves `updated_at` back: a prompt's touch may land
    // between a sync's read of the row and its write.
    let later = SessionRecord {
        updated_at: ts(T0 + 1_000_000),
        ..with("ag-5", "codex")
    };
    store
        .put_sessions(std::slice::from_ref(&later))
        .await
        .unwrap();
    let stale = SessionRecord {
        updated_at: ts(T0),
        title: Some("from the listing".to_owned()),
        ..later.clone()
    };
    store.put_sessions(&[stale]).await.unwrap();
    let got = store.get_session("ag-5").await.unwrap().unwrap();
    assert_eq!(got.updated_at, later.updated_at);
    assert_eq!(got.title.as_deref(), Some("from the listing"));
}
