//! The store contract suite: one set of `check_*` functions, written against `dyn Store`, each
//! run as its own test against every backend, on a database of its own: SQLite on a temporary
//! file (`sqlite::…`, which also reopens it) and in memory (`sqlite_memory::…`), and PostgreSQL
//! on a throwaway database created under `DATABASE_URL` (`postgres::…`; skipped, loudly, when
//! that variable is unset; failing when it is set but the server cannot be reached). The
//! replica registry checks run where there is a registry (PostgreSQL), the held-session checks
//! where there is none (SQLite).

mod events;
mod listing;
mod reopen;
mod replicas;
mod sessions;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io::Write;
use std::sync::Arc;

use acp_gateway::store::{
    self, Database, HeldSessions, ListCursor, ListQuery, NewEvent, NewLifecycleEvent, Origin,
    PgStore, ReplicaRegistry, Replicas, SessionRecord, SqliteStore, Store, StoredEvent,
};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use sqlx::Connection;
use tokio::task::JoinSet;

/// An arbitrary instant with a non-zero microsecond part: 2023-11-14T22:13:20.123456Z.
const T0: i64 = 1_700_000_000_123_456;

fn ts(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).expect("timestamp in range")
}

/// A minimal live session: no title, no meta, no extra directories.
fn record(id: &str, tenant: &str) -> SessionRecord {
    SessionRecord {
        session_id: id.to_owned(),
        tenant: tenant.to_owned(),
        cwd: "/work/default".to_owned(),
        additional_directories: Vec::new(),
        title: None,
        updated_at: ts(T0),
        created_at: ts(T0),
        meta: None,
        archived: false,
        origin: Origin::Gateway,
        deleted_at: None,
        synced_at: None,
    }
}

fn event(kind: &str, payload: Value) -> NewEvent {
    NewEvent {
        kind: kind.to_owned(),
        payload,
    }
}

fn ids(records: &[SessionRecord]) -> Vec<String> {
    records.iter().map(|r| r.session_id.clone()).collect()
}

/// `records` in list order: `updated_at` descending, then `session_id` descending (byte order).
fn list_order(mut records: Vec<SessionRecord>) -> Vec<SessionRecord> {
    records.sort_by(|a, b| (b.updated_at, &b.session_id).cmp(&(a.updated_at, &a.session_id)));
    records
}

/// Walks every page of `query` with keyset pagination and returns the rows in order, checking
/// that no page is longer than `limit` and that no row comes twice.
async fn paginate(store: &dyn Store, mut query: ListQuery, limit: i64) -> Vec<SessionRecord> {
    query.limit = limit;
    query.after = None;
    let mut all: Vec<SessionRecord> = Vec::new();
    for _ in 0..1000 {
        let page = store.list_sessions(&query).await.expect("list_sessions");
        assert!(
            page.sessions.len() as i64 <= limit,
            "page of {} rows exceeds limit {limit}",
            page.sessions.len()
        );
        all.extend(page.sessions);
        query.after = page.next;
        if query.after.is_none() {
            break;
        }
    }
    let unique: BTreeSet<&str> = all.iter().map(|r| r.session_id.as_str()).collect();
    assert_eq!(unique.len(), all.len(), "pagination returned a row twice");
    all
}

fn assert_fresh_timestamp(at: DateTime<Utc>) {
    let skew = (Utc::now() - at).num_seconds().abs();
    assert!(skew < 300, "created_at {at} is not close to now");
    assert_eq!(
        at.timestamp_subsec_nanos() % 1000,
        0,
        "created_at {at} has sub-microsecond digits"
    );
}

// ------------------------------------------------------------------------------------------
// Backends: each check gets a fresh database and the URL that names it
// ------------------------------------------------------------------------------------------

/// Runs `check` on a new SQLite file, opened as `sqlite://PATH` through the dispatching
/// `connect` (the file does not exist yet).
async fn on_sqlite<F, Fut>(_name: &str, check: F)
where
    F: FnOnce(Database, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let url = format!("sqlite://{}", path.to_str().expect("utf-8 temp path"));
    let db = store::connect(&url, "contract").await.expect("open sqlite");
    check(db, url).await;
}

