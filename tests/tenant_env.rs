//! Whose key pays: a tenant's own agent environment (`[tenants.NAME.env]`, a value from the
//! gateway's environment and one from a file) reaches the agent processes of that tenant's
//! sessions — asked from inside the agent (`/env`), for new sessions, for one resumed after
//! it closed and after a restart — and never another tenant's sessions, which run on the
//! agent's own pool; the tenant's pool shows in `/agents` by its tenant, and its values are in
//! no answer and (checked by the harness when the gateway stops) no log line.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::*;

const ANN: &str = "ann-key-0123456789ab";
const BOB: &str = "bob-key-0123456789ab";
const ADMIN: &str = "admin-key-0123456789";
const PROVIDER_KEY: &str = "sk-acme-provider-0123456789";
const ACCOUNT: &str = "acct-acme-from-a-file-0123";

both_backends!(a_tenants_own_environment_reaches_only_its_agents);

/// Ann of acme, whose sessions' agents get `PROVIDER_KEY` and `ACCOUNT`; bob of globex, whose
/// get nothing of theirs.
fn tenant_env(dir: &std::path::Path) -> Options {
    let account = dir.join("account");
    std::fs::write(&account, format!("{ACCOUNT}\n")).unwrap();
    let file = dir.join("tenants.toml");
    std::fs::write(
        &file,
        format!(
            "[tenants.acme.env]\nPROVIDER_KEY = \"${{ACME_PROVIDER_KEY}}\"\nACCOUNT = {{ file = {:?} }}\n",
            account.display().to_string()
        ),
    )
    .unwrap();
    for secret in [PROVIDER_KEY, ACCOUNT] {
        support::secrets::secret(secret);
    }
    Options::default()
        .env("ACME_PROVIDER_KEY", PROVIDER_KEY)
        .args(&[
            "--api-key",
            &format!("acme/ann:{ANN}"),
            "--api-key",
            &format!("globex:{BOB}"),
            "--admin-api-key",
            ADMIN,
            "--config",
            file.to_str().unwrap(),
        ])
}

async fn created(gw: &Gateway, key: &str) -> String {
    let made = (gw.with_key(Some(key)))
        .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
        .await;
    made["sessionId"].as_str().unwrap().to_owned()
}

/// What the session's agent process has of the two variables, asked from inside it.
async fn seen(gw: &Gateway, key: &str, id: &str) -> String {
    let text = "/env PROVIDER_KEY /env ACCOUNT";
    gw.with_key(Some(key)).said(id, text).await
}

async fn a_tenants_own_environment_reaches_only_its_agents(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::start(backend, tenant_env(dir.path())).await;
    let gw = w.gw();
    let own = format!("PROVIDER_KEY={PROVIDER_KEY}ACCOUNT={ACCOUNT}");
    let none = "PROVIDER_KEY unsetACCOUNT unset";
    let mut anns = Vec::new();
    let mut bobs = Vec::new();
    for _ in 0..2 {
        anns.push(created(gw, ANN).await);
        bobs.push(created(gw, BOB).await);
    }
    for id in &anns {
        assert_eq!(seen(gw, ANN, id).await, own);
    }
    for id in &bobs {
        assert_eq!(seen(gw, BOB, id).await, none, "another tenant's session");
    }

    // Closed and resumed by its next prompt, ann's session is on acme's pool again.
    let admin = gw.with_key(Some(ADMIN));
    let close = format!("/sessions/{}/close", anns[0]);
    admin.send_expecting(Method::POST, &close, None, 204).await;
    assert_eq!(seen(gw, ANN, &anns[0]).await, own);

    // The pools: the agent's own and acme's, shown by tenant, with no value of its.
    let (_, agents) = admin.get("/agents").await;
    let shown = agents.to_string();
    assert!(!shown.contains(PROVIDER_KEY) && !shown.contains(ACCOUNT));
    let members: Vec<Value> = agents
        .as_array()
        .or_else(|| agents["agents"].as_array())
        .unwrap_or_else(|| panic!("{agents}"))
        .iter()
        .flat_map(|a| a["members"].as_array().cloned().unwrap_or_default())
        .collect();
    let tenants: Vec<Option<&str>> = members.iter().map(|m| m["tenant"].as_str()).collect();
    assert_eq!(tenants, [None, Some("acme")], "{agents}");
    let (_, agent) = admin.get("/agent").await;
    assert!(!agent.to_string().contains(PROVIDER_KEY));
    // Nor in an error.
    let bad = format!("/sessions/{}/prompt", anns[1]);
    let (status, problem) = gw
        .with_key(Some(ANN))
        .send(Method::POST, &bad, Some(json!({"text": 7})))
        .await;
    assert!(status >= 400, "{problem}");
    assert!(!problem.to_string().contains(PROVIDER_KEY));

    // After a restart, in new processes: still each tenant's own.
    w.restart().await;
    let gw = w.gw();
    assert_eq!(seen(gw, ANN, &anns[1]).await, own);
    assert_eq!(seen(gw, BOB, &bobs[1]).await, none);
    w.finish().await;
}

const LLM_KEY: &str = "sk-acme-llm-0123456789abc";

/// Acme's own LLM provider (`[tenants.acme.provider]`, its key from the gateway's environment),
/// for an agent started with `caps` (as `ECHO_AGENT_CAPS`).
fn provider(dir: &std::path::Path, caps: &str) -> Options {
    let file = dir.join("provider.toml");
    std::fs::write(
        &file,
        "[tenants.acme.provider]\nid = \"acme-llm\"\napi-type = \"anthropic\"\n\
         base-url = \"https://llm.acme.example/v1\"\n\
         headers = { authorization = \"Bearer ${ACME_LLM_KEY}\" }\n",
    )
    .unwrap();
    support::secrets::secret(LLM_KEY);
    Options::default()
        .env("ACME_LLM_KEY", LLM_KEY)
        .env("ECHO_AGENT_CAPS", caps)
        .args(&[
            "--api-key",
            &format!("acme/ann:{ANN}"),
            "--api-key",
            &format!("globex:{BOB}"),
            "--acquire-timeout",
            "1",
            "--config",
            file.to_str().unwrap(),
        ])
}

/// An agent that advertises ACP's LLM providers is told acme's with `providers/set` on acme's
/// own processes only; one that does not is never given acme's sessions (503 naming why),
/// while another tenant's go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_provider_is_set_on_its_agents_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = provider(dir.path(), "load,list,delete,resume,close,providers");
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let (ann, bob) = (created(gw, ANN).await, created(gw, BOB).await);
    let own = gw.with_key(Some(ANN)).said(&ann, "/provider").await;
    assert_eq!(
        own,
        format!("provider acme-llm https://llm.acme.example/v1 authorization=Bearer {LLM_KEY}")
    );
    let theirs = gw.with_key(Some(BOB)).said(&bob, "/provider").await;
    assert_eq!(theirs, "provider none");
    w.finish().await;

    let dir = tempfile::tempdir().unwrap();
    let w = World::start(Backend::Sqlite, provider(dir.path(), "load,list")).await;
    let gw = w.gw();
    let (status, problem) = (gw.with_key(Some(ANN)))
        .send(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})))
        .await;
    assert_eq!(status, 503, "{problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("does not advertise"), "{problem}");
    assert!(!problem.to_string().contains(LLM_KEY));
    created(gw, BOB).await;
    w.finish().await;
}
