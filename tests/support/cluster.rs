//! Three gateway replicas sharing one PostgreSQL database (and one agent state directory, as
//! agents on one host share their home), for the tests of what any replica serves.

use super::{Gateway, Options, World};

/// A PostgreSQL world with replicas `a` (the world's), `b` and `c`, each started with `opts`,
/// once each sees all three.
pub async fn three_replicas(opts: Options) -> (World, Gateway, Gateway) {
    let w = World::start(super::Backend::Postgres, opts.clone()).await;
    let b = Gateway::spawn(&w.db.url, w.dir.path(), &opts).await;
    let c = Gateway::spawn(&w.db.url, w.dir.path(), &opts).await;
    for g in [w.gw(), &b, &c] {
        g.wait_until(|g| async move {
            g.json("/agent").await["replicas"].as_array().unwrap().len() == 3
        })
        .await;
    }
    (w, b, c)
}

/// Heartbeats every second: a dead replica's lease runs out after three.
pub fn beating() -> Options {
    Options::default().args(&["--heartbeat-interval", "1"])
}

/// Which of `replicas` holds sessions live on its first member, and how many.
pub async fn sessions_held(replicas: &[&Gateway]) -> Vec<u64> {
    let mut held = Vec::new();
    for g in replicas {
        held.push(
            g.json("/agent").await["members"][0]["sessions"]
                .as_u64()
                .unwrap_or(0),
        );
    }
    held
}
