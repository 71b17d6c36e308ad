//! Sign-in with an OpenID Connect provider: the npm `oidc-provider` (tests/browser/oidc-provider.mjs)
//! started on a loopback port issues real JWT access tokens, and the gateway takes them beside
//! its API keys: tenants and admins from their claims, every kind of bad token refused with
//! its reason, a key rotation at the provider followed, what a token opened ended when it
//! expires, and two tenants kept apart under concurrent load.
//! Ignored by plain `cargo test` because it needs `npm ci` in `tests/browser`; `.ci/run` runs
//! it with `--ignored`.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::acp::AcpClient;
use support::*;
use tokio::io::{AsyncBufReadExt as _, BufReader};

const AUDIENCE: &str = "urn:acp-gateway";
const BOB: &str = "bob-key-0123456789ab";

/// The provider's process, ended when dropped.
pub(crate) struct Provider {
    issuer: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Provider {
    pub(crate) async fn start() -> Provider {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser");
        let mut child = tokio::process::Command::new("node")
            .arg("oidc-provider.mjs")
            .current_dir(dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (is Node.js installed, and `npm ci` run in tests/browser?)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("the provider starts in time")
            .unwrap()
            .expect("the provider prints where it listens");
        // Read on: a closed pipe would end the provider at its next line.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let started: Value = serde_json::from_str(&first).unwrap();
        Provider {
            issuer: started["issuer"].as_str().unwrap().to_owned(),
            http: reqwest::Client::new(),
            _child: child,
        }
    }

    /// An access token of `client` (client credentials) for `resource`.
    async fn token_for(&self, client: &str, resource: &str) -> String {
        let body = format!("grant_type=client_credentials&scope=api&resource={resource}");
        let r = self
            .http
            .post(format!("{}/token", self.issuer))
            .basic_auth(client, Some("secret"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["access_token"].as_str().expect("a token").to_owned()
    }

    /// An access token of `client` for the gateway.
    async fn token(&self, client: &str) -> String {
        self.token_for(client, AUDIENCE).await
    }

    /// A token no real provider issues (see the script).
    pub(crate) async fn forge(&self, how: Value) -> String {
        let r = self.test("forge", how).await;
        r["token"].as_str().unwrap().to_owned()
    }

    async fn test(&self, what: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}/test/{what}", self.issuer))
            .json(&body)
            .send()
            .await
            .unwrap();
        r.json().await.unwrap()
    }

    /// The gateway's options for this provider (no clock skew: expiry is exact).
    pub(crate) fn options(&self) -> Options {
        Options::default().args(&[
            "--oidc-issuer",
            &self.issuer,
            "--oidc-audience",
            AUDIENCE,
            "--oidc-admin-role",
            "admin",
            "--oidc-clock-skew",
            "0",
            "--api-key",
            &format!("bob:{BOB}"),
        ])
    }
}

/// The status and problem detail of `GET /sessions` with `token`, and its challenge.
async fn refused(gw: &Gateway, token: &str) -> (u16, String, String) {
    let r = gw
        .http
        .get(gw.url("/sessions"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body: Value = r.json().await.unwrap_or_default();
    (
        status,
        body["detail"].as_str().unwrap_or("").to_owned(),
        challenge,
    )
}

/// How many times the gateway fetched the provider's keys, read with the admin's `token`.
async fn key_fetches(gw: &Gateway, token: &str) -> f64 {
    let (_, text) = gw.with_key(Some(token)).get("/metrics").await;
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("acp_gateway_oidc_key_fetches_total ")?
                .parse()
                .ok()
        })
        .expect("the fetches are counted")
}

/// The ids of the sessions `token` lists.
async fn listed(gw: &Gateway, token: &str) -> Vec<String> {
    let (status, body) = gw.with_key(Some(token)).get("/sessions").await;
    assert_eq!(status, 200, "{body}");
    body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_owned())
        .collect()
}

/// Real tokens identify their tenant or make an admin, beside API keys; every bad token is
/// refused with 401, `WWW-Authenticate: Bearer error="invalid_token"` and its reason; a token
/// naming no tenant is 403; after a key rotation at the provider, a token of the new key is
/// taken (the keys fetched again once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs `npm ci` in tests/browser, then: cargo test --test integration oidc:: -- --ignored"]
async fn provider_tokens_identify_their_callers() {
    let idp = Provider::start().await;
    let w = World::start(Backend::Sqlite, idp.options()).await;
    let gw = w.gw();
    let acme = idp.token("acme").await;
    let globex = idp.token("globex").await;
    let ops = idp.token("ops").await;

    // Tenants from the claim: each sees its own sessions, the admin every one, an API key
    // still works beside the tokens.
    let (status, created) = gw
        .with_key(Some(&acme))
        .post("/sessions", json!({"cwd": "/tmp"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let acmes = created["sessionId"].as_str().unwrap().to_owned();
    let (status, created) = gw
        .with_key(Some(&globex))
        .post("/sessions", json!({"cwd": "/tmp"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let globexs = created["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(listed(gw, &acme).await, vec![acmes.clone()]);
    assert_eq!(listed(gw, &globex).await, vec![globexs.clone()]);
    let all = listed(gw, &ops).await;
    assert!(all.contains(&acmes) && all.contains(&globexs), "{all:?}");
    assert!(listed(gw, BOB).await.is_empty());
    let (status, _) = gw
        .with_key(Some(&globex))
        .get(&format!("/sessions/{acmes}"))
        .await;
    assert_eq!(status, 404, "another tenant's session does not exist");
    let (status, answer) = gw
        .with_key(Some(&acme))
        .post(&format!("/sessions/{acmes}/prompt"), json!({"text": "hi"}))
        .await;
    assert_eq!(status, 200, "{answer}");

    // Refused, each with its reason.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let cases = [
        (
            "another audience",
            idp.token_for("acme", "urn:other").await,
            "aud",
        ),
        (
            "another issuer",
            idp.forge(json!({"claims": {"iss": "http://127.0.0.1:1"}}))
                .await,
            "iss",
        ),
        (
            "expired",
            idp.forge(json!({"claims": {"exp": now - 5}})).await,
            "expired",
        ),
        (
            "not valid yet",
            idp.forge(json!({"claims": {"nbf": now + 300}})).await,
            "nbf",
        ),
        (
            "alg none",
            idp.forge(json!({"sign": "none"})).await,
            "not a signed JWT",
        ),
        (
            "HMAC with the public key",
            idp.forge(json!({"sign": "hmac-public"})).await,
            "not its key's",
        ),
        (
            "an unknown key",
            idp.forge(json!({"header": {"kid": "nobody-knows"}})).await,
            "not one of the provider's signing keys",
        ),
        (
            "a bad signature",
            {
                let t = idp.token("acme").await;
                let (head, sig) = t.rsplit_once('.').unwrap();
                let flipped = if sig.starts_with('A') { "B" } else { "A" };
                format!("{head}.{flipped}{}", &sig[1..])
            },
            "signature",
        ),
    ];
    for (name, token, reason) in cases {
        let (status, detail, challenge) = refused(gw, &token).await;
        assert_eq!(status, 401, "{name}: {detail}");
        assert!(detail.contains(reason), "{name}: {detail:?}");
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{name}: {challenge}"
        );
    }
    // The forging itself is sound: the same key, issuer and audience make a token taken.
    let forged = idp.forge(json!({})).await;
    assert_eq!(listed(gw, &forged).await, vec![acmes.clone()]);
    let (status, detail, _) = refused(gw, &idp.token("nobody").await).await;
    assert_eq!(status, 403, "{detail}");
    assert!(detail.contains("no \"tenant\" claim"), "{detail}");
    // A token whose tenant claim names the gateway's own tenant is refused: it would see the
    // admin's sessions.
    for reserved in ["admin", "default"] {
        let token = idp.forge(json!({"claims": {"tenant": reserved}})).await;
        let (status, detail, _) = refused(gw, &token).await;
        assert_eq!(status, 403, "{reserved}: {detail}");
        assert!(detail.contains("reserved"), "{reserved}: {detail}");
    }
    let (status, _, challenge) = refused(gw, "not-a-key-nor-a-token").await;
    assert_eq!((status, challenge.as_str()), (401, "Bearer"));

    // The provider rotates its key: a token of the new key is taken once the keys are
    // fetched again; the old key's tokens, still listed, still work.
    let fetches = key_fetches(gw, &ops).await;
    let rotated = idp.test("rotate", json!({})).await;
    assert_eq!(rotated["kid"], "k2");
    let fresh = idp.token("acme").await;
    assert_eq!(listed(gw, &fresh).await, vec![acmes.clone()]);
    assert_eq!(listed(gw, &acme).await, vec![acmes.clone()]);
    assert_eq!(key_fetches(gw, &ops).await, fetches + 1.0);

    // The provider goes away: a token of a key not seen yet cannot be checked (503, try again
    // later); those of known keys still can.
    let unknown = idp.forge(json!({"header": {"kid": "k9"}})).await;
    drop(idp);
    let (status, detail, _) = refused(gw, &unknown).await;
    assert_eq!(status, 503, "{detail}");
    assert!(detail.contains("cannot be fetched"), "{detail}");
    assert_eq!(listed(gw, &fresh).await, vec![acmes.clone()]);
    w.finish().await;
}

/// What a token opened ends when it expires: its lifecycle stream, its session's event
/// stream and its `/acp` connections (HTTP/SSE and WebSocket); the token itself is refused from then on, and the same
/// client carries on with a fresh token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs `npm ci` in tests/browser, then: cargo test --test integration oidc:: -- --ignored"]
async fn what_a_token_opened_ends_when_it_expires() {
    let idp = Provider::start().await;
    let w = World::start(Backend::Sqlite, idp.options()).await;
    let gw = w.gw();
    let lasting = idp.token("acme").await;
    let id = {
        let (status, created) = gw
            .with_key(Some(&lasting))
            .post("/sessions", json!({"cwd": "/tmp"}))
            .await;
        assert_eq!(status, 201, "{created}");
        created["sessionId"].as_str().unwrap().to_owned()
    };
    // Tokens of a few seconds (the provider's BRIEF_TTL).
    let brief = idp.token("acme-brief").await;
    let opened = Instant::now();
    let open = |path: String, token: String| {
        let http = gw.http.clone();
        let url = gw.url(&path);
        async move {
            let r = Sse::request(&http, &url, None)
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            Sse::from_response(r)
        }
    };
    let mut lifecycle = open("/events".into(), brief.clone()).await;
    let mut events = open(format!("/sessions/{id}/events"), brief.clone()).await;
    let mut lasting_stream = open("/events".into(), lasting.clone()).await;
    let acp = AcpClient::start(&gw.base, Some(&brief), false).await;
    let acp_ws = AcpClient::start(&gw.base, Some(&brief), true).await;
    for client in [&acp, &acp_ws] {
        assert!(client.call("session/list", json!({})).await.is_ok());
    }

    for (name, sse) in [("lifecycle", &mut lifecycle), ("events", &mut events)] {
        let ended =
            tokio::time::timeout(PATIENCE, async { while sse.next().await.is_some() {} }).await;
        assert!(ended.is_ok(), "the {name} stream ends");
    }
    let lived = opened.elapsed();
    assert!(
        lived >= Duration::from_secs(2),
        "the streams lived until the token expired, not less: {lived:?}"
    );
    for (name, client) in [("HTTP/SSE", &acp), ("WebSocket", &acp_ws)] {
        let listed = client.call("session/list", json!({})).await;
        assert!(
            listed.is_err(),
            "/acp over {name} with an expired token: {listed:?}"
        );
    }
    let (status, detail, _) = refused(gw, &brief).await;
    assert_eq!(status, 401);
    assert!(detail.contains("expired"), "{detail}");

    // The stream of a lasting token goes on: it sees a session created now (after whatever
    // else the lifecycle log got meanwhile, such as the list sync's session_updated).
    let (status, created) = gw
        .with_key(Some(&lasting))
        .post("/sessions", json!({"cwd": "/tmp"}))
        .await;
    assert_eq!(status, 201);
    let seen = tokio::time::timeout(PATIENCE, lasting_stream.until("session_created"))
        .await
        .unwrap();
    assert_eq!(seen.last().unwrap().data["sessionId"], created["sessionId"]);
    // A fresh token reopens what ended.
    let mut again = open(format!("/sessions/{id}/events"), idp.token("acme").await).await;
    let (status, _) = gw
        .with_key(Some(&lasting))
        .post(&format!("/sessions/{id}/prompt"), json!({"text": "hi"}))
        .await;
    assert_eq!(status, 200);
    let turn = tokio::time::timeout(PATIENCE, again.until("turn_ended"))
        .await
        .unwrap();
    assert!(!turn.is_empty());
    acp.close().await;
    acp_ws.close().await;
    w.finish().await;
}

/// Two tenants' clients at once, each with its own real token: every client creates and
/// prompts sessions concurrently, and each tenant lists exactly its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs `npm ci` in tests/browser, then: cargo test --test integration oidc:: -- --ignored"]
async fn two_tenants_at_once_stay_apart() {
    let idp = Provider::start().await;
    let w = World::start(Backend::Sqlite, idp.options().pool(2)).await;
    let gw = w.gw();
    const CLIENTS: usize = 8;
    const EACH: usize = 3;
    let mut tokens = Vec::new();
    for i in 0..CLIENTS {
        tokens.push(idp.token(if i % 2 == 0 { "acme" } else { "globex" }).await);
    }
    let runs = tokens.iter().map(|token| async move {
        let mut mine = Vec::new();
        for _ in 0..EACH {
            let (status, created) = gw
                .with_key(Some(token))
                .post("/sessions", json!({"cwd": "/tmp"}))
                .await;
            assert_eq!(status, 201, "{created}");
            let id = created["sessionId"].as_str().unwrap().to_owned();
            let (status, answer) = gw
                .with_key(Some(token))
                .post(&format!("/sessions/{id}/prompt"), json!({"text": "hi"}))
                .await;
            assert_eq!(status, 200, "{answer}");
            mine.push(id);
        }
        mine
    });
    let made = futures::future::join_all(runs).await;
    for tenant in [0, 1] {
        let mut expected: Vec<String> = made
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == tenant)
            .flat_map(|(_, ids)| ids.clone())
            .collect();
        expected.sort();
        let mut seen = listed(gw, &tokens[tenant]).await;
        seen.sort();
        assert_eq!(seen, expected, "tenant {tenant} lists exactly its own");
        for other in made.iter().skip(1 - tenant).step_by(2).flatten() {
            let (status, _) = gw
                .with_key(Some(&tokens[tenant]))
                .get(&format!("/sessions/{other}"))
                .await;
            assert_eq!(status, 404);
        }
    }
    w.finish().await;
}

/// The console signs in with the provider (authorization code with PKCE, in Chromium through
/// the provider's own sign-in pages): the login names the tenant, the console works with the
/// token it gets, refreshes it before it expires, and goes on working past its first token's
/// life. Needs Debian's chromium too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration oidc:: -- --ignored"]
async fn the_console_signs_in_with_the_provider() {
    let idp = Provider::start().await;
    let opts = idp.options().args(&["--oidc-console-client-id", "console"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    idp.test("console", json!({"redirectUri": gw.url("/")}))
        .await;
    let (status, sign_in) = gw.with_key(None).get("/console/sign-in").await;
    assert_eq!(status, 200);
    assert_eq!(sign_in["oidc"]["clientId"], "console", "{sign_in}");
    assert_eq!(sign_in["oidc"]["resource"], AUDIENCE);

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser");
    let out = tokio::time::timeout(
        PATIENCE * 2,
        tokio::process::Command::new("node")
            .arg("console-oidc.mjs")
            .current_dir(dir)
            .env("GATEWAY_URL", gw.url(""))
            .env("LOGIN", "acme")
            .env("CONSOLE_TTL", "10")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser run ends in time")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            panic!(
                "no report: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(report["error"].is_null(), "{report:#}");
    assert_eq!(
        report["steps"],
        json!(["offered", "signed-in", "prompted", "past-expiry"]),
        "{report:#}"
    );
    assert!(
        report["button"].as_str().unwrap().contains("127.0.0.1"),
        "{report}"
    );
    assert_eq!(
        report["providerPage"], true,
        "the sign-in is the provider's page"
    );
    assert_eq!(report["tokenIsJwt"], true);
    assert_eq!(
        report["refreshed"], true,
        "the token was refreshed: {report}"
    );
    assert!(
        !report["backAt"].as_str().unwrap().contains("code="),
        "the code is taken off the address: {report}"
    );
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
    assert_eq!(report["pageErrors"], json!([]), "{report:#}");
    // The sessions are the tenant's the login named.
    let mut made: Vec<String> = report["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    made.sort();
    let mut acmes = listed(gw, &idp.token("acme").await).await;
    acmes.sort();
    assert_eq!(made.len(), 2);
    assert_eq!(acmes, made);
    assert!(listed(gw, &idp.token("globex").await).await.is_empty());
    w.finish().await;
}
