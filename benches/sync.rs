//! List-sync benchmark (not a test): how long the gateway takes to sync its session cache with
//! an agent that lists 100,000 and 1,000,000 sessions, the first time (every session added)
//! and again with the list unchanged, and how many SQL statements that repeat runs; on SQLite
//! and, with `DATABASE_URL` set, on PostgreSQL (fresh databases `acpgw_bench_<random>`,
//! dropped at the end).
//!
//! Run with `bash bench/sync.sh` (it builds the release binaries first). Prints a table and
//! writes it to `bench/results/sync.md`.
//!
//! How: the echo agent lists synthetic sessions, made up as they are listed (the file
//! `synthetic-sessions` in its state directory, see `examples/echo_agent.rs`), `SYNC_PAGE_SIZE`
//! a page (default 1,000): a listing read from a million files would measure the agent. For
//! each backend and size: a fresh store and a gateway (`--sync-interval 0`, no request timeout)
//! whose sync at start finds nothing; then the synthetic sessions appear and
//! `GET /sessions?refresh=true&limit=1` is timed: the initial sync, then `REPEATS` syncs of the
//! unchanged list (median), each with the CPU time it took the gateway, the agent and (on
//! PostgreSQL) the server processes serving the gateway's database, from `/proc`; on SQLite the
//! database's work is the gateway's. Statements: the gateway is restarted on the same store
//! with sqlx's statement log on (`RUST_LOG=…,sqlx::query=debug`, which costs time, hence not
//! while timing), and the statements logged while one more refresh runs are counted, by kind.
//! With `SYNC_BASELINE=/path/to/acp-gateway` (another build, e.g. from before bulk sync) that
//! build is measured the same way, in the same run, at the sizes in `SYNC_BASELINE_SIZES`
//! (default 100000; comma-separated, as `SYNC_SIZES` sets this build's).

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::Connection;
use support::{Backend, Database, Gateway, Options, cpu_time};

/// List sizes measured (`SYNC_SIZES` overrides, comma-separated).
const SIZES: &str = "100000,1000000";
const REPEATS: usize = 3;
/// The targets for 1,000,000 listed sessions: a first sync within a minute, a repeat within 2 s.
const INITIAL_TARGET: Duration = Duration::from_secs(60);
const REPEAT_TARGET: Duration = Duration::from_secs(2);

/// One sync: its wall time and the CPU time it took each process.
#[derive(Clone, Copy)]
struct Timed {
    wall: Duration,
    gateway: Duration,
    agent: Duration,
    /// The PostgreSQL server processes serving the gateway's database.
    database: Option<Duration>,
}

/// What one build did on one backend with one list size.
struct Figures {
    initial: Timed,
    repeat: Timed,
    /// Statements a repeat sync ran, by kind ("SELECT … FROM sessions", …).
    statements: BTreeMap<String, usize>,
}

fn page_size() -> String {
    std::env::var("SYNC_PAGE_SIZE").unwrap_or_else(|_| "1000".into())
}

/// A gateway on `db` with its agent state in `dir/agent`; `statements` logs every SQL
/// statement to `dir/gateway.log`.
async fn gateway(binary: &Path, db: &str, dir: &Path, statements: bool) -> Gateway {
    let mut opts = Options::bench()
        .binary(binary)
        .env("ECHO_AGENT_CAPS", "load,list,resume,close")
        .env("ECHO_AGENT_PAGE_SIZE", &page_size())
        .args(&["--sync-interval", "0", "--request-timeout", "0"]);
    if statements {
        opts.record = true;
        opts.rust_log = "warn,tower_http=off,sqlx::query=debug".into();
    }
    Gateway::spawn(db, dir, &opts).await
}

/// `GET /sessions?refresh=true&limit=1`: one sync.
async fn refresh(gw: &Gateway) {
    let r = gw.get("/sessions?refresh=true&limit=1").await;
    assert_eq!(r.status(), 200, "refresh: {}", r.text().await.unwrap());
}

