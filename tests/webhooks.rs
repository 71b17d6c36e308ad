//! Webhooks against a real receiver (`tests/webhooks/receiver.py`) that verifies every
//! signature with the reference `standardwebhooks` library: deliveries signed, in log order per
//! session, with stable ids, retried after the receiver fails them on purpose; a backlog kept
//! across a gateway restart; two replicas sharing one backlog without a delivery lost or sent
//! twice at once; private addresses refused without `--webhook-allow-private`; a subscription
//! that keeps failing disabled, then enabled and retried; a rotated secret; tenants.

use crate::support;

use std::collections::HashMap;

use serde_json::{Value, json};
use support::webhooks::Receiver;
use support::*;

both_backends!(
    deliveries_are_signed_ordered_and_retried,
    a_restart_during_a_backlog_loses_nothing,
    a_failing_subscription_is_disabled_then_retried,
);

/// Fast retries and polls, and the receiver on loopback allowed.
fn fast() -> Options {
    Options::default().args(&[
        "--webhook-allow-private",
        "--webhook-retry-base-ms",
        "100",
        "--webhook-retry-max",
        "1",
        "--webhook-poll-ms",
        "50",
    ])
}

/// Subscribes `receiver` to `events` and gives it the secret; returns the subscription.
async fn subscribe(gw: &Gateway, receiver: &Receiver, events: Value) -> Value {
    subscribe_at(gw, receiver, &receiver.url, events).await
}

