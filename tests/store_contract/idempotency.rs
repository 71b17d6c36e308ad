//! Idempotency keys: taken by one request per tenant, run by one replica (and handed on to
//! another), held with its response once it has one, freed when released by its runner, taken
//! anew once its response expired but never while running, pruned once expired; taken by exactly
//! one of many requests at once; and the replicas' secret, stored once.

use super::*;
use acp_gateway::store::{KeyClaim, KeyRecord, KeyRequest, StoredResponse};

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
                .take_idempotency_key(
                    KeyRequest {
                        tenant,
                        key,
                        fingerprint,
                        runner: "r1",
                    },
                    (now, until),
                )
                .await
                .unwrap()
        }
    };
    let running = |fingerprint: &str, runner: &str| {
        KeyClaim::Held(KeyRecord {
            fingerprint: fingerprint.into(),
            runner: runner.into(),
            response: None,
        })
    };
    assert_eq!(take("t1", "k", "f1").await, KeyClaim::Taken);
    assert_eq!(take("t1", "k", "f1").await, running("f1", "r1"));
    assert_eq!(
        take("t1", "k", "f2").await,
        running("f1", "r1"),
        "the first digest stays"
    );
    assert_eq!(take("t2", "k", "f2").await, KeyClaim::Taken, "per tenant");

    // Answered: the response is held, with its bytes and headers as they were.
    let kept = response("{\"sessionId\":\"s1\",\"bytes\":\"\u{0}\u{1f600}\"}");
    store
        .finish_idempotency_key("t1", "k", &kept, until)
        .await
        .unwrap();
    let held = KeyClaim::Held(KeyRecord {
        fingerprint: "f1".into(),
        runner: "r1".into(),
        response: Some(kept.clone()),
    });
    assert_eq!(take("t1", "k", "f1").await, held);
    // An answered key is neither answered again nor released.
    store
        .finish_idempotency_key("t1", "k", &response("other"), until)
        .await
        .unwrap();
    store
        .release_idempotency_key("t1", "k", "r1")
        .await
        .unwrap();
    assert_eq!(take("t1", "k", "f1").await, held);

    // Released unanswered by its runner: free again; by another replica: not.
    store
        .release_idempotency_key("t2", "k", "r2")
        .await
        .unwrap();
    assert_eq!(take("t2", "k", "f3").await, running("f2", "r1"));
    store
        .release_idempotency_key("t2", "k", "r1")
        .await
        .unwrap();
    assert_eq!(take("t2", "k", "f3").await, KeyClaim::Taken);

    // Handed on: from the runner it has (or from any), never once answered.
    let term = (now, until);
    let hand = |from: Option<&'static str>, to: &'static str| {
        let store = store.clone();
        async move {
            store
                .hand_idempotency_key("t2", "k", (from, to), term)
                .await
                .unwrap()
        }
    };
    assert!(!hand(Some("r9"), "r2").await, "r1 runs it, not r9");
    assert!(hand(Some("r1"), "r2").await);
    assert_eq!(take("t2", "k", "f3").await, running("f3", "r2"));
    assert!(hand(None, "r3").await, "adopted from whichever runs it");
    assert_eq!(take("t2", "k", "f3").await, running("f3", "r3"));
    store
        .finish_idempotency_key("t2", "k", &response("t2"), until)
        .await
        .unwrap();
    assert!(!hand(None, "r4").await, "an answered key stays");

    // Expired: an answer is taken anew; a request still running is not, however old.
    let later = ts(T0 + 60_000_000);
    let end = ts(T0 + 120_000_000);
    let take_later = |tenant: &'static str, runner: &'static str| {
        let store = store.clone();
        async move {
            store
                .take_idempotency_key(
                    KeyRequest {
                        tenant,
                        key: "k",
                        fingerprint: "f4",
                        runner,
                    },
                    (later, end),
                )
                .await
                .unwrap()
        }
    };
    assert_eq!(take("t3", "k", "f4").await, KeyClaim::Taken);
    assert_eq!(
        take_later("t1", "r5").await,
        KeyClaim::Taken,
        "an expired answer"
    );
    assert_eq!(
        take_later("t3", "r5").await,
        running("f4", "r1"),
        "still running"
    );
    // Pruned: t2's expired answer, and t3's, expired and running on a replica that is neither
    // this one nor registered; not t1's, whose term runs on.
    assert_eq!(
        store.prune_idempotency_keys(later, "r1").await.unwrap(),
        1,
        "t2's"
    );
    assert_eq!(
        take_later("t3", "r5").await,
        running("f4", "r1"),
        "r1 is here"
    );
    assert_eq!(
        store.prune_idempotency_keys(later, "r5").await.unwrap(),
        1,
        "t3's"
    );
    assert_eq!(take_later("t3", "r5").await, KeyClaim::Taken);
    assert_eq!(store.prune_idempotency_keys(later, "r5").await.unwrap(), 0);
    assert_eq!(
        store.prune_idempotency_keys(end, "r5").await.unwrap(),
        0,
        "running here"
    );
    store
        .finish_idempotency_key("t1", "k", &response("t1"), end)
        .await
        .unwrap();
    assert_eq!(
        store.prune_idempotency_keys(end, "r5").await.unwrap(),
        1,
        "t1's"
    );

    // The replicas' secret: the first one stored stays.
    let first = store.cluster_secret(b"first secret").await.unwrap();
    assert_eq!(first, b"first secret");
    let second = store.cluster_secret(b"second secret").await.unwrap();
    assert_eq!(second, b"first secret");
}

/// Of many requests taking one key at once, exactly one gets it.
pub async fn check_concurrent_idempotency_keys(store: Arc<dyn Store>) {
    let mut set = JoinSet::new();
    for i in 0..16 {
        let store = store.clone();
        set.spawn(async move {
            let fingerprint = format!("f{i}");
            let request = KeyRequest {
                tenant: "t",
                key: "once",
                fingerprint: &fingerprint,
                runner: "r",
            };
            store
                .take_idempotency_key(request, (ts(T0), ts(T0 + 1_000_000)))
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
