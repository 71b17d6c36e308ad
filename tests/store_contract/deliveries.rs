//! The webhook outbox's deliveries once inserted: their claim with leases (one claimer per
//! delivery, many claimers at once), how attempts are recorded, and retries.

use super::webhooks::{deliveries, soon, webhook};
use super::*;
use acp_gateway::store::{Attempt, DeliveryRecord, WebhookRecord};

/// Appends `n` events to each of `sessions` (tenant `a`) and returns the deliveries of webhook
/// `wh` (hearing everything) after them, oldest first.
pub(crate) async fn backlog(store: &dyn Store, sessions: &[&str], n: i64) -> Vec<DeliveryRecord> {
    store
        .put_webhook(&webhook("wh", "a", &["*"], 1))
        .await
        .unwrap();
    for id in sessions {
        assert!(store.put_session(&record(id, "a")).await.unwrap());
        let events: Vec<NewEvent> = (1..=n).map(|i| event("x", json!({"i": i}))).collect();
        store.append_events(id, &events).await.unwrap();
    }
    deliveries(store, "wh").await
}

fn claimed_ids(claimed: &[(DeliveryRecord, WebhookRecord)]) -> Vec<i64> {
    claimed.iter().map(|(d, _)| d.id).collect()
}

/// A claim takes, lowest id first, the lowest pending delivery of each (webhook, session) that
/// is due, of an enabled webhook, and not leased (or its lease expired), with its webhook; a
/// delivery delivered or given up lets the next of its session go.
pub async fn check_claim(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let all = backlog(store, &["c1", "c2"], 3).await;
    let (c1, c2): (Vec<_>, Vec<_>) = all.iter().partition(|d| d.session_id == "c1");
    let now = soon();
    let lease = Duration::seconds(30);

    assert!(
        store
            .claim_deliveries("a", now, now + lease, 0)
            .await
            .unwrap()
            .is_empty()
    );
    let first = store
        .claim_deliveries("a", now, now + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&first), [c1[0].id, c2[0].id]);
    let (d, w) = &first[0];
    assert_eq!(d, c1[0], "as listed");
    assert_eq!(Some(w.clone()), store.get_webhook("wh").await.unwrap());

    // Leased: nobody else gets them, nor what follows them, until the lease has passed.
    assert!(
        store
            .claim_deliveries("b", now, now + lease, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let later = now + lease + Duration::seconds(1);
    let again = store
        .claim_deliveries("b", later, later + lease, 1)
        .await
        .unwrap();
    assert_eq!(
        claimed_ids(&again),
        [c1[0].id],
        "at most `limit`, lowest first"
    );
    let again = store
        .claim_deliveries("b", later, later + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&again), [c2[0].id]);

    // Delivered: the next of its session goes.
    let delivered = Attempt::Delivered {
        status: 204,
        body: String::new(),
    };
    assert!(
        store
            .finish_delivery(c1[0].id, "b", &delivered, later)
            .await
            .unwrap()
    );
    let next = store
        .claim_deliveries("c", later, later + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&next), [c1[1].id]);

    // Not due yet: nothing before `next_attempt_at`.
    let retry_at = later + Duration::minutes(5);
    let failed = Attempt::Failed {
        status: Some(503),
        body: Some("busy".into()),
        error: "HTTP 503".into(),
        next: Some(retry_at),
    };
    assert!(
        store
            .finish_delivery(c2[0].id, "b", &failed, later)
            .await
            .unwrap()
    );
    let free = later + lease + Duration::seconds(1);
    assert!(
        store
            .claim_deliveries("d", free, free + lease, 10)
            .await
            .unwrap()
            .iter()
            .all(|(d, _)| d.session_id != "c2")
    );
    let due = store
        .claim_deliveries("d", retry_at, retry_at + lease, 10)
        .await
        .unwrap();
    assert!(claimed_ids(&due).contains(&c2[0].id));

    // Given up: the next of its session goes.
    let give_up = Attempt::Failed {
        status: None,
        body: None,
        error: "connection refused".into(),
        next: None,
    };
    assert!(
        store
            .finish_delivery(c2[0].id, "d", &give_up, retry_at)
            .await
            .unwrap()
    );
    let end = retry_at + lease + Duration::seconds(1);
    let next = store
        .claim_deliveries("e", end, end + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&next), [c1[1].id, c2[1].id]);

    // A disabled webhook's deliveries wait.
    let mut w = store.get_webhook("wh").await.unwrap().unwrap();
    w.enabled = false;
    assert!(store.update_webhook(&w).await.unwrap());
    let end = end + lease + Duration::seconds(1);
    assert!(
        store
            .claim_deliveries("f", end, end + lease, 10)
            .await
            .unwrap()
            .is_empty()
    );
    w.enabled = true;
    assert!(store.update_webhook(&w).await.unwrap());
    assert_eq!(
        claimed_ids(
            &store
                .claim_deliveries("f", end, end + lease, 10)
                .await
                .unwrap()
        ),
        [c1[1].id, c2[1].id]
    );
}

