//! A session's workspace and its files over HTTP, on both stores, against the echo agent in
//! its own process: a scratch workspace made for the session (its `cwd`, empty, its own);
//! files written, read (ETag, If-None-Match, Range), overwritten with `If-Match` (412 when
//! stale), listed and deleted through the API and seen by the agent, the agent's files seen
//! through the API; every way out refused (`..`, encoded, absolute, a symlink the agent made);
//! a `.json` file served byte for byte; a prompt's links only to the workspace's files; a fork
//! from a copy of its parent's files; several files uploaded in one multipart body (every path
//! checked first, the body bounded); the workspace removed with the session.

use crate::support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::raw::raw;
use support::*;

both_backends!(
    a_scratch_workspace_is_the_sessions_own,
    files_written_and_read_through_the_api_and_by_the_agent,
    no_path_leads_out_of_the_workspace,
    a_prompt_links_only_the_workspaces_files,
    a_fork_starts_from_its_parents_files,
    several_files_are_uploaded_at_once
);

/// A session created with a scratch workspace: its view.
async fn scratch(gw: &Gateway) -> Value {
    let r = gw
        .post("/sessions", json!({"workspace": {"kind": "scratch"}}))
        .await;
    assert_eq!(r.status(), 201);
    r.json().await.unwrap()
}

fn files_url(id: &str, path: &str) -> String {
    format!("/sessions/{id}/files/{path}")
}

async fn put(
    gw: &Gateway,
    path: &str,
    body: &'static [u8],
    if_match: Option<&str>,
) -> reqwest::Response {
    let mut req = reqwest::Client::new().put(gw.url(path)).body(body);
    if let Some(tag) = if_match {
        req = req.header("if-match", tag);
    }
    req.send().await.unwrap()
}

async fn a_scratch_workspace_is_the_sessions_own(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let (one, two) = (scratch(gw).await, scratch(gw).await);
    let path = one["workspace"]["path"].as_str().unwrap().to_owned();
    assert_eq!(one["workspace"]["kind"], "scratch", "{one}");
    assert_eq!(one["cwd"], path.as_str(), "the agent works in it: {one}");
    assert_ne!(two["cwd"], one["cwd"], "each session its own");
    assert!(std::fs::read_dir(&path).unwrap().next().is_none(), "empty");
    let id = one["sessionId"].as_str().unwrap();
    assert_eq!(
        gw.json(&format!("/sessions/{id}")).await["workspace"],
        one["workspace"]
    );
    let listed = gw.json(&format!("/sessions/{id}/files")).await;
    assert_eq!(listed["entries"], json!([]), "{listed}");

    // The agent's working directory is the workspace; its file is the session's own.
    assert_eq!(gw.said(id, "/write mine.txt").await, "wrote mine.txt");
    let other = two["sessionId"].as_str().unwrap();
    assert!(gw.said(other, "/read mine.txt").await.contains("error"));

    // A workspace with a cwd, or a session without either, is refused; so is a plain session's
    // files request.
    for body in [
        json!({"cwd": "/tmp", "workspace": {"kind": "scratch"}}),
        json!({}),
        json!({"workspace": {"kind": "elsewhere"}}),
    ] {
        let r = gw.post("/sessions", body.clone()).await;
        assert_eq!(r.status(), 422, "{body}");
    }
    let plain = gw.create("/tmp").await;
    let r = gw.get(&format!("/sessions/{plain}/files")).await;
    assert_eq!(r.status(), 409);

    // Deleted with its session.
    assert_eq!(gw.delete(&format!("/sessions/{id}")).await.status(), 204);
    assert!(!std::path::Path::new(&path).exists(), "{path} removed");
    let r = gw.get(&format!("/sessions/{id}/files")).await;
    assert_eq!(r.status(), 404);
    w.finish().await;
}

