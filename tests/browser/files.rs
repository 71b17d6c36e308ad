//! The console's Files panel in Chromium (`console-files.mjs`), on a session the console's form
//! makes as a git worktree of a real repository: the tree and a file's text and download; a
//! file dropped on the panel, which the test then reads through the API; the tree following
//! the agent's writes live; the last turn's changes against all of them; revert to a turn and
//! to the base, after which the API and the worktree agree with what the page showed.

use crate::support;

use serde_json::{Value, json};
use support::git::repository;
use support::*;
use tokio::io::AsyncWriteExt as _;

#[tokio::test]
#[ignore = "needs chromium and `npm ci` in tests/browser, then: cargo test --test integration browser:: -- --ignored"]
async fn console_files_panel_browses_uploads_shows_changes_and_reverts() {
    let w = World::start(Backend::Sqlite, Options::default()).await;
    let gw = w.gw();
    let repo = repository(w.dir());
    let base = gw.url("");
    let (mut node, mut stdin, mut lines) = super::script::console_script(
        "console-files.mjs",
        &[("GATEWAY_URL", &base), ("REPO", repo.to_str().unwrap())],
    );
    let mut report = None;
    let mut session = None;
    while let Some(line) = tokio::time::timeout(PATIENCE * 4, lines.next_line())
        .await
        .expect("the console run ends in time")
        .unwrap()
    {
        if let Some(id) = line.strip_prefix("DROPPED ") {
            // What the page uploaded is in the workspace, for the API as for the agent.
            let r = gw.get(&format!("/sessions/{id}/files/dropped.txt")).await;
            assert_eq!(r.status(), 200);
            assert_eq!(r.text().await.unwrap(), "dropped by drag\n");
            session = Some(id.to_owned());
            stdin.write_all(b"CHECKED\n").await.unwrap();
        } else if line.starts_with('{') {
            report = Some(line);
        }
    }
    let report = super::script::clean_report(&mut node, report).await;
    let id = session.expect("the page uploaded a file");

    let view: Value = gw.json(&format!("/sessions/{id}")).await;
    let branch = format!("acp/{id}");
    assert_eq!(view["workspace"]["branch"], json!(branch));
    assert_eq!(report["summary"], json!(format!("worktree on {branch}")));
    assert_eq!(
        report["root"],
        json!([".gitignore", "README.md", "src"]),
        "{report:#}"
    );
    assert_eq!(report["src"], json!(["src/lib.rs"]));
    assert_eq!(
        report["shown"],
        json!({"path": "src/lib.rs", "text": "pub fn one() {}\n"})
    );
    assert_eq!(
        report["download"],
        json!({"name": "lib.rs", "text": "pub fn one() {}\n"})
    );
    assert_eq!(report["uploadStatus"], json!("uploaded dropped.txt"));
    assert_eq!(report["last"], json!([["b.txt", "added"]]));
    assert!(
        report["lastPatch"]
            .as_str()
            .unwrap()
            .contains("+echo wrote b.txt"),
        "{report:#}"
    );
    assert_eq!(
        report["all"],
        json!([
            ["b.txt", "added"],
            ["dropped.txt", "added"],
            ["notes.txt", "added"]
        ])
    );
    // Two turns' checkpoints and the base; then two reverts, each a checkpoint of its own.
    assert_eq!(report["revertChoices"], json!(3));
    assert_eq!(
        report["afterRevert"],
        json!([["dropped.txt", "added"], ["notes.txt", "added"]])
    );
    assert_eq!(
        report["afterBase"],
        json!([".gitignore", "README.md", "src"])
    );
    let listed: Value = gw.json(&format!("/sessions/{id}/checkpoints")).await;
    let reasons: Vec<&str> = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons[0], "revert to base");
    assert!(reasons[1].starts_with("revert to "), "{reasons:?}");
    assert_eq!(reasons[2..], ["turn", "turn"]);
    let worktree = std::path::Path::new(view["cwd"].as_str().unwrap());
    for gone in ["notes.txt", "b.txt", "dropped.txt"] {
        assert!(!worktree.join(gone).exists(), "{gone} is reverted away");
    }
    assert!(
        !repo.join("notes.txt").exists(),
        "the repository is untouched"
    );
    w.finish().await;
}
