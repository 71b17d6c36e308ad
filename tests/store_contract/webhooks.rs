//! Webhooks and their outbox: the subscriptions' rows, the deliveries every append inserts (by
//! each path that appends), the deliveries' list, and what deleting a webhook takes with it
//! (their claims and retries are `deliveries.rs`).

use super::deliveries::backlog;
use super::*;
use acp_gateway::store::{DeliveryRecord, WebhookRecord};
use chrono::SubsecRound;

/// A second from now, to the microsecond the store keeps: every delivery appended so far is
/// due then.
pub(crate) fn soon() -> DateTime<Utc> {
    (Utc::now() + Duration::seconds(1)).trunc_subsecs(6)
}

/// An enabled webhook of `tenant` hearing `events`, created at `T0 + n` seconds.
pub(crate) fn webhook(id: &str, tenant: &str, events: &[&str], n: i64) -> WebhookRecord {
    WebhookRecord {
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        admin: false,
        url: format!("https://hooks.example/{id}"),
        events: events.iter().map(|e| (*e).to_owned()).collect(),
        session_id: None,
        description: None,
        secret: format!("whsec_{id}"),
        enabled: true,
        disabled_reason: None,
        created_at: ts(T0 + n * 1_000_000),
        updated_at: ts(T0 + n * 1_000_000),
    }
}

/// All of `webhook_id`'s deliveries, oldest first.
pub(crate) async fn deliveries(store: &dyn Store, webhook_id: &str) -> Vec<DeliveryRecord> {
    let mut all = store.list_deliveries(webhook_id, None, 1000).await.unwrap();
    all.reverse();
    all
}

/// The message ids of `webhook_id`'s deliveries, oldest first.
pub(crate) async fn message_ids(store: &dyn Store, webhook_id: &str) -> Vec<String> {
    let all = deliveries(store, webhook_id).await;
    all.into_iter().map(|d| d.message_id).collect()
}

/// A webhook is stored as given, listed per tenant (or all) newest first, updated in what may
/// change, and deleted.
pub async fn check_webhook_crud(store: Arc<dyn Store>) {
    assert!(store.list_webhooks(None).await.unwrap().is_empty());
    assert!(store.get_webhook("wh_none").await.unwrap().is_none());
    let mut a1 = webhook("wh_a1", "a", &["turn_ended", "permission_requested"], 1);
    a1.session_id = Some("s-1".into());
    a1.description = Some("CI".into());
    // Sub-microsecond digits are not kept.
    a1.created_at = ts(T0) + Duration::nanoseconds(999);
    let a2 = webhook("wh_a2", "a", &["*"], 2);
    let mut b1 = webhook("wh_b1", "b", &["*"], 3);
    b1.admin = true;
    for w in [&a1, &a2, &b1] {
        store.put_webhook(w).await.unwrap();
    }
    assert!(
        store.put_webhook(&a2).await.is_err(),
        "an id is inserted once"
    );
    let mut a1_stored = a1.clone();
    a1_stored.created_at = ts(T0);
    assert_eq!(store.get_webhook("wh_a1").await.unwrap(), Some(a1_stored));
    assert_eq!(store.get_webhook("wh_b1").await.unwrap(), Some(b1.clone()));

    let ids = |list: Vec<WebhookRecord>| list.into_iter().map(|w| w.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_webhooks(Some("a")).await.unwrap()),
        ["wh_a2", "wh_a1"]
    );
    assert_eq!(
        ids(store.list_webhooks(Some("b")).await.unwrap()),
        ["wh_b1"]
    );
    assert!(store.list_webhooks(Some("c")).await.unwrap().is_empty());
    assert_eq!(
        ids(store.list_webhooks(None).await.unwrap()),
        ["wh_b1", "wh_a2", "wh_a1"]
    );

    // An update writes what may change, and leaves the tenant, admin and created_at alone.
    let mut changed = a2.clone();
    changed.tenant = "other".into();
    changed.admin = true;
    changed.created_at = ts(T0 + 99_000_000);
    changed.url = "https://hooks.example/moved".into();
    changed.events = vec!["session_created".into()];
    changed.session_id = Some("s-9".into());
    changed.description = Some("moved".into());
    changed.secret = "whsec_rotated".into();
    changed.enabled = false;
    changed.disabled_reason = Some("failing since yesterday".into());
    changed.updated_at = ts(T0 + 50_000_000);
    assert!(store.update_webhook(&changed).await.unwrap());
    let mut expected = changed.clone();
    expected.tenant = a2.tenant.clone();
    expected.admin = a2.admin;
    expected.created_at = a2.created_at;
    assert_eq!(store.get_webhook("wh_a2").await.unwrap(), Some(expected));
    let mut unknown = a2.clone();
    unknown.id = "wh_none".into();
    assert!(!store.update_webhook(&unknown).await.unwrap());
    assert!(store.get_webhook("wh_none").await.unwrap().is_none());

    assert!(store.delete_webhook("wh_a2").await.unwrap());
    assert!(!store.delete_webhook("wh_a2").await.unwrap());
    assert!(store.get_webhook("wh_a2").await.unwrap().is_none());
    assert_eq!(
        ids(store.list_webhooks(Some("a")).await.unwrap()),
        ["wh_a1"]
    );
}

