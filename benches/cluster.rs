//! Cluster benchmark (not a test): `GET /sessions/{id}/status` throughput across three gateway
//! replicas sharing one PostgreSQL database, against one replica answering alone, measured in
//! the same run. Each replica holds one live session. "Alone": every client asks one replica
//! about its own session. "Each its own": clients spread over the three replicas, each asking
//! about a session its replica holds. "Any": clients spread over the replicas and the
//! sessions, so two requests in three are forwarded to the replica holding the session.
//!
//! Run with `DATABASE_URL=… bash bench/cluster.sh`. Prints a table and writes it to
//! `bench/results/cluster.md`.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::{Backend, Database, Gateway, LoadPlan, Options, load_spread, postgres};

/// Each layout measured `rounds` times, the three alternated; the best of each.
const LOAD: LoadPlan = LoadPlan::STANDARD;

#[tokio::main]
async fn main() {
    postgres::admin_url().expect("DATABASE_URL: the replicas share one PostgreSQL database");
    let dir = tempfile::tempdir().unwrap();
    let mut db = Database::create(Backend::Postgres, dir.path(), "bench").await;
    let options = Options::bench().args(&["--heartbeat-interval", "1"]);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Gateway::spawn(&db.url, dir.path(), &options).await);
    }
    let http = reqwest::Client::new();
    // Wait until every replica knows the others, then give each a session of its own (a
    // replica keeps what it creates while it holds no more than the others).
    for gw in &replicas {
        while gw.json("/agent").await["replicas"]
            .as_array()
            .map_or(0, Vec::len)
            < 3
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut sessions = Vec::new();
    for gw in &replicas {
        sessions.push(gw.create("/tmp").await);
    }
    let (replicas_ref, sessions_ref, http_ref) = (&replicas, &sessions, &http);
    let target = |replica: usize, session: usize| async move {
        let (replicas, sessions, http) = (replicas_ref, sessions_ref, http_ref);
        let url = format!(
            "{}/sessions/{}/status",
            replicas[replica].base, sessions[session]
        );
        let body = http.get(&url).send().await.unwrap().bytes().await.unwrap();
        (url, body.len())
    };
    let alone = vec![target(0, 0).await];
    let own = vec![target(0, 0).await, target(1, 1).await, target(2, 2).await];
    let mut any = Vec::new();
    for replica in 0..3 {
        for session in 0..3 {
            any.push(target(replica, session).await);
        }
    }
    let mut best = [0.0f64; 3];
    for round in 0..LOAD.rounds {
        for k in 0..3 {
            let k = (k + round) % 3;
            let targets = [&alone, &own, &any][k];
            best[k] = best[k].max(load_spread(targets, LOAD, false).await);
        }
    }
    for gw in replicas {
        gw.stop().await;
    }
    db.remove().await;
    let (commit, cores) = (support::commit(), support::cores());
    let table = format!(
        "`GET /sessions/{{id}}/status` across replicas; commit {commit}, {cores} cores; \
         {}, layouts alternated, best of {}\n\n\
         | layout | req/s | ÷ one replica alone |\n|---|---|---|\n\
         | one replica alone, its own session | {:.0} | 1.00 |\n\
         | three replicas, each asked about its own session | {:.0} | {:.2} |\n\
         | three replicas, asked about any session (2 in 3 forwarded) | {:.0} | {:.2} |\n",
        LOAD.describe(),
        LOAD.rounds,
        best[0],
        best[1],
        best[1] / best[0],
        best[2],
        best[2] / best[0],
    );
    println!("{table}");
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results/cluster.md");
    std::fs::write(&out, &table).unwrap();
    println!("written to {}", out.display());
}
