//! The store contract suite: one set of `check_*` functions, written against `dyn Store`, each
//! run as its own test against every backend, on a database of its own: SQLite on a temporary
//! file (`sqlite::…`, which also reopens it) and in memory (`sqlite_memory::…`), and PostgreSQL
//! on a throwaway database created under `DATABASE_URL` (`postgres::…`; ignored, with that reason,
//! when built without it; failing when it is set but the server cannot be reached). The
//! replica registry checks run where there is a registry (PostgreSQL), the held-session checks
//! where there is none (SQLite).

use crate::support;

mod bulk;
mod deliveries;
mod events;
mod idempotency;
mod imports;
mod installs;
mod listing;
mod log_writer;
mod payloads;
mod people;
mod queue;
mod quotas;
mod reopen;
mod replicas;
mod sessions;
mod usage;
mod vanished;
mod watchers;
mod webhooks;
mod workspaces;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use acp_gateway::store::{
    self, Claimed, Database, Heartbeat, HeldSessions, ListCursor, ListQuery, ListedSession,
    NewEvent, NewLifecycleEvent, Origin, PgStore, ReplicaRegistry, Replicas, SessionRecord,
    SqliteStore, Store, StoredEvent, ToSync,
};
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use support::postgres::{Collation, FreshDatabase};
use tokio::task::JoinSet;

/// An arbitrary instant with a non-zero microsecond part: 2023-11-14T22:13:20.123456Z.
const T0: i64 = 1_700_000_000_123_456;

fn ts(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).expect("timestamp in range")
}

/// A minimal live session: no title, no meta, no extra directories.
fn record(id: &str, tenant: &str) -> SessionRecord {
    SessionRecord::new(
        id.to_owned(),
        tenant.to_owned(),
        "/work/default".to_owned(),
        "default".into(),
        Origin::Gateway,
        ts(T0),
    )
}

fn event(kind: &str, payload: Value) -> NewEvent {
    NewEvent {
        kind: kind.to_owned(),
        payload: payload.into(),
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

/// The first page (up to 100) of `tenant`'s live, non-archived sessions.
async fn listed(store: &dyn Store, tenant: &str) -> Vec<SessionRecord> {
    let query = ListQuery {
        tenant: Some(tenant.to_owned()),
        limit: 100,
        ..ListQuery::default()
    };
    store.list_sessions(&query).await.unwrap().sessions
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
async fn on_sqlite<F, Fut>(check: F)
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
async fn on_sqlite_memory<F, Fut>(check: F)
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

/// Runs `check` on a throwaway PostgreSQL database (`acpgw_test_…`, ordering text by ICU
/// `en-US` where the server has ICU, to prove the store does not depend on the server's
/// collation) created under `DATABASE_URL` and dropped afterwards, whether the check passes or
/// not. The tests that use it are ignored, with the reason, when built without `DATABASE_URL`.
async fn on_postgres<F, Fut>(check: F)
where
    F: FnOnce(Database, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let fresh = FreshDatabase::create("test", Collation::IcuEnUs).await;
    let db = store::connect(&fresh.url, "contract")
        .await
        .expect("open postgres");
    check(db, fresh.url.clone()).await;
    fresh.remove().await;
}

/// The store of a database.
fn store(db: Database) -> Arc<dyn Store> {
    db.store
}

/// The whole database: its store and how it records replicas.
fn whole(db: Database) -> Database {
    db
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

/// One `#[tokio::test]` per `module::check`, each on a fresh database from `$open`, checking
/// the part of it `$part` takes (its store, its registry, its held sessions); with `[ATTRS]`
/// first, each test also gets those attributes.
macro_rules! store_tests {
    (@one [$($attr:tt)*] $open:ident, $part:ident, $module:ident::$check:ident) => {
        #[tokio::test]
        $($attr)*
        async fn $check() {
            crate::store_contract::$open(|db, _url| crate::store_contract::$module::$check(crate::store_contract::$part(db))).await;
        }
    };
    ($open:ident, $($rest:tt)+) => {
        store_tests!([] $open, $($rest)+);
    };
    ($attrs:tt $open:ident, $part:ident: $($module:ident::$check:ident),+ $(,)?) => {
        $( store_tests!(@one $attrs $open, $part, $module::$check); )+
    };
}

/// Every check against `dyn Store`, on the backend `$open` opens.
macro_rules! store_contract {
    ($($open:tt)+) => {
        store_tests!($($open)+, store:
            sessions::check_fresh_database,
            sessions::check_session_round_trip,
            sessions::check_session_identity,
            sessions::check_session_agents,
            sessions::check_update_session,
            sessions::check_concurrent_updates,
            people::check_session_people,
            bulk::check_sessions_in_bulk,
            listing::check_list_sessions,
            listing::check_stable_pagination,
            sessions::check_tombstone,
            vanished::check_vanish_and_revive,
            events::check_append_events,
            events::check_turn_open,
            events::check_session_state,
            events::check_concurrent_appends,
            log_writer::check_log_writer,
            log_writer::check_log_writer_append_all,
            payloads::check_payload_round_trip,
            payloads::check_nul_round_trip,
            payloads::check_nul_in_text_round_trip,
            events::check_lifecycle,
            events::check_prune_events,
            webhooks::check_webhook_crud,
            webhooks::check_outbox,
            webhooks::check_lifecycle_outbox,
            webhooks::check_outbox_ids_are_distinct,
            deliveries::check_claim,
            deliveries::check_finish_and_retry,
            webhooks::check_list_and_cascade,
            deliveries::check_concurrent_claims,
            webhooks::check_appends_while_webhooks_change,
            idempotency::check_idempotency_keys,
            idempotency::check_concurrent_idempotency_keys,
            quotas::check_tenant_prompts,
            workspaces::check_workspaces,
            queue::check_prompt_queue,
            watchers::check_watchers,
            watchers::check_watchers_counted_at_once,
            usage::check_usage_ledger,
            installs::check_installs,
            imports::check_session_imports,
        );
        store_tests!($($open)+, whole:
            quotas::check_tenant_slots,
            quotas::check_concurrent_tenant_slots,
        );
    };
}

mod sqlite {
    use super::*;

    store_contract!(on_sqlite);
    store_tests!(on_sqlite, held: replicas::check_held_sessions);

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
    store_contract!(on_sqlite_memory);
    store_tests!(on_sqlite_memory, held: replicas::check_held_sessions);
}

mod postgres {
    use super::*;

    store_contract!([#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]] on_postgres);
    store_tests!(
        [#[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]]
        on_postgres, registry: replicas::check_replicas, replicas::check_claims
    );

    #[tokio::test]
    #[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
    async fn check_log_writer_reconnects() {
        on_postgres(|db, url| async move {
            log_writer::check_log_writer_reconnects(db.store, &url).await;
        })
        .await;
    }

    /// What one pool wrote, a new one reads.
    #[tokio::test]
    #[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
    async fn reopen() {
        on_postgres(|db, url| async move {
            let before = reopen::check_reopen_write(db.store.clone()).await;
            drop(db);
            let db: Arc<dyn Store> =
                Arc::new(PgStore::connect(&url, "contract").await.expect("reconnect"));
            reopen::check_reopen_read(db, &before).await;
        })
        .await;
    }
}
