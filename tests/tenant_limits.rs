//! Per-tenant limits (`--tenant-max-sessions`, `--tenant-max-turns`,
//! `--tenant-prompts-per-minute`, a tenant's own in `[tenants.NAME]`): one gateway on SQLite,
//! and two replicas on one PostgreSQL database taking turns at the requests, so that each
//! limit is shown to hold across replicas: 429 with `Retry-After` and the IETF `RateLimit`
//! headers past it, another tenant untouched, the slot free again once a session closes or a
//! turn ends, exactly the quota granted to many creates at once, and one tenant's flood refused
//! while the other tenant's requests at the same time all succeed.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::*;

const ALICE: &str = "alice-key-0123456789";
const BOB: &str = "bob-key-0123456789ab";
const ADMIN: &str = "admin-key-0123456789";

/// Keys for alice, bob and an admin.
fn keyed() -> Options {
    Options::default().args(&[
        "--api-key",
        &format!("alice:{ALICE}"),
        "--api-key",
        &format!("bob:{BOB}"),
        "--admin-api-key",
        ADMIN,
    ])
}

/// Keys for alice, bob and an admin; two live sessions and one turn per tenant; bob may send
/// three prompts a minute (his own table in the config file).
fn limited(dir: &std::path::Path) -> Options {
    let file = dir.join("limits.toml");
    std::fs::write(&file, "[tenants.bob]\nprompts-per-minute = 3\n").unwrap();
    keyed().args(&[
        "--tenant-max-sessions",
        "2",
        "--tenant-max-turns",
        "1",
        "--config",
        file.to_str().unwrap(),
    ])
}

