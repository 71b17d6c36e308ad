//! Upgrades: the stores earlier releases wrote (`tests/fixtures/stores/<release>/`, made by
//! `scripts/store-fixture.py` with that release's binaries) are migrated by this one and
//! served whole: every tenant reads the sessions, histories, webhooks, outbox and usage the
//! release showed before it stopped. And on PostgreSQL, where replicas of two releases share
//! the database during a rolling upgrade, every statement the earlier release ran still
//! prepares on the migrated schema: migrations only add, so an older replica keeps working.

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use sqlx::{Connection as _, Executor as _};
use support::seen::{ACME, GLOBEX, assert_same, seen, two_tenants};
use support::*;

/// The gateway of the fixtures' scenario, its webhooks' deliveries never too old to retry.
/// Its agent is a new one, which never heard of the fixtures' sessions: it lists none, so
/// that no list sync takes them for sessions the agent lost.
fn opts() -> Options {
    two_tenants()
        .args(&["--webhook-max-age", "3153600000"])
        .env("ECHO_AGENT_CAPS", "load,resume,close,delete")
}

/// Each release's fixtures folder.
fn releases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stores");
    let mut all: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    assert!(!all.is_empty(), "no store fixtures");
    all
}

/// Serves `url` with this release and checks that it shows what `expected` says.
async fn serves_whole(url: &str, dir: &Path, expected: &Value, release: &Path) {
    let gw = Gateway::spawn(url, dir, &opts()).await;
    let now = (seen(&gw, ACME).await, seen(&gw, GLOBEX).await);
    let then = (expected["acme"].clone(), expected["globex"].clone());
    assert!(
        then.0["sessions"].as_array().is_some_and(|s| s.len() >= 2),
        "{}: the fixture holds sessions",
        release.display()
    );
    assert_same(&then, &now);
    gw.stop().await;
}

fn expected(release: &Path) -> Value {
    let text = std::fs::read_to_string(release.join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stores_of_earlier_releases_upgrade_and_serve_whole() {
    for release in releases() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gateway.db");
        std::fs::copy(release.join("sqlite.db"), &file).unwrap();
        let url = format!("sqlite:{}", file.display());
        serves_whole(&url, dir.path(), &expected(&release)["sqlite"], &release).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
async fn postgres_stores_of_earlier_releases_upgrade_serve_whole_and_keep_their_queries() {
    for release in releases() {
        let dir = tempfile::tempdir().unwrap();
        let db =
            postgres::FreshDatabase::create("upgrade", postgres::Collation::ServerDefault).await;
        let dump = std::fs::read_to_string(release.join("postgres.sql")).unwrap();
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        conn.execute(dump.as_str()).await.unwrap();
        conn.close().await.unwrap();
        serves_whole(
            &db.url,
            dir.path(),
            &expected(&release)["postgres"],
            &release,
        )
        .await;

        // The earlier release's statements, on the schema this one migrated.
        let queries = std::fs::read_to_string(release.join("postgres-queries.sql")).unwrap();
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let (mut failed, mut untyped) = (Vec::new(), 0);
        for sql in queries.lines().filter(|l| !l.trim().is_empty()) {
            match conn.prepare(sql).await {
                Ok(_) => {}
                // A parameter only its bound value gives a type to (`$1 IS NULL`): the schema
                // is not what refuses it.
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("42P08" | "42P18")) =>
                {
                    untyped += 1
                }
                Err(e) => failed.push(format!("{sql}\n  {e}")),
            }
        }
        assert!(untyped < 10, "{untyped} statements could not be typed");
        assert!(
            failed.is_empty(),
            "{}: statements of that release no longer prepare:\n{}",
            release.display(),
            failed.join("\n")
        );
        assert!(
            queries.lines().count() > 50,
            "the release's statements were recorded"
        );
        conn.close().await.unwrap();
        db.remove().await;
    }
}
