//! Database URLs a new user gets wrong, tried as they would: the gateway (and `migrate`) says
//! once, on stderr, before anything says it listens, which URL, what is wrong and what to do,
//! and exits non-zero. A PostgreSQL that is not running, a scheme the gateway does not speak,
//! an SQLite file in a folder that does not exist or a file that is not SQLite; with
//! PostgreSQL, a database that does not exist and a user it refuses.

use crate::support;

use std::process::Stdio;

use support::*;

/// What the gateway does with `--database-url url` (after `command`, if any): its exit code,
/// its stdout and its stderr.
async fn said(command: Option<&str>, url: &str) -> (Option<i32>, String, String) {
    let opts = Options::default();
    let mut cmd = tokio::process::Command::new(&opts.binary);
    cmd.args(command)
        .arg("--agent")
        .arg(&opts.agent)
        .args(["--listen", "127.0.0.1:0", "--database-url", url])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("the gateway gave up on the database in time")
        .unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// The gateway fails with one line naming `shown` and saying each of `says`.
async fn refused(url: &str, shown: &str, says: &[&str]) {
    for command in [None, Some("migrate")] {
        let (code, stdout, stderr) = said(command, url).await;
        assert_eq!(code, Some(1), "{command:?} {url}: {stdout}{stderr}");
        assert!(!stdout.contains("listening"), "{url}: {stdout}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "said once: {stderr}");
        let line = lines[0];
        assert!(line.starts_with("acp-gateway: "), "{line}");
        assert!(line.contains(shown), "{shown:?} is not in {line}");
        for said in says {
            assert!(line.contains(said), "{said:?} is not in {line}");
        }
        for noise in [
            "pool timed out",
            "error returned from database",
            "gateway-lock",
        ] {
            assert!(!line.contains(noise), "{noise:?} in {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_database_urls_are_explained_once_before_listening() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let url = format!("postgres://ann:secret@127.0.0.1:{port}/test");
    let shown = format!("postgres://***@127.0.0.1:{port}/test");
    refused(&url, &shown, &["connection refused", "Start it"]).await;

    refused(
        "mysql://root@127.0.0.1/test",
        "mysql://***@127.0.0.1/test",
        &["mysql:// is not a database", "sqlite:PATH"],
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("missing/folder/gateway.db");
    let folder = dir.path().join("missing/folder");
    let url = format!("sqlite:{}", file.display());
    let mkdir = format!("mkdir -p {}", folder.display());
    refused(&url, &url, &["does not exist", &mkdir]).await;
    assert!(!folder.exists(), "nothing was made");

    let not_sqlite = dir.path().join("notes.txt");
    std::fs::write(&not_sqlite, "these are notes, not a database\n".repeat(200)).unwrap();
    let url = not_sqlite.display().to_string();
    refused(&url, &url, &["is not an SQLite database"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn wrong_postgres_databases_and_users_are_explained() {
    let admin = postgres::required_admin_url();
    let url = postgres::with_database(&admin, "acp_gateway_no_such_db");
    let shown = acp_gateway::redact::url(&url);
    refused(
        &url,
        &shown,
        &["\"acp_gateway_no_such_db\" does not exist", "createdb"],
    )
    .await;

    let mut nobody = reqwest::Url::parse(&admin).unwrap();
    nobody.set_username("acp_gateway_nobody").unwrap();
    let shown = acp_gateway::redact::url(nobody.as_str());
    refused(
        nobody.as_str(),
        &shown,
        &["refused the login", "user and password"],
    )
    .await;
}