/// `method path` with `key` on `gw`: the response, whole.
async fn send(
    gw: &Gateway,
    key: &str,
    method: Method,
    path: &str,
    body: Value,
) -> reqwest::Response {
    gw.http
        .request(method, gw.url(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// `POST /sessions/{id}/prompt` with `text`.
async fn prompt(gw: &Gateway, key: &str, id: &str, text: &str) -> reqwest::Response {
    let path = format!("/sessions/{id}/prompt");
    send(gw, key, Method::POST, &path, json!({"text": text})).await
}

/// `POST /sessions/{id}/{action}`.
async fn action(gw: &Gateway, key: &str, id: &str, action: &str) -> reqwest::Response {
    let path = format!("/sessions/{id}/{action}");
    send(gw, key, Method::POST, &path, json!({})).await
}

async fn create(gw: &Gateway, key: &str) -> reqwest::Response {
    send(gw, key, Method::POST, "/sessions", json!({"cwd": "/tmp"})).await
}

async fn created(gw: &Gateway, key: &str) -> String {
    let r = create(gw, key).await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    v["sessionId"].as_str().unwrap().to_owned()
}

/// A 429 of the limit `policy` names, with its headers.
async fn assert_limited(r: reqwest::Response, policy: &str, says: &str) {
    assert_eq!(r.status(), 429, "{policy}: {says}");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["ratelimit-policy"], policy);
    let body: Value = r.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(says), "{detail}");
}

async fn limits_hold(gws: &[&Gateway]) {
    let at = |i: usize| gws[i % gws.len()];
    // Live sessions: two of alice's, on different replicas; a third refused on either.
    let s1 = created(at(0), ALICE).await;
    let s2 = created(at(1), ALICE).await;
    for i in 0..2 {
        assert_limited(
            create(at(i), ALICE).await,
            "\"sessions\";q=2;qu=\"concurrent-requests\"",
            "maximum of 2 live sessions",
        )
        .await;
    }
    let bobs = created(at(1), BOB).await;
    // Closed, a session frees its place; resumed, it takes one again.
    let r = action(at(0), ALICE, &s2, "close").await;
    assert_eq!(r.status(), 204);
    let s3 = created(at(1), ALICE).await;
    let r = action(at(0), ALICE, &s2, "resume").await;
    assert_limited(
        r,
        "\"sessions\";q=2;qu=\"concurrent-requests\"",
        "live sessions",
    )
    .await;

    // Turns: one of alice's at a time, whichever replica is asked.
    let hanging = {
        let (gw, s1) = (at(0), s1.clone());
        let (http, url) = (gw.http.clone(), gw.url(&format!("/sessions/{s1}/prompt")));
        tokio::spawn(async move {
            let r = http
                .post(url)
                .bearer_auth(ALICE)
                .json(&json!({"text": "/hang"}))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap()
        })
    };
    at(0)
        .wait_until(|g| {
            let s1 = s1.clone();
            async move {
                let r = send(
                    g,
                    ALICE,
                    Method::GET,
                    &format!("/sessions/{s1}/status"),
                    json!(null),
                )
                .await;
                r.json::<Value>().await.unwrap()["activity"] == "running"
            }
        })
        .await;
    let r = prompt(at(1), ALICE, &s3, "hi").await;
    assert_limited(
        r,
        "\"turns\";q=1;qu=\"concurrent-requests\"",
        "1 turns at once",
    )
    .await;
    let (r, bobs_first) = timed(prompt(at(1), BOB, &bobs, "hi")).await;
    assert_eq!(r.status(), 200, "bob has his own turns");
    let r = action(at(1), ALICE, &s1, "cancel").await;
    assert_eq!(r.status(), 204);
    assert_eq!(hanging.await.unwrap()["stopReason"], "cancelled");
    let r = prompt(at(1), ALICE, &s3, "hi").await;
    assert_eq!(r.status(), 200, "the ended turn's slot is free");

    // Prompts per minute: bob's own three (one sent above), counted across replicas, in
    // minutes of the clock (the gateway's, on this machine).
    let (r, span) =
        past_the_minutes_prompts(&[bobs_first], |i| prompt(at(i), BOB, &bobs, "hi")).await;
    assert_eq!(r.status(), 429, "bob's fourth prompt of a minute");
    let state = r.headers()["ratelimit"].to_str().unwrap().to_owned();
    // The seconds left of the minute the refusal was in, as the gateway reports them.
    let left = state
        .strip_prefix("\"prompts\";r=0;t=")
        .and_then(|t| t.parse::<i64>().ok())
        .unwrap_or_else(|| panic!("{state}"));
    let (from, to) = (60 - span.1.rem_euclid(60), 60 - span.0.rem_euclid(60));
    assert!(
        (from..=to).contains(&left),
        "{state}: not {from}..={to} seconds left"
    );
    assert_limited(r, "\"prompts\";q=3;w=60", "3 prompts of this minute").await;
    let r = prompt(at(1), ALICE, &s3, "hi").await;
    assert_eq!(r.status(), 200, "alice has no prompt limit");

    // Counted per tenant in /metrics (each replica's own refusals).
    let mut metrics = String::new();
    for gw in gws {
        let r = send(gw, ADMIN, Method::GET, "/metrics", json!(null)).await;
        metrics.push_str(&r.text().await.unwrap());
    }
    for (tenant, limit) in [
        ("alice", "sessions"),
        ("alice", "turns"),
        ("bob", "prompts"),
    ] {
        let labels = [format!("tenant=\"{tenant}\""), format!("limit=\"{limit}\"")];
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("acp_gateway_tenant_limited_total{")
                    && labels.iter().all(|label| l.contains(label.as_str()))),
            "{labels:?} in\n{metrics}"
        );
    }

    // Many creates at once, spread over the replicas: exactly the places left are granted.
    for id in [&s1, &s3] {
        let r = send(
            at(0),
            ALICE,
            Method::DELETE,
            &format!("/sessions/{id}"),
            json!(null),
        )
        .await;
        assert_eq!(r.status(), 204);
    }
    let creates = (0..8).map(|i| create(at(i), ALICE));
    let statuses: Vec<u16> = futures::future::join_all(creates)
        .await
        .iter()
        .map(|r| r.status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        2,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 429),
        "{statuses:?}"
    );
}

/// When a request was sent and answered: the Unix times in seconds.
type Span = (i64, i64);

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// `request`'s response, and when it was sent and answered.
async fn timed(
    request: impl std::future::Future<Output = reqwest::Response>,
) -> (reqwest::Response, Span) {
    let sent = unix_now();
    let r = request.await;
    (r, (sent, unix_now()))
}

