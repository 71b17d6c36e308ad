//! `acp-gateway check-agent`: describes a working agent as a table, and explains an unusable
//! one in one line with a non-zero exit; with several named agents, one section each, and a
//! failure naming each unusable one. Also the gateway itself serving a named agent, and a
//! default agent that authenticates with `auth-meta`.

use crate::support;

use std::process::{Command, Output};

use support::*;

fn check_agent(args: &[&str], env: &[(&str, &str)]) -> Output {
    let state = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .arg("check-agent")
        .args(args)
        .env("ECHO_AGENT_DIR", state.path())
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// The last line on stderr: the reason.
fn reason(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr.lines().last().unwrap_or_default().to_owned()
}

#[test]
fn describes_a_working_agent() {
    let agent = support::echo_agent();
    let out = check_agent(
        &["--agent", agent.to_str().unwrap()],
        &[("ECHO_AGENT_CAPS", "load,list,title")],
    );
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    let row = |k: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{k} ")))
            .map(|l| l[k.len()..].trim().to_owned())
            .unwrap_or_else(|| panic!("no {k} row in\n{table}"))
    };
    assert_eq!(row("agent"), "echo-agent");
    assert_eq!(row("protocol version"), "1");
    assert_eq!(row("session/load"), "yes");
    assert_eq!(row("session/list"), "yes");
    assert_eq!(row("session/set_title"), "yes");
    assert_eq!(row("session/resume"), "no");
    assert_eq!(row("session/delete"), "no");
    // A session was tried; the agent can neither delete nor close it.
    let tried = row("session/new");
    assert!(
        tried.starts_with("ok (a session in ") && tried.ends_with("left to the agent)"),
        "{tried}"
    );
}

/// An agent that answers `session/new` with `auth_required` is unusable until signed in, and
/// the reason names the methods it offers; with its method configured, it is usable (and its
/// trial session deleted again).
#[test]
fn an_agent_that_needs_a_sign_in_is_unusable_until_signed_in() {
    let agent = support::echo_agent();
    let needs = [("ECHO_AGENT_AUTH", "agent-login")];
    let refused = reason(&check_agent(&["--agent", agent.to_str().unwrap()], &needs));
    assert!(
        refused.contains("session/new answered auth_required")
            && refused.contains("\"agent-login\"")
            && refused.contains("auth-method"),
        "{refused}"
    );
    let signed_in = check_agent(
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--agent-auth-method",
            "agent-login",
        ],
        &needs,
    );
    assert!(signed_in.status.success(), "{signed_in:?}");
    let table = String::from_utf8(signed_in.stdout).unwrap();
    assert_eq!(row(&table, "authenticated with"), "agent-login");
    let tried = row(&table, "session/new");
    assert!(tried.ends_with("deleted again)"), "{tried}");
}

#[test]
fn explains_an_unusable_agent_in_one_line() {
    let missing = reason(&check_agent(&["--agent", "/nonexistent/agent"], &[]));
    assert!(missing.contains("cannot start the agent"), "{missing}");

    let crashing = reason(&check_agent(
        &["--agent", "sh -c 'echo no api key set >&2; exit 3'"],
        &[],
    ));
    assert!(
        crashing.contains("exited before answering initialize (exit code 3)")
            && crashing.contains("no api key set"),
        "{crashing}"
    );

    let silent = reason(&check_agent(
        &["--agent", "sleep 30", "--init-timeout", "1"],
        &[],
    ));
    assert!(
        silent.contains("did not answer initialize within 1 s"),
        "{silent}"
    );

    let agent = support::echo_agent();
    let auth = reason(&check_agent(
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--agent-auth-method",
            "oauth",
        ],
        &[],
    ));
    assert!(
        auth.contains("does not offer auth method \"oauth\""),
        "{auth}"
    );
}

/// Writes `text` as `dir/gateway.toml`, `@ECHO@` standing for the echo agent's path.
fn config_file(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("gateway.toml");
    let agent = support::echo_agent();
    std::fs::write(&path, text.replace("@ECHO@", agent.to_str().unwrap())).unwrap();
    path.display().to_string()
}