/// An attempt is recorded by the lease's owner only; delivered, failed for now, given up; and a
/// manual retry makes a delivery due again whatever became of it.
pub async fn check_finish_and_retry(store: Arc<dyn Store>) {
    let store = store.as_ref();
    let all = backlog(store, &["f1"], 2).await;
    let (first, second) = (&all[0], &all[1]);
    let now = soon();
    let lease = Duration::seconds(30);
    let get = async |id: i64| store.get_delivery("wh", id).await.unwrap().unwrap();
    let claimed = store
        .claim_deliveries("a", now, now + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&claimed), [first.id]);

    // Not the owner: nothing written.
    let delivered = Attempt::Delivered {
        status: 200,
        body: "ok".into(),
    };
    assert!(
        !store
            .finish_delivery(first.id, "b", &delivered, now)
            .await
            .unwrap()
    );
    assert!(
        !store
            .finish_delivery(second.id, "a", &delivered, now)
            .await
            .unwrap(),
        "not claimed"
    );
    assert!(
        !store
            .finish_delivery(i64::MAX, "a", &delivered, now)
            .await
            .unwrap()
    );
    assert_eq!(&get(first.id).await, first);
    assert_eq!(&get(second.id).await, second);

    // Failed, to try again later.
    let at = now + Duration::seconds(2);
    let retry_at = now + Duration::seconds(60);
    let failed = Attempt::Failed {
        status: Some(500),
        body: Some("oops".into()),
        error: "HTTP 500".into(),
        next: Some(retry_at),
    };
    assert!(
        store
            .finish_delivery(first.id, "a", &failed, at)
            .await
            .unwrap()
    );
    let d = get(first.id).await;
    assert_eq!((d.status.as_str(), d.attempts), ("pending", 1));
    assert_eq!(
        (d.next_attempt_at, d.retry_from, d.updated_at),
        (retry_at, first.retry_from, at)
    );
    assert_eq!(
        (
            d.last_status,
            d.last_body.as_deref(),
            d.last_error.as_deref()
        ),
        (Some(500), Some("oops"), Some("HTTP 500"))
    );
    assert!(
        !store
            .finish_delivery(first.id, "a", &delivered, at)
            .await
            .unwrap(),
        "the lease went with the attempt"
    );

    // A lease taken over after it expired is the new owner's only.
    store
        .claim_deliveries("a", retry_at, retry_at + lease, 10)
        .await
        .unwrap();
    let taken = retry_at + lease + Duration::seconds(1);
    let claimed = store
        .claim_deliveries("b", taken, taken + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&claimed), [first.id]);
    assert!(
        !store
            .finish_delivery(first.id, "a", &delivered, taken)
            .await
            .unwrap()
    );
    assert!(
        store
            .finish_delivery(first.id, "b", &delivered, taken)
            .await
            .unwrap()
    );
    let d = get(first.id).await;
    assert_eq!((d.status.as_str(), d.attempts), ("delivered", 2));
    assert_eq!(
        (
            d.last_status,
            d.last_body.as_deref(),
            d.last_error.as_deref()
        ),
        (Some(200), Some("ok"), None)
    );

    // Given up.
    let claimed = store
        .claim_deliveries("b", taken, taken + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&claimed), [second.id]);
    let give_up = Attempt::Failed {
        status: None,
        body: None,
        error: "timed out".into(),
        next: None,
    };
    assert!(
        store
            .finish_delivery(second.id, "b", &give_up, taken)
            .await
            .unwrap()
    );
    let d = get(second.id).await;
    assert_eq!((d.status.as_str(), d.attempts), ("failed", 1));
    assert_eq!(d.next_attempt_at, second.next_attempt_at, "unchanged");
    assert_eq!(
        (d.last_status, d.last_error.as_deref()),
        (None, Some("timed out"))
    );
    assert!(
        store
            .claim_deliveries("b", taken, taken + lease, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // A manual retry: due now, retries counted from now, claimable again.
    let retried = taken + Duration::seconds(5);
    assert!(
        store
            .retry_delivery("wh", second.id, retried)
            .await
            .unwrap()
    );
    assert!(!store.retry_delivery("wh", i64::MAX, retried).await.unwrap());
    assert!(
        !store
            .retry_delivery("wh_other", second.id, retried)
            .await
            .unwrap()
    );
    let d = get(second.id).await;
    assert_eq!(d.status, "pending");
    assert_eq!(
        (d.next_attempt_at, d.retry_from, d.updated_at),
        (retried, retried, retried)
    );
    assert_eq!(d.attempts, 1, "attempts are kept");
    let claimed = store
        .claim_deliveries("c", retried, retried + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&claimed), [second.id]);

    // A retry of a leased delivery takes the lease away.
    assert!(
        store
            .retry_delivery("wh", second.id, retried)
            .await
            .unwrap()
    );
    assert!(
        !store
            .finish_delivery(second.id, "c", &delivered, retried)
            .await
            .unwrap()
    );
    let claimed = store
        .claim_deliveries("d", retried, retried + lease, 10)
        .await
        .unwrap();
    assert_eq!(claimed_ids(&claimed), [second.id], "free again");
}

/// Claims running at once never take the same delivery, nor two of one session.
pub async fn check_concurrent_claims(store: Arc<dyn Store>) {
    let sessions: Vec<String> = (0..12).map(|i| format!("cc{i}")).collect();
    let names: Vec<&str> = sessions.iter().map(String::as_str).collect();
    let all = backlog(store.as_ref(), &names, 2).await;
    let now = soon();
    let mut claims = JoinSet::new();
    for owner in 0..6 {
        let store = store.clone();
        claims.spawn(async move {
            let owner = format!("owner-{owner}");
            let claimed = store
                .claim_deliveries(&owner, now, now + Duration::seconds(30), 3)
                .await
                .unwrap();
            claimed_ids(&claimed)
        });
    }
    let mut claimed: Vec<i64> = claims.join_all().await.into_iter().flatten().collect();
    claimed.sort_unstable();
    let firsts: Vec<i64> = sessions
        .iter()
        .map(|s| all.iter().find(|d| &d.session_id == s).unwrap().id)
        .collect();
    let mut expected = firsts.clone();
    expected.sort_unstable();
    assert_eq!(claimed, expected, "each session's first, each once");
}
