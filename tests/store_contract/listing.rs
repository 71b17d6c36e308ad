//! The session list: filters, order, keyset pages, and pages that stay stable while sessions
//! move between them.

use super::*;

pub async fn check_list_sessions(store: Arc<dyn Store>) {
    const T1: &str = "list-t1";
    const T2: &str = "list-t2";
    // Prefixes whose byte order differs from a case-insensitive or punctuation-blind locale
    // order ("B" < "D" < "_" < "a" < "c" in bytes).
    let prefixes = ["a", "B", "c", "D", "_"];
    let mut live_t1 = Vec::new();
    for i in 0..25i64 {
        let id = format!("{}-list-{i:02}", prefixes[i as usize % prefixes.len()]);
        let r = SessionRecord {
            cwd: if i % 2 == 0 { "/list/a" } else { "/list/b" }.to_owned(),
            // Groups of three rows share one `updated_at`.
            updated_at: ts(T0 + (i / 3) * 1_000_000),
            title: Some(format!("row {i}")),
            ..record(&id, T1)
        };
        assert!(store.put_session(&r).await.unwrap());
        live_t1.push(r);
    }
    let mut archived_t1 = Vec::new();
    for i in 0..3i64 {
        let r = SessionRecord {
            archived: true,
            updated_at: ts(T0 + i * 1_000_000),
            cwd: "/list/a".to_owned(),
            ..record(&format!("list-archived-{i}"), T1)
        };
        assert!(store.put_session(&r).await.unwrap());
        archived_t1.push(r);
    }
    let mut live_t2 = Vec::new();
    for i in 0..4i64 {
        let r = SessionRecord {
            cwd: "/list/a".to_owned(),
            updated_at: ts(T0 + i * 1_000_000),
            ..record(&format!("list-t2-{i}"), T2)
        };
        assert!(store.put_session(&r).await.unwrap());
        live_t2.push(r);
    }
    // Newest of all, then deleted: must never be listed.
    let dead = SessionRecord {
        cwd: "/list/a".to_owned(),
        updated_at: ts(T0 + 1_000_000_000),
        ..record("list-dead", T1)
    };
    assert!(store.put_session(&dead).await.unwrap());
    assert!(
        store
            .tombstone_session("list-dead", T1, ts(T0))
            .await
            .unwrap()
    );

    let expected_t1 = list_order(live_t1.clone());
    let by_tenant = ListQuery {
        tenant: Some(T1.to_owned()),
        ..ListQuery::default()
    };

    // The first page: the newest rows, full records.
    let first_page = store
        .list_sessions(&ListQuery {
            limit: 7,
            ..by_tenant.clone()
        })
        .await
        .unwrap()
        .sessions;
    assert_eq!(first_page, expected_t1[..7].to_vec());

    // Every row exactly once across pages of 7, in order, ties broken by id descending.
    let walked = paginate(&*store, by_tenant.clone(), 7).await;
    assert_eq!(ids(&walked), ids(&expected_t1));
    assert_eq!(walked, expected_t1);
    // Also with a page size that splits the groups of equal `updated_at` differently.
    let walked = paginate(&*store, by_tenant.clone(), 2).await;
    assert_eq!(ids(&walked), ids(&expected_t1));

    // archived: None and Some(false) = only live non-archived rows; Some(true) = only archived.
    let not_archived = ListQuery {
        archived: Some(false),
        ..by_tenant.clone()
    };
    assert_eq!(
        ids(&paginate(&*store, not_archived, 7).await),
        ids(&expected_t1)
    );
    let only_archived = ListQuery {
        archived: Some(true),
        ..by_tenant.clone()
    };
    assert_eq!(
        ids(&paginate(&*store, only_archived, 7).await),
        ids(&list_order(archived_t1.clone()))
    );

    // cwd is an exact match.
    let cwd_a = ListQuery {
        cwd: Some("/list/a".to_owned()),
        ..by_tenant.clone()
    };
    let expected_a: Vec<SessionRecord> = expected_t1
        .iter()
        .filter(|r| r.cwd == "/list/a")
        .cloned()
        .collect();
    assert_eq!(ids(&paginate(&*store, cwd_a, 3).await), ids(&expected_a));
    let cwd_prefix_only = ListQuery {
        cwd: Some("/list".to_owned()),
        ..by_tenant.clone()
    };
    assert!(paginate(&*store, cwd_prefix_only, 7).await.is_empty());

    // tenant: None spans tenants.
    let all_tenants_a = ListQuery {
        cwd: Some("/list/a".to_owned()),
        ..ListQuery::default()
    };
    let mut expected_both: Vec<SessionRecord> = expected_a.clone();
    expected_both.extend(live_t2.iter().cloned());
    assert_eq!(
        ids(&paginate(&*store, all_tenants_a, 7).await),
        ids(&list_order(expected_both))
    );
    let other_tenant = ListQuery {
        tenant: Some(T2.to_owned()),
        ..ListQuery::default()
    };
    assert_eq!(
        ids(&paginate(&*store, other_tenant, 7).await),
        ids(&list_order(live_t2.clone()))
    );
    let everything = paginate(&*store, ListQuery::default(), 7).await;
    for pair in everything.windows(2) {
        assert!(
            (pair[0].updated_at, &pair[0].session_id) > (pair[1].updated_at, &pair[1].session_id),
            "list order broken between {:?} and {:?}",
            pair[0].session_id,
            pair[1].session_id
        );
    }
    let listed: BTreeSet<String> = ids(&everything).into_iter().collect();
    for r in live_t1.iter().chain(&live_t2) {
        assert!(
            listed.contains(&r.session_id),
            "{} not listed",
            r.session_id
        );
    }
    assert!(
        everything
            .iter()
            .all(|r| r.deleted_at.is_none() && !r.archived)
    );
    assert!(!listed.contains("list-dead"), "a tombstoned row was listed");

    // A cursor that is not a row: strictly older than `T0 + 4 s` (no id sorts before "").
    let older = store
        .list_sessions(&ListQuery {
            after: Some(ListCursor {
                snapshot: i64::MAX,
                updated_at: ts(T0 + 4_000_000),
                session_id: String::new(),
            }),
            limit: 100,
            ..by_tenant.clone()
        })
        .await
        .unwrap()
        .sessions;
    let expected_older: Vec<String> = expected_t1
        .iter()
        .filter(|r| r.updated_at < ts(T0 + 4_000_000))
        .map(|r| r.session_id.clone())
        .collect();
    assert_eq!(ids(&older), expected_older);
}