/// The webhooks of [`check_outbox`]: which of session `s1` (tenant `a`)'s events each hears.
async fn outbox_webhooks(store: &dyn Store) {
    let mut only_s1 = webhook("wh_only_s1", "a", &["*"], 3);
    only_s1.session_id = Some("s1".into());
    let mut only_s2 = webhook("wh_only_s2", "a", &["*"], 4);
    only_s2.session_id = Some("s2".into());
    let mut admin = webhook("wh_admin", "root", &["turn_ended", "session_created"], 5);
    admin.admin = true;
    let mut disabled = webhook("wh_disabled", "a", &["*"], 6);
    disabled.enabled = false;
    for w in [
        webhook("wh_all", "a", &["*"], 1),
        webhook("wh_turns", "a", &["turn_ended", "permission_requested"], 2),
        only_s1,
        only_s2,
        admin,
        disabled,
        webhook("wh_b", "b", &["*"], 7),
    ] {
        store.put_webhook(&w).await.unwrap();
    }
}

/// Every append of session events (`append_events`, the log writer's `append` and
/// `append_all`) inserts one pending delivery per event and enabled webhook that hears it (its
/// kinds or `*`, its session if it names one, its tenant unless an admin's), numbered in log
/// order; a session without a row gets none.
pub async fn check_outbox(store: Arc<dyn Store>) {
    for (id, tenant) in [("s1", "a"), ("s2", "b"), ("s3", "a")] {
        assert!(store.put_session(&record(id, tenant)).await.unwrap());
    }
    outbox_webhooks(store.as_ref()).await;
    let stored = store
        .append_events(
            "s1",
            &[
                event("agent_message_chunk", json!({"text": "hi"})),
                event("turn_ended", json!({"stopReason": "end_turn"})),
                event("agent_message_chunk", json!({"text": "again"})),
            ],
        )
        .await
        .unwrap();
    let s = |ids: &[&str]| ids.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>();
    let store = store.as_ref();
    assert_eq!(
        message_ids(store, "wh_all").await,
        s(&["s1.1", "s1.2", "s1.3"])
    );
    assert_eq!(message_ids(store, "wh_turns").await, s(&["s1.2"]));
    assert_eq!(
        message_ids(store, "wh_only_s1").await,
        s(&["s1.1", "s1.2", "s1.3"])
    );
    assert_eq!(message_ids(store, "wh_only_s2").await, s(&[]));
    assert_eq!(message_ids(store, "wh_admin").await, s(&["s1.2"]));
    assert_eq!(message_ids(store, "wh_disabled").await, s(&[]));
    assert_eq!(message_ids(store, "wh_b").await, s(&[]));

    // Each row as the event was stored, due at once.
    let all = deliveries(store, "wh_all").await;
    for (d, e) in all.iter().zip(&stored) {
        assert_eq!(d.webhook_id, "wh_all");
        assert_eq!((d.session_id.as_str(), d.tenant.as_str()), ("s1", "a"));
        assert_eq!((d.seq, d.kind.as_str()), (e.seq, e.kind.as_str()));
        assert_eq!(d.payload, e.payload.to_value());
        assert_eq!(d.event_at, e.created_at);
        for at in [d.next_attempt_at, d.retry_from, d.created_at, d.updated_at] {
            assert_eq!(at, e.created_at);
        }
        assert_eq!((d.status.as_str(), d.attempts), ("pending", 0));
        assert_eq!(
            (d.last_status, &d.last_body, &d.last_error),
            (None, &None, &None)
        );
    }
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "ids follow seq");

    // The log writer's appends do the same: alone, and several sessions at once.
    let mut log = store.log_writer();
    log.append("s2", &[event("turn_ended", json!({}))], None)
        .await
        .unwrap();
    let for_s3 = [event("x", json!(1)), event("y", json!(2))];
    let for_s1 = [event("turn_ended", json!({}))];
    let groups = [("s3", &for_s3[..], None), ("s1", &for_s1[..], None)];
    match log.append_all(&groups).await {
        Some(appended) => {
            appended.unwrap();
        }
        None => {
            for (id, events, touch) in groups {
                log.append(id, events, touch).await.unwrap();
            }
        }
    }
    assert_eq!(message_ids(store, "wh_b").await, s(&["s2.1"]));
    assert_eq!(message_ids(store, "wh_only_s2").await, s(&[]), "s2 is b's");
    assert_eq!(
        message_ids(store, "wh_admin").await,
        s(&["s1.2", "s2.1", "s1.4"])
    );
    assert_eq!(message_ids(store, "wh_turns").await, s(&["s1.2", "s1.4"]));
    let all = message_ids(store, "wh_all").await;
    assert_eq!(all[..3], s(&["s1.1", "s1.2", "s1.3"]));
    let mut rest = all[3..].to_vec();
    rest.sort();
    assert_eq!(rest, s(&["s1.4", "s3.1", "s3.2"]));
    let s3: Vec<i64> = deliveries(store, "wh_all")
        .await
        .iter()
        .filter(|d| d.session_id == "s3")
        .map(|d| d.seq)
        .collect();
    assert_eq!(s3, [1, 2], "in log order");

    // No row, no tenant: no deliveries.
    store
        .append_events("ghost", &[event("turn_ended", json!({}))])
        .await
        .unwrap();
    assert!(
        !message_ids(store, "wh_admin")
            .await
            .contains(&"ghost.1".into())
    );
}

