//! Agents in the console, in Chromium (`console-agents.mjs`): an admin opens the Agents page
//! from the header. The echo agent, which needs a terminal login (`ECHO_AGENT_TERMINAL_AUTH`),
//! shows a button for it; the login runs in the page over the WebSocket with the console's key
//! as `access_token`: its device code is on the screen, the token typed in the page's field
//! signs the agent in (exit 0), after which a session can be made. The registry on loopback
//! lists the echo agent packed as a binary archive; Install installs it, the page following
//! the install until the agent is ready, and Remove (confirmed) takes it away again.

use crate::support;

use serde_json::json;
use support::registry::Registry;
use support::*;

const ADMIN: &str = "admin-console-key-0123456789";

#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn console_signs_an_agent_in_in_a_terminal_and_installs_from_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(&dir.path().join("registry")).await;
    registry.pack_echo("echo.tar.gz", "console");
    registry.publish(&[("echo-acp", "echo.tar.gz")]);
    let agents_dir = dir.path().join("agents");
    let opts = Options::default()
        .env("ECHO_AGENT_TERMINAL_AUTH", "echo-login")
        .args(&[
            "--admin-api-key",
            ADMIN,
            "--registry",
            &registry.url(),
            "--agents-dir",
            agents_dir.to_str().unwrap(),
        ]);
    let w = World::start(Backend::Sqlite, opts).await;
    let gw = w.gw();
    let admin = gw.with_key(Some(ADMIN));
    let (status, problem) = admin.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 503, "not signed in yet: {problem}");

    let base = gw.url("");
    let env = [("GATEWAY_URL", base.as_str()), ("API_KEY", ADMIN)];
    let (mut node, _stdin, mut lines) = super::script::console_script("console-agents.mjs", &env);
    let mut report = None;
    while let Some(line) = tokio::time::timeout(PATIENCE * 4, lines.next_line())
        .await
        .expect("the console run ends in time")
        .unwrap()
    {
        if line.starts_with('{') {
            report = Some(line);
        }
    }
    let report = super::script::clean_report(&mut node, report).await;

    // The terminal login, in the page.
    assert_eq!(report["loginButton"], "Log in in a terminal", "{report:#}");
    let screen = report["screen"].as_str().unwrap();
    assert!(screen.contains("WXYZ-1234"), "the device code: {screen:?}");
    assert!(screen.contains("Signed in."), "{screen:?}");
    assert!(!screen.contains('\u{1b}'), "escapes dropped: {screen:?}");
    assert_eq!(report["exit"], "0", "{report:#}");
    assert_eq!(
        report["loginStatus"], "The login exited with code 0.",
        "{report:#}"
    );
    let (status, made) = admin.post("/sessions", json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201, "signed in through the console: {made}");

    // The registry, an install followed to the end, and a removal.
    assert_eq!(report["registryIds"], json!(["echo-acp"]), "{report:#}");
    assert_eq!(report["installedState"], "ready", "{report:#}");
    assert_eq!(
        report["registryAfterInstall"],
        "Runs as: binary · installed as echo-acp"
    );
    assert_eq!(report["removed"], true, "{report:#}");
    let (status, _) = admin.get("/agents/echo-acp").await;
    assert_eq!(status, 404, "removed through the console");
    w.finish().await;
}