/// Runs `check` on a new in-memory SQLite database.
async fn on_sqlite_memory<F, Fut>(_name: &str, check: F)
where
    F: FnOnce(Database, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let url = "sqlite::memory:".to_owned();
    let db = store::connect(&url, "contract")
        .await
        .expect("open in-memory sqlite");
    check(db, url).await;
}

/// `admin_url` with its database name replaced by `database`.
fn with_database(admin_url: &str, database: &str) -> String {
    let (base, params) = match admin_url.split_once('?') {
        Some((base, params)) => (base, Some(params)),
        None => (admin_url, None),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority..].find('/') {
        Some(slash) => &base[..authority + slash],
        None => base,
    };
    match params {
        Some(params) => format!("{base}/{database}?{params}"),
        None => format!("{base}/{database}"),
    }
}

/// Runs `check` on a throwaway PostgreSQL database (`acpgw_test_…`) created under
/// `DATABASE_URL` and dropped afterwards, whether the check passes or not. Without
/// `DATABASE_URL` the test is skipped, loudly.
async fn on_postgres<F, Fut>(name: &str, check: F)
where
    F: FnOnce(Database, String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let admin_url = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            // Written to the real stderr rather than with `eprintln!`, which the test harness
            // captures and hides for a passing test: a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "\n!!!!!!!! postgres::{name} SKIPPED: DATABASE_URL is not set, the PostgreSQL \
                 store was NOT tested !!!!!!!!\n"
            );
            return;
        }
    };
    let mut admin = sqlx::PgConnection::connect(&admin_url)
        .await
        .unwrap_or_else(|e| panic!("DATABASE_URL is set but PostgreSQL is unreachable: {e}"));
    let database = format!("acpgw_test_{}", uuid::Uuid::new_v4().simple());
    // Prefer a locale whose text order is not byte order ("a" < "B"), to prove the store does
    // not depend on the server's default collation; fall back where ICU is unavailable.
    let icu = format!(
        "CREATE DATABASE {database} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
    );
    if let Err(e) = sqlx::query(&icu).execute(&mut admin).await {
        eprintln!("note: no ICU database ({e}); using the server's default collation");
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&mut admin)
            .await
            .expect("create the test database");
    }

    let url = with_database(&admin_url, &database);
    // Run in a task so that a failed assertion comes back here and the database still gets
    // dropped before the panic is passed on.
    let outcome = tokio::spawn({
        let url = url.clone();
        async move {
            let db = store::connect(&url, "contract")
                .await
                .expect("open postgres");
            check(db, url).await;
        }
    })
    .await;

    if let Err(e) = sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&mut admin)
        .await
    {
        eprintln!("warning: could not drop test database {database}: {e}");
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The registry of a database several replicas share.
fn registry(db: Database) -> Arc<dyn ReplicaRegistry> {
    match db.replicas {
        Replicas::Shared(registry) => registry,
        Replicas::Alone(_) => panic!("PostgreSQL has a replica registry"),
    }
}

/// The held sessions of a database one gateway serves alone.
fn held(db: Database) -> Arc<dyn HeldSessions> {
    match db.replicas {
        Replicas::Alone(held) => held,
        Replicas::Shared(_) => panic!("SQLite has no replica registry"),
    }
}

// ------------------------------------------------------------------------------------------
// The suite: one test per check and backend
// ------------------------------------------------------------------------------------------

/// One `#[tokio::test]` per `module::check`, each on a fresh database from `$open`.
macro_rules! store_tests {
    ($open:ident: $($module:ident::$check:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                crate::$open(stringify!($check), |db, _url| crate::$module::$check(db.store))
                    .await;
            }
        )+
    };
}

/// Every check against `dyn Store`, on the backend `$open` opens.
macro_rules! store_contract {
    ($open:ident) => {
        store_tests!($open:
            sessions::check_fresh_database,
            sessions::check_session_round_trip,
            sessions::check_update_session,
            sessions::check_concurrent_updates,
            listing::check_list_sessions,
            listing::check_stable_pagination,
            sessions::check_tombstone,
            events::check_append_events,
            events::check_concurrent_appends,
            events::check_log_writer,
            events::check_payload_round_trip,
            events::check_lifecycle,
            events::check_prune_events,
        );
    };
}

