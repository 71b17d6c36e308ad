//! Browsers against the gateway: headless Chromium (Debian's `chromium`, driven by
//! `playwright-core` from npm). A frontend on another origin creates a session with `fetch` and
//! a bearer key, prompts it, and reads its stream with `EventSource` and `?access_token=`; the
//! gateway's own console at `/` is driven through a session's life, a reload and a restart, and
//! shows the Mode and Model pickers only for what the session's agent offers; its Files panel
//! is driven in `files`, several people on a session in `people`, and what turns spent (a
//! session's Usage panel, the Usage page and its CSV) in `usage`, and the Agents page (a
//! terminal login, an install from the registry) in `agents`.
//! Ignored by plain `cargo test` because it needs the browser and `npm ci` in `tests/browser`;
//! `.ci/run` installs both and runs them with `--ignored`.

use crate::support;

mod agents;
mod files;
mod people;
mod script;
mod shared;
mod usage;

use serde_json::Value;
use support::*;
use tokio::io::AsyncWriteExt as _;

const KEY: &str = "alice-browser-key-0123456789";

#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn browser_on_another_origin_uses_fetch_and_eventsource() {
    let page_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page_origin = format!("http://{}", page_listener.local_addr().unwrap());
    let opts = Options::default()
        .arg("--api-key")
        .arg(&format!("alice:{KEY}"))
        .arg("--cors-origin")
        .arg(&page_origin);
    let w = World::start(Backend::Sqlite, opts).await;
    let gateway_url = w.gw().url("");
    let page = include_str!("browser/page.html")
        .replace("GATEWAY_URL", gateway_url.trim_end_matches('/'))
        .replace("API_KEY", KEY);
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(page) }),
    );
    let server = tokio::spawn(async move { axum::serve(page_listener, app).await });

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser");
    let out = tokio::time::timeout(
        PATIENCE * 2,
        tokio::process::Command::new("node")
            .arg("run.mjs")
            .current_dir(dir)
            .env("PAGE_URL", format!("{page_origin}/"))
            .env(
                "DOCS_URL",
                format!("{}/docs", gateway_url.trim_end_matches('/')),
            )
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser run ends in time")
    .expect("node runs (is Node.js installed?)");
    server.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser run failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    let docs = &report["docs"];
    assert!(docs["error"].is_null(), "the docs page failed: {docs}");
    let operations = docs["operations"].as_array().unwrap();
    for id in [
        "listSessions",
        "createSession",
        "promptSession",
        "streamSessionEvents",
    ] {
        assert!(
            operations.iter().any(|o| o == id),
            "/docs lacks {id}: {docs}"
        );
    }
    assert_eq!(
        docs["elsewhere"],
        serde_json::json!([]),
        "/docs fetched from elsewhere"
    );
    let r = &report["result"];
    assert!(r.get("error").is_none(), "the page failed: {report}");
    let id = r["sessionId"].as_str().unwrap();
    assert_eq!(r["createdStatus"], 201);
    assert_eq!(
        r["location"],
        format!("/sessions/{id}"),
        "Location is exposed"
    );
    assert_eq!(r["promptStatus"], 200);
    assert_eq!(r["stopReason"], "end_turn");
    let events = r["events"].as_array().unwrap();
    let names: Vec<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"turn_started"), "{report}");
    assert_eq!(names.last(), Some(&"turn_ended"), "{report}");
    let text: String = events
        .iter()
        .filter(|e| e["name"] == "agent_message_chunk")
        .map(|e| e["data"]["update"]["content"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "hello from a browser");
    let ids: Vec<i64> = events
        .iter()
        .map(|e| e["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (1..=ids.len() as i64).collect::<Vec<_>>(), "{report}");
    assert_eq!(r["listedTitle"], "Echo: hello from a browser");
    assert_eq!(r["withoutKeyStatus"], 401, "a 401 is readable cross-origin");
    assert!(
        r["withoutKeyType"]
            .as_str()
            .unwrap()
            .ends_with("unauthorized")
    );
    let log = w.log();
    assert!(
        !log.contains(KEY),
        "the access token is redacted from the logs"
    );
    w.finish().await;
}

/// The console's flows, in one browser session against one gateway restarted where it listened
/// (so that the page's origin survives the restart): create, prompt and stream, agent HTML rendered as text,
/// a permission answered, a reload mid-turn, mode and model switched, a restart mid-stream.
#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn the_console_creates_prompts_answers_and_resumes_after_a_reload_and_a_restart() {
    let opts = Options::default().env("ECHO_AGENT_CONTROLS", "modes,models,options");
    let mut w = World::start(Backend::Sqlite, opts).await;
    let base = w.gw().url("");
    let shots = concat!(env!("CARGO_MANIFEST_DIR"), "/target/console-screenshots");

    let (mut node, mut stdin, mut lines) = script::console_script(
        "console.mjs",
        &[("GATEWAY_URL", &base), ("SHOTS_DIR", shots)],
    );
    let mut report = None;
    let mut restarted = false;
    while let Some(line) = tokio::time::timeout(PATIENCE * 4, lines.next_line())
        .await
        .expect("the console run ends in time")
        .unwrap()
    {
        if line == "RESTART" {
            w.restart_in_place().await;
            assert_eq!(
                w.gw().url(""),
                base,
                "the restarted gateway keeps its origin"
            );
            restarted = true;
            stdin.write_all(b"RESTARTED\n").await.unwrap();
        } else if line.starts_with('{') {
            report = Some(line);
        }
    }
    let status = node.wait().await.unwrap();
    let report: Value = serde_json::from_str(&report.expect("a report")).unwrap();
    assert!(status.success(), "node failed: {report}");
    assert!(
        report.get("error").is_none(),
        "the console run failed: {report:#}"
    );
    assert!(restarted, "{report}");

    assert_eq!(
        report["csp"],
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    assert_eq!(report["contentType"], "text/html; charset=utf-8");
    assert_eq!(
        report["elsewhere"],
        serde_json::json!([]),
        "no request leaves the origin"
    );
    assert_eq!(report["consoleErrors"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["pageErrors"], serde_json::json!([]), "{report:#}");
    // While the gateway is down the browser reports the refused connections, and nothing else.
    for e in report["restartErrors"].as_array().unwrap() {
        let e = e.as_str().unwrap();
        assert!(
            e.contains("net::ERR_") || e.contains("503") || e.contains("502"),
            "an error other than the gateway being away: {e}"
        );
    }

    assert_eq!(report["firstReply"], "hello big world", "{report:#}");
    assert_eq!(
        report["strong"],
        serde_json::json!(["big"]),
        "Markdown rendered"
    );
    assert_eq!(report["listedTitle"], "Echo: hello **big** world");
    let xss = &report["xss"];
    assert!(xss["ran"].is_null(), "agent text ran: {xss}");
    assert_eq!(xss["imgs"], 0);
    assert_eq!(xss["scripts"], 0);
    assert_eq!(
        xss["text"],
        "<img src=x onerror=window.__xss=1> <script>window.__xss=2</script> done"
    );
    assert_eq!(report["permissionReply"], "permission: allowplease");
    assert_eq!(report["pendingAfter"], 0);
    // The agent's prompt suggestions: offered under the prompt, one click puts one in it, and
    // a reload (in the middle of a turn that suggests nothing) shows them again.
    assert_eq!(report["suggested"], serde_json::json!(["again", "more"]));
    assert_eq!(report["suggestionFilled"], "again");
    assert_eq!(
        report["suggestedAfterReload"],
        serde_json::json!(["again", "more"])
    );
    assert_eq!(
        report["reloadReply"], report["expectedReload"],
        "nothing doubled or lost"
    );
    assert_eq!(
        report["userAfterReload"],
        serde_json::json!([
            "hello big world",
            "<img src=x onerror=window.__xss=1> <script>window.__xss=2</script> done",
            "/suggest again /suggest more /permission please",
            "/chunks 30 /delay 80 go"
        ])
    );
    assert_eq!(report["agentCountAfterReload"], 4);
    assert_eq!(report["lastSeqStored"], report["lastSeqShown"]);

    assert_eq!(
        report["pickersShown"],
        serde_json::json!(["mode-label", "mode-select", "model-label", "model-select"]),
        "the agent offers modes and models"
    );
    assert_eq!(
        report["modesOffered"],
        serde_json::json!(["ask", "code", "architect"])
    );
    assert_eq!(
        report["modelsOffered"],
        serde_json::json!(["echo-small", "echo-large"])
    );
    assert_eq!(report["modeStatus"], 200);
    assert_eq!(report["modelStatus"], 200);
    assert_eq!(report["modeAfterReload"], "code");
    assert_eq!(report["modelAfterReload"], "echo-large");
    assert_eq!(report["sessionError"], "");

    // The interrupted turn: what streamed before the restart is there once, in order.
    let before = report["beforeRestart"].as_str().unwrap();
    let interrupted = report["interrupted"].as_str().unwrap();
    assert!(interrupted.starts_with(before), "{report:#}");
    let words: Vec<&str> = interrupted.split_whitespace().collect();
    let expected: Vec<String> = (1..=words.len()).map(|i| format!("c{i}")).collect();
    assert_eq!(words, expected, "the interrupted turn, once and in order");
    let states = report["connectionStates"].as_array().unwrap();
    assert!(
        states.iter().any(|s| s == "reconnecting") && states.last().unwrap() == "online",
        "the page saw the gateway go and come back: {states:?}"
    );
    assert_eq!(report["afterRestart"], "after the restart");
    assert_eq!(report["userFinal"].as_array().unwrap().len(), 6);
    assert_eq!(report["sameAfterReload"], true, "{report:#}");
    assert_eq!(report["phoneOverflow"], false, "readable on a 390 px phone");
    assert_eq!(
        report["darkBackground"], "rgb(15, 18, 21)",
        "dark with prefers-color-scheme"
    );
    for shot in [
        "console-1280x800.png",
        "console-390x844.png",
        "console-dark-1280x800.png",
    ] {
        assert!(
            std::path::Path::new(shots).join(shot).exists(),
            "{shot} saved"
        );
    }
    w.finish().await;
}

/// The console with API keys: sign-in, the list following `GET /events` (a session created by
/// another client appears), commands, plan and usage, an elicitation's form, rename, archive
/// and the archived filter, delete after a confirmation, sign-out.
#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn the_console_signs_in_follows_the_list_and_manages_a_session() {
    let opts = Options::default()
        .env("ECHO_AGENT_CONTROLS", "modes,models,options")
        .args(&["--retention-events", "30"])
        .arg("--api-key")
        .arg(&format!("alice:{KEY}"));
    let w = World::start(Backend::Sqlite, opts).await;
    let base = w.gw().url("");
    let http = reqwest::Client::new();
    let (mut node, mut stdin, mut lines) = script::console_script(
        "console-manage.mjs",
        &[("GATEWAY_URL", &base), ("API_KEY", KEY)],
    );
    let mut report = None;
    let mut created = None;
    while let Some(line) = tokio::time::timeout(PATIENCE * 4, lines.next_line())
        .await
        .expect("the console run ends in time")
        .unwrap()
    {
        if line == "MANY" {
            for _ in 0..31 {
                let r = http
                    .post(w.gw().url("/sessions"))
                    .bearer_auth(KEY)
                    .json(&serde_json::json!({"cwd": "/"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
            }
            stdin.write_all(b"MADE\n").await.unwrap();
        } else if line == "CREATE" {
            let s: Value = http
                .post(w.gw().url("/sessions"))
                .bearer_auth(KEY)
                .json(&serde_json::json!({"cwd": "/tmp"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let id = s["sessionId"].as_str().unwrap().to_owned();
            let r = http
                .post(w.gw().url(&format!("/sessions/{id}/prompt")))
                .bearer_auth(KEY)
                .json(&serde_json::json!({"text": "from curl"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            // Another session, whose first events retention removes (--retention-events 30).
            let s: Value = http
                .post(w.gw().url("/sessions"))
                .bearer_auth(KEY)
                .json(&serde_json::json!({"cwd": "/tmp"}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let pruned = s["sessionId"].as_str().unwrap().to_owned();
            let r = http
                .post(w.gw().url(&format!("/sessions/{pruned}/prompt")))
                .bearer_auth(KEY)
                .json(&serde_json::json!({"text": "/chunks 40"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let path = format!("/sessions/{pruned}/history");
            w.gw()
                .wait_until(|g| {
                    let path = path.clone();
                    async move {
                        g.http
                            .get(g.url(&path))
                            .bearer_auth(KEY)
                            .send()
                            .await
                            .unwrap()
                            .json::<Value>()
                            .await
                            .unwrap()["events"][0]["seq"]
                            != 1
                    }
                })
                .await;
            stdin
                .write_all(format!("CREATED {id} {pruned}\n").as_bytes())
                .await
                .unwrap();
            created = Some(id);
        } else if line.starts_with('{') {
            report = Some(line);
        }
    }
    let status = node.wait().await.unwrap();
    let report: Value = serde_json::from_str(&report.expect("a report")).unwrap();
    assert!(status.success(), "node failed: {report}");
    assert!(
        report.get("error").is_none(),
        "the console run failed: {report:#}"
    );
    let id = created.expect("the page asked for a session");
    assert_eq!(report["sessionId"], id);

    assert_eq!(report["appHiddenBeforeKey"], true);
    assert_eq!(report["moreVisible"], true, "a second page");
    assert_eq!(report["moreAfterLast"], false);
    assert_eq!(report["cwds"], serde_json::json!(["/"]));
    assert_eq!(report["wrongKeyError"], "That key was not accepted.");
    assert_eq!(report["keyStored"], true);
    // Before the key: the browser reports the 401s it was answered, and nothing else.
    for e in report["signInErrors"].as_array().unwrap() {
        assert!(e.as_str().unwrap().contains("401"), "{e}");
    }
    assert_eq!(report["consoleErrors"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["pageErrors"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["elsewhere"], serde_json::json!([]));

    // state_changed (session/new), turn_started, 40 chunks (cN is event N+2),
    // session_info_update, turn_ended: 44 events, of which 15–44 are kept.
    assert_eq!(
        report["gapNotes"],
        serde_json::json!(["events 1–14 are no longer kept (gap)"])
    );
    let kept = (13..=40)
        .map(|i| format!("c{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(report["prunedText"], serde_json::json!([kept]));
    assert_eq!(
        report["plan"],
        serde_json::json!(["completed: Read the prompt", "in_progress: Echo it"])
    );
    assert!(
        report["usage"]
            .as_str()
            .unwrap()
            .contains("context 1200/200000"),
        "{report}"
    );
    assert_eq!(report["suggested"], serde_json::json!(["shout"]));
    assert_eq!(report["picked"], "/shout ");
    assert_eq!(report["allSuggested"], serde_json::json!(["help", "shout"]));
    let labels = report["elicitationLabels"].as_array().unwrap();
    assert!(labels.iter().any(|l| l == "Name (required)"), "{labels:?}");
    let reply = report["elicitationReply"].as_str().unwrap();
    assert!(
        reply.starts_with("elicitation: accept")
            && reply.contains("\"Ada\"")
            && reply.contains("36"),
        "{reply}"
    );
    assert_eq!(report["requestsLeft"], 0);
    assert!(
        report["elicitationText"]
            .as_str()
            .unwrap()
            .contains("Answer before"),
        "the deadline is shown: {report}"
    );
    assert_eq!(report["activityWhileRunning"], "running");
    let md = &report["markdown"];
    assert_eq!(md["heading"], "Title");
    assert_eq!(md["code"], "<b>not bold</b>");
    assert_eq!(md["lang"], "js");
    assert_eq!(md["items"], serde_json::json!(["one", "two"]));
    assert_eq!(md["strong"], serde_json::json!(["two"]));
    assert_eq!(md["ordered"], serde_json::json!(["first"]));
    assert_eq!(
        md["links"],
        serde_json::json!([["ok", "https://example.org/x", "noopener noreferrer"]])
    );
    assert_eq!(md["html"], 0, "no element from the text's HTML");
    assert_eq!(
        md["last"],
        "ok [bad](javascript:alert(1)) <i>x</i> <u>u</u>"
    );
    assert_eq!(report["archivedListed"], true);
    assert_eq!(report["stillThereAfterCancel"], true);
    assert!(
        report["confirmText"]
            .as_str()
            .unwrap()
            .starts_with("Delete")
    );
    assert!(report["keyAfterSignOut"].is_null());
    let r = &report["rendering"];
    assert_eq!(r["thought"], "Thought<b>hmm</b>");
    assert_eq!(r["thoughtOpen"], false, "thoughts collapsed");
    assert_eq!(r["tools"], 1, "an update changes its tool call in place");
    assert_eq!(
        r["tool"], "Edit <main.rs>editcompleted/src/main.rs:3/src/main.rs- a\n+ b\n",
        "the second update with seq 3 is dropped as a repeat"
    );
    assert_eq!(r["diff"], serde_json::json!(["del:- a\n", "add:+ b\n"]));
    assert_eq!(r["html"], 0);
    let gone = http
        .get(w.gw().url(&format!("/sessions/{id}")))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "deleted through the console");
    w.finish().await;
}

/// The session view shows a Mode or Model label and picker only for what the session's agent
/// offers: agents `default` (the echo agent as the README runs it: neither), `modes`, `models`,
/// `both` (modes and models) and `options` (both as config options); back on `default`'s
/// session, neither again.
#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn the_console_shows_mode_and_model_only_when_the_agent_offers_them() {
    let dirs = tempfile::tempdir().unwrap();
    let echo = echo_agent();
    let mut opts = Options::default();
    for (name, controls) in [
        ("modes", "modes"),
        ("models", "models"),
        ("both", "modes,models"),
        ("options", "options"),
    ] {
        let dir = dirs.path().join(name);
        let cmd = format!(
            "{name}=env ECHO_AGENT_DIR={} ECHO_AGENT_CONTROLS={controls} {}",
            dir.display(),
            echo.display()
        );
        opts = opts.arg("--agent").arg(&cmd);
    }
    let w = World::start(Backend::Sqlite, opts).await;
    w.gw()
        .wait_until(|g| async move {
            let agents = g.json("/agents").await;
            agents
                .as_array()
                .unwrap()
                .iter()
                .all(|a| a["ready"] == true)
        })
        .await;
    let out = tokio::time::timeout(
        PATIENCE * 2,
        tokio::process::Command::new("node")
            .arg("console-pickers.mjs")
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser"))
            .env("GATEWAY_URL", w.gw().url(""))
            .env("AGENTS", "default,modes,models,both,options")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser run ends in time")
    .expect("node runs (is Node.js installed?)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "node failed: {report}");
    assert!(report.get("error").is_none(), "the run failed: {report:#}");
    assert_eq!(report["consoleErrors"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["pageErrors"], serde_json::json!([]), "{report:#}");
    let mode = ["mode-label", "mode-select"];
    let model = ["model-label", "model-select"];
    let both = [mode, model].concat();
    for (agent, shown) in [
        ("default", &[][..]),
        ("modes", &mode[..]),
        ("models", &model[..]),
        ("both", &both[..]),
        ("options", &both[..]),
        ("again", &[][..]),
    ] {
        assert_eq!(report["shown"][agent], serde_json::json!(shown), "{agent}");
    }
    w.finish().await;
}