/// The `[NAME]` sections of check-agent's output, each heading with its lines.
fn sections(out: &Output) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.starts_with('[') {
            sections.push((line.to_owned(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections
}

/// The value of a table's row `key`.
fn row(table: &str, key: &str) -> String {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{key} ")))
        .map(|l| l[key.len()..].trim().to_owned())
        .unwrap_or_else(|| panic!("no {key} row in\n{table}"))
}

/// Two echo agents of different environments: `plain`, and `codex`, which needs a key in
/// `_meta` (Codex's shape), taken from `TEST_CODEX_KEY` by `auth-meta`.
const TWO_AGENTS: &str = r#"
default-agent = "codex"

[agents.plain]
command = "@ECHO@"
env = { ECHO_AGENT_CAPS = "load,list" }

[agents.codex]
command = "@ECHO@"
env = { ECHO_AGENT_AUTH = "api-key", ECHO_AGENT_AUTH_KEY = "sk-codex-0123" }
auth-method = "api-key"
auth-meta = { "api-key" = { apiKey = "${TEST_CODEX_KEY}" } }
"#;

#[test]
fn checks_every_configured_agent_in_its_own_section() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), TWO_AGENTS);
    let out = check_agent(
        &["--config", &config],
        &[("TEST_CODEX_KEY", "sk-codex-0123")],
    );
    assert!(out.status.success(), "{out:?}");
    let parts = sections(&out);
    let headings: Vec<&str> = parts.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(headings, ["[codex] (default)", "[plain]"], "{out:?}");
    let codex = &parts[0].1;
    assert_eq!(row(codex, "auth methods"), "api-key");
    assert_eq!(row(codex, "authenticated with"), "api-key");
    let plain = &parts[1].1;
    assert_eq!(row(plain, "auth methods"), "none");
    assert_eq!(row(plain, "session/list"), "yes");
    assert_eq!(row(plain, "session/delete"), "no");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("sk-codex"));

    // The same agents named on the command line, the default by --default-agent.
    let agent = support::echo_agent();
    let out = check_agent(
        &[
            "--agent",
            &format!("one={}", agent.display()),
            "--agent",
            &format!("two={}", agent.display()),
            "--default-agent",
            "two",
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let headings: Vec<String> = sections(&out).into_iter().map(|(h, _)| h).collect();
    assert_eq!(headings, ["[two] (default)", "[one]"]);
}

#[test]
fn only_checks_the_agent_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), TWO_AGENTS);
    // The key is wrong, but codex is not checked.
    let out = check_agent(
        &["--config", &config, "--only", "plain"],
        &[("TEST_CODEX_KEY", "wrong")],
    );
    assert!(out.status.success(), "{out:?}");
    let headings: Vec<String> = sections(&out).into_iter().map(|(h, _)| h).collect();
    assert_eq!(headings, ["[plain]"]);

    let unknown = reason(&check_agent(
        &["--config", &config, "--only", "gemini"],
        &[("TEST_CODEX_KEY", "sk-codex-0123")],
    ));
    assert!(
        unknown.contains("--only \"gemini\": no such agent; the agents are: codex, plain"),
        "{unknown}"
    );
}

#[test]
fn fails_naming_each_unusable_agent_and_still_describes_the_others() {
    let dir = tempfile::tempdir().unwrap();
    // Gemini's shape of the key, wrong; and an agent that cannot start.
    let config = config_file(
        dir.path(),
        r#"
default-agent = "plain"

[agents.plain]
command = "@ECHO@"

[agents.gemini]
command = "@ECHO@"
env = { ECHO_AGENT_AUTH = "gemini-api-key", ECHO_AGENT_AUTH_KEY = "gm-right" }
auth-method = "gemini-api-key"
auth-meta = { "api-key" = "${TEST_GEMINI_KEY}" }
"#,
    );
    let wrong = check_agent(&["--config", &config], &[("TEST_GEMINI_KEY", "gm-wrong")]);
    let why = reason(&wrong);
    assert!(
        why.contains(
            "agent \"gemini\" cannot be used: authenticate with \"gemini-api-key\" failed"
        ) && why.contains("-32000")
            && why.contains("wrong API key"),
        "{why}"
    );
    assert!(!why.contains("plain"), "{why}");
    let parts = sections(&wrong);
    assert_eq!(parts[0].0, "[plain] (default)");
    assert!(parts[0].1.contains("agent "), "{parts:?}");
    assert_eq!(parts[1].0, "[gemini]");
    assert!(parts[1].1.starts_with("unusable  "), "{parts:?}");

    let right = check_agent(&["--config", &config], &[("TEST_GEMINI_KEY", "gm-right")]);
    assert!(
        right.status.success(),
        "Gemini's shape is accepted: {right:?}"
    );

    let unset = reason(&check_agent(&["--config", &config], &[]));
    assert!(
        unset.contains("[agents.gemini]")
            && unset.contains("the environment variable TEST_GEMINI_KEY is not set"),
        "{unset}"
    );

    let two = reason(&check_agent(
        &["--config", &config, "--agent", "broken=/nonexistent/agent"],
        &[("TEST_GEMINI_KEY", "gm-wrong")],
    ));
    assert!(
        two.starts_with("acp-gateway: 2 agents cannot be used: \"broken\": cannot start the agent")
            && two.contains("; \"gemini\": authenticate with"),
        "{two}"
    );
}

#[tokio::test]
async fn the_gateway_serves_an_agent_given_as_name_equals_command() {
    let opts = Options {
        agent: format!("echo={}", echo_agent().display()).into(),
        ..Options::default()
    };
    let w = World::start(Backend::Sqlite, opts).await;
    let id = w.gw().create("/tmp").await;
    assert_eq!(w.gw().prompt(&id, "a b").await.0, 200);
    w.finish().await;
}

#[tokio::test]
async fn the_default_agent_authenticates_with_its_auth_meta() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        r#"
[agents.codex]
command = "@ECHO@"
env = { ECHO_AGENT_AUTH = "api-key", ECHO_AGENT_AUTH_KEY = "sk-codex-0123" }
auth-method = "api-key"
auth-meta = { "api-key" = { apiKey = "${TEST_CODEX_KEY}" } }
"#,
    );
    // `--agent PATH` of the options is the agent named `default`; codex is made the default.
    let opts = Options::default()
        .args(&["--config", &config, "--default-agent", "codex"])
        .env("TEST_CODEX_KEY", "sk-codex-0123");
    let w = World::start(Backend::Sqlite, opts).await;
    let id = w.gw().create("/tmp").await;
    assert_eq!(w.gw().prompt(&id, "a b").await.0, 200);
    assert_eq!(w.calls("authenticate"), 1);
    assert!(!w.log().contains("sk-codex-0123"), "the key is not logged");
    w.finish().await;
}
