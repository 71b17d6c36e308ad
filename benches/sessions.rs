//! Session-list benchmark (not a test): whether `GET /sessions?limit=50` stays as fast with
//! 1,000,000 sessions in the store as with 1,000 (plain and `cwd`-filtered pages), and how its
//! throughput on the large store compares with a bare axum route serving the same bytes.
//!
//! Run with `bash bench/sessions.sh` (it builds the release binaries first). SQLite is always
//! measured; with `DATABASE_URL` set (an administrative connection, e.g.
//! `postgres://postgres@127.0.0.1:5432/test`) PostgreSQL is measured too, on fresh databases
//! named `acpgw_bench_<random>` that are dropped at the end. Prints a table, with the query plans
//! of the list queries, and writes it to `bench/results/sessions.md`.
//!
//! How: for each backend, two stores are created with `acp-gateway migrate` and filled by SQL
//! (1,000 sessions over 10 cwds; 1,000,000 over 1,000 cwds, so that the filtered page is full in
//! both), then `ANALYZE`d; a gateway (single tenant, echo agent with an empty state directory) is
//! started on each. Latency: sequential requests on one keep-alive connection per gateway, the
//! four (store, query) cells interleaved in rounds so that background load hits them alike;
//! these requests carry `Cache-Control: no-cache`, so every one reads the store.
//! Throughput: the same reqwest load generator (fixed concurrency and duration, after a warm-up)
//! against the large-store gateway and against a bare axum route on its own tokio runtime in
//! this process, returning exactly the body the gateway returned, alternated, best of each. The
//! gateway serves a page it has read before from memory until a session changes; its
//! throughput with `Cache-Control: no-cache` (a store read per request) is reported too.

mod support;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use sqlx::Connection;
use support::{
    Backend, Database, Gateway, LoadPlan, Options, bare_server, best_alternated, load, percentile,
};

const SMALL: i64 = 1_000;
const SMALL_CWDS: i64 = 10;
const LARGE: i64 = 1_000_000;
const LARGE_CWDS: i64 = 1_000;
/// Rows per INSERT statement when filling a store.
const BATCH: i64 = 100_000;
/// The cwd of the filtered page (exists in both stores).
const CWD: &str = "/srv/projects/p0007";
const PAGE: usize = 50;
/// Latency: warm-up requests per cell, then SAMPLES per cell taken in ROUNDS interleaved slices.
const WARMUP: usize = 100;
const SAMPLES: usize = 1_000;
const ROUNDS: usize = 20;
/// Throughput: concurrent requests, warm-up, measured window, and alternating rounds (best of).
const LOAD: LoadPlan = LoadPlan {
    window: Duration::from_secs(5),
    ..LoadPlan::STANDARD
};
/// The list-latency ratio (1M store / 1k store) must stay at or below this.
const LATENCY_TARGET: f64 = 1.5;
/// Gateway throughput over bare-route throughput must reach this.
const THROUGHPUT_TARGET: f64 = 0.25;

/// The columns `list_sessions` selects (`session_columns!` in `src/store/{postgres,sqlite}.rs`).
const COLUMNS: &str = "session_id, tenant, cwd, additional_directories, title, updated_at, \
     created_at, meta, archived, origin, deleted_at, synced_at";

/// The statement `list_sessions` builds for a single-tenant caller, with or without `cwd`.
fn list_sql(backend: Backend, with_cwd: bool) -> String {
    let p = |n: usize| match backend {
        Backend::Postgres => format!("${n}"),
        Backend::Sqlite => "?".to_owned(),
    };
    let mut sql = format!(
        "SELECT {COLUMNS} FROM sessions WHERE deleted_at IS NULL AND archived = {} AND tenant = {}",
        p(1),
        p(2)
    );
    let mut next = 3;
    if with_cwd {
        sql.push_str(&format!(" AND cwd = {}", p(next)));
        next += 1;
    }
    sql.push_str(&format!(
        " ORDER BY updated_at DESC, session_id DESC LIMIT {}",
        p(next)
    ));
    sql
}

