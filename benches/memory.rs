//! What a live session and a subscriber cost the gateway in memory (not a test): the gateway's
//! RSS (its process only; the agent is another) as live idle sessions grow to 1,000 and then
//! 10,000 on one bench agent, then with an SSE subscriber on each of 1,000 of them, then once
//! each of those has had a turn (its state folded, its log's tail in the hub's buffer).
//!
//! Run with `bash bench/memory.sh` (it builds the release binaries first). SQLite is always
//! measured; with `DATABASE_URL` set, PostgreSQL too. `MEMORY_SESSIONS` sets the two session
//! counts (default `1000,10000`), `MEMORY_SUBSCRIBERS` how many sessions get a subscriber and a
//! turn (default 1,000). Writes `bench/results/memory.md`.

mod support;

use std::path::Path;

use futures::StreamExt;
use support::fronts::{env_or, load_average};
use support::{Backend, Database, Gateway, Options, Sse, settled_rss};

/// Sessions created (and subscribers opened) at once.
const CONCURRENCY: usize = 16;

/// Creates sessions until `gw` has `total` of them in `ids`.
async fn create_up_to(gw: &Gateway, ids: &mut Vec<String>, total: usize) {
    let more = futures::stream::iter(ids.len()..total)
        .map(|_| gw.create("/tmp"))
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<String>>()
        .await;
    ids.extend(more);
}

/// KiB per item, growing from `before` to `after` over `items`.
fn per(before: u64, after: u64, items: usize) -> String {
    let kib = after.saturating_sub(before) as f64 / items.max(1) as f64;
    format!("{kib:.2} KiB")
}

async fn measure(backend: Backend, dir: &Path, counts: &[usize], subscribers: usize) -> String {
    let mut db = Database::create(backend, dir, "memory").await;
    let opts = Options {
        agent: support::bench_agent(),
        ..Options::bench()
    };
    let gw = Gateway::spawn(&db.url, dir, &opts).await;
    let mut ids = Vec::new();
    // One first, so that what is built lazily (pools, caches) is not charged to sessions.
    create_up_to(&gw, &mut ids, 1).await;
    let idle = settled_rss(&gw).await;
    let mut out = String::new();
    let mut before = idle;
    for &n in counts {
        create_up_to(&gw, &mut ids, n).await;
        before = settled_rss(&gw).await;
        out += &format!(
            "| {} | {n} live idle sessions | {:.1} MiB | {} per session (1 → {n}) |\n",
            backend.name(),
            before as f64 / 1024.0,
            per(idle, before, n - 1),
        );
    }
    let followed = &ids[..subscribers.min(ids.len())];
    let mut streams: Vec<Sse> = futures::stream::iter(followed)
        .map(|id| gw.events(id, None))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let with_streams = settled_rss(&gw).await;
    out += &format!(
        "| {} | and {} SSE subscribers, one per session | {:.1} MiB | {} per subscriber |\n",
        backend.name(),
        followed.len(),
        with_streams as f64 / 1024.0,
        per(before, with_streams, followed.len()),
    );
    futures::stream::iter(followed)
        .map(|id| gw.prompt(id, "/chunks 20"))
        .buffer_unordered(CONCURRENCY)
        .for_each(|(status, body)| async move { assert_eq!(status, 200, "{body}") })
        .await;
    // Every subscriber reads its turn, so the hub's buffers hold it and nothing waits.
    for sse in &mut streams {
        while let Some(frame) = sse.next_frame().await {
            if frame.bytes().windows(10).any(|w| w == b"turn_ended") {
                break;
            }
        }
    }
    let after_turns = settled_rss(&gw).await;
    out += &format!(
        "| {} | and one 20-chunk turn in each followed session | {:.1} MiB | {} per session with a turn |\n",
        backend.name(),
        after_turns as f64 / 1024.0,
        per(with_streams, after_turns, followed.len()),
    );
    drop(streams);
    gw.stop().await;
    db.remove().await;
    format!(
        "| {} | idle, one session | {:.1} MiB | — |\n{out}",
        backend.name(),
        idle as f64 / 1024.0
    )
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let counts: Vec<usize> = env_or::<String>("MEMORY_SESSIONS", "1000,10000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("MEMORY_SESSIONS: numbers"))
        .collect();
    let subscribers: usize = env_or("MEMORY_SUBSCRIBERS", 1000);
    let load_before = load_average();
    let mut table = String::new();
    for backend in Backend::available() {
        eprintln!("{}…", backend.name());
        let state = dir.path().join(backend.name());
        table += &measure(backend, &state, &counts, subscribers).await;
    }
    let report = format!(
        "Memory; commit {}, {} cores, load average {load_before} before and {} after; one run of \
         `bash bench/memory.sh`\n\n\
         The gateway's RSS (its process only, read from /proc after 750 ms of quiet) on one bench \
         agent (`examples/bench_agent.rs`), the default settings (no limit on live sessions): \
         live idle sessions created 16 at a time, then an SSE subscriber on each of the first \
         {subscribers}, then one 20-chunk turn in each of those, every subscriber reading it. \
         A session's growth is from the idle gateway with one session (RSS also falls back as the \
         allocator returns memory, so a smaller count's figure carries more of the fixed costs); \
         a subscriber's from the row above, and a turn's from the row above it.\n\n\
         | backend | what is held | RSS | growth |\n|---|---|---|---|\n{table}",
        support::commit(),
        support::cores(),
        load_average(),
    );
    print!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/memory.md");
    std::fs::write(out, report).unwrap();
}
