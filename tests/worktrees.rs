//! Workspaces that are git worktrees, and what changed in a workspace, on both stores, against
//! the echo agent in its own process and real repositories made with the host's `git`: two
//! sessions on one repository work apart and the repository's checkout is untouched; a ref to
//! start from, and a cwd that is no repository's top refused; the diff against the base
//! (untracked files included, as JSON and as a patch); a checkpoint and a `workspace_changed`
//! after each turn that changed files, none after one that did not; a checkpoint's own diff;
//! revert to a checkpoint and to the base (409 while a turn runs); a fork from its parent's
//! files as they are; a worktree's `.git` out of the files API's reach; delete leaves no
//! worktree or branch behind; a gateway without git.

use std::path::Path;

use crate::support;

use serde_json::{Value, json};
use support::git::{git, repository};
use support::*;

both_backends!(
    two_sessions_on_one_repository_work_apart,
    a_worktree_starts_at_its_ref_and_only_from_a_repositorys_top,
    each_turn_that_changes_files_is_a_checkpoint_and_revert_undoes,
    a_worktree_fork_starts_from_its_parents_files,
    without_git_scratch_workspaces_still_serve_files
);

/// A session with a worktree of `repo` (at `reference`, if given): its view.
async fn worktree(gw: &Gateway, repo: &Path, reference: Option<&str>) -> Value {
    let mut workspace = json!({"kind": "worktree"});
    if let Some(r) = reference {
        workspace["ref"] = json!(r);
    }
    let body = json!({"cwd": repo.to_str().unwrap(), "workspace": workspace});
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

fn id_of(view: &Value) -> &str {
    view["sessionId"].as_str().unwrap()
}

async fn put_file(gw: &Gateway, id: &str, path: &str, body: &'static str) {
    let url = gw.url(&format!("/sessions/{id}/files/{path}"));
    let r = reqwest::Client::new()
        .put(url)
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

async fn read_file(gw: &Gateway, id: &str, path: &str) -> (u16, String) {
    let r = gw.get(&format!("/sessions/{id}/files/{path}")).await;
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The diff's files as `(path, status)`, sorted.
async fn changed(gw: &Gateway, id: &str, query: &str) -> Vec<(String, String)> {
    let diff = gw.json(&format!("/sessions/{id}/diff{query}")).await;
    let mut files: Vec<(String, String)> = diff["files"]
        .as_array()
        .unwrap_or_else(|| panic!("{diff}"))
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().into(),
                f["status"].as_str().unwrap().into(),
            )
        })
        .collect();
    files.sort();
    files
}

async fn checkpoints(gw: &Gateway, id: &str) -> Vec<Value> {
    let listed = gw.json(&format!("/sessions/{id}/checkpoints")).await;
    listed["checkpoints"].as_array().unwrap().clone()
}

async fn revert(gw: &Gateway, id: &str, to: &str) -> reqwest::Response {
    gw.post(&format!("/sessions/{id}/revert"), json!({"to": to}))
        .await
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

async fn two_sessions_on_one_repository_work_apart(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let repo = repository(w.dir());
    let head = git(&repo, &["rev-parse", "HEAD"]);
    let (one, two) = (
        worktree(gw, &repo, None).await,
        worktree(gw, &repo, None).await,
    );
    let (a, b) = (id_of(&one), id_of(&two));
    let ws = &one["workspace"];
    assert_eq!(ws["kind"], "worktree", "{one}");
    assert_eq!(ws["base"], head.as_str());
    assert_eq!(ws["branch"], format!("acp/{a}"));
    assert_eq!(ws["repository"], repo.to_str().unwrap());
    assert_eq!(one["cwd"], ws["path"], "the agent works in the worktree");
    assert_ne!(one["cwd"], two["cwd"]);
    assert_eq!(gw.json(&format!("/sessions/{a}")).await["workspace"], *ws);

    assert_eq!(gw.said(a, "/write README.md").await, "wrote README.md");
    put_file(gw, b, "README.md", "two's\n").await;
    assert_eq!(
        read_file(gw, a, "README.md").await.1,
        "echo wrote README.md"
    );
    assert_eq!(
        gw.said(b, "/read README.md").await,
        "read README.md: two's\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        git(&repo, &["status", "--porcelain"]),
        "",
        "the checkout is untouched"
    );
    assert_eq!(git(&repo, &["rev-parse", "--abbrev-ref", "HEAD"]), "main");
    assert_eq!(
        changed(gw, a, "").await,
        pairs(&[("README.md", "modified")])
    );
    // The worktree's `.git` (a file naming its git directory) is git's, never the API's.
    let git_file = format!("/sessions/{a}/files/.git");
    assert_eq!(gw.get(&git_file).await.status(), 403);
    let root = gw.json(&format!("/sessions/{a}/files")).await;
    let names: Vec<&str> = root["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [".gitignore", "README.md", "src"], "no .git listed");
    let r = reqwest::Client::new()
        .put(gw.url(&git_file))
        .body("gitdir: /elsewhere")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(gw.delete(&format!("{git_file}/x")).await.status(), 403);
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("ok.txt"),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"x".to_vec()).file_name(".git"),
        );
    let url = gw.url(&format!("/sessions/{a}/files"));
    let r = reqwest::Client::new()
        .post(url)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        read_file(gw, a, "ok.txt").await.0,
        404,
        "nothing of a refused upload is written"
    );

    let path = ws["path"].as_str().unwrap().to_owned();
    assert_eq!(gw.delete(&format!("/sessions/{a}")).await.status(), 204);
    assert!(
        !Path::new(&path).exists(),
        "the worktree's folder is removed"
    );
    let listed = git(&repo, &["worktree", "list", "--porcelain"]);
    assert!(
        !listed.contains(&path),
        "git knows no stale worktree: {listed}"
    );
    assert!(listed.contains(two["cwd"].as_str().unwrap()), "{listed}");
    let branches = git(&repo, &["branch", "--list", "acp/*"]);
    assert!(!branches.contains(a) && branches.contains(b), "{branches}");
    assert_eq!(
        git(&repo, &["for-each-ref", "refs/acp-gateway"])
            .lines()
            .count(),
        1
    );
    w.finish().await;
}

