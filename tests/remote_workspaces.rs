//! Workspaces of an agent reached over the network whose host is another gateway, through a
//! front on each store (over WebSocket): the front asks the host for the workspace
//! (`_meta.workspace`), shows it as the host made it, and sends every files, diff,
//! checkpoints and revert request there with the host's key (the front's callers send none).
//! Files written through the front and by the agent's turns are on the host's disk; a path
//! that the host would resolve to another session's files is 400 at the front; a worktree of a
//! repository on the host; delete at the front removes the host's worktree, and never the
//! folder of a host that keeps it. With two front replicas on one PostgreSQL database, the one
//! not holding the session forwards to the one that does, which asks the host.

use std::path::Path;

use crate::remote_agents::{HOST_KEY, front, front_options, host, host_options, url_of};
use crate::support;

use serde_json::{Value, json};
use support::git::{git, repository};
use support::raw::raw;
use support::*;

both_backends!(
    a_hosts_scratch_workspace_through_the_front,
    a_hosts_worktree_through_the_front
);

/// A session made at the front with `workspace`: its view there.
async fn made(gw: &Gateway, body: Value) -> Value {
    let r = gw.post("/sessions", body).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

/// `body` written to `path` in session `id`'s workspace through `gw`.
async fn write_file(gw: &Gateway, id: &str, path: &str, body: &'static str) -> reqwest::Response {
    let url = gw.url(&format!("/sessions/{id}/files/{path}"));
    gw.http.put(url).body(body).send().await.unwrap()
}

/// The host's own view of session `id` (its key required).
async fn on_host(host: &World, id: &str) -> reqwest::Response {
    let url = host.gw().url(&format!("/sessions/{id}"));
    let r = host.gw().http.get(url).bearer_auth(HOST_KEY).send().await;
    r.unwrap()
}

async fn a_hosts_scratch_workspace_through_the_front(backend: Backend) {
    // The host keeps a deleted session's folder: the front, deleting, must not remove it.
    let host = World::start(Backend::Sqlite, host_options().arg("--keep-workspaces")).await;
    let dir = tempfile::tempdir().unwrap();
    let front = front(backend, &url_of(&host, "ws"), dir.path()).await;
    let gw = front.gw();
    let view = made(gw, json!({"workspace": {"kind": "scratch"}})).await;
    let id = view["sessionId"].as_str().unwrap();
    let there: Value = on_host(&host, id).await.json().await.unwrap();
    assert_eq!(
        view["workspace"], there["workspace"],
        "shown as the host made it"
    );
    let folder = Path::new(there["workspace"]["path"].as_str().unwrap()).to_owned();
    assert!(
        folder.starts_with(host.dir()),
        "on the host's disk: {folder:?}"
    );
    assert_eq!(view["cwd"], there["cwd"]);

    // Written through the front: on the host's disk, read back through the front.
    let put = write_file(gw, id, "notes/a.txt", "from the front\n").await;
    assert_eq!(put.status(), 201);
    assert!(put.headers().contains_key("etag"));
    let on_disk = std::fs::read_to_string(folder.join("notes/a.txt")).unwrap();
    assert_eq!(on_disk, "from the front\n");
    let listed = gw.json(&format!("/sessions/{id}/files/notes")).await;
    assert_eq!(listed["entries"][0]["name"], "a.txt", "{listed}");

    // The agent's turn writes on the host; the host checkpoints it, the front shows it.
    gw.said(id, "/write b.txt").await;
    let r = gw.get(&format!("/sessions/{id}/files/b.txt")).await;
    assert_eq!(r.text().await.unwrap(), "echo wrote b.txt");
    assert_eq!(gw.changed_paths(id).await, ["b.txt", "notes/a.txt"]);
    let checkpoints = gw.json(&format!("/sessions/{id}/checkpoints")).await;
    assert_eq!(checkpoints["checkpoints"].as_array().unwrap().len(), 1);
    let r = gw
        .post(&format!("/sessions/{id}/revert"), json!({"to": "base"}))
        .await;
    assert_eq!(r.status(), 200);
    assert!(!folder.join("b.txt").exists() && !folder.join("notes").exists());

    // Escapes are refused by the host, as for its own clients; an unknown session here too.
    let r = gw.get(&format!("/sessions/{id}/files/..%2fx")).await;
    assert_eq!(r.status(), 400);
    assert_eq!(gw.get("/sessions/nope/files").await.status(), 404);
    // A path the host's URL parser would resolve to another session's files (which the host
    // serves the front's token) never leaves the front.
    let other = made(gw, json!({"workspace": {"kind": "scratch"}})).await;
    let other = other["sessionId"].as_str().unwrap();
    assert_eq!(
        write_file(gw, other, "secret.txt", "secret").await.status(),
        201
    );
    let address = gw.base.strip_prefix("http://").unwrap();
    for sneaky in [
        format!("/sessions/{id}/files/%2e%2e/%2e%2e/{other}/files/secret.txt"),
        format!("/sessions/{id}/files/../../{other}/files/secret.txt"),
        format!("/sessions/{id}/files/.%2E/.%2e/{other}/files/secret.txt"),
    ] {
        let (status, body) = raw(gw, "GET", &sneaky, &[("Host", address)], None).await;
        assert_eq!(status, 400, "{sneaky}: {body}");
        assert!(!body.ends_with("secret"), "{body}");
    }

    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    assert_eq!(on_host(&host, id).await.status(), 404);
    assert!(
        folder.exists(),
        "the host keeps it; the front never removes the host's files"
    );
    front.finish().await;
    host.finish().await;
}

async fn a_hosts_worktree_through_the_front(backend: Backend) {
    let host = host().await;
    let repo = repository(host.dir());
    let dir = tempfile::tempdir().unwrap();
    let front = front(backend, &url_of(&host, "ws"), dir.path()).await;
    let gw = front.gw();
    let body = json!({"cwd": repo.to_str().unwrap(), "workspace": {"kind": "worktree"}});
    let view = made(gw, body).await;
    let id = view["sessionId"].as_str().unwrap();
    assert_eq!(view["workspace"]["kind"], "worktree");
    assert_eq!(view["workspace"]["branch"], json!(format!("acp/{id}")));
    let readme = gw.get(&format!("/sessions/{id}/files/README.md")).await;
    assert_eq!(readme.text().await.unwrap(), "hello\n");
    gw.said(id, "/write notes.txt").await;
    assert_eq!(gw.changed_paths(id).await, ["notes.txt"]);
    assert!(
        !repo.join("notes.txt").exists(),
        "the repository is untouched"
    );

    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    let listed = git(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(listed.matches("worktree ").count(), 1, "{listed}");
    front.finish().await;
    host.finish().await;
}

#[tokio::test]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn a_front_replica_forwards_to_the_one_that_asks_the_host() {
    let host = host().await;
    let dir = tempfile::tempdir().unwrap();
    let opts = front_options(&url_of(&host, "ws"), dir.path(), HOST_KEY, 5);
    let a = World::start(Backend::Postgres, opts.clone()).await;
    let b = Gateway::spawn(&a.db.url, a.dir.path(), &opts).await;
    for g in [a.gw(), &b] {
        g.wait_until(|g| async move {
            g.json("/agent").await["replicas"].as_array().unwrap().len() == 2
        })
        .await;
    }
    let view = made(a.gw(), json!({"workspace": {"kind": "scratch"}})).await;
    let id = view["sessionId"].as_str().unwrap();
    assert_eq!(a.gw().json("/agent").await["members"][0]["sessions"], 1);
    // `b` forwards to `a`, which holds the session and sends it on to the host.
    assert_eq!(write_file(&b, id, "a.txt", "through b").await.status(), 201);
    let r = b.get(&format!("/sessions/{id}/files/a.txt")).await;
    assert_eq!(r.text().await.unwrap(), "through b");
    assert_eq!(b.changed_paths(id).await, ["a.txt"]);
    b.stop().await;
    a.finish().await;
    host.finish().await;
}
