//! `acp-gateway check-agent`: describes a working agent as a table, and explains an unusable
//! one in one line with a non-zero exit.

mod support;

use std::process::{Command, Output};

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
