//! What turns spend, against the echo agent with `ECHO_AGENT_COST` (a word costs 0.01 USD; a
//! token per word in and out): each turn's tokens and cost (its session's cumulative figure
//! turned into the turn's) per session and summed by tenant, session, model and day, as JSON
//! and CSV; a tenant reading only its own; the ledger kept when the session is deleted and
//! across a restart (both stores); `/metrics`' counters; and daily budgets — tokens and cost —
//! refusing a tenant's new turns with 429 while another tenant goes on, on one gateway and
//! across two replicas, each budget's 80 % and 100 % sent once to a webhook; and a turn that
//! ended while the database was down, recorded once it is back.

use crate::support;

use reqwest::Method;
use serde_json::{Value, json};
use support::webhooks::Receiver;
use support::*;

const ANN: &str = "ann-key-0123456789ab";
const BOB: &str = "bob-key-0123456789ab";
const CAROL: &str = "carol-key-0123456789";
const ADMIN: &str = "admin-key-0123456789";

both_backends!(spend_is_recorded_per_turn_and_summed);

/// Ann of acme, bob of globex, carol of initech and an admin, on an echo agent whose words
/// cost 0.01 USD each and that names its model.
fn priced() -> Options {
    Options::default()
        .env("ECHO_AGENT_COST", "0.01 USD")
        .env("ECHO_AGENT_CONTROLS", "models")
        .args(&[
            "--api-key",
            &format!("acme/ann:{ANN}"),
            "--api-key",
            &format!("globex:{BOB}"),
            "--api-key",
            &format!("initech:{CAROL}"),
            "--admin-api-key",
            ADMIN,
        ])
}

async fn created(gw: &Gateway, key: &str) -> String {
    let made = (gw.with_key(Some(key)))
        .send_expecting(Method::POST, "/sessions", Some(json!({"cwd": "/tmp"})), 201)
        .await;
    made["sessionId"].as_str().unwrap().to_owned()
}

async fn prompt(gw: &Gateway, key: &str, id: &str, text: &str) -> reqwest::Response {
    gw.http
        .post(gw.url(&format!("/sessions/{id}/prompt")))
        .bearer_auth(key)
        .json(&json!({"text": text}))
        .send()
        .await
        .unwrap()
}

async fn prompted(gw: &Gateway, key: &str, id: &str, text: &str) {
    let r = prompt(gw, key, id, text).await;
    assert_eq!(r.status(), 200, "{text}");
}

