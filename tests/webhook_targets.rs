//! Where a webhook may point: a URL whose host is an address the delivery flags refuse is 422
//! at `POST /webhooks` and `PATCH` (every IPv6 form of a refused IPv4 address too), link-local
//! and instance-metadata addresses need a flag of their own even with
//! `--webhook-allow-private`, a URL must name its host, and a URL's userinfo is never shown.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::*;

/// `POST /webhooks` for `url` (every event), asserting the answer's status; answers its body.
async fn create(gw: &Gateway, url: &str, want: u16) -> Value {
    let r = gw
        .post("/webhooks", json!({"url": url, "events": ["*"]}))
        .await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, want, "{url}: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_addresses_are_refused_when_the_webhook_is_made() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    for url in [
        "http://127.0.0.1:9000/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[2002:7f00:1::]/",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1]/",
        "http:///x",
        "http:/x",
        "http:\\\\x",
        "ftp://hooks.example/",
    ] {
        create(gw, url, 422).await;
    }
    let made = create(gw, "https://user:s3cret@hooks.example/acp?x=1", 201).await;
    assert_eq!(made["url"], "https://***@hooks.example/acp?x=1", "{made}");
    let id = made["id"].as_str().unwrap();
    for shown in [
        gw.json("/webhooks").await,
        gw.json(&format!("/webhooks/{id}")).await,
    ] {
        assert!(!shown.to_string().contains("s3cret"), "{shown}");
        assert!(!shown.to_string().contains("user"), "{shown}");
    }
    let path = format!("/webhooks/{id}");
    let refused = json!({"url": "http://[64:ff9b::a9fe:a9fe]/"});
    gw.send_expecting(Method::PATCH, &path, refused, 422).await;
    let with_token = json!({"url": "https://t0ken@hooks.example/b"});
    let patched = gw
        .send_expecting(Method::PATCH, &path, with_token, 200)
        .await;
    assert_eq!(patched["url"], "https://***@hooks.example/b", "{patched}");
    w.finish().await;

    // --webhook-allow-private opens private addresses, not the metadata endpoints.
    let opts = Options::default().arg("--webhook-allow-private");
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    for url in [
        "http://127.0.0.1:9000/",
        "http://[64:ff9b::a00:1]/",
        "http://10.0.0.1/",
    ] {
        create(gw, url, 201).await;
    }
    for url in [
        "http://169.254.169.254/latest",
        "http://[::ffff:169.254.169.254]/",
        "http://100.100.100.200/",
        "http://[fd00:ec2::254]/",
    ] {
        let problem = create(gw, url, 422).await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("--webhook-allow-link-local"), "{problem}");
    }
    w.finish().await;

    let opts = Options::default().arg("--webhook-allow-link-local");
    let w = World::start(Backend::Sqlite, opts).await;
    create(w.gw(), "http://169.254.169.254/latest", 201).await;
    create(w.gw(), "http://127.0.0.1/", 422).await;
    w.finish().await;
}
