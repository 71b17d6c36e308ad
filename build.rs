//! Rebuild when a migration changes (`sqlx::migrate!` embeds them at compile time), and tell
//! the tests what PostgreSQL this machine offers, so that a test which needs what is missing is
//! ignored with its reason (cargo's summary counts it) instead of passing without running:
//!
//! - `cfg(database_url)`: `DATABASE_URL` is set, so the tests that need a PostgreSQL server run
//!   on it (and fail when it cannot be reached). Setting or unsetting it rebuilds the crate.
//! - `cfg(initdb)`: `/usr/lib/postgresql/*/bin/initdb` exists, so the tests that start a
//!   PostgreSQL cluster of their own run. Looked for when this script runs: after installing
//!   PostgreSQL where there was none, `touch build.rs`.

use std::path::Path;

const POSTGRESQL: &str = "/usr/lib/postgresql";

fn main() {
    println!("cargo::rerun-if-changed=migrations");

    println!("cargo::rustc-check-cfg=cfg(database_url)");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    if std::env::var("DATABASE_URL").is_ok_and(|url| !url.trim().is_empty()) {
        println!("cargo::rustc-cfg=database_url");
    }

    println!("cargo::rustc-check-cfg=cfg(initdb)");
    // Only a path that exists is watched: cargo reruns a script on every build while a path it
    // watches is missing, and this one would then rebuild the whole crate every time.
    if Path::new(POSTGRESQL).is_dir() {
        println!("cargo::rerun-if-changed={POSTGRESQL}");
    }
    if has_initdb() {
        println!("cargo::rustc-cfg=initdb");
    }
}

/// Whether some `/usr/lib/postgresql/*/bin` holds an `initdb` (what `tests/support/pgcluster.rs`
/// starts its clusters with).
fn has_initdb() -> bool {
    std::fs::read_dir(POSTGRESQL).is_ok_and(|versions| {
        versions
            .filter_map(Result::ok)
            .any(|version| version.path().join("bin/initdb").is_file())
    })
}