/// [`subscribe`] with the receiver's URL written as `url` (with a password, say).
async fn subscribe_at(gw: &Gateway, receiver: &Receiver, url: &str, events: Value) -> Value {
    let r = gw
        .post(
            "/webhooks",
            json!({"url": url, "events": events, "description": "test"}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let hook: Value = r.json().await.unwrap();
    let secret = hook["secret"]
        .as_str()
        .expect("the secret is shown at creation");
    assert!(secret.starts_with("whsec_"), "{hook}");
    receiver.configure(json!({"secret": secret})).await;
    hook
}

/// The successful attempts (2xx), by message id.
fn delivered(attempts: &[Value]) -> HashMap<String, Value> {
    attempts
        .iter()
        .filter(|a| {
            a["status"]
                .as_u64()
                .is_some_and(|s| (200..300).contains(&s))
        })
        .map(|a| (a["msgId"].as_str().unwrap().to_owned(), a.clone()))
        .collect()
}

/// The history events of `kinds` as the message ids the webhook must receive, in log order.
async fn expected(gw: &Gateway, id: &str, kinds: &[&str]) -> Vec<(String, Value)> {
    gw.history(id)
        .await
        .into_iter()
        .filter(|e| kinds.contains(&e["event"].as_str().unwrap()))
        .map(|e| (format!("{id}.{}", e["seq"]), e))
        .collect()
}

async fn deliveries_are_signed_ordered_and_retried(backend: Backend) {
    let w = World::start(backend, fast()).await;
    let gw = w.gw();
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    receiver
        .configure(json!({"failFirst": 2, "failStatus": 500}))
        .await;
    let kinds = ["turn_started", "agent_message_chunk", "turn_ended"];
    let hook = subscribe(gw, &receiver, json!(kinds)).await;
    let hook_id = hook["id"].as_str().unwrap();
    let id = gw.create("/tmp").await;
    for text in ["/chunks 3 one", "/state two"] {
        assert_eq!(gw.prompt(&id, text).await.0, 200);
    }
    let want = expected(gw, &id, &kinds).await;
    assert!(want.len() >= 8, "{want:?}");
    let attempts = receiver
        .wait_for(|a| delivered(a).len() >= want.len())
        .await;

    // Every attempt verified by the reference library; never two of one id at once.
    assert!(
        attempts.iter().all(|a| a["verified"] == true),
        "{attempts:?}"
    );
    assert!(
        attempts.iter().all(|a| a["concurrent"] != true),
        "{attempts:?}"
    );
    let ok = delivered(&attempts);
    // Only the kinds subscribed to (no state_changed, no plan…), each exactly as logged.
    assert_eq!(ok.len(), want.len(), "{:?}", ok.keys());
    for (msg, event) in &want {
        let got = &ok[msg];
        let body = &got["body"];
        assert_eq!(body["type"], event["event"], "{body}");
        assert_eq!(body["data"]["sessionId"], id.as_str());
        assert_eq!(body["data"]["tenant"], "default");
        assert_eq!(body["data"]["id"], event["seq"]);
        assert_eq!(body["data"]["data"], event["data"], "{msg}");
        // Failed twice on purpose, then delivered: three attempts with the same webhook-id.
        let tries: Vec<u64> = attempts
            .iter()
            .filter(|a| a["msgId"] == msg.as_str())
            .map(|a| a["status"].as_u64().unwrap())
            .collect();
        assert_eq!(tries, [500, 500, 204], "{msg}");
    }
    // In log order: each delivered after the one before it in the session.
    let order: Vec<&str> = attempts
        .iter()
        .filter(|a| a["status"] == 204)
        .map(|a| a["msgId"].as_str().unwrap())
        .collect();
    let want_order: Vec<&str> = want.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(order, want_order);

    // The gateway's account of it, once it has recorded the last answers the receiver gave.
    let path = format!("/webhooks/{hook_id}/deliveries?limit=200");
    gw.wait_until(|g| {
        let path = path.clone();
        async move {
            let page = g.json(&path).await;
            let rows = page["deliveries"].as_array().cloned().unwrap_or_default();
            rows.iter().all(|d| d["status"] != "pending")
        }
    })
    .await;
    let page = gw.json(&path).await;
    let rows = page["deliveries"].as_array().unwrap();
    assert_eq!(rows.len(), want.len());
    for d in rows {
        assert_eq!(d["status"], "delivered", "{d}");
        assert_eq!(d["attempts"], 3, "{d}");
        assert_eq!(d["lastStatusCode"], 204, "{d}");
    }
    // The secret is shown only once.
    let shown = gw.json(&format!("/webhooks/{hook_id}")).await;
    assert!(shown.get("secret").is_none(), "{shown}");

    // A rotated secret signs what comes next; the old one no longer verifies.
    let rotated = gw
        .post(&format!("/webhooks/{hook_id}/rotate-secret"), json!({}))
        .await;
    assert_eq!(rotated.status(), 200);
    let rotated: Value = rotated.json().await.unwrap();
    receiver
        .configure(json!({"secret": rotated["secret"], "failFirst": 0}))
        .await;
    assert_eq!(gw.prompt(&id, "three").await.0, 200);
    let want = expected(gw, &id, &kinds).await;
    let attempts = receiver
        .wait_for(|a| delivered(a).len() >= want.len())
        .await;
    let last = &attempts[attempts.len() - 1];
    assert_eq!(last["verified"], true, "{last}");
    receiver.stop().await;
    w.finish().await;
}

async fn a_restart_during_a_backlog_loses_nothing(backend: Backend) {
    let mut w = World::start(backend, fast()).await;
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    receiver.configure(json!({"down": true})).await;
    let hook = subscribe(w.gw(), &receiver, json!(["turn_ended", "session_created"])).await;
    let hook_id = hook["id"].as_str().unwrap().to_owned();
    let mut want = Vec::new();
    for _ in 0..3 {
        let id = w.gw().create("/tmp").await;
        for text in ["a", "b"] {
            assert_eq!(w.gw().prompt(&id, text).await.0, 200);
        }
        want.extend(expected(w.gw(), &id, &["turn_ended"]).await);
    }
    // A backlog: every attempt so far refused.
    receiver.wait_for(|a| !a.is_empty()).await;
    w.restart().await;
    receiver.configure(json!({"down": false})).await;
    let attempts = receiver
        .wait_for(|a| {
            let ok = delivered(a);
            want.iter().all(|(m, _)| ok.contains_key(m))
                && ok.keys().filter(|m| m.starts_with("lifecycle:")).count() == 3
        })
        .await;
    assert!(attempts.iter().all(|a| a["verified"] == true));
    // The receiver has each one before the gateway records its answer.
    let path = format!("/webhooks/{hook_id}/deliveries?limit=200");
    let count = want.len() + 3;
    w.gw()
        .wait_until(|g| {
            let path = path.clone();
            async move {
                let page = g.json(&path).await;
                let rows = page["deliveries"].as_array().unwrap().clone();
                assert_eq!(rows.len(), count, "{page}");
                rows.iter().all(|d| d["status"] == "delivered")
            }
        })
        .await;
    receiver.stop().await;
    w.finish().await;
}

async fn a_failing_subscription_is_disabled_then_retried(backend: Backend) {
    let opts = fast().args(&["--webhook-max-age", "1"]);
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    receiver.configure(json!({"down": true})).await;
    // The receiver's URL with a password in it, which the log must not show when the
    // subscription is disabled.
    const PASSWORD: &str = "hook-pa55word-0123456789";
    let with_password =
        receiver
            .url
            .replacen("http://", &format!("http://hook-user:{PASSWORD}@"), 1);
    let hook = subscribe_at(gw, &receiver, &with_password, json!(["turn_ended"])).await;
    let hook_id = hook["id"].as_str().unwrap();
    let mut lifecycle = gw.sse("/events", None).await;
    let id = gw.create("/tmp").await;
    assert_eq!(gw.prompt(&id, "doomed").await.0, 200);
    // Retried for a second, then given up: the subscription is disabled and that is announced.
    let disabled = lifecycle.until("webhook_disabled").await;
    assert_eq!(disabled.last().unwrap().data["webhookId"], hook_id);
    let shown = gw.json(&format!("/webhooks/{hook_id}")).await;
    assert_eq!(shown["enabled"], false, "{shown}");
    assert!(
        shown["disabledReason"].as_str().unwrap().contains("503"),
        "{shown}"
    );
    let log = w.log();
    assert!(log.contains("webhook disabled"), "{log}");
    assert!(!log.contains(PASSWORD), "{log}");
    let page = gw.json(&format!("/webhooks/{hook_id}/deliveries")).await;
    let failed = &page["deliveries"][0];
    assert_eq!(failed["status"], "failed", "{page}");
    assert!(failed["attempts"].as_i64().unwrap() >= 2, "{failed}");
    assert_eq!(failed["lastStatusCode"], 503);
    assert!(failed["lastResponseBody"].is_string(), "{failed}");

    // The receiver is fixed; the client enables the subscription and retries the delivery.
    receiver.configure(json!({"down": false})).await;
    let r = gw
        .patch(&format!("/webhooks/{hook_id}"), json!({"enabled": true}))
        .await;
    assert_eq!(r.status(), 200);
    let delivery = failed["id"].as_i64().unwrap();
    let r = gw
        .post(
            &format!("/webhooks/{hook_id}/deliveries/{delivery}/retry"),
            json!({}),
        )
        .await;
    assert_eq!(r.status(), 202);
    let msg = failed["messageId"].as_str().unwrap().to_owned();
    receiver.wait_for(|a| delivered(a).contains_key(&msg)).await;
    receiver.stop().await;
    w.finish().await;
}

/// Without `--webhook-allow-private`, nothing is sent to loopback: a loopback address is refused
/// when the webhook is made, and a name that resolves to one at each attempt, which the delivery
/// records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_addresses_are_refused() {
    let opts =
        Options::default().args(&["--webhook-poll-ms", "50", "--webhook-retry-base-ms", "100"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    // Its address is refused at once; a name is resolved, and refused, at each attempt.
    let r = gw
        .post("/webhooks", json!({"url": receiver.url, "events": ["*"]}))
        .await;
    assert_eq!(r.status(), 422);
    let by_name = receiver.url.replace("127.0.0.1", "localhost");
    let r = gw
        .post("/webhooks", json!({"url": by_name, "events": ["*"]}))
        .await;
    assert_eq!(r.status(), 201);
    let hook: Value = r.json().await.unwrap();
    let hook_id = hook["id"].as_str().unwrap();
    let id = gw.create("/tmp").await;
    assert_eq!(gw.prompt(&id, "hello").await.0, 200);
    let url = format!("/webhooks/{hook_id}/deliveries");
    gw.wait_until(|gw| {
        let url = url.clone();
        async move {
            let page = gw.json(&url).await;
            page["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["attempts"].as_i64() >= Some(2))
        }
    })
    .await;
    let page = gw.json(&url).await;
    // The session's first event is tried (and refused) again and again; the rest wait behind it.
    let rows = page["deliveries"].as_array().unwrap();
    let tried: Vec<&Value> = rows
        .iter()
        .filter(|d| d["attempts"].as_i64() > Some(0))
        .collect();
    assert_eq!(tried.len(), 1, "{page}");
    let d = tried[0];
    assert_eq!(d["id"], rows.last().unwrap()["id"], "the oldest: {page}");
    assert!(d["lastError"].as_str().unwrap().contains("refused"), "{d}");
    assert!(d["lastStatusCode"].is_null(), "{d}");
    assert!(receiver.attempts().await.is_empty());
    receiver.stop().await;
    w.finish().await;
}

/// Two replicas on one database share one backlog: every delivery made once, none at the same
/// time from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn two_replicas_share_one_backlog() {
    let w = World::start(Backend::Postgres, fast()).await;
    let b = Gateway::spawn(&w.db.url, w.dir.path(), &fast()).await;
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    receiver
        .configure(json!({"down": true, "delayMs": 100}))
        .await;
    subscribe(w.gw(), &receiver, json!(["turn_started", "turn_ended"])).await;
    let mut want = Vec::new();
    for gw in [w.gw(), &b, w.gw(), &b] {
        let id = gw.create("/tmp").await;
        for text in ["a", "b", "c"] {
            assert_eq!(gw.prompt(&id, text).await.0, 200);
        }
        // The session may live on the other replica (placement), whose last commit this
        // replica's history can read a moment later: wait for the three turns.
        let kinds = ["turn_started", "turn_ended"];
        gw.wait_until(|gw| {
            let id = id.clone();
            async move { expected(gw, &id, &kinds).await.len() == 6 }
        })
        .await;
        want.extend(expected(gw, &id, &kinds).await);
    }
    receiver.wait_for(|a| !a.is_empty()).await;
    receiver.configure(json!({"down": false})).await;
    let attempts = receiver
        .wait_for(|a| delivered(a).len() >= want.len())
        .await;
    assert!(
        attempts.iter().all(|a| a["concurrent"] != true),
        "{attempts:?}"
    );
    let successes: Vec<&str> = attempts
        .iter()
        .filter(|a| a["status"] == 204)
        .map(|a| a["msgId"].as_str().unwrap())
        .collect();
    assert_eq!(
        successes.len(),
        want.len(),
        "each delivered once: {successes:?}"
    );
    // Per session, in log order.
    for (session, _) in want
        .iter()
        .map(|(m, e)| (e["data"]["sessionId"].as_str().unwrap(), m))
    {
        let got: Vec<&str> = successes
            .iter()
            .copied()
            .filter(|m| m.starts_with(session))
            .collect();
        let exp: Vec<&str> = want
            .iter()
            .map(|(m, _)| m.as_str())
            .filter(|m| m.starts_with(session))
            .collect();
        assert_eq!(got, exp);
    }
    receiver.stop().await;
    drop(b);
    w.finish().await;
}

/// Subscriptions are the tenant's: another tenant neither sees it nor feeds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_belong_to_a_tenant() {
    let (alice, bob) = ("alice-key-0123456789", "bob-key-0123456789ab");
    let opts = fast().args(&[
        "--api-key",
        &format!("alice:{alice}"),
        "--api-key",
        &format!("bob:{bob}"),
    ]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    let send = |key: &'static str, method: reqwest::Method, path: String, body: Value| {
        gw.http
            .request(method, gw.url(&path))
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    let r = send(
        alice,
        reqwest::Method::POST,
        "/webhooks".into(),
        json!({"url": receiver.url, "events": ["turn_ended"]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let hook: Value = r.json().await.unwrap();
    receiver.configure(json!({"secret": hook["secret"]})).await;
    let hook_id = hook["id"].as_str().unwrap();
    let r = send(
        bob,
        reqwest::Method::GET,
        format!("/webhooks/{hook_id}"),
        json!(null),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    let listed: Value = send(bob, reqwest::Method::GET, "/webhooks".into(), json!(null))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]));
    // Invalid subscriptions are refused.
    for body in [
        json!({"url": "ftp://x", "events": ["turn_ended"]}),
        json!({"url": receiver.url, "events": ["no_such_kind"]}),
        json!({"url": receiver.url, "events": []}),
    ] {
        let r = send(alice, reqwest::Method::POST, "/webhooks".into(), body)
            .await
            .unwrap();
        assert_eq!(r.status(), 422);
    }
    // Bob's turn is not Alice's event; Alice's is.
    for (key, text) in [(bob, "bob's"), (alice, "alice's")] {
        let r = send(
            key,
            reqwest::Method::POST,
            "/sessions".into(),
            json!({"cwd": "/tmp"}),
        )
        .await
        .unwrap();
        let id = r.json::<Value>().await.unwrap()["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        let r = send(
            key,
            reqwest::Method::POST,
            format!("/sessions/{id}/prompt"),
            json!({"text": text}),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 200);
    }
    let attempts = receiver.wait_for(|a| !delivered(a).is_empty()).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let attempts = if attempts.len() > 1 {
        attempts
    } else {
        receiver.attempts().await
    };
    assert_eq!(delivered(&attempts).len(), 1, "{attempts:?}");
    let only = delivered(&attempts).into_values().next().unwrap();
    assert_eq!(only["body"]["data"]["tenant"], "alice");
    receiver.stop().await;
    w.finish().await;
}
