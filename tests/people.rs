//! Several people on one session: keys that name their user (`TENANT/USER:KEY`), each
//! session's owner (`GET /sessions?owner=me`), the author of every prompt in `turn_started`
//! and in what `/acp` clients are told, who answered each request, and `whoAnswers` (the
//! session's, or the tenant's default from the config file) refusing everyone else with 403
//! while the request stays pending for the right person. On both stores; and the same with two
//! users of one tenant signed in with an OpenID Connect provider (ignored by plain `cargo test`,
//! as `oidc.rs`'s tests are).

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::acp::AcpClient;
use support::*;

both_backends!(
    authors_and_owners_are_recorded_and_shown,
    who_answers_refuses_everyone_else,
    watchers_appear_and_leave,
);

const ANN: &str = "ann-key-0123456789ab";
const CY: &str = "cy-key-0123456789abc";
/// Tenant acme's key naming no user.
const ACME: &str = "acme-key-0123456789a";
const DEE: &str = "dee-key-0123456789ab";
const GLOBEX: &str = "globex-key-012345678";

/// Ann and Cy of acme, acme's own key, Dee of globex and globex's own key; globex's sessions
/// are answered by their owner unless they say otherwise (its table in the config file).
fn people(dir: &std::path::Path) -> Options {
    let file = dir.join("tenants.toml");
    std::fs::write(&file, "[tenants.globex]\nwho-answers = \"owner\"\n").unwrap();
    Options::default().args(&[
        "--api-key",
        &format!("acme/ann:{ANN}"),
        "--api-key",
        &format!("acme/cy:{CY}"),
        "--api-key",
        &format!("acme:{ACME}"),
        "--api-key",
        &format!("globex/dee:{DEE}"),
        "--api-key",
        &format!("globex:{GLOBEX}"),
        "--config",
        file.to_str().unwrap(),
    ])
}

async fn create(gw: &Gateway, key: &str, body: Value) -> Value {
    let path = "/sessions";
    (gw.with_key(Some(key)))
        .send_expecting(Method::POST, path, Some(body), 201)
        .await
}

/// The session ids `key` lists with `query`.
async fn listed(gw: &Gateway, key: &str, query: &str) -> Vec<String> {
    let path = format!("/sessions?{query}");
    let page = (gw.with_key(Some(key)))
        .send_expecting(Method::GET, &path, None, 200)
        .await;
    let ids = page["sessions"].as_array().unwrap().iter();
    ids.map(|s| s["sessionId"].as_str().unwrap().to_owned())
        .collect()
}