mod sqlite {
    use super::*;

    store_contract!(on_sqlite);

    #[tokio::test]
    async fn check_held_sessions() {
        on_sqlite("check_held_sessions", |db, _url| {
            replicas::check_held_sessions(held(db))
        })
        .await;
    }

    /// What one connection wrote, the next reads, whichever form of URL names the file.
    #[tokio::test]
    async fn reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("store.db");
        let path_str = path.to_str().expect("utf-8 temp path");

        // `sqlite://PATH` through the dispatching `connect`; the file does not exist yet.
        let db = store::connect(&format!("sqlite://{path_str}"), "contract")
            .await
            .expect("open sqlite")
            .store;
        let before = reopen::check_reopen_write(db.clone()).await;
        drop(db);
        assert!(path.exists(), "the database file was created");

        // Reopen as a plain path.
        let db: Arc<dyn Store> = Arc::new(SqliteStore::connect(path_str).await.expect("reopen"));
        reopen::check_reopen_read(db.clone(), &before).await;
        drop(db);

        // And as `sqlite:PATH`: the sequence goes on from where the last run left it.
        let db = store::connect(&format!("sqlite:{path_str}"), "contract")
            .await
            .expect("reopen again")
            .store;
        assert_eq!(db.last_event_seq("reopen-1").await.unwrap(), 5);
        let next = db
            .append_events("reopen-1", &[event("persist", json!({"i": 5}))])
            .await
            .unwrap();
        assert_eq!(next[0].seq, 6);
    }

    /// SQLite: the log writer's connection does not checkpoint at SQLite's threshold but in small
    /// steps of its own, and the WAL file still stays bounded under a steady stream of appends (it
    /// is started over after each checkpoint instead of growing by every commit).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn log_writer_keeps_the_wal_bounded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("wal.db");
        let db = store::connect(path.to_str().unwrap(), "contract")
            .await
            .expect("open")
            .store;
        let mut log = db.log_writer();
        // The log writer checkpoints every few appends, a few pages each: the WAL never holds
        // more than a small part of what this many appends write, however loaded the CPUs are.
        const APPENDS: usize = 12_000;
        let payload = json!({"text": "x".repeat(3000)});
        for i in 0..APPENDS {
            log.append("wal-1", &[event("chunk", payload.clone())], None)
                .await
                .unwrap();
            if i == 0 {
                // The first append opened the database's WAL.
                assert!(dir.path().join("wal.db-wal").exists());
            }
        }
        // Each append adds at least one 4 KiB page of payload: without checkpoints the WAL would
        // hold all of them, more than 49 MB.
        let wal = std::fs::metadata(dir.path().join("wal.db-wal"))
            .unwrap()
            .len();
        assert!(
            wal < (APPENDS as u64 * 4096) / 2,
            "the WAL grew to {wal} bytes over {APPENDS} appends"
        );
        assert_eq!(db.last_event_seq("wal-1").await.unwrap(), APPENDS as i64);
    }
}

mod sqlite_memory {
    use super::*;

    store_contract!(on_sqlite_memory);

    #[tokio::test]
    async fn check_held_sessions() {
        on_sqlite_memory("check_held_sessions", |db, _url| {
            replicas::check_held_sessions(held(db))
        })
        .await;
    }
}

mod postgres {
    use super::*;

    store_contract!(on_postgres);

    #[tokio::test]
    async fn check_replicas() {
        on_postgres("check_replicas", |db, _url| {
            replicas::check_replicas(registry(db))
        })
        .await;
    }

    #[tokio::test]
    async fn check_log_writer_reconnects() {
        on_postgres("check_log_writer_reconnects", |db, url| async move {
            events::check_log_writer_reconnects(db.store, &url).await;
        })
        .await;
    }

    /// What one pool wrote, a new one reads.
    #[tokio::test]
    async fn reopen() {
        on_postgres("reopen", |db, url| async move {
            let before = reopen::check_reopen_write(db.store.clone()).await;
            drop(db);
            let db: Arc<dyn Store> =
                Arc::new(PgStore::connect(&url, "contract").await.expect("reconnect"));
            reopen::check_reopen_read(db, &before).await;
        })
        .await;
    }
}
