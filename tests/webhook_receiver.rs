//! The webhook receiver the webhook tests rely on (`tests/support/webhooks.rs`,
//! `tests/webhooks/receiver.py`), checked on its own: it verifies Standard Webhooks signatures
//! with the reference library (a request signed here by hand passes, a wrong or stale one is
//! refused and recorded as such), accepts any of several secrets, fails the first attempts of
//! each id when told, answers 503 while down, and flags overlapping requests with the same id.

use crate::support;

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use support::webhooks::{Receiver, delivered, random_secret};

/// HMAC-SHA256 (RFC 2104) over SHA-256's 64-byte block; nothing more is needed here.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` keyed with the decoded secret.
fn sign(secret: &str, id: &str, timestamp: u64, body: &str) -> String {
    let key = B64.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mac = hmac_sha256(&key, format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", B64.encode(mac))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn event(session: &str, seq: u64) -> String {
    json!({
        "type": "turn_ended",
        "timestamp": "2026-01-01T00:00:00Z",
        "data": {"sessionId": session, "tenant": "t1", "id": seq, "event": "turn_ended", "data": {"stopReason": "end_turn"}},
    })
    .to_string()
}

/// Sends one delivery as a sender would; returns the status and the body of the answer.
async fn deliver(
    r: &Receiver,
    id: &str,
    timestamp: u64,
    signature: &str,
    body: &str,
) -> (u16, String) {
    let resp = reqwest::Client::new()
        .post(format!("{}/hooks/ci", r.url))
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn deliver_signed(r: &Receiver, secret: &str, id: &str, body: &str) -> (u16, String) {
    let ts = now();
    deliver(r, id, ts, &sign(secret, id, ts, body), body).await
}

#[test]
fn hmac_matches_rfc_4231() {
    // RFC 4231, test case 2.
    let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifies_signatures_with_the_reference_library() {
    let secret = random_secret();
    let r = Receiver::start(&secret).await;
    let body = event("sess_abc", 7);

    assert_eq!(
        deliver_signed(&r, &secret, "sess_abc.7", &body).await,
        (204, String::new())
    );
    let other = random_secret();
    let ts = now();
    let (status, _) = deliver(
        &r,
        "sess_abc.8",
        ts,
        &sign(&other, "sess_abc.8", ts, &body),
        &body,
    )
    .await;
    assert_eq!(status, 401, "signed with another secret");
    // Signed for another body, or for another id.
    let (status, _) = deliver(
        &r,
        "sess_abc.9",
        ts,
        &sign(&secret, "sess_abc.9", ts, "{}"),
        &body,
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = deliver(
        &r,
        "sess_abc.10",
        ts,
        &sign(&secret, "sess_abc.1", ts, &body),
        &body,
    )
    .await;
    assert_eq!(status, 401);
    // Older than the library's five minutes of tolerance, however well signed: a sender must
    // sign each retry anew.
    let stale = ts - 600;
    let (status, _) = deliver(
        &r,
        "sess_abc.11",
        stale,
        &sign(&secret, "sess_abc.11", stale, &body),
        &body,
    )
    .await;
    assert_eq!(status, 401);
    // Not a signature at all.
    let (status, _) = deliver(&r, "sess_abc.12", ts, "garbage", &body).await;
    assert_eq!(status, 401);

    let attempts = r.wait_for(|a| a.len() == 6).await;
    let first = &attempts[0];
    assert_eq!(first["msgId"], "sess_abc.7");
    assert_eq!(first["verified"], true, "{first}");
    assert_eq!(first["error"], Value::Null);
    assert_eq!(first["status"], 204);
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["concurrent"], false);
    assert_eq!(first["path"], "/hooks/ci");
    assert_eq!(first["body"]["data"]["sessionId"], "sess_abc");
    assert_eq!(first["body"]["data"]["id"], 7);
    assert_eq!(first["rawBody"], body.as_str());
    assert!(first["timestamp"].as_u64().unwrap() >= ts - 1);
    assert!(first["receivedAt"].as_f64().unwrap() > 0.0);
    for a in &attempts[1..] {
        assert_eq!(a["verified"], false, "{a}");
        assert_eq!(a["status"], 401, "{a}");
        assert!(a["error"].as_str().is_some_and(|e| !e.is_empty()), "{a}");
    }
    assert!(
        attempts[4]["error"].as_str().unwrap().contains("too old"),
        "{}",
        attempts[4]
    );
    assert_eq!(
        delivered(&attempts),
        vec![&json!(serde_json::from_str::<Value>(&body).unwrap())]
    );

    r.reset().await;
    assert!(r.attempts().await.is_empty());
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_any_configured_secret() {
    let (old, new) = (random_secret(), random_secret());
    let r = Receiver::start(&old).await;
    let body = event("sess_rot", 1);
    assert_eq!(deliver_signed(&r, &new, "sess_rot.1", &body).await.0, 401);
    r.configure(json!({"secret": [old, new]})).await;
    assert_eq!(deliver_signed(&r, &new, "sess_rot.1", &body).await.0, 204);
    assert_eq!(deliver_signed(&r, &old, "sess_rot.2", &body).await.0, 204);
    r.configure(json!({"secret": new})).await;
    assert_eq!(deliver_signed(&r, &old, "sess_rot.3", &body).await.0, 401);
    assert_eq!(deliver_signed(&r, &new, "sess_rot.3", &body).await.0, 204);
    let verified: Vec<bool> = r
        .attempts()
        .await
        .iter()
        .map(|a| a["verified"].as_bool().unwrap())
        .collect();
    assert_eq!(verified, [false, true, true, false, true]);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_the_first_attempts_of_each_id_and_can_be_down() {
    let secret = random_secret();
    let r = Receiver::start_with(&secret, &["--fail-first", "2"]).await;
    let body = event("sess_ff", 1);
    for _ in 0..2 {
        assert_eq!(
            deliver_signed(&r, &secret, "sess_ff.1", &body).await,
            (500, "try again".to_owned())
        );
    }
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.1", &body).await.0, 204);
    assert_eq!(
        deliver_signed(&r, &secret, "sess_ff.1", &body).await.0,
        204,
        "a duplicate"
    );
    // Each id has its own count.
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.2", &body).await.0, 500);

    r.configure(json!({"failFirst": 1, "failStatus": 429, "okStatus": 200}))
        .await;
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.3", &body).await.0, 429);
    assert_eq!(
        deliver_signed(&r, &secret, "sess_ff.3", &body).await,
        (200, "ok".to_owned())
    );

    // Down: 503 whatever the signature, and down attempts do not count as failed-first ones.
    r.configure(json!({"down": true})).await;
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.4", &body).await.0, 503);
    assert_eq!(
        deliver(&r, "sess_ff.4", now(), "v1,AAAA", &body).await.0,
        503
    );
    r.configure(json!({"down": false})).await;
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.4", &body).await.0, 429);
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.4", &body).await.0, 200);

    let attempts = r.attempts().await;
    let summary: Vec<(String, u64, u64)> = attempts
        .iter()
        .map(|a| {
            (
                a["msgId"].as_str().unwrap().to_owned(),
                a["attempt"].as_u64().unwrap(),
                a["status"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("sess_ff.1", 1, 500),
        ("sess_ff.1", 2, 500),
        ("sess_ff.1", 3, 204),
        ("sess_ff.1", 4, 204),
        ("sess_ff.2", 1, 500),
        ("sess_ff.3", 1, 429),
        ("sess_ff.3", 2, 200),
        ("sess_ff.4", 1, 503),
        ("sess_ff.4", 2, 503),
        ("sess_ff.4", 3, 429),
        ("sess_ff.4", 4, 200),
    ]
    .map(|(id, n, s)| (id.to_owned(), n, s));
    assert_eq!(summary, expected);
    assert_eq!(
        attempts[8]["verified"], false,
        "down still records the verdict"
    );

    // A reset forgets the counts: the first attempt of an id fails again.
    r.reset().await;
    assert_eq!(deliver_signed(&r, &secret, "sess_ff.1", &body).await.0, 429);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_overlapping_requests_with_the_same_id() {
    let secret = random_secret();
    let r = Receiver::start_with(&secret, &["--delay-ms", "700"]).await;
    let body = event("sess_dup", 3);
    let (a, b, c) = tokio::join!(
        deliver_signed(&r, &secret, "sess_dup.3", &body),
        deliver_signed(&r, &secret, "sess_dup.3", &body),
        deliver_signed(&r, &secret, "sess_dup.4", &body),
    );
    assert_eq!((a.0, b.0, c.0), (204, 204, 204));
    // The same id again, once the others were answered: not concurrent.
    assert_eq!(
        deliver_signed(&r, &secret, "sess_dup.3", &body).await.0,
        204
    );

    let attempts = r.wait_for(|a| a.len() == 4).await;
    let flagged = |id: &str| -> Vec<bool> {
        attempts
            .iter()
            .filter(|a| a["msgId"] == id)
            .map(|a| a["concurrent"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(flagged("sess_dup.3"), [true, true, false], "{attempts:#?}");
    assert_eq!(flagged("sess_dup.4"), [false]);
    for a in &attempts {
        let waited = a["answeredAt"].as_f64().unwrap() - a["receivedAt"].as_f64().unwrap();
        assert!(waited >= 0.69, "answered after the delay: {a}");
    }

    // While a request waits it shows among the in-flight attempts only.
    r.reset().await;
    let slow = {
        let (url, secret, body) = (r.url.clone(), secret.clone(), body.clone());
        tokio::spawn(async move {
            let ts = now();
            reqwest::Client::new()
                .post(format!("{url}/hooks"))
                .header("webhook-id", "sess_dup.5")
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", sign(&secret, "sess_dup.5", ts, &body))
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let deadline = std::time::Instant::now() + support::PATIENCE;
    while r.attempts_in_flight().await.is_empty() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(r.attempts().await.is_empty(), "not answered yet");
    assert_eq!(r.attempts_in_flight().await[0]["status"], Value::Null);
    assert_eq!(slow.await.unwrap(), 204);
    assert_eq!(r.attempts().await.len(), 1);
    r.stop().await;
}