/// Applies the migrations with `acp-gateway migrate`.
async fn migrate(db: &str) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["migrate", "--database-url", db])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "acp-gateway migrate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Unix microseconds a little in the past: the base of the generated timestamps.
fn base_micros() -> i64 {
    chrono::Utc::now().timestamp_micros() - 2 * 3600 * 1_000_000
}

/// Fills an empty store with sessions 0..n: ids `sess_` + 32 hex digits, cwd
/// `/srv/projects/pNNNN` (i mod cwds), `updated_at` scattered over ~72 minutes in an order
/// unrelated to insertion, single tenant `default`, origin `gateway`, live, not archived; then
/// `ANALYZE`.
async fn populate(backend: Backend, db: &str, n: i64, cwds: i64) {
    let base = base_micros();
    match backend {
        Backend::Sqlite => {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(db)
                .unwrap()
                .synchronous(sqlx::sqlite::SqliteSynchronous::Off)
                .pragma("cache_size", "-262144");
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let sql = "INSERT INTO sessions (session_id, tenant, cwd, additional_directories, \
                 title, updated_at, created_at, meta, archived, origin, deleted_at, synced_at) \
                 WITH RECURSIVE s(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM s WHERE i < ?2) \
                 SELECT printf('sess_%032x', i), 'default', printf('/srv/projects/p%04d', i % ?3), \
                 '[]', 'Echo: bench session ' || i, ?4 + (i * 2654435761) % 4294967296, \
                 ?4 - 86400000000 + i, NULL, 0, 'gateway', NULL, NULL FROM s";
            for start in (0..n).step_by(BATCH as usize) {
                let end = (start + BATCH).min(n) - 1;
                let mut tx = conn.begin().await.unwrap();
                sqlx::query(sql)
                    .bind(start)
                    .bind(end)
                    .bind(cwds)
                    .bind(base)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            sqlx::query("ANALYZE").execute(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
            let base = chrono::DateTime::from_timestamp_micros(base).unwrap();
            let sql = "INSERT INTO sessions (session_id, tenant, cwd, additional_directories, \
                 title, updated_at, created_at, meta, archived, origin, deleted_at, synced_at) \
                 SELECT 'sess_' || lpad(to_hex(i), 32, '0'), 'default', \
                 '/srv/projects/p' || lpad((i % $3)::text, 4, '0'), '[]'::jsonb, \
                 'Echo: bench session ' || i, \
                 $4 + ((i * 2654435761) % 4294967296) * interval '1 microsecond', \
                 $4 - interval '1 day' + i * interval '1 microsecond', \
                 NULL, false, 'gateway', NULL, NULL \
                 FROM generate_series($1::bigint, $2::bigint) AS i";
            for start in (0..n).step_by(BATCH as usize) {
                let end = (start + BATCH).min(n) - 1;
                sqlx::query(sql)
                    .bind(start)
                    .bind(end)
                    .bind(cwds)
                    .bind(base)
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            sqlx::query("ANALYZE sessions")
                .execute(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
        }
    }
    let count = count_sessions(backend, db).await;
    assert_eq!(count, n, "the store holds {count} sessions, not {n}");
}

async fn count_sessions(backend: Backend, db: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM sessions WHERE deleted_at IS NULL AND NOT archived";
    match backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(db).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
        }
    }
}

/// The plans of the unfiltered and the cwd-filtered list query, as printable lines.
async fn explain(backend: Backend, db: &str) -> Vec<String> {
    let limit = PAGE as i64 + 1;
    let mut lines = vec![];
    match backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(db).await.unwrap();
            for with_cwd in [false, true] {
                let sql = list_sql(backend, with_cwd);
                let explain = format!("EXPLAIN QUERY PLAN {sql}");
                let mut q = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain)
                    .bind(false)
                    .bind("default");
                if with_cwd {
                    q = q.bind(CWD);
                }
                lines.push(explain.clone());
                for (_, _, _, detail) in q.bind(limit).fetch_all(&mut conn).await.unwrap() {
                    lines.push(format!("    {detail}"));
                }
            }
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
            for with_cwd in [false, true] {
                let sql = list_sql(backend, with_cwd);
                let explain = format!("EXPLAIN {sql}");
                let mut q = sqlx::query_scalar::<_, String>(&explain)
                    .bind(false)
                    .bind("default");
                if with_cwd {
                    q = q.bind(CWD);
                }
                let args = if with_cwd {
                    format!("false, 'default', '{CWD}', {limit}")
                } else {
                    format!("false, 'default', {limit}")
                };
                lines.push(format!("EXPLAIN {sql}  -- with ({args})"));
                for line in q.bind(limit).fetch_all(&mut conn).await.unwrap() {
                    lines.push(format!("    {line}"));
                }
                // sqlx keeps statements prepared; after five runs PostgreSQL may switch a
                // prepared statement to its generic plan, so show that one too.
                let types = if with_cwd {
                    "boolean, text, text, bigint"
                } else {
                    "boolean, text, bigint"
                };
                let name = if with_cwd { "bench_cwd" } else { "bench_all" };
                let prepare = format!(
                    "SET plan_cache_mode = force_generic_plan; PREPARE {name} ({types}) AS {sql}"
                );
                sqlx::raw_sql(&prepare).execute(&mut conn).await.unwrap();
                let generic: Vec<String> =
                    sqlx::query_scalar(&format!("EXPLAIN EXECUTE {name} ({args})"))
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                lines.push(format!("generic plan of the same statement ({args})"));
                lines.extend(generic.into_iter().map(|l| format!("    {l}")));
                sqlx::raw_sql("RESET plan_cache_mode")
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
        }
    }
    lines
}