async fn files_written_and_read_through_the_api_and_by_the_agent(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let view = scratch(gw).await;
    let id = view["sessionId"].as_str().unwrap();
    let root = view["workspace"]["path"].as_str().unwrap();

    let url = files_url(id, "notes/todo.md");
    let r = put(gw, &url, b"hello world", None).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    let written: Value = r.json().await.unwrap();
    assert_eq!(written["size"], 11);
    assert_eq!(written["uri"], format!("file://{root}/notes/todo.md"));
    assert_eq!(
        gw.said(id, "/read notes/todo.md").await,
        "read notes/todo.md: hello world"
    );

    let r = gw.get(&url).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(r.headers()["content-type"], "text/markdown");
    assert_eq!(r.text().await.unwrap(), "hello world");
    let get = |headers: &'static [(&'static str, &'static str)]| {
        let mut req = reqwest::Client::new().get(gw.url(&url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    let r = reqwest::Client::new()
        .get(gw.url(&url))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    let r = get(&[("range", "bytes=6-")]).await.unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.headers()["content-range"], "bytes 6-10/11");
    assert_eq!(r.text().await.unwrap(), "world");
    let r = get(&[("range", "bytes=-5")]).await.unwrap();
    assert_eq!(r.text().await.unwrap(), "world");
    let r = get(&[("range", "bytes=20-30")]).await.unwrap();
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers()["content-range"], "bytes */11");

    // If-Match: over the version it names only.
    let r = put(gw, &url, b"second", Some(&etag)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let second = r.headers()["etag"].to_str().unwrap().to_owned();
    assert_ne!(second, etag);
    let r = put(gw, &url, b"lost update", Some(&etag)).await;
    assert_eq!(r.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(gw.get(&url).await.text().await.unwrap(), "second");
    let r = put(gw, &files_url(id, "new.txt"), b"x", Some("*")).await;
    assert_eq!(
        r.status(),
        StatusCode::PRECONDITION_FAILED,
        "If-Match * needs the file"
    );

    // The agent's files, seen through the API; a folder is listed.
    assert_eq!(gw.said(id, "/write src/lib.rs").await, "wrote src/lib.rs");
    let r = gw.get(&files_url(id, "src/lib.rs")).await;
    assert_eq!(r.text().await.unwrap(), "echo wrote src/lib.rs");
    let top = gw.json(&format!("/sessions/{id}/files")).await;
    let names: Vec<(&str, &str)> = top["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("notes", "folder"), ("src", "folder")], "{top}");
    let src = gw.json(&files_url(id, "src")).await;
    assert_eq!(src["entries"][0]["name"], "lib.rs", "{src}");
    assert_eq!(
        src["entries"][0]["uri"],
        format!("file://{root}/src/lib.rs")
    );

    // A JSON file is served as its bytes, whatever they hold.
    let bytes: &'static [u8] = "{\"mark\": \"\u{FDD0}\\ud83d\", \"n\": 1e999}".as_bytes();
    let r = put(gw, &files_url(id, "data.json"), bytes, None).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = gw.get(&files_url(id, "data.json")).await;
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.bytes().await.unwrap(), bytes);

    // Deleted through the API: gone for the agent too; a folder with all it holds.
    let r = gw.delete(&files_url(id, "notes/todo.md")).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(gw.said(id, "/read notes/todo.md").await.contains("error"));
    assert_eq!(gw.get(&url).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        gw.delete(&files_url(id, "src")).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        gw.get(&files_url(id, "src/lib.rs")).await.status(),
        StatusCode::NOT_FOUND
    );
    w.finish().await;
}

async fn no_path_leads_out_of_the_workspace(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let view = scratch(gw).await;
    let id = view["sessionId"].as_str().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    let out = outside.path().display().to_string();
    assert_eq!(
        gw.said(id, &format!("/link out {out} /link up ..")).await,
        "linked outlinked up"
    );
    put(gw, &files_url(id, "inside.txt"), b"in", None).await;

    // Refused before they are looked up: climbing, encoded or not, and absolute paths (sent
    // raw: an HTTP client would resolve the dots away).
    let host = gw.base.strip_prefix("http://").unwrap().to_owned();
    for path in [
        "../x",
        "a/../../x",
        "%2e%2e/x",
        "..%2Fx",
        "%2Fetc%2Fhostname",
    ] {
        let url = files_url(id, path);
        for method in ["GET", "PUT", "DELETE"] {
            let (status, problem) = raw(gw, method, &url, &[("Host", &host)], None).await;
            assert_eq!(status, 400, "{method} {path}: {problem}");
        }
    }
    // A name longer than the file system takes is the client's error, not the server's.
    let long = "x".repeat(300);
    let r = put(gw, &files_url(id, &long), b"x", None).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        gw.get(&files_url(id, &long)).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // Through the agent's symlinks: refused when followed, whatever the method.
    for path in ["out/secret.txt", "up/etc/hostname", "out"] {
        let r = gw.get(&files_url(id, path)).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "GET {path}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains("outside"),
            "{problem}"
        );
    }
    let r = put(gw, &files_url(id, "out/new.txt"), b"pwned", None).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!outside.path().join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "secret"
    );
    // Listed as links; deleting one removes the link only.
    let top = gw.json(&format!("/sessions/{id}/files")).await;
    let out_entry = top["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "out")
        .unwrap();
    assert_eq!(out_entry["kind"], "symlink", "{top}");
    assert_eq!(
        gw.delete(&files_url(id, "out")).await.status(),
        StatusCode::NO_CONTENT
    );
    assert!(outside.path().join("secret.txt").exists());
    w.finish().await;
}

/// A prompt's `resource_link` to a `file://` URI passes when it names a file of the session's
/// workspace (as a listing gives it), and is 422 when it leads anywhere else: another folder,
/// `..`, or the agent's symlink out. A session without a workspace links what it likes.
async fn a_prompt_links_only_the_workspaces_files(backend: Backend) {
    let w = World::start(backend, Options::default()).await;
    let gw = w.gw();
    let view = scratch(gw).await;
    let id = view["sessionId"].as_str().unwrap();
    let root = view["workspace"]["path"].as_str().unwrap();
    put(gw, &files_url(id, "spec.md"), b"# Spec", None).await;
    assert_eq!(gw.said(id, "/link out /etc").await, "linked out");
    let listed = gw.json(&format!("/sessions/{id}/files")).await;
    let spec = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "spec.md")
        .unwrap();
    let link = |uri: &str| {
        json!({"prompt": [
            {"type": "text", "text": "read this"},
            {"type": "resource_link", "uri": uri, "name": "the file"},
        ]})
    };
    let prompt_path = format!("/sessions/{id}/prompt");
    let prompt = |body: Value| gw.post(&prompt_path, body);
    let r = prompt(link(spec["uri"].as_str().unwrap())).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for uri in [
        "file:///etc/hostname".to_owned(),
        format!("file://{root}/../other/x"),
        format!("file://{root}/%2E%2E/x"),
        format!("file://{root}/out/hostname"),
        format!("file://{root}-sibling/x"),
    ] {
        let r = prompt(link(&uri)).await;
        assert_eq!(r.status(), 422, "{uri}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains("outside"),
            "{problem}"
        );
    }
    // An http link, or a plain session's file link, is the agent's business.
    assert_eq!(prompt(link("https://example.org/x")).await.status(), 200);
    let plain = gw.create("/tmp").await;
    let r = gw
        .post(
            &format!("/sessions/{plain}/prompt"),
            link("file:///etc/hostname"),
        )
        .await;
    assert_eq!(r.status(), 200);
    w.finish().await;
}

