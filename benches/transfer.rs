//! Export and move throughput (not a test): events per second of `GET /sessions/{id}/export`
//! (JSON Lines and Markdown, read to their end by a client) and of
//! `acp-gateway migrate --from … --to …` (copy and check), each against reading the same events
//! from the same store directly (`EventLog::read_events`, pages of 1,000, through the library),
//! in the same run.
//!
//! Run with `bash bench/transfer.sh` (it builds the release binaries first). The store holds
//! `TRANSFER_EVENTS` events (default 1,000,000) in 10 sessions, written through the library.
//! SQLite is always measured: the direct read, both exports, and `migrate` into a new SQLite
//! file. With `DATABASE_URL` set (an administrative connection), `migrate` into a fresh
//! PostgreSQL database is measured too, then the direct read and the JSON Lines export from it.
//! Prints a table and writes it to `bench/results/transfer.md`.

mod support;

use std::time::Instant;

use acp_gateway::store::{NewEvent, Origin, SessionRecord};
use futures::StreamExt;
use serde_json::json;
use support::{Backend, Database, Gateway, Options};

const SESSIONS: usize = 10;
const BATCH: usize = 1_000;

/// One measured way of reading the events: its name, the events it read, the seconds it took.
struct Measured {
    what: String,
    events: u64,
    secs: f64,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

/// Writes `events` events over [`SESSIONS`] sessions into the store at `url`; their ids.
async fn fill(url: &str, events: usize) -> Vec<String> {
    let db = acp_gateway::store::connect(url, "bench").await.unwrap();
    let each = events / SESSIONS;
    let mut ids = Vec::new();
    for s in 0..SESSIONS {
        let id = format!("sess_transfer_{s:02}");
        let record = SessionRecord::new(
            id.clone(),
            "default".into(),
            "/tmp".into(),
            "default".into(),
            Origin::Gateway,
            chrono::Utc::now(),
        );
        db.store.put_session(&record).await.unwrap();
        for start in (0..each).step_by(BATCH) {
            let batch: Vec<NewEvent> = (start..(start + BATCH).min(each))
                .map(|n| NewEvent {
                    kind: if n % 50 == 0 { "turn_started" } else { "agent_message_chunk" }.into(),
                    payload: json!({"sessionId": id, "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": format!("word {n} of a longer answer ")}}}).into(),
                })
                .collect();
            db.store.append_events(&id, &batch).await.unwrap();
        }
        ids.push(id);
    }
    ids
}

/// Every event of `ids` read from the store at `url` directly.
async fn direct(url: &str, ids: &[String], what: &str) -> Measured {
    let db = acp_gateway::store::connect(url, "bench").await.unwrap();
    let started = Instant::now();
    let mut events = 0;
    for id in ids {
        let mut after = 0;
        loop {
            let page = db.store.read_events(id, after, BATCH as i64).await.unwrap();
            let Some(last) = page.last() else { break };
            after = last.seq;
            events += page.len() as u64;
        }
    }
    Measured {
        what: what.into(),
        events,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// Every session of `ids` exported by `gw` as `accept`, read to its end; the events are the
/// JSON Lines' event lines (the Markdown is counted by the sessions' events).
async fn export(gw: &Gateway, ids: &[String], accept: &str, what: &str, events: u64) -> Measured {
    let started = Instant::now();
    let mut lines = 0u64;
    for id in ids {
        let r = gw
            .http
            .get(gw.url(&format!("/sessions/{id}/export")))
            .header("accept", accept)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut body = r.bytes_stream();
        while let Some(chunk) = body.next().await {
            lines += chunk.unwrap().iter().filter(|b| **b == b'\n').count() as u64;
        }
    }
    let read = if accept.contains("ndjson") {
        lines - 2 * ids.len() as u64
    } else {
        events
    };
    assert_eq!(read, events, "{what}: every event exported");
    Measured {
        what: what.into(),
        events: read,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// `acp-gateway migrate --from from --to to`, to its end.
async fn migrate(from: &str, to: &str, what: &str, events: u64) -> Measured {
    let started = Instant::now();
    let out = tokio::process::Command::new(Options::bench().binary)
        .args(["migrate", "--from", from, "--to", to])
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!("session_events: {events} rows")),
        "{said}"
    );
    Measured {
        what: what.into(),
        events,
        secs,
    }
}

#[tokio::main]
async fn main() {
    let events: usize = std::env::var("TRANSFER_EVENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Database::create(Backend::Sqlite, dir.path(), "transfer").await;
    let filled = Instant::now();
    let ids = fill(&sqlite.url, events).await;
    let total = (events / SESSIONS * SESSIONS) as u64;
    eprintln!(
        "filled {total} events in {:.1} s",
        filled.elapsed().as_secs_f64()
    );

    let mut runs = Vec::new();
    let base = direct(&sqlite.url, &ids, "SQLite: read from the store directly").await;
    let gw = Gateway::spawn(&sqlite.url, &dir.path().join("gw"), &Options::bench()).await;
    runs.push(
        export(
            &gw,
            &ids,
            "application/x-ndjson",
            "SQLite: export, JSON Lines",
            total,
        )
        .await,
    );
    runs.push(
        export(
            &gw,
            &ids,
            "text/markdown",
            "SQLite: export, Markdown",
            total,
        )
        .await,
    );
    gw.stop().await;
    let copy = format!("sqlite:{}", dir.path().join("copy.db").display());
    runs.push(
        migrate(
            &sqlite.url,
            &copy,
            "SQLite → SQLite: migrate (copy and check)",
            total,
        )
        .await,
    );
    let mut rows = vec![(base, runs)];

    if support::postgres::admin_url().is_some() {
        let mut pg = Database::create(Backend::Postgres, &dir.path().join("pg"), "transfer").await;
        let moved = migrate(
            &sqlite.url,
            &pg.url,
            "SQLite → PostgreSQL: migrate (copy and check)",
            total,
        )
        .await;
        let base = direct(&pg.url, &ids, "PostgreSQL: read from the store directly").await;
        let gw = Gateway::spawn(&pg.url, &dir.path().join("gwpg"), &Options::bench()).await;
        let exported = export(
            &gw,
            &ids,
            "application/x-ndjson",
            "PostgreSQL: export, JSON Lines",
            total,
        )
        .await;
        gw.stop().await;
        rows.push((base, vec![exported, moved]));
        pg.remove().await;
    }

    let mut table = format!(
        "Export and move, {total} events in {SESSIONS} sessions (commit {}):\n\n| what | events/s | vs. the direct read |\n|---|---|---|\n",
        support::commit()
    );
    for (base, runs) in &rows {
        table.push_str(&format!("| {} | {:.0} | 1 |\n", base.what, base.rate()));
        for run in runs {
            table.push_str(&format!(
                "| {} | {:.0} | {:.2} |\n",
                run.what,
                run.rate(),
                run.rate() / base.rate()
            ));
        }
    }
    print!("{table}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/transfer.md");
    std::fs::write(out, table).unwrap();
}