/// The CPU time so far of the server processes serving `db` (PostgreSQL; none for SQLite).
async fn database_cpu(backend: Backend, db: &str) -> Option<Duration> {
    if backend != Backend::Postgres {
        return None;
    }
    let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    // A connection closed meanwhile has no `/proc` entry left.
    let live = pids.into_iter().map(|pid| pid as u32);
    let live = live.filter(|pid| std::path::Path::new(&format!("/proc/{pid}/stat")).exists());
    Some(live.map(cpu_time).sum())
}

/// One refresh, timed, with the CPU it took each process.
async fn timed_refresh(gw: &Gateway, backend: Backend, db: &str) -> Timed {
    let (gateway, agent) = (gw.pid(), gw.agent_pid().await);
    let (g0, a0, d0) = (
        cpu_time(gateway),
        cpu_time(agent),
        database_cpu(backend, db).await,
    );
    let started = Instant::now();
    refresh(gw).await;
    let wall = started.elapsed();
    let database = database_cpu(backend, db).await;
    Timed {
        wall,
        gateway: cpu_time(gateway) - g0,
        agent: cpu_time(agent) - a0,
        database: database.zip(d0).map(|(d1, d0)| d1.saturating_sub(d0)),
    }
}

/// Returns once the sync a gateway runs once at start (within 100 ms of its agent becoming
/// ready) is over: a refresh queues behind it.
async fn after_the_sync_at_start(gw: &Gateway) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    refresh(gw).await;
}

/// Makes the agent list `n` synthetic sessions (besides its real ones, of which there are none).
fn list_synthetic(dir: &Path, n: usize) {
    std::fs::write(dir.join("agent/synthetic-sessions"), n.to_string()).unwrap();
}