async fn a_worktree_starts_at_its_ref_and_only_from_a_repositorys_top(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let repo = repository(w.dir());
    let first = git(&repo, &["rev-parse", "HEAD"]);
    git(&repo, &["tag", "v1"]);
    std::fs::write(repo.join("README.md"), "second\n").unwrap();
    git(&repo, &["commit", "-q", "-am", "second"]);
    let at_tag = worktree(gw, &repo, Some("v1")).await;
    assert_eq!(at_tag["workspace"]["base"], first.as_str());
    assert_eq!(
        read_file(gw, id_of(&at_tag), "README.md").await.1,
        "hello\n"
    );
    let at_head = worktree(gw, &repo, None).await;
    assert_eq!(
        read_file(gw, id_of(&at_head), "README.md").await.1,
        "second\n"
    );

    let refused = |cwd: &Path, workspace: Value| json!({"cwd": cwd.to_str().unwrap(), "workspace": workspace});
    let plain = w.dir().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    for (body, says) in [
        (
            refused(&repo, json!({"kind": "worktree", "ref": "nope"})),
            "names no commit",
        ),
        (
            refused(&plain, json!({"kind": "worktree"})),
            "not a git repository",
        ),
        (
            refused(&repo.join("src"), json!({"kind": "worktree"})),
            "name its top level",
        ),
        (
            json!({"workspace": {"kind": "worktree"}}),
            "cwd is required",
        ),
        (
            json!({"workspace": {"kind": "scratch", "ref": "main"}}),
            "is for a worktree",
        ),
    ] {
        let r = gw.post("/sessions", body.clone()).await;
        assert_eq!(r.status(), 422, "{body}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{problem}"
        );
    }
    let listed = git(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(
        listed.matches("worktree ").count(),
        3,
        "no worktree left by a refusal: {listed}"
    );
    w.finish().await;
}

async fn each_turn_that_changes_files_is_a_checkpoint_and_revert_undoes(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let repo = repository(w.dir());
    let view = worktree(gw, &repo, None).await;
    let (id, base) = (id_of(&view), view["workspace"]["base"].as_str().unwrap());
    assert!(checkpoints(gw, id).await.is_empty());

    gw.said(id, "/write notes.txt").await;
    let first = checkpoints(gw, id).await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        (first[0]["parent"].as_str(), first[0]["reason"].as_str()),
        (Some(base), Some("turn"))
    );
    let history = gw.history(id).await;
    let changes: Vec<&Value> = history
        .iter()
        .filter(|e| e["event"] == "workspace_changed")
        .collect();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0]["data"]["paths"], json!(["notes.txt"]));
    assert_eq!(changes[0]["data"]["checkpoint"]["id"], first[0]["id"]);
    let ended = history
        .iter()
        .rposition(|e| e["event"] == "turn_ended")
        .unwrap();
    let told = history
        .iter()
        .rposition(|e| e["event"] == "workspace_changed")
        .unwrap();
    assert!(told < ended, "the checkpoint is told before the turn's end");

    put_file(gw, id, "README.md", "changed\n").await;
    std::fs::create_dir_all(Path::new(view["cwd"].as_str().unwrap()).join("target")).unwrap();
    std::fs::write(
        Path::new(view["cwd"].as_str().unwrap()).join("target/out"),
        "ignored",
    )
    .unwrap();
    assert_eq!(
        changed(gw, id, "").await,
        pairs(&[("README.md", "modified"), ("notes.txt", "added")]),
        "untracked files count, ignored ones do not"
    );
    let patch = reqwest::Client::new()
        .get(gw.url(&format!("/sessions/{id}/diff")))
        .header("accept", "text/x-diff")
        .send()
        .await
        .unwrap();
    assert_eq!(
        patch.headers()["content-type"],
        "text/x-diff; charset=utf-8"
    );
    let patch = patch.text().await.unwrap();
    assert!(
        patch.contains("-hello\n+changed\n") && patch.contains("+echo wrote notes.txt"),
        "{patch}"
    );

    gw.said(id, "/write b.txt").await;
    gw.said(id, "nothing changes").await;
    let second = checkpoints(gw, id).await;
    assert_eq!(
        second.len(),
        2,
        "a turn that changed nothing is no checkpoint: {second:?}"
    );
    assert_eq!(second[0]["parent"], first[0]["id"]);
    let own = format!("?checkpoint={}", second[0]["id"].as_str().unwrap());
    assert_eq!(
        changed(gw, id, &own).await,
        pairs(&[("README.md", "modified"), ("b.txt", "added")])
    );
    let r = gw
        .get(&format!("/sessions/{id}/diff?checkpoint={base}"))
        .await;
    assert_eq!(r.status(), 404);

    let r = revert(gw, id, first[0]["id"].as_str().unwrap()).await;
    assert_eq!(r.status(), 200);
    let now: Value = r.json().await.unwrap();
    assert_eq!(
        now["reason"],
        format!("revert to {}", first[0]["id"].as_str().unwrap())
    );
    assert_eq!(read_file(gw, id, "README.md").await.1, "hello\n");
    assert_eq!(read_file(gw, id, "b.txt").await.0, 404);
    assert_eq!(
        read_file(gw, id, "notes.txt").await.1,
        "echo wrote notes.txt"
    );
    assert_eq!(
        checkpoints(gw, id).await.len(),
        3,
        "the revert is a checkpoint too"
    );
    assert_eq!(revert(gw, id, "base").await.status(), 200);
    assert_eq!(changed(gw, id, "").await, Vec::new());
    assert!(
        Path::new(view["cwd"].as_str().unwrap())
            .join("target/out")
            .exists(),
        "ignored files stay"
    );
    // The revert is undone by reverting to the checkpoint before it.
    assert_eq!(
        revert(gw, id, now["id"].as_str().unwrap()).await.status(),
        200
    );
    assert_eq!(read_file(gw, id, "notes.txt").await.0, 200);
    assert_eq!(revert(gw, id, "0000000").await.status(), 404);

    gw.prompt_async(id, "/hang").await;
    let status = format!("/sessions/{id}/status");
    gw.wait_until(|g| {
        let status = status.clone();
        async move { g.json(&status).await["activity"] == "running" }
    })
    .await;
    assert_eq!(
        revert(gw, id, "base").await.status(),
        409,
        "not while a turn runs"
    );
    assert_eq!(gw.session_action(id, "cancel").await.status(), 204);
    w.finish().await;
}