/// A lifecycle append inserts the deliveries of its events, `lifecycle:<seq>`, with the
/// session and tenant of each, but none for `session_deleted` (the session's own log has it).
pub async fn check_lifecycle_outbox(store: Arc<dyn Store>) {
    outbox_webhooks(store.as_ref()).await;
    let lifecycle = |session: &str, tenant: &str, kind: &str| NewLifecycleEvent {
        session_id: session.to_owned(),
        tenant: tenant.to_owned(),
        kind: kind.to_owned(),
        payload: json!({"sessionId": session}),
    };
    let stored = store
        .append_lifecycle(&[
            lifecycle("s1", "a", "session_created"),
            lifecycle("s1", "a", "session_deleted"),
            lifecycle("s2", "b", "session_created"),
            lifecycle("s1", "a", "session_info_updated"),
        ])
        .await
        .unwrap();
    let message = |i: usize| format!("lifecycle:{}", stored[i].seq);
    let store = store.as_ref();
    assert_eq!(message_ids(store, "wh_all").await, [message(0), message(3)]);
    assert_eq!(
        message_ids(store, "wh_admin").await,
        [message(0), message(2)]
    );
    assert_eq!(message_ids(store, "wh_b").await, [message(2)]);
    assert_eq!(
        message_ids(store, "wh_only_s1").await,
        [message(0), message(3)]
    );
    assert!(message_ids(store, "wh_turns").await.is_empty());
    assert!(message_ids(store, "wh_disabled").await.is_empty());

    let d = deliveries(store, "wh_b").await.remove(0);
    let e = &stored[2];
    assert_eq!((d.session_id.as_str(), d.tenant.as_str()), ("s2", "b"));
    assert_eq!((d.seq, d.kind.as_str()), (e.seq, "session_created"));
    assert_eq!(d.payload, e.payload);
    assert_eq!(
        (d.event_at, d.next_attempt_at),
        (e.created_at, e.created_at)
    );
    assert_eq!(d.status, "pending");
}

