//! What turns spent, in the console, in Chromium (`console-usage.mjs`), against the echo agent
//! with `ECHO_AGENT_COST` (a token per prompt word in and out, 0.01 USD a word) and a tenant's
//! daily budget of 20 tokens: a session's Usage panel shows its first turn, then follows the
//! second turn's end by itself (2 turns, 18 tokens, 0.09 USD, "—" for the figures the agent
//! does not report); the Usage page, reached from the header, shows a row per group (by tenant,
//! then by user and session), the budget alert the second turn set off, and downloads the rows
//! as CSV with the console's key; the grouping survives a reload, and a session's link leads
//! back to its view.

use crate::support;

use serde_json::json;
use support::*;
use tokio::io::AsyncWriteExt as _;

const ANN: &str = "ann-usage-key-0123456789";

#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn console_shows_a_sessions_usage_and_the_usage_page_with_its_csv() {
    let key = format!("acme/ann:{ANN}");
    let opts = Options::default()
        .env("ECHO_AGENT_COST", "0.01 USD")
        .args(&["--api-key", &key, "--tenant-max-tokens-per-day", "20"]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let ann = gw.with_key(Some(ANN));
    let (status, made) = ann.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201, "{made}");
    let id = made["sessionId"].as_str().unwrap().to_owned();
    let prompt = format!("/sessions/{id}/prompt");
    // Five words: 10 tokens of the day's 20, no alert yet.
    let (status, answer) = ann
        .post(&prompt, json!({"text": "one two three four five"}))
        .await;
    assert_eq!(status, 200, "{answer}");

    let base = gw.url("");
    let env = [
        ("GATEWAY_URL", base.as_str()),
        ("SESSION", &id),
        ("API_KEY", ANN),
    ];
    let (mut node, mut stdin, mut lines) = super::script::console_script("console-usage.mjs", &env);
    let mut report = None;
    while let Some(line) = tokio::time::timeout(PATIENCE * 4, lines.next_line())
        .await
        .expect("the console run ends in time")
        .unwrap()
    {
        if line == "OPENED" {
            // Four words, while the page is open: 18 tokens, past 80 % of the budget.
            let (status, answer) = ann
                .post(&prompt, json!({"text": "six seven eight nine"}))
                .await;
            assert_eq!(status, 200, "{answer}");
            stdin.write_all(b"PROMPTED\n").await.unwrap();
        } else if line.starts_with('{') {
            report = Some(line);
        }
    }
    let report = super::script::clean_report(&mut node, report).await;

    // The session's panel.
    assert_eq!(report["summaryAfterOne"], "1 turn · 10 tokens · 0.05 USD");
    assert_eq!(report["summary"], "2 turns · 18 tokens · 0.09 USD");
    assert_eq!(report["panelOpenBefore"], false, "a small panel, closed");
    assert_eq!(report["tableVisible"], true, "{report:#}");
    let figures = |input: &str, total: &str, cost: &str| {
        json!({"inputTokens": input, "outputTokens": input, "thoughtTokens": "—",
               "cacheReadTokens": "—", "cacheWriteTokens": "—", "totalTokens": total, "cost": cost})
    };
    let turns = report["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{report:#}");
    for (turn, (input, total, cost)) in turns
        .iter()
        .zip([("5", "10", "0.05 USD"), ("4", "8", "0.04 USD")])
    {
        assert_eq!(turn["user"], "ann", "{turn}");
        assert_eq!(turn["model"], "—", "the echo agent names no model");
        for (col, want) in figures(input, total, cost).as_object().unwrap() {
            assert_eq!(&turn[col], want, "{col} of {turn}");
        }
    }
    assert_eq!(
        report["turnsTotal"],
        json!([figures("9", "18", "0.09 USD")])
    );
    assert_eq!(report["turnsTotalLabel"], "Total (2 turns)");

    // The Usage page: by tenant, the default.
    assert_eq!(report["navCurrent"], "page");
    assert_eq!(report["sessionHidden"], true);
    let heads = |keys: &[&str]| {
        let mut h: Vec<&str> = keys.to_vec();
        h.extend([
            "Turns",
            "Input",
            "Output",
            "Thought",
            "Cache read",
            "Cache write",
            "Total tokens",
            "Cost",
        ]);
        json!(h)
    };
    assert_eq!(report["byTenantHeads"], heads(&["Tenant"]));
    let mut acme = figures("9", "18", "0.09 USD");
    acme["tenant"] = json!("acme");
    acme["turns"] = json!("2");
    assert_eq!(report["byTenant"], json!([acme]), "{report:#}");

    // By user and session: a row per group, the same as the API's.
    let hash = report["hash"].as_str().unwrap();
    assert!(
        hash.starts_with("#/usage?from=") && hash.ends_with("&groupBy=user%2Csession"),
        "the grouping is in the address: {hash}"
    );
    assert_eq!(report["bySessionHeads"], heads(&["User", "Session"]));
    let mut row = figures("9", "18", "0.09 USD");
    row["user"] = json!("ann");
    row["session"] = json!(id);
    row["turns"] = json!("2");
    assert_eq!(report["bySession"], json!([row]), "{report:#}");
    let (status, api) = ann.get("/usage?groupBy=user,session").await;
    assert_eq!(status, 200, "{api}");
    assert_eq!(api["rows"].as_array().unwrap().len(), 1, "{api}");
    assert_eq!(api["rows"][0]["session"], json!(id));
    let mut total = figures("9", "18", "0.09 USD");
    total["turns"] = json!("2");
    assert_eq!(report["bySessionTotal"], json!([total]));
    assert_eq!(report["status"], "1 row, 2 turns");

    // The alert the second turn set off: 18 of 20 tokens.
    let alerts = report["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{report:#}");
    assert!(
        alerts[0]
            .as_str()
            .unwrap()
            .starts_with("80 % of acme's daily token budget (18 of 20 tokens) on 20"),
        "{report:#}"
    );
    assert_eq!(report["alertBadge"], "1");

    // The CSV, fetched with Ann's key.
    let csv = report["csv"]["text"].as_str().unwrap();
    let mut csv_lines = csv.lines();
    assert_eq!(
        csv_lines.next(),
        Some(
            "user,session,turns,inputTokens,outputTokens,thoughtTokens,cacheReadTokens,cacheWriteTokens,totalTokens,costAmount,costCurrency,costs"
        ),
        "{csv}"
    );
    let data = csv_lines.next().unwrap_or_default();
    assert!(
        data.starts_with(&format!("ann,{id},2,9,9,,,,18,0.0")) && data.contains(",USD,USD="),
        "{csv}"
    );
    assert_eq!(csv_lines.next(), None, "one row: {csv}");
    let name = report["csv"]["name"].as_str().unwrap();
    assert!(
        name.starts_with("usage-") && name.ends_with("-by-user-session.csv"),
        "{name}"
    );

    // A reload keeps the grouping; a session's link opens its view.
    assert_eq!(
        report["afterReload"]["checked"],
        json!(["usage-by-user", "usage-by-session"])
    );
    assert_eq!(report["afterReload"]["rows"], report["bySession"]);
    assert_eq!(report["backTo"], format!("#/s/{id}"));
    assert_eq!(report["usagePageHidden"], true);
    w.finish().await;
}