async fn a_worktree_fork_starts_from_its_parents_files(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_CAPS", "list,delete,resume,close,load,fork");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let repo = repository(w.dir());
    let parent = worktree(gw, &repo, None).await;
    let id = id_of(&parent);
    gw.said(id, "/write notes.txt").await;
    put_file(gw, id, "README.md", "unsaved\n").await;
    let r = gw.post(&format!("/sessions/{id}/fork"), json!({})).await;
    assert_eq!(r.status(), 201);
    let fork: Value = r.json().await.unwrap();
    let fork_id = id_of(&fork);
    assert_eq!(fork["workspace"]["kind"], "worktree", "{fork}");
    assert_eq!(fork["workspace"]["branch"], format!("acp/{fork_id}"));
    assert_ne!(fork["cwd"], parent["cwd"]);
    assert_eq!(read_file(gw, fork_id, "README.md").await.1, "unsaved\n");
    assert_eq!(
        read_file(gw, fork_id, "notes.txt").await.1,
        "echo wrote notes.txt"
    );
    assert_eq!(
        changed(gw, fork_id, "").await,
        Vec::new(),
        "its base is its parent's files"
    );
    put_file(gw, fork_id, "README.md", "the fork's\n").await;
    assert_eq!(read_file(gw, id, "README.md").await.1, "unsaved\n");
    w.finish().await;
}

async fn without_git_scratch_workspaces_still_serve_files(backend: Backend) {
    let opts = Options::default().env("ACP_GATEWAY_GIT", "/nonexistent/git");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let repo = repository(w.dir());
    let body = json!({"cwd": repo.to_str().unwrap(), "workspace": {"kind": "worktree"}});
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 501);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("worktree workspaces are off"),
        "{problem}"
    );
    let r = gw
        .post("/sessions", json!({"workspace": {"kind": "scratch"}}))
        .await;
    assert_eq!(r.status(), 201);
    let view: Value = r.json().await.unwrap();
    let id = id_of(&view);
    assert!(view["workspace"]["base"].is_null(), "{view}");
    put_file(gw, id, "a.txt", "kept").await;
    assert_eq!(read_file(gw, id, "a.txt").await.1, "kept");
    assert_eq!(gw.get(&format!("/sessions/{id}/diff")).await.status(), 501);
    gw.said(id, "/write b.txt").await;
    w.finish().await;
}
