//! Idempotency keys: taken by one request per tenant, held with its response once it has one,
//! freed when released unanswered or expired, pruned once expired; and taken by exactly one of
//! many requests at once.

use super::*;
use acp_gateway::store::{KeyClaim, KeyRecord, StoredResponse};

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("location".into(), "/sessions/s1".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

pub async fn check_idempotency_keys(store: Arc<dyn Store>) {
    let (now, until) = (ts(T0), ts(T0 + 60_000_000));
    let take = |tenant: &'static str, key: &'static str, fingerprint: &'static str| {
        let store = store.clone();
        async move {
            store
                .take_idempotency_key(tenant, key, fingerprint, now, until)
                .await
                .unwrap()
        }
    };
    let running = |fingerprint: &str| {
        KeyClaim::Held(KeyRecord {
            fingerprint: fingerprint.into(),
            response: None,
        })
    };
    assert_eq!(take("t1", "k", "f1").await, KeyClaim::Taken);
    assert_eq!(take("t1", "k", "f1").await, running("f1"));
    assert_eq!(
        take("t1", "k", "f2").await,
        running("f1"),
        "the first digest stays"
    );
    assert_eq!(take("t2", "k", "f2").await, KeyClaim::Taken, "per tenant");

    // Answered: the response is held, with its bytes and headers as they were.
    let kept = response("{\"sessionId\":\"s1\",\"bytes\":\"\u{0}\u{1f600}\"}");
    store
        .finish_idempotency_key("t1", "k", &kept)
        .await
        .unwrap();
    let held = KeyClaim::Held(KeyRecord {
        fingerprint: "f1".into(),
        response: Some(kept.clone()),
    });
    assert_eq!(take("t1", "k", "f1").await, held);
    // An answered key is neither answered again nor released.
    store
        .finish_idempotency_key("t1", "k", &response("other"))
        .await
        .unwrap();
    store.release_idempotency_key("t1", "k").await.unwrap();
    assert_eq!(take("t1", "k", "f1").await, held);

    // Released unanswered: free again.
    store.release_idempotency_key("t2", "k").await.unwrap();
    assert_eq!(take("t2", "k", "f3").await, KeyClaim::Taken);

    // Expired: free again, and pruned.
    let later = ts(T0 + 60_000_000);
    let again = store
        .take_idempotency_key("t1", "k", "f4", later, ts(T0 + 120_000_000))
        .await
        .unwrap();
    assert_eq!(again, KeyClaim::Taken, "an expired key is taken anew");
    assert_eq!(
        store.prune_idempotency_keys(later).await.unwrap(),
        1,
        "t2's"
    );
    assert_eq!(store.prune_idempotency_keys(later).await.unwrap(), 0);
    let end = ts(T0 + 120_000_000);
    assert_eq!(store.prune_idempotency_keys(end).await.unwrap(), 1, "t1's");
}

/// Of many requests taking one key at once, exactly one gets it.
pub async fn check_concurrent_idempotency_keys(store: Arc<dyn Store>) {
    let mut set = JoinSet::new();
    for i in 0..16 {
        let store = store.clone();
        set.spawn(async move {
            let fingerprint = format!("f{i}");
            store
                .take_idempotency_key("t", "once", &fingerprint, ts(T0), ts(T0 + 1_000_000))
                .await
                .unwrap()
        });
    }
    let mut taken = 0;
    while let Some(claim) = set.join_next().await {
        if claim.unwrap() == KeyClaim::Taken {
            taken += 1;
        }
    }
    assert_eq!(taken, 1);
}