/// Prompts of a tenant allowed three a minute, sent by `send(i)` (the i-th of a burst) until
/// one is refused, all in one minute of the clock: the refusal and when it was sent and
/// answered. `before`: when the tenant's earlier prompts were sent and answered, so that the
/// burst knows how many the minute holds already. A burst starts in a minute with room for it
/// (else in the next one) and, when the minute turns while it runs (the prompt past the limit
/// may then be answered 200, in a fresh minute), starts again: whenever it is run, the limit
/// is checked within one minute, never across two.
async fn past_the_minutes_prompts<F, Fut>(before: &[Span], send: F) -> (reqwest::Response, Span)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    let minute = |t: i64| t.div_euclid(60);
    let mut sent: Vec<Span> = before.to_vec();
    let mut bursts = 0;
    loop {
        let now = unix_now();
        let this = minute(now);
        // A prompt sent in the last minute and answered in this one counts in either.
        let unsure = sent
            .iter()
            .any(|s| minute(s.0) < this && minute(s.1) == this);
        if now.rem_euclid(60) >= 50 || unsure {
            let wait = 60 - now.rem_euclid(60) as u64;
            tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
            continue;
        }
        bursts += 1;
        assert!(
            bursts <= 3,
            "three bursts of four prompts each straddled a minute"
        );
        let counted = sent.iter().filter(|s| minute(s.0) == this).count();
        let start = sent.len();
        for i in counted..3 {
            let (r, span) = timed(send(i)).await;
            sent.push(span);
            assert_eq!(r.status(), 200, "prompt {} of 3 in a minute", i + 1);
        }
        let (r, span) = timed(send(3)).await;
        sent.push(span);
        if sent[start..]
            .iter()
            .all(|s| minute(s.0) == this && minute(s.1) == this)
        {
            return (r, span);
        }
        eprintln!("the minute turned during a burst of prompts: another burst");
    }
}

/// Alice floods the gateway with prompts, six at once, past her two turns, while bob prompts
/// at his own pace on two sessions at the same time: the flood gets 429s (and some turns run),
/// and every request of bob's succeeds.
async fn a_flood_leaves_the_other_tenant_alone(gws: &[&Gateway]) {
    let at = |i: usize| gws[i % gws.len()];
    let mut alices = Vec::new();
    for i in 0..6 {
        alices.push(created(at(i), ALICE).await);
    }
    let bobs = [created(at(0), BOB).await, created(at(1), BOB).await];
    let status = |i: usize, key: &'static str, id: String, text: &'static str| async move {
        prompt(at(i), key, &id, text).await.status().as_u16()
    };
    let flood = async {
        let mut statuses = Vec::new();
        for _ in 0..4 {
            let round = alices
                .iter()
                .enumerate()
                .map(|(i, id)| status(i, ALICE, id.clone(), "/delay 200 flood"));
            statuses.extend(futures::future::join_all(round).await);
        }
        statuses
    };
    let steady = bobs.iter().enumerate().map(|(i, id)| async move {
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(status(i, BOB, id.clone(), "/delay 50 steady").await);
        }
        statuses
    });
    let (flooded, steady) = tokio::join!(flood, futures::future::join_all(steady));
    assert!(flooded.contains(&429), "{flooded:?}");
    assert!(flooded.contains(&200), "{flooded:?}");
    assert!(
        flooded.iter().all(|s| *s == 200 || *s == 429),
        "{flooded:?}"
    );
    assert!(
        steady.iter().flatten().all(|s| *s == 200),
        "bob's requests: {steady:?}"
    );
}

/// Keys, and two turns at once per tenant (agent processes enough for both tenants' turns).
fn turns_limited() -> Options {
    keyed().pool(4).args(&["--tenant-max-turns", "2"])
}

/// Two replicas on one PostgreSQL database, each started with `opts`, once each sees the
/// other.
async fn two_replicas(opts: Options) -> (World, Gateway) {
    let w = World::start(Backend::Postgres, opts.clone()).await;
    let b = Gateway::spawn(&w.db.url, w.dir.path(), &opts).await;
    for g in [w.gw(), &b] {
        g.wait_until(|g| async move {
            let r = send(g, ADMIN, Method::GET, "/agent", json!(null)).await;
            r.json::<Value>().await.unwrap()["replicas"]
                .as_array()
                .is_some_and(|r| r.len() == 2)
        })
        .await;
    }
    (w, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_limits_on_one_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::start(Backend::Sqlite, limited(dir.path())).await;
    limits_hold(&[w.gw()]).await;
    w.finish().await;
    let w = World::start(Backend::Sqlite, turns_limited()).await;
    a_flood_leaves_the_other_tenant_alone(&[w.gw()]).await;
    w.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn tenant_limits_hold_across_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let (w, b) = two_replicas(limited(dir.path())).await;
    limits_hold(&[w.gw(), &b]).await;
    drop(b);
    w.finish().await;
    let (w, b) = two_replicas(turns_limited()).await;
    a_flood_leaves_the_other_tenant_alone(&[w.gw(), &b]).await;
    w.finish().await;
}