/// Message ids never collide: a session named `lifecycle` gets `lifecycle.<seq>`, the lifecycle
/// log's events `lifecycle:<seq>` (a session's ids always end in `.<seq>`), so every event of
/// both is delivered.
pub async fn check_outbox_ids_are_distinct(store: Arc<dyn Store>) {
    assert!(store.put_session(&record("lifecycle", "a")).await.unwrap());
    store
        .put_webhook(&webhook("wh_all", "a", &["*"], 1))
        .await
        .unwrap();
    let stored = store
        .append_lifecycle(&[NewLifecycleEvent {
            session_id: "lifecycle".into(),
            tenant: "a".into(),
            kind: "session_created".into(),
            payload: json!({}),
        }])
        .await
        .unwrap();
    assert_eq!(stored[0].seq, 1, "a fresh database");
    store
        .append_events(
            "lifecycle",
            &[event("x", json!({"n": 1})), event("y", json!({"n": 2}))],
        )
        .await
        .unwrap();
    let all = deliveries(store.as_ref(), "wh_all").await;
    let ids: Vec<&str> = all.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(ids, ["lifecycle:1", "lifecycle.1", "lifecycle.2"]);
    assert_eq!(all[0].kind, "session_created");
}

/// A webhook's deliveries are listed newest first, in pages before an id; deleting the webhook
/// deletes them, and later appends insert none for it.
pub async fn check_list_and_cascade(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let all = backlog(store, &["l1", "l2"], 3).await;
    store
        .put_webhook(&webhook("wh_other", "a", &["*"], 2))
        .await
        .unwrap();
    store
        .append_events("l1", &[event("x", json!({"i": 4}))])
        .await
        .unwrap();
    let mut newest_first: Vec<i64> = all.iter().map(|d| d.id).rev().collect();
    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let page = store.list_deliveries("wh", before, 4).await.unwrap();
        assert!(page.len() <= 4);
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        pages.extend(page.iter().map(|d| d.id));
    }
    let l1_4 = deliveries(store, "wh").await.last().unwrap().id;
    newest_first.insert(0, l1_4);
    assert_eq!(pages, newest_first);
    assert!(
        store
            .list_deliveries("wh", None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_deliveries("wh_none", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.get_delivery("wh", all[0].id).await.unwrap().as_ref(),
        Some(&all[0])
    );
    assert!(
        store
            .get_delivery("wh_other", all[0].id)
            .await
            .unwrap()
            .is_none(),
        "another's"
    );
    assert_eq!(message_ids(store, "wh_other").await, ["l1.4"]);

    assert!(store.delete_webhook("wh").await.unwrap());
    assert!(
        store
            .list_deliveries("wh", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.get_delivery("wh", all[0].id).await.unwrap().is_none());
    store
        .append_events("l2", &[event("x", json!({"i": 4}))])
        .await
        .unwrap();
    assert!(
        store
            .list_deliveries("wh", None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        message_ids(store, "wh_other").await,
        ["l1.4", "l2.4"],
        "the other's stay"
    );
    let now = soon();
    let claimed = store.claim_deliveries("a", now, now, 10).await.unwrap();
    assert!(
        claimed
            .iter()
            .all(|(d, w)| d.webhook_id == "wh_other" && w.id == "wh_other")
    );
}

/// Appends keep succeeding while webhooks that hear them are deleted and created: a delivery is
/// never inserted for a webhook gone (PostgreSQL: the foreign key would fail the append).
pub async fn check_appends_while_webhooks_change(store: Arc<dyn Store>) {
    assert!(store.put_session(&record("busy", "a")).await.unwrap());
    let churn = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                let w = webhook(&format!("wh_{i}"), "a", &["*"], i);
                store.put_webhook(&w).await.unwrap();
                tokio::task::yield_now().await;
                assert!(store.delete_webhook(&w.id).await.unwrap());
            }
        })
    };
    let mut log = store.log_writer();
    let mut appended = 0;
    while !churn.is_finished() {
        log.append("busy", &[event("x", json!({"n": appended}))], None)
            .await
            .expect("an append while webhooks change");
        appended += 1;
        // SQLite's log writer blocks this thread for the append: let the churn run.
        tokio::task::yield_now().await;
    }
    churn.await.unwrap();
    assert_eq!(store.last_event_seq("busy").await.unwrap(), appended);
}