/// The statements sqlx logged in `log`, counted by kind: the sync's own by name, others as
/// their verb and what follows their `FROM` or `INTO`.
fn statements(log: &str) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("sqlx::query")) {
        let text = line
            .split_once("db.statement=\"")
            .and_then(|(_, rest)| rest.split_once("\" rows_affected="))
            .map_or(line, |(statement, _)| statement)
            .replace("\\n", " ");
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let cut = |s: &str| s.chars().take(40).collect::<String>();
        let kind = if text.contains("listed_id") {
            "a page's new or changed sessions read (`sessions_to_sync`)".to_owned()
        } else if text.contains("synced_at IS NOT NULL") {
            "the digests syncs stored (`visit_synced`)".to_owned()
        } else {
            let verb = text.split(' ').next().unwrap_or("?");
            match [" FROM ", " INTO "].iter().find_map(|k| text.find(k)) {
                Some(i) => format!("`{verb} …{}…`", cut(&text[i..])),
                None => format!("`{}`", cut(&text)),
            }
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

/// Every figure for `binary` on a fresh store of `backend` with `n` listed sessions.
async fn figures(binary: &Path, backend: Backend, n: usize, dir: &Path) -> Figures {
    let mut db = Database::create(backend, dir, "bench").await;
    let gw = gateway(binary, &db.url, dir, false).await;
    after_the_sync_at_start(&gw).await;
    list_synthetic(dir, n);
    let initial = timed_refresh(&gw, backend, &db.url).await;
    // The last lifecycle events of the initial sync may still be on their way to the store.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut repeats: Vec<Timed> = Vec::new();
    for _ in 0..REPEATS {
        repeats.push(timed_refresh(&gw, backend, &db.url).await);
    }
    repeats.sort_by_key(|t| t.wall);
    gw.stop().await;

    let gw = gateway(binary, &db.url, dir, true).await;
    after_the_sync_at_start(&gw).await;
    let log = dir.join("gateway.log");
    let before = std::fs::metadata(&log).unwrap().len() as usize;
    refresh(&gw).await;
    let text = std::fs::read_to_string(&log).unwrap();
    gw.stop().await;
    db.remove().await;
    Figures {
        initial,
        repeat: repeats[REPEATS / 2],
        statements: statements(&text[before..]),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Wall time, then the CPU time of each process.
fn timed(t: &Timed) -> String {
    let mut cpu = format!("gateway {}, agent {}", secs(t.gateway), secs(t.agent));
    if let Some(d) = t.database {
        cpu.push_str(&format!(", PostgreSQL {}", secs(d)));
    }
    format!("{} (CPU: {cpu})", secs(t.wall))
}

fn size_name(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// One row per figure and size, one column per backend.
fn table(rows: &[(String, usize, Vec<Option<Figures>>)], backends: &[Backend]) -> String {
    let mut out = String::from("| build | sessions listed | figure |");
    for b in backends {
        out.push_str(&format!(" {} |", b.name()));
    }
    out.push_str(" target |\n|---|---|---|");
    out.push_str(&"---|".repeat(backends.len() + 1));
    out.push('\n');
    for (build, n, per_backend) in rows {
        let big = *n == 1_000_000;
        let mut row = |figure: &str, cell: &dyn Fn(&Figures) -> String, target: &str| {
            out.push_str(&format!("| {build} | {} | {figure} |", size_name(*n)));
            for f in per_backend {
                out.push_str(&format!(" {} |", f.as_ref().map_or("—".into(), cell)));
            }
            out.push_str(&format!(" {target} |\n"));
        };
        let initial_target = format!("≤ {}", secs(INITIAL_TARGET));
        let repeat_target = format!("≤ {}", secs(REPEAT_TARGET));
        row(
            "initial sync",
            &|f| timed(&f.initial),
            if big { &initial_target } else { "" },
        );
        row(
            &format!("repeat sync, unchanged (median of {REPEATS})"),
            &|f| timed(&f.repeat),
            if big { &repeat_target } else { "" },
        );
        row(
            "statements in a repeat sync",
            &|f| f.statements.values().sum::<usize>().to_string(),
            "",
        );
        row(
            "… of which",
            &|f| {
                f.statements
                    .iter()
                    .map(|(kind, count)| format!("{count} × {kind}"))
                    .collect::<Vec<_>>()
                    .join("<br>")
            },
            "",
        );
    }
    out
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let backends = Backend::available();
    let this = PathBuf::from(env!("CARGO_BIN_EXE_acp-gateway"));
    let baseline = std::env::var_os("SYNC_BASELINE").map(PathBuf::from);
    let sizes = |var: &str, default: &str| -> Vec<usize> {
        std::env::var(var)
            .unwrap_or_else(|_| default.into())
            .split(',')
            .map(|n| n.trim().parse().expect("sizes: comma-separated numbers"))
            .collect()
    };
    let all = sizes("SYNC_SIZES", SIZES);
    let mut builds = vec![("this build".to_owned(), this, all.clone())];
    if let Some(baseline) = baseline {
        builds.push((
            "baseline".to_owned(),
            baseline,
            sizes("SYNC_BASELINE_SIZES", "100000"),
        ));
    }
    let mut rows = Vec::new();
    let mut run = 0;
    for &n in &all {
        // Builds alternate within a size, so that both meet the machine in the same minutes.
        for (name, binary, sizes) in &builds {
            if !sizes.contains(&n) {
                continue;
            }
            let mut per_backend = Vec::new();
            for &backend in &backends {
                run += 1;
                let started = Instant::now();
                let f = figures(binary, backend, n, &dir.path().join(run.to_string())).await;
                eprintln!(
                    "{name}, {}, {} sessions: initial {}, repeat {}, {} statements ({:.0} s)",
                    backend.name(),
                    size_name(n),
                    timed(&f.initial),
                    timed(&f.repeat),
                    f.statements.values().sum::<usize>(),
                    started.elapsed().as_secs_f64()
                );
                per_backend.push(Some(f));
            }
            rows.push((name.clone(), n, per_backend));
        }
    }

    let (commit, cores) = (support::commit(), support::cores());
    let mut report = format!(
        "List sync; commit {commit}, {cores} cores\n\n\
         The echo agent lists synthetic sessions ({} a page, made up as they are listed); \
         each figure on a fresh store, through `GET /sessions?refresh=true&limit=1`. \
         Statements: counted in sqlx's statement log of a gateway restarted on the same \
         store.\n\n",
        page_size()
    );
    report.push_str(&table(&rows, &backends));
    println!("{report}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/sync.md");
    std::fs::write(&out, &report).unwrap();
    println!("written to {}", out.display());
}
