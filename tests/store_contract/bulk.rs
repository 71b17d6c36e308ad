//! Sessions a list sync reads and writes a page at a time: those to look at in one query, the
//! changed ones written in one statement (past SQLite's bound-parameter limit too), tombstones
//! left alone.

use super::*;

/// A list sync's page: the sessions to look at found in one query (unknown ids, and live rows
/// not made by this very listing), those that changed written in one statement, which leaves
/// tombstones alone and says which ids it wrote; more rows than one SQLite statement binds
/// (2,520) work the same. Any other write clears the digest a sync stored.
pub async fn check_sessions_in_bulk(store: Arc<dyn Store>) {
    assert!(store.sessions_to_sync(&[]).await.unwrap().is_empty());
    assert!(store.put_sessions(&[]).await.unwrap().is_empty());

    let kept = SessionRecord {
        title: Some("kept".to_owned()),
        ..record("bulk-kept", "bulk-t")
    };
    let dead = record("bulk-dead", "bulk-t");
    assert!(store.put_session(&kept).await.unwrap());
    assert!(store.put_session(&dead).await.unwrap());
    assert!(
        store
            .tombstone_session("bulk-dead", "bulk-t", ts(T0 + 1))
            .await
            .unwrap()
    );

    // Rows of every shape: new ones, a replaced live row, a tombstoned id.
    let page: Vec<SessionRecord> = (0..3_000)
        .map(|i| SessionRecord {
            cwd: format!("/bulk/{}", i % 7),
            additional_directories: vec![format!("/extra/{i}")],
            title: (i % 2 == 0).then(|| format!("title \"{i}\" — ü\n")),
            updated_at: ts(T0 + i),
            meta: (i % 3 == 0).then(|| json!({"i": i, "nested": {"list": [i, null]}})),
            archived: i % 5 == 0,
            origin: Origin::Upstream,
            synced_at: Some(ts(T0 + 2 * i)),
            listed: Some(i - 1_500),
            ..record(&format!("bulk-{i:05}"), "bulk-t")
        })
        .chain([
            SessionRecord {
                title: Some("replaced".to_owned()),
                synced_at: Some(ts(T0 + 5)),
                listed: Some(i64::MAX),
                ..kept.clone()
            },
            SessionRecord {
                title: Some("resurrected".to_owned()),
                listed: Some(i64::MIN),
                ..dead.clone()
            },
        ])
        .collect();
    let written: BTreeSet<String> = store
        .put_sessions(&page)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let live = &page[..page.len() - 1];
    assert_eq!(
        written,
        ids(live).into_iter().collect(),
        "every id but the tombstoned one is written"
    );
    for r in [&live[0], &live[1_234], &live[2_999], &live[3_000]] {
        assert_eq!(
            store.get_session(&r.session_id).await.unwrap().as_ref(),
            Some(r)
        );
    }
    assert_eq!(
        store.get_session("bulk-dead").await.unwrap(),
        Some(SessionRecord {
            deleted_at: Some(ts(T0 + 1)),
            ..dead.clone()
        })
    );

    // Listed as written: nothing to look at, the tombstone included.
    let as_written: Vec<ListedSession> = page
        .iter()
        .map(|r| ListedSession {
            session_id: r.session_id.clone(),
            digest: r.listed.unwrap(),
        })
        .collect();
    assert!(
        store
            .sessions_to_sync(&as_written)
            .await
            .unwrap()
            .is_empty()
    );

    // Another digest, an unknown id, a live row no sync made: each answered with its row.
    let mut changed = as_written.clone();
    changed[7].digest += 1;
    changed.push(ListedSession {
        session_id: "bulk-new".to_owned(),
        digest: 0,
    });
    let mine = record("bulk-mine", "bulk-t");
    assert!(store.put_session(&mine).await.unwrap());
    changed.push(ListedSession {
        session_id: "bulk-mine".to_owned(),
        digest: 0,
    });
    let mut to_sync = store.sessions_to_sync(&changed).await.unwrap();
    to_sync.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    assert_eq!(
        to_sync,
        [
            ToSync {
                session_id: "bulk-00007".to_owned(),
                cached: Some(live[7].clone()),
            },
            ToSync {
                session_id: "bulk-mine".to_owned(),
                cached: Some(mine),
            },
            ToSync {
                session_id: "bulk-new".to_owned(),
                cached: None,
            },
        ]
    );

    // A change of the gateway's own clears the digest: the row is to look at again.
    let renamed = store
        .update_session("bulk-00008", &|r| r.title = Some("renamed".to_owned()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renamed.listed, None);
    let to_sync = store.sessions_to_sync(&as_written[8..9]).await.unwrap();
    assert_eq!(
        to_sync,
        [ToSync {
            session_id: "bulk-00008".to_owned(),
            cached: Some(renamed),
        }]
    );

    // What a sync compares a listing with: each live row a sync has seen, with its digest
    // (none once the gateway changed it); no tombstone, no row no sync has seen.
    let mut synced = BTreeMap::new();
    store
        .visit_synced("default", &mut |id, digest| {
            if id.starts_with("bulk-") {
                assert!(synced.insert(id.to_owned(), digest).is_none(), "{id} twice");
            }
        })
        .await
        .unwrap();
    let mut of_another_agent = 0;
    store
        .visit_synced("codex", &mut |id, _| {
            of_another_agent += usize::from(id.starts_with("bulk-"));
        })
        .await
        .unwrap();
    assert_eq!(
        of_another_agent, 0,
        "each agent's sync sees its own sessions"
    );
    let expected: BTreeMap<String, Option<i64>> = live
        .iter()
        .map(|r| {
            let digest = r.listed.filter(|_| r.session_id != "bulk-00008");
            (r.session_id.clone(), digest)
        })
        .collect();
    assert_eq!(synced.len(), 3_001);
    assert_eq!(synced, expected);
}