fn amount(cost: &Value) -> f64 {
    assert_eq!(cost["currency"], "USD", "{cost}");
    cost["amount"].as_f64().unwrap()
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

async fn spend_is_recorded_per_turn_and_summed(backend: Backend) {
    let mut w = World::start(backend, priced()).await;
    let gw = w.gw();
    let (ann, bob, admin) = (
        gw.with_key(Some(ANN)),
        gw.with_key(Some(BOB)),
        gw.with_key(Some(ADMIN)),
    );
    let anns = created(gw, ANN).await;
    prompted(gw, ANN, &anns, "one two three").await;
    prompted(gw, ANN, &anns, "four five").await;
    let bobs = created(gw, BOB).await;
    prompted(gw, BOB, &bobs, "six").await;

    let path = format!("/sessions/{anns}/usage");
    let usage = ann.send_expecting(Method::GET, &path, None, 200).await;
    let totals = &usage["totals"];
    assert_eq!(totals["turns"], 2, "{usage}");
    assert_eq!(
        (
            &totals["inputTokens"],
            &totals["outputTokens"],
            &totals["totalTokens"]
        ),
        (&json!(5), &json!(5), &json!(10))
    );
    assert_eq!(
        totals["cacheReadTokens"],
        Value::Null,
        "not reported: unknown"
    );
    assert!(near(amount(&totals["cost"]), 0.05), "{usage}");
    let turns = usage["turns"].as_array().unwrap();
    let costs: Vec<f64> = turns.iter().map(|t| amount(&t["cost"])).collect();
    assert!(near(costs[0], 0.03) && near(costs[1], 0.02), "{costs:?}");
    for t in turns {
        assert_eq!(
            (&t["tenant"], &t["user"], &t["model"]),
            (&json!("acme"), &json!("ann"), &json!("echo-small")),
            "{t}"
        );
    }
    assert_eq!(bob.get(&path).await.0, 404, "another tenant's session");

    // Sums: a tenant reads its own; an admin every tenant's, by any keys.
    let own = ann.send_expecting(Method::GET, "/usage", None, 200).await;
    let rows = own["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{own}");
    assert_eq!(
        (&rows[0]["tenant"], &rows[0]["totalTokens"]),
        (&json!("acme"), &json!(10))
    );
    assert_eq!(ann.get("/usage?tenant=globex").await.0, 403);
    let all = admin
        .send_expecting(Method::GET, "/usage?groupBy=tenant", None, 200)
        .await;
    let tenants: Vec<(&str, i64)> = (all["rows"].as_array().unwrap().iter())
        .map(|r| (r["tenant"].as_str().unwrap(), r["turns"].as_i64().unwrap()))
        .collect();
    assert_eq!(tenants, [("acme", 2), ("globex", 1)]);
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let by = "/usage?groupBy=session,day,model";
    let grouped = admin.send_expecting(Method::GET, by, None, 200).await;
    let row = (grouped["rows"].as_array().unwrap().iter())
        .find(|r| r["session"] == anns.as_str())
        .unwrap_or_else(|| panic!("{grouped}"));
    assert_eq!(
        (&row["day"], &row["model"]),
        (&json!(today), &json!("echo-small"))
    );
    assert!(
        row.get("tenant").is_none(),
        "only the keys grouped by: {row}"
    );
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).format("%Y-%m-%d");
    let later = admin
        .send_expecting(Method::GET, &format!("/usage?from={tomorrow}"), None, 200)
        .await;
    assert!(later["rows"].as_array().unwrap().is_empty(), "{later}");
    let (status, bad) = admin.get("/usage?groupBy=colour").await;
    assert_eq!(status, 422, "{bad}");
    assert_eq!(admin.get("/usage?from=yesterday").await.0, 400);

    // As CSV.
    let csv = gw
        .http
        .get(gw.url("/usage?groupBy=tenant"))
        .bearer_auth(ADMIN)
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap();
    assert_eq!(csv.status(), 200);
    assert!(
        csv.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let text = csv.text().await.unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(lines[0][..3], ["tenant", "turns", "inputTokens"], "{text}");
    let acme = lines.iter().find(|l| l[0] == "acme").unwrap();
    assert_eq!((acme[1], acme[7], acme[9]), ("2", "10", "USD"), "{text}");
    assert!(near(acme[8].parse().unwrap(), 0.05), "{text}");

    // Counted in /metrics.
    let metrics = admin.get("/metrics").await.1;
    let metrics = metrics.as_str().unwrap();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("acp_gateway_usage_tokens_total")
                && l.contains("tenant=\"acme\"")
                && l.contains("kind=\"total\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.ends_with(" 10"), "{line}");
    assert!(metrics.contains("acp_gateway_usage_cost_micros_total"));

    // Deleted, the session's spend stays; and across a restart.
    let r = gw
        .http
        .delete(gw.url(&format!("/sessions/{anns}")))
        .bearer_auth(ANN)
        .send();
    assert_eq!(r.await.unwrap().status(), 204);
    w.restart().await;
    let gw = w.gw();
    let kept = gw
        .with_key(Some(ANN))
        .send_expecting(Method::GET, &path, None, 200)
        .await;
    assert_eq!(kept["totals"]["totalTokens"], 10, "{kept}");
    let sums = gw
        .with_key(Some(ANN))
        .send_expecting(Method::GET, "/usage", None, 200)
        .await;
    assert_eq!(sums["rows"][0]["turns"], 2, "{sums}");
    w.finish().await;
}

/// [`priced`] with budgets: 20 tokens a day for every tenant; globex none of tokens but
/// 0.05 USD a day; initech 1000 tokens. Webhooks may go to the loopback receiver.
fn budgeted(dir: &std::path::Path) -> Options {
    let file = dir.join("budgets.toml");
    std::fs::write(
        &file,
        "[tenants.globex]\nmax-tokens-per-day = 0\nmax-cost-per-day = { USD = 0.05 }\n\
         [tenants.initech]\nmax-tokens-per-day = 1000\n",
    )
    .unwrap();
    priced().args(&[
        "--tenant-max-tokens-per-day",
        "20",
        "--config",
        file.to_str().unwrap(),
        "--webhook-allow-private",
        "--webhook-poll-ms",
        "50",
    ])
}

/// A 429 of the budget `policy` names, asking to retry when the day ends.
async fn assert_spent(r: reqwest::Response, policy: &str) {
    assert_eq!(r.status(), 429, "{policy}");
    assert_eq!(r.headers()["ratelimit-policy"], policy);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let now = chrono::Utc::now();
    let midnight = (now.date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let left = (midnight.and_utc() - now).num_seconds() as u64;
    assert!(retry <= left + 1 && retry + 60 >= left, "{retry} of {left}");
    let body: Value = r.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("today"), "{body}");
}

async fn budgets_hold(gws: &[&Gateway]) {
    let at = |i: usize| gws[i % gws.len()];
    let receiver = Receiver::start("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").await;
    let hook = (at(0).with_key(Some(ADMIN)))
        .send_expecting(
            Method::POST,
            "/webhooks",
            Some(json!({"url": receiver.url, "events": ["usage_budget"]})),
            201,
        )
        .await;
    receiver.configure(json!({"secret": hook["secret"]})).await;
    let anns = created(at(0), ANN).await;
    let bobs = created(at(1), BOB).await;
    let carols = created(at(0), CAROL).await;

    // Tokens: 10, then 18 (past 80 %), then 28 — a turn begun under the budget finishes.
    for (i, text) in ["a b c d e", "a b c d", "a b c d e"]
        .into_iter()
        .enumerate()
    {
        prompted(at(i), ANN, &anns, text).await;
        prompted(at(i + 1), CAROL, &carols, text).await;
    }
    for i in 0..2 {
        assert_spent(
            prompt(at(i), ANN, &anns, "more").await,
            "\"tokens-per-day\";q=20;w=86400",
        )
        .await;
    }
    // A new session of acme's is refused its turns too; initech goes on.
    let another = created(at(1), ANN).await;
    assert_eq!(prompt(at(1), ANN, &another, "hi").await.status(), 429);
    prompted(at(1), CAROL, &carols, "still going").await;

    // Cost: 0.03 USD, then 0.06 (past all of it).
    prompted(at(1), BOB, &bobs, "a b c").await;
    prompted(at(0), BOB, &bobs, "a b c").await;
    assert_spent(
        prompt(at(1), BOB, &bobs, "more").await,
        "\"cost-per-day\";q=50000;w=86400",
    )
    .await;
    prompted(at(0), CAROL, &carols, "still going").await;

    // Each budget's 80 % and 100 %, once each, whichever replica saw them.
    let attempts = receiver
        .wait_for(|a| a.iter().filter(|a| a["status"] == 204).count() >= 4)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let attempts = [attempts, receiver.attempts().await].concat();
    let mut alerts: Vec<(String, String, i64)> = attempts
        .iter()
        .filter(|a| a["status"] == 204)
        .map(|a| {
            let data = &a["body"]["data"]["data"];
            (
                data["tenant"].as_str().unwrap().to_owned(),
                data["budget"].as_str().unwrap().to_owned(),
                data["percent"].as_i64().unwrap(),
            )
        })
        .collect();
    alerts.sort();
    alerts.dedup();
    let want = [
        ("acme", "tokens-per-day", 80),
        ("acme", "tokens-per-day", 100),
        ("globex", "cost-per-day", 80),
        ("globex", "cost-per-day", 100),
    ];
    let want: Vec<(String, String, i64)> = want
        .iter()
        .map(|(t, b, p)| (t.to_string(), b.to_string(), *p))
        .collect();
    assert_eq!(alerts, want, "{attempts:?}");
    let ids: std::collections::HashSet<&str> = attempts
        .iter()
        .filter_map(|a| a["msgId"].as_str())
        .collect();
    assert_eq!(ids.len(), 4, "one event per alert: {attempts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_stop_a_tenants_turns_on_one_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::start(Backend::Sqlite, budgeted(dir.path())).await;
    budgets_hold(&[w.gw()]).await;
    w.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn budgets_hold_across_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let opts = budgeted(dir.path());
    let w = World::start(Backend::Postgres, opts.clone()).await;
    let b = Gateway::spawn(&w.db.url, w.dir.path(), &opts).await;
    for g in [w.gw(), &b] {
        g.wait_until(|g| async move {
            let (_, agent) = g.with_key(Some(ADMIN)).get("/agent").await;
            agent["replicas"].as_array().is_some_and(|r| r.len() == 2)
        })
        .await;
    }
    budgets_hold(&[w.gw(), &b]).await;
    drop(b);
    w.finish().await;
}

/// A turn that ends while the database is down: its spend is recorded once the database is
/// back, exactly as the agent reported it (a cluster of the test's own, stopped and started).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(initdb), ignore = "needs PostgreSQL's initdb: /usr/lib/postgresql")]
async fn a_turns_spend_survives_a_database_restart() {
    let cluster = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default().env("ECHO_AGENT_COST", "0.01 USD");
    let gw = Gateway::spawn(&cluster.url(), dir.path(), &opts).await;
    let id = gw.create("/tmp").await;
    let turn = gw.prompt_in_background(&id, "/delay 1500 a b c");
    gw.wait_until(|g| {
        let id = id.clone();
        async move { g.json(&format!("/sessions/{id}/status")).await["activity"] == "running" }
    })
    .await;
    cluster.pg_ctl("stop");
    // The turn ends while the database is down.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    cluster.pg_ctl("start");
    let answer = tokio::time::timeout(PATIENCE * 2, turn)
        .await
        .expect("the prompt is answered once the database is back")
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 200);
    let result: Value = answer.json().await.unwrap();
    let reported = &result["result"]["usage"]["totalTokens"];
    assert!(reported.as_i64().is_some(), "{result}");
    let usage = gw.json(&format!("/sessions/{id}/usage")).await;
    assert_eq!(usage["totals"]["turns"], 1, "{usage}");
    assert_eq!(&usage["totals"]["totalTokens"], reported, "{usage}");
    let words = 5.0; // "/delay 1500 a b c"
    assert!(
        near(amount(&usage["totals"]["cost"]), 0.01 * words),
        "{usage}"
    );
    gw.stop().await;
    drop(cluster);
}