/// Sessions created, updated (once or twice), deleted and un-archived between pages: every
/// session that existed at the first page and still exists is listed exactly once, in its
/// first-page order; sessions created since may appear, but only once.
pub async fn check_stable_pagination(store: Arc<dyn Store>) {
    const T: &str = "stable-t";
    let at = |i: i64| ts(T0 + i * 1_000_000);
    let mut original = Vec::new();
    for i in 0..30 {
        let r = SessionRecord {
            updated_at: at(i),
            ..record(&format!("stable-{i:02}"), T)
        };
        assert!(store.put_session(&r).await.unwrap());
        original.push(r);
    }
    let touch = |id: &'static str, to: i64| {
        let store = store.clone();
        async move {
            let moved = store
                .update_session(id, &|r| r.updated_at = at(to))
                .await
                .unwrap();
            assert!(moved.is_some(), "{id} exists");
        }
    };
    let mut query = ListQuery {
        tenant: Some(T.to_owned()),
        limit: 7,
        ..ListQuery::default()
    };
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = store.list_sessions(&query).await.unwrap();
        seen.extend(ids(&page.sessions));
        pages += 1;
        match pages {
            1 => {
                // stable-29…23 are on page 1. Move a seen one and two unseen ones to the top,
                // one of them twice; create one new newest and one new oldest; delete one.
                touch("stable-25", 100).await;
                touch("stable-20", 101).await;
                touch("stable-03", 102).await;
                touch("stable-03", 103).await;
                let newest = SessionRecord {
                    updated_at: at(200),
                    ..record("stable-new-top", T)
                };
                let oldest = SessionRecord {
                    updated_at: at(-5),
                    ..record("stable-new-bottom", T)
                };
                assert!(store.put_session(&newest).await.unwrap());
                assert!(store.put_session(&oldest).await.unwrap());
                assert!(
                    store
                        .tombstone_session("stable-10", T, at(300))
                        .await
                        .unwrap()
                );
            }
            2 => {
                // A row moved after page 1 and again now, and one replaced by a put.
                touch("stable-20", 110).await;
                let replaced = SessionRecord {
                    updated_at: at(120),
                    title: Some("replaced".into()),
                    ..record("stable-05", T)
                };
                assert!(store.put_session(&replaced).await.unwrap());
            }
            _ => {}
        }
        query.after = page.next;
        if query.after.is_none() {
            break;
        }
        assert!(pages < 20, "pagination does not end");
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(
        unique.len(),
        seen.len(),
        "a session was listed twice: {seen:?}"
    );
    let expected: Vec<String> = original
        .iter()
        .rev()
        .map(|r| r.session_id.clone())
        .filter(|id| id != "stable-10")
        .collect();
    let seen_original: Vec<String> = seen
        .iter()
        .filter(|id| !id.starts_with("stable-new"))
        .cloned()
        .collect();
    assert_eq!(
        seen_original, expected,
        "every session present at the first page is listed once, in first-page order"
    );
    assert!(!seen.contains(&"stable-new-top".to_owned()), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("stable-new-bottom"));

    // A new listing shows the moves.
    query.after = None;
    query.limit = 3;
    let first = store.list_sessions(&query).await.unwrap();
    assert_eq!(
        ids(&first.sessions),
        ["stable-new-top", "stable-05", "stable-20"]
    );

    // Once moves are forgotten, a cursor degrades to plain keyset order.
    let pruned = store
        .prune_moves(Utc::now() + Duration::hours(2))
        .await
        .unwrap();
    assert!(pruned >= 5, "{pruned} moves pruned");
    assert_eq!(
        store
            .prune_moves(Utc::now() + Duration::hours(2))
            .await
            .unwrap(),
        0
    );
}
