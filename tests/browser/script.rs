//! Running a console script of tests/browser: node with the script, talking with the test in
//! lines, and the report it ends with, checked to be a clean run.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// A console script of tests/browser run by node (killed if the test ends first), which talks
/// with the test in lines: its stdin, and its stdout's lines.
pub fn console_script(
    script: &str,
    env: &[(&str, &str)],
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    let mut node = tokio::process::Command::new("node")
        .arg(script)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser"))
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs (is Node.js installed?)");
    let stdin = node.stdin.take().unwrap();
    let lines = BufReader::new(node.stdout.take().unwrap()).lines();
    (node, stdin, lines)
}

/// The report of a console script that has ended (its last JSON line), checked to be a clean
/// run: node exited 0, the script met no error, and the page logged none.
pub async fn clean_report(node: &mut tokio::process::Child, report: Option<String>) -> Value {
    let status = node.wait().await.unwrap();
    let report: Value = serde_json::from_str(&report.expect("a report")).unwrap();
    assert!(status.success(), "node failed: {report}");
    assert!(report.get("error").is_none(), "the run failed: {report:#}");
    assert_eq!(report["consoleErrors"], json!([]), "{report:#}");
    assert_eq!(report["pageErrors"], json!([]), "{report:#}");
    report
}
