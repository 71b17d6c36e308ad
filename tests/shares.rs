//! Read-only links to a session, on both stores: a link opens its session without a key (its
//! JSON, its transcript, its page, and with `live` its stream as a new turn runs), is listed
//! without its token and revoked (410), expires (410), keeps only its token's hash in the
//! store, opens no other door (no other route, session, tenant or write), and is rate limited
//! per client address.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::seen::{ACME, GLOBEX, get_as, two_tenants};
use support::sse::Sse;
use support::*;

both_backends!(a_share_link_opens_one_session_read_only_and_nothing_else);

async fn a_share_link_opens_one_session_read_only_and_nothing_else(backend: Backend) {
    let w = World::start(backend, two_tenants()).await;
    let gw = w.gw();
    let acme = gw.with_key(Some(ACME));
    let made = acme
        .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
        .await;
    let id = made["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("/sessions/{id}/prompt");
    acme.send_expecting(
        Method::POST,
        &prompt,
        Some(json!({"text": "hello shared world"})),
        200,
    )
    .await;
    let other = acme
        .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
        .await;
    let other = other["sessionId"].as_str().unwrap().to_owned();

    let shares = format!("/sessions/{id}/shares");
    let link = acme
        .send_expecting(
            Method::POST,
            &shares,
            Some(json!({"expiresIn": 3600, "live": true})),
            201,
        )
        .await;
    let token = link["token"].as_str().unwrap().to_owned();
    let path = link["path"].as_str().unwrap().to_owned();
    assert_eq!(path, format!("/shared/{token}"));
    assert_eq!(
        (link["live"].clone(), link["state"].clone()),
        (json!(true), json!("active"))
    );

    // Opened without a key: the session, its transcript, its page.
    let (status, _, body) = get_as(gw, None, &path, "application/json").await;
    assert_eq!(status, 200, "{body}");
    let shared: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(shared["sessionId"], id.as_str());
    assert_eq!(shared["title"], "Echo: hello shared world");
    let history = acme
        .send_expecting(
            Method::GET,
            &format!("/sessions/{id}/history?limit=1000"),
            None,
            200,
        )
        .await;
    let (status, _, body) = get_as(
        gw,
        None,
        &format!("{path}/history?limit=1000"),
        "application/json",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), history);
    let (status, media, page) = get_as(gw, None, &path, "text/html").await;
    assert_eq!((status, media.as_str()), (200, "text/html; charset=utf-8"));
    assert!(page.contains("/console/shared.js"), "{page}");

    // Live: a new turn streams to the link.
    let last = history["events"].as_array().unwrap().last().unwrap()["seq"]
        .as_i64()
        .unwrap();
    let mut follow = Sse::open(&gw.http, &gw.url(&format!("{path}/events")), Some(last)).await;
    acme.send_expecting(Method::POST, &prompt, Some(json!({"text": "again"})), 200)
        .await;
    let turn = follow.until("turn_ended").await;
    assert_eq!(turn[0].id, last + 1);
    assert_eq!(turn[0].event, "turn_started");
    drop(follow);

    // A link opens nothing else.
    let as_key = |path: &'static str| {
        let (http, url, token) = (gw.http.clone(), gw.url(path), token.clone());
        async move {
            http.get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(as_key("/sessions").await, 401, "a token is no API key");
    let session = gw
        .http
        .get(gw.url(&format!("/sessions/{id}")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(session.status(), 401);
    for (method, tail) in [
        (Method::POST, "/history"),
        (Method::POST, "/prompt"),
        (Method::GET, "/files"),
        (Method::DELETE, ""),
    ] {
        let r = gw
            .http
            .request(method.clone(), gw.url(&format!("{path}{tail}")))
            .send()
            .await
            .unwrap();
        assert!(
            [404, 405].contains(&r.status().as_u16()),
            "{method} {path}{tail}: {}",
            r.status()
        );
    }
    let bogus = format!("/shared/shr_{}", "0".repeat(64));
    assert_eq!(get_as(gw, None, &bogus, "application/json").await.0, 404);
    let (status, _, _) = get_as(gw, None, &format!("/shared/{other}"), "application/json").await;
    assert_eq!(status, 404, "a session id is no token");
    let globex = gw.with_key(Some(GLOBEX));
    assert_eq!(
        globex.get(&shares).await.0,
        404,
        "another tenant sees no links"
    );
    assert_eq!(globex.post(&shares, json!({})).await.0, 404);

    // Listed without tokens; the store keeps only their hashes.
    let plain = acme
        .send_expecting(Method::POST, &shares, Some(json!({})), 201)
        .await;
    let listed = acme.send_expecting(Method::GET, &shares, None, 200).await;
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert!(!listed.to_string().contains("shr_"), "{listed}");
    let db = acp_gateway::store::connect(&w.db.url, "check")
        .await
        .unwrap();
    let kept = db.store.shares_of(&id).await.unwrap();
    let hashed = format!("{:x}", Sha256::digest(token.as_bytes()));
    assert!(kept.iter().any(|s| s.token_hash == hashed));
    assert!(kept.iter().all(|s| !s.token_hash.contains(&token)));
    drop(db);
    // A link without `live` shows the transcript only.
    let plain_path = plain["path"].as_str().unwrap();
    let r = gw
        .http
        .get(gw.url(&format!("{plain_path}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Revoked, and expired: 410; a stream the link opened ends.
    let url = gw.url(&format!("{path}/events"));
    let mut open_stream = Sse::open(&gw.http, &url, Some(0)).await;
    assert!(open_stream.next().await.is_some());
    let revoke = format!("{shares}/{}", link["id"].as_str().unwrap());
    assert_eq!(acme.send(Method::DELETE, &revoke, None).await.0, 204);
    let ended = async { while open_stream.next().await.is_some() {} };
    tokio::time::timeout(PATIENCE, ended)
        .await
        .expect("the revoked link's stream ends");
    for tail in ["", "/history", "/events"] {
        let (status, _, body) =
            get_as(gw, None, &format!("{path}{tail}"), "application/json").await;
        assert_eq!(status, 410, "{tail}: {body}");
    }
    let listed = acme.send_expecting(Method::GET, &shares, None, 200).await;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["state"] == "revoked"),
        "{listed}"
    );
    let brief = acme
        .send_expecting(Method::POST, &shares, Some(json!({"expiresIn": 1})), 201)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        get_as(
            gw,
            None,
            brief["path"].as_str().unwrap(),
            "application/json"
        )
        .await
        .0,
        410
    );
    assert_eq!(acme.post(&shares, json!({"expiresIn": 0})).await.0, 422);

    // Trying tokens at speed is cut short.
    let mut statuses = Vec::new();
    for _ in 0..80 {
        statuses.push(get_as(gw, None, &bogus, "application/json").await.0);
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    assert_eq!(statuses[0], 404);
}