/// One GET, body read to the end; checks the status.
async fn get(http: &reqwest::Client, url: &str) -> Bytes {
    fetch(http, url, false).await
}

/// One GET; `fresh` sends `Cache-Control: no-cache`, which makes the gateway read the page
/// from the store instead of its page cache.
async fn fetch(http: &reqwest::Client, url: &str, fresh: bool) -> Bytes {
    let mut req = http.get(url);
    if fresh {
        req = req.header("cache-control", "no-cache");
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), 200, "GET {url}");
    res.bytes().await.unwrap()
}

/// Checks a list page: a full page, a next cursor, and (when given) every row in `cwd`.
fn check_page(body: &[u8], cwd: Option<&str>) {
    let page: Value = serde_json::from_slice(body).unwrap();
    let sessions = page["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), PAGE, "not a full page");
    assert!(page["nextCursor"].is_string(), "no nextCursor");
    if let Some(cwd) = cwd {
        assert!(sessions.iter().all(|s| s["cwd"] == cwd));
    }
}

#[derive(Clone, Copy, Default)]
struct Latency {
    p50: Duration,
    p99: Duration,
}

/// p50/p99 of the unfiltered and the cwd-filtered page on the small and the large store:
/// `[[small all, small cwd], [large all, large cwd]]`.
async fn latencies(small: &Gateway, large: &Gateway) -> [[Latency; 2]; 2] {
    // One client per gateway that never holds more than one connection: sequential requests
    // reuse the same keep-alive connection.
    let clients = [small, large].map(|gw| {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()
            .unwrap();
        let urls = [
            format!("{}/sessions?limit={PAGE}", gw.base),
            format!("{}/sessions?limit={PAGE}&cwd={CWD}", gw.base),
        ];
        (http, urls)
    });
    for (http, urls) in &clients {
        for (q, url) in urls.iter().enumerate() {
            check_page(&fetch(http, url, true).await, (q == 1).then_some(CWD));
            for _ in 0..WARMUP {
                fetch(http, url, true).await;
            }
        }
    }
    let mut samples: [[Vec<Duration>; 2]; 2] = Default::default();
    for round in 0..ROUNDS {
        for cell in 0..4 {
            // Rotate the order so that no cell always runs first or last in a round.
            let cell = (cell + round) % 4;
            let (store, q) = (cell / 2, cell % 2);
            let (http, urls) = &clients[store];
            for _ in 0..SAMPLES / ROUNDS {
                let started = Instant::now();
                fetch(http, &urls[q], true).await;
                samples[store][q].push(started.elapsed());
            }
        }
    }
    samples.map(|per_query| {
        per_query.map(|mut s| {
            s.sort();
            Latency {
                p50: percentile(&s, 0.50),
                p99: percentile(&s, 0.99),
            }
        })
    })
}

struct Figures {
    lat: [[Latency; 2]; 2],
    gateway_rps: f64,
    gateway_fresh_rps: f64,
    bare_rps: f64,
    healthz_rps: f64,
    body_len: usize,
    fill: Duration,
    plans: Vec<String>,
}

/// Every figure for one backend, given the URLs of its two (migrated, empty) stores.
async fn figures(backend: Backend, small_db: &str, large_db: &str, state: &Path) -> Figures {
    let started = Instant::now();
    populate(backend, small_db, SMALL, SMALL_CWDS).await;
    populate(backend, large_db, LARGE, LARGE_CWDS).await;
    let fill = started.elapsed();
    let plans = explain(backend, large_db).await;
    let small = Gateway::spawn(small_db, &state.join("small"), &Options::bench()).await;
    let large = Gateway::spawn(large_db, &state.join("large"), &Options::bench()).await;
    let lat = latencies(&small, &large).await;
    small.stop().await;

    let url = format!("{}/sessions?limit={PAGE}", large.base);
    let body = get(&reqwest::Client::new(), &url).await;
    check_page(&body, None);
    let body_len = body.len();
    let bare = format!("http://{}/sessions", bare_server("/sessions", body.clone()));
    assert_eq!(get(&reqwest::Client::new(), &bare).await, body);
    // For reference: the gateway's HTTP stack alone (middleware, no store, 2-byte body).
    let healthz = format!("{}/healthz", large.base);
    let healthz_len = get(&reqwest::Client::new(), &healthz).await.len();
    let healthz_rps = load(&healthz, healthz_len, LOAD, false).await;
    let (gateway_rps, bare_rps) = best_alternated((&url, &bare), body_len, LOAD).await;
    let gateway_fresh_rps = load(&url, body_len, LOAD, true).await;
    large.stop().await;
    Figures {
        lat,
        gateway_rps,
        gateway_fresh_rps,
        bare_rps,
        healthz_rps,
        body_len,
        fill,
        plans,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// The table: one row per figure, one column per backend.
fn table(sqlite: &Figures, pg: Option<&Figures>) -> String {
    let mut out =
        String::from("| figure | SQLite | PostgreSQL | target | met? |\n|---|---|---|---|---|\n");
    let mut row = |name: &str,
                   f: &dyn Fn(&Figures) -> String,
                   target: &str,
                   ok: Option<&dyn Fn(&Figures) -> bool>| {
        let pg_cell = pg.map_or("not run (DATABASE_URL unset)".to_owned(), f);
        let met = match ok {
            None => String::new(),
            Some(ok) => {
                let mut failed = vec![];
                if !ok(sqlite) {
                    failed.push("SQLite");
                }
                if pg.is_some_and(|p| !ok(p)) {
                    failed.push("PostgreSQL");
                }
                if failed.is_empty() {
                    "yes".to_owned()
                } else {
                    format!("**no** ({})", failed.join(", "))
                }
            }
        };
        out.push_str(&format!(
            "| {name} | {} | {pg_cell} | {target} | {met} |\n",
            f(sqlite)
        ));
    };
    let lat_ratio = |f: &Figures, q: usize, p99: bool| {
        let pick = |l: Latency| if p99 { l.p99 } else { l.p50 };
        pick(f.lat[1][q]).as_secs_f64() / pick(f.lat[0][q]).as_secs_f64()
    };
    let target = format!("≤ {LATENCY_TARGET}");
    for (q, what) in [(0, "`GET /sessions?limit=50`"), (1, "cwd-filtered page")] {
        for (p99, pct) in [(false, "p50"), (true, "p99")] {
            let pick = move |l: Latency| if p99 { l.p99 } else { l.p50 };
            for (store, size) in [(0, "1k"), (1, "1M")] {
                row(
                    &format!("{what} {pct}, {size} store"),
                    &|f| ms(pick(f.lat[store][q])),
                    "",
                    None,
                );
            }
            row(
                &format!("{what} {pct} ratio 1M / 1k"),
                &|f| format!("{:.2}", lat_ratio(f, q, p99)),
                &target,
                Some(&|f| lat_ratio(f, q, p99) <= LATENCY_TARGET),
            );
        }
    }
    let tp_ratio = |f: &Figures| f.gateway_rps / f.bare_rps;
    row(
        "gateway `GET /sessions?limit=50`, 1M store (req/s)",
        &|f| format!("{:.0}", f.gateway_rps),
        "",
        None,
    );
    row(
        "… with `Cache-Control: no-cache` (every page read from the store) (req/s)",
        &|f| format!("{:.0}", f.gateway_fresh_rps),
        "",
        None,
    );
    row(
        "bare axum route, same body (req/s)",
        &|f| format!("{:.0}", f.bare_rps),
        "",
        None,
    );
    row(
        "throughput ratio gateway / bare",
        &|f| format!("{:.2}", tp_ratio(f)),
        &format!("≥ {THROUGHPUT_TARGET}"),
        Some(&|f| tp_ratio(f) >= THROUGHPUT_TARGET),
    );
    row(
        "for reference: gateway `GET /healthz` (req/s)",
        &|f| format!("{:.0}", f.healthz_rps),
        "",
        None,
    );
    row(
        "response body (bytes)",
        &|f| f.body_len.to_string(),
        "",
        None,
    );
    row(
        "time to fill both stores + ANALYZE",
        &|f| format!("{:.1} s", f.fill.as_secs_f64()),
        "",
        None,
    );
    out
}

/// [`figures`] on two fresh, migrated stores of `backend` in `dir`, dropped afterwards (a
/// PostgreSQL database also when a measurement panics).
async fn figures_on(backend: Backend, dir: &Path) -> Figures {
    let mut small = Database::create(backend, &dir.join("small"), "bench").await;
    let mut large = Database::create(backend, &dir.join("large"), "bench").await;
    migrate(&small.url).await;
    migrate(&large.url).await;
    let figures = figures(backend, &small.url, &large.url, &dir.join("state")).await;
    small.remove().await;
    large.remove().await;
    figures
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = figures_on(Backend::Sqlite, &dir.path().join("sqlite")).await;
    let pg = match support::postgres::admin_url() {
        Some(_) => Some(figures_on(Backend::Postgres, &dir.path().join("pg")).await),
        None => None,
    };

    let (commit, cores) = (support::commit(), support::cores());
    let mut report = format!(
        "Session list, single tenant; commit {commit}, {cores} cores\n\n\
         Stores: {SMALL} sessions over {SMALL_CWDS} cwds (\"1k\") and {LARGE} over {LARGE_CWDS} \
         cwds (\"1M\"), filled by SQL, then ANALYZE; the cwd-filtered page is \
         `GET /sessions?limit={PAGE}&cwd={CWD}` (a full page in both stores). Latency: \
         {SAMPLES} sequential requests per cell on one keep-alive connection after {WARMUP} \
         warm-up, the four cells interleaved in {ROUNDS} rounds. Throughput: {} \
         (reqwest), gateway and bare route alternated, best of {} each (`/healthz`: one \
         run).\n\n",
        LOAD.describe(),
        LOAD.rounds,
    );
    report.push_str(&table(&sqlite, pg.as_ref()));
    let mut plans = vec![("SQLite", &sqlite.plans)];
    if let Some(pg) = &pg {
        plans.push(("PostgreSQL", &pg.plans));
    }
    for (name, lines) in plans {
        report.push_str(&format!(
            "\n{name} plans of the list queries on the 1M store:\n\n```\n{}\n```\n",
            lines.join("\n")
        ));
    }
    println!("{report}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/sessions.md");
    std::fs::write(&out, &report).unwrap();
    println!("written to {}", out.display());
}