/// A fork of a session with a workspace starts from a copy of its parent's files, in a
/// workspace of its own: what either writes afterwards, the other does not see.
async fn a_fork_starts_from_its_parents_files(backend: Backend) {
    let opts = Options::default().env("ECHO_AGENT_CAPS", "list,delete,resume,close,load,fork");
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let parent = scratch(gw).await;
    let id = parent["sessionId"].as_str().unwrap();
    assert_eq!(gw.said(id, "/write notes/a.txt").await, "wrote notes/a.txt");
    let r = gw.post(&format!("/sessions/{id}/fork"), json!({})).await;
    assert_eq!(r.status(), 201);
    let fork: Value = r.json().await.unwrap();
    let fork_id = fork["sessionId"].as_str().unwrap();
    assert_eq!(fork["workspace"]["kind"], "scratch", "{fork}");
    assert_ne!(fork["workspace"]["path"], parent["workspace"]["path"]);
    assert_eq!(fork["cwd"], fork["workspace"]["path"]);
    let copied = gw.get(&files_url(fork_id, "notes/a.txt")).await;
    assert_eq!(copied.text().await.unwrap(), "echo wrote notes/a.txt");

    put(gw, &files_url(fork_id, "notes/a.txt"), b"the fork's", None).await;
    assert_eq!(
        gw.said(fork_id, "/read notes/a.txt").await,
        "read notes/a.txt: the fork's"
    );
    let original = gw.get(&files_url(id, "notes/a.txt")).await;
    assert_eq!(original.text().await.unwrap(), "echo wrote notes/a.txt");
    assert_eq!(gw.said(id, "/write b.txt").await, "wrote b.txt");
    let r = gw.get(&files_url(fork_id, "b.txt")).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    w.finish().await;
}

async fn several_files_are_uploaded_at_once(backend: Backend) {
    let opts = Options::default().args(&["--max-body-bytes", "4096"]);
    let w = World::start(backend, opts).await;
    let gw = w.gw();
    let id = scratch(gw).await["sessionId"].as_str().unwrap().to_owned();
    let upload = |parts: Vec<(&'static str, &'static str, Vec<u8>)>| {
        let mut form = reqwest::multipart::Form::new();
        for (name, path, bytes) in parts {
            form = form.part(name, reqwest::multipart::Part::bytes(bytes).file_name(path));
        }
        reqwest::Client::new()
            .post(gw.url(&format!("/sessions/{id}/files")))
            .multipart(form)
            .send()
    };
    let r = upload(vec![
        ("file", "a.txt", b"first".to_vec()),
        ("file", "docs/deep/b.md", b"# second".to_vec()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let written: Value = r.json().await.unwrap();
    let paths: Vec<&str> = written["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["a.txt", "docs/deep/b.md"]);
    assert!(
        written["files"][1]["uri"]
            .as_str()
            .unwrap()
            .starts_with("file:///")
    );
    assert_eq!(
        gw.said(&id, "/read docs/deep/b.md").await,
        "read docs/deep/b.md: # second"
    );

    // One path out of the workspace: nothing is written.
    let r = upload(vec![
        ("file", "c.txt", b"third".to_vec()),
        ("file", "../escape.txt", b"out".to_vec()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        gw.get(&files_url(&id, "c.txt")).await.status(),
        StatusCode::NOT_FOUND
    );
    let r = upload(vec![("notes", "d.txt", b"x".to_vec())])
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a part not named file");
    let r = upload(vec![("file", "big.bin", vec![7u8; 8192])])
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        gw.get(&files_url(&id, "big.bin")).await.status(),
        StatusCode::NOT_FOUND
    );
    let r = reqwest::Client::new()
        .post(gw.url(&format!("/sessions/{id}/files")))
        .json(&json!({"a.txt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "not multipart");
    w.finish().await;
}