/// The id of the session's first pending request of `kind` (`permissions`, `elicitations`),
/// waited for (up to [`PATIENCE`]).
async fn pending(gw: &Gateway, key: &str, id: &str, kind: &str) -> String {
    let path = format!("/sessions/{id}/{kind}");
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let list = gw.with_key(Some(key)).get(&path).await.1;
        if let Some(request) = list[0]["requestId"].as_str() {
            return request.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing pending: {list}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `key`'s answer to the session's permission request: its status.
async fn allow(gw: &Gateway, key: &str, id: &str, request: &str) -> (u16, Value) {
    let path = format!("/sessions/{id}/permissions/{request}");
    (gw.with_key(Some(key)))
        .post(&path, json!({"optionId": "allow"}))
        .await
}

/// Waits until the session's turn has ended.
async fn idle(gw: &Gateway, key: &str, id: &str) {
    let path = format!("/sessions/{id}/status");
    gw.wait_until(|g| {
        let path = path.clone();
        async move { g.with_key(Some(key)).get(&path).await.1["activity"] == "idle" }
    })
    .await;
}

async fn authors_and_owners_are_recorded_and_shown(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let w = World::start(backend, people(dir.path())).await;
    let gw = w.gw();
    let anns = create(gw, ANN, json!({"cwd": "/tmp"})).await;
    assert_eq!(anns["owner"], json!({"tenant": "acme", "user": "ann"}));
    let anns = anns["sessionId"].as_str().unwrap().to_owned();
    let cys = create(gw, CY, json!({"cwd": "/tmp"})).await;
    let cys = cys["sessionId"].as_str().unwrap().to_owned();
    let acmes = create(gw, ACME, json!({"cwd": "/tmp"})).await;
    assert!(acmes.get("owner").is_none(), "{acmes}");

    // One's own sessions, another's, and no "me" for a key naming no user.
    assert_eq!(listed(gw, ANN, "owner=me").await, vec![anns.clone()]);
    assert_eq!(listed(gw, CY, "owner=me").await, vec![cys.clone()]);
    assert_eq!(listed(gw, CY, "owner=ann").await, vec![anns.clone()]);
    assert_eq!(listed(gw, ACME, "").await.len(), 3);
    let (status, problem) = gw.with_key(Some(ACME)).get("/sessions?owner=me").await;
    assert_eq!(status, 400, "{problem}");
    assert!(listed(gw, GLOBEX, "owner=ann").await.is_empty());
    let page = (gw.with_key(Some(ACME)))
        .send_expecting(Method::GET, "/sessions", None, 200)
        .await;
    let shown = page["sessions"].as_array().unwrap().iter();
    let owners: Vec<&Value> = shown.map(|s| &s["owner"]["user"]).collect();
    assert!(owners.contains(&&json!("ann")) && owners.contains(&&json!("cy")));

    // An ACP client of Ann's follows her session; Cy prompts it over REST.
    let mut acp = AcpClient::start(&gw.base, Some(ANN), false).await;
    let resumed = json!({"sessionId": anns, "cwd": "/tmp"});
    acp.call("session/resume", resumed).await.unwrap();
    let (status, _) = (gw.with_key(Some(CY)))
        .post(&format!("/sessions/{anns}/prompt"), json!({"text": "hi"}))
        .await;
    assert_eq!(status, 200);
    let notes = acp.notes_until("agent_message_chunk").await;
    let user = &notes[0].1;
    assert_eq!(user["update"]["sessionUpdate"], "user_message_chunk");
    assert_eq!(user["_meta"]["author"]["user"], "cy", "{notes:?}");
    acp.close().await;

    // Ann asks; Cy allows. Ann asks for input; Cy declines.
    gw.with_key(Some(ANN))
        .prompt_async(&anns, "/permission please")
        .await;
    let request = pending(gw, ANN, &anns, "permissions").await;
    assert_eq!(allow(gw, CY, &anns, &request).await.0, 200);
    idle(gw, ANN, &anns).await;
    gw.with_key(Some(ANN)).prompt_async(&anns, "/elicit").await;
    let request = pending(gw, ANN, &anns, "elicitations").await;
    let path = format!("/sessions/{anns}/elicitations/{request}");
    let (status, _) = (gw.with_key(Some(CY)))
        .post(&path, json!({"action": "decline"}))
        .await;
    assert_eq!(status, 200);
    idle(gw, ANN, &anns).await;

    let started = gw.with_key(Some(ANN)).logged(&anns, "turn_started").await;
    let authors: Vec<&Value> = started.iter().map(|t| &t["author"]["user"]).collect();
    assert_eq!(authors, [&json!("cy"), &json!("ann"), &json!("ann")]);
    assert_eq!(started[0]["author"]["tenant"], "acme");
    let allowed = gw
        .with_key(Some(ANN))
        .logged(&anns, "permission_resolved")
        .await;
    assert_eq!(allowed[0]["reason"], "answered");
    assert_eq!(
        allowed[0]["answeredBy"],
        json!({"tenant": "acme", "user": "cy"})
    );
    let declined = gw
        .with_key(Some(ANN))
        .logged(&anns, "elicitation_resolved")
        .await;
    assert_eq!(declined[0]["answeredBy"]["user"], "cy");
    // A prompt by a key naming no user is the tenant's.
    (gw.with_key(Some(ACME)))
        .send_expecting(
            Method::POST,
            &format!("/sessions/{cys}/prompt"),
            Some(json!({"text": "x"})),
            200,
        )
        .await;
    let started = gw.with_key(Some(CY)).logged(&cys, "turn_started").await;
    assert_eq!(started[0]["author"], json!({"tenant": "acme"}));
    w.finish().await;
}

async fn who_answers_refuses_everyone_else(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let w = World::start(backend, people(dir.path())).await;
    let gw = w.gw();
    let made = create(gw, ANN, json!({"cwd": "/tmp", "whoAnswers": "author"})).await;
    assert_eq!(made["whoAnswers"], "author");
    let id = made["sessionId"].as_str().unwrap().to_owned();

    // `author`: Cy's turn asks; Ann (the owner) is refused and the request stays pending.
    gw.with_key(Some(CY))
        .prompt_async(&id, "/permission please")
        .await;
    let request = pending(gw, CY, &id, "permissions").await;
    let (status, problem) = allow(gw, ANN, &id, &request).await;
    assert_eq!(status, 403, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("author"),
        "{problem}"
    );
    assert_eq!(pending(gw, ANN, &id, "permissions").await, request);
    assert_eq!(allow(gw, CY, &id, &request).await.0, 200);
    idle(gw, CY, &id).await;

    // Only the owner changes who answers.
    let path = format!("/sessions/{id}");
    let body = Some(json!({"whoAnswers": "owner"}));
    let patch = |key| gw.with_key(Some(key));
    let refused = patch(CY).send(Method::PATCH, &path, body.clone()).await;
    assert_eq!(refused.0, 403, "{}", refused.1);
    let changed = (patch(ANN))
        .send_expecting(Method::PATCH, &path, body, 200)
        .await;
    assert_eq!(changed["whoAnswers"], "owner");
    assert_eq!(changed["owner"]["user"], "ann", "the title and owner stay");

    // `owner`: Cy's turn asks, Cy is refused, Ann answers.
    gw.with_key(Some(CY))
        .prompt_async(&id, "/permission again")
        .await;
    let request = pending(gw, CY, &id, "permissions").await;
    assert_eq!(allow(gw, CY, &id, &request).await.0, 403);
    assert_eq!(allow(gw, ANN, &id, &request).await.0, 200);
    idle(gw, CY, &id).await;
    let resolved = gw
        .with_key(Some(ANN))
        .logged(&id, "permission_resolved")
        .await;
    let by: Vec<&Value> = resolved.iter().map(|r| &r["answeredBy"]["user"]).collect();
    assert_eq!(by, [&json!("cy"), &json!("ann")]);

    // Globex's default (its table): the owner, Dee; globex's own key is refused.
    let made = create(gw, DEE, json!({"cwd": "/tmp"})).await;
    assert!(made.get("whoAnswers").is_none(), "{made}");
    let id = made["sessionId"].as_str().unwrap().to_owned();
    gw.with_key(Some(GLOBEX))
        .prompt_async(&id, "/permission please")
        .await;
    let request = pending(gw, GLOBEX, &id, "permissions").await;
    assert_eq!(allow(gw, GLOBEX, &id, &request).await.0, 403);
    assert_eq!(allow(gw, DEE, &id, &request).await.0, 200);
    idle(gw, DEE, &id).await;
    w.finish().await;
}

/// The users watching the session (`GET /sessions/{id}/watchers`, read with acme's key), each
/// with their number of streams.
async fn watching(gw: &Gateway, id: &str) -> Vec<(String, u64)> {
    let path = format!("/sessions/{id}/watchers");
    let list = (gw.with_key(Some(ACME)))
        .send_expecting(Method::GET, &path, None, 200)
        .await;
    let people = list.as_array().unwrap().iter();
    people
        .map(|p| {
            let user = p["user"].as_str().unwrap().to_owned();
            (user, p["streams"].as_u64().unwrap())
        })
        .collect()
}

/// Waits until the session's watchers are `want`.
async fn watched_by(gw: &Gateway, id: &str, want: &[(&str, u64)]) {
    let want: Vec<(String, u64)> = want.iter().map(|(u, n)| (u.to_string(), *n)).collect();
    let want = &want;
    gw.wait_until(|g| async move { &watching(g, id).await == want })
        .await;
}

/// Ann's two streams and Cy's one are listed as two watchers; each leaving is seen, and each
/// first arrival and last departure is a `watchers_changed` on the lifecycle stream.
async fn watchers_appear_and_leave(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let w = World::start(backend, people(dir.path())).await;
    let gw = w.gw();
    let id = create(gw, ANN, json!({"cwd": "/tmp"})).await;
    let id = id["sessionId"].as_str().unwrap().to_owned();
    let url = |path: String, key: &str| gw.url(&format!("{path}?access_token={key}"));
    let mut lifecycle = Sse::open(&gw.http, &url("/events".into(), ACME), None).await;
    let events = format!("/sessions/{id}/events");
    let stream = async |key| Sse::open(&gw.http, &url(events.clone(), key), None).await;
    assert!(watching(gw, &id).await.is_empty());

    let ann = stream(ANN).await;
    let cy = stream(CY).await;
    let ann_again = stream(ANN).await;
    watched_by(gw, &id, &[("ann", 2), ("cy", 1)]).await;
    drop(cy);
    watched_by(gw, &id, &[("ann", 2)]).await;
    drop(ann);
    watched_by(gw, &id, &[("ann", 1)]).await;
    drop(ann_again);
    watched_by(gw, &id, &[]).await;

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let changed = lifecycle.until("watchers_changed").await.pop().unwrap();
        assert_eq!(changed.data["sessionId"], id.as_str());
        let users = changed.data["watchers"].as_array().unwrap().iter();
        seen.push(
            users
                .map(|p| p["user"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(seen, [vec!["ann"], vec!["ann", "cy"], vec!["ann"], vec![]]);
    w.finish().await;
}

/// Two people of tenant acme with tokens of the provider (`oidc.rs`'s), each naming its `sub`
/// and shown by its `name` or `email`: the owner and authors are theirs, and under
/// `whoAnswers: owner` only the owner's token answers. A `sub` with a control character is no
/// one's: 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs `npm ci` in tests/browser, then: cargo test --test integration people:: -- --ignored"]
async fn two_token_users_of_one_tenant() {
    let idp = crate::oidc::Provider::start().await;
    let w = World::start(Backend::Sqlite, idp.options()).await;
    let gw = w.gw();
    let ann = idp
        .forge(json!({"claims": {"sub": "u-ann", "name": "Ann Archer"}}))
        .await;
    let cy = idp
        .forge(json!({"claims": {"sub": "u-cy", "email": "cy@acme.test"}}))
        .await;
    let made = create(gw, &ann, json!({"cwd": "/tmp", "whoAnswers": "owner"})).await;
    let shown = json!({"tenant": "acme", "user": "u-ann", "name": "Ann Archer"});
    assert_eq!(made["owner"], shown);
    let id = made["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(listed(gw, &ann, "owner=me").await, vec![id.clone()]);
    assert!(listed(gw, &cy, "owner=me").await.is_empty());

    gw.with_key(Some(&cy))
        .prompt_async(&id, "/permission please")
        .await;
    let request = pending(gw, &cy, &id, "permissions").await;
    assert_eq!(allow(gw, &cy, &id, &request).await.0, 403);
    assert_eq!(allow(gw, &ann, &id, &request).await.0, 200);
    idle(gw, &ann, &id).await;
    let started = gw.with_key(Some(&cy)).logged(&id, "turn_started").await;
    let cys = json!({"tenant": "acme", "user": "u-cy", "name": "cy@acme.test"});
    assert_eq!(started[0]["author"], cys);
    let resolved = gw
        .with_key(Some(&cy))
        .logged(&id, "permission_resolved")
        .await;
    assert_eq!(resolved[0]["answeredBy"], shown);

    let nobody = idp.forge(json!({"claims": {"sub": "u-\u{7}"}})).await;
    let (status, problem) = gw.with_key(Some(&nobody)).get("/sessions").await;
    assert_eq!(status, 401, "{problem}");
    w.finish().await;
}

/// A stream open on one replica is a watcher on every replica; when that replica is killed,
/// its streams stop counting once its lease has run out, and the same person's next stream,
/// on another replica, is their first again (a `watchers_changed` there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn watchers_are_seen_across_replicas() {
    let (w, mut b, c) = support::cluster::three_replicas(support::cluster::beating()).await;
    let id = b.create("/tmp").await;
    let _stream = b.events(&id, None).await;
    let path = format!("/sessions/{id}/watchers");
    let path = path.as_str();
    let count = async |g: &Gateway| {
        let r = g.get(path).await;
        if r.status() != 200 {
            return None;
        }
        Some(r.json::<Value>().await.unwrap().as_array().unwrap().len())
    };
    c.wait_until(|g| async move { count(g).await == Some(1) })
        .await;
    let seen = c.json(path).await;
    assert_eq!(
        seen[0],
        json!({"tenant": "default", "streams": 1, "since": seen[0]["since"]})
    );
    let live = async |g: &Gateway| {
        let replicas = g.json("/agent").await["replicas"].clone();
        let replicas = replicas.as_array().unwrap().iter();
        replicas.filter(|r| r["live"] == true).count()
    };
    let before = live(&c).await;
    b.kill().await;
    // Nobody lists the watchers meanwhile (a listing removes a dead replica's rows).
    c.wait_until(|g| async move { live(g).await == before - 1 })
        .await;
    let mut lifecycle = c.sse("/events", None).await;
    let _again = c.events(&id, None).await;
    let changed = lifecycle.until("watchers_changed").await.pop().unwrap();
    assert_eq!(changed.data["sessionId"], id.as_str());
    let watchers = changed.data["watchers"].as_array().unwrap();
    assert_eq!(watchers.len(), 1, "{changed:?}");
    assert_eq!(watchers[0]["streams"], 1);
    drop(_again);
    c.wait_until(|g| async move { count(g).await == Some(0) })
        .await;
    c.stop().await;
    w.finish().await;
}
