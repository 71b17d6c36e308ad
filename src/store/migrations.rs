//! The schema migrations of each backend, embedded in the binary (the files under
//! `migrations/`), made into sqlx migrators at run time.
//!
//! `sqlx::migrate!` would embed them too, but its proc macro builds a second copy of sqlx and
//! of SQLite's C sources for the compiler's host: a minute of a fresh build for a list of
//! files. Versions, descriptions and checksums come out as the macro makes them (the version
//! and the words of the file name; SHA-384 of the text), so databases migrated by either agree.
//! A test keeps each list equal to its directory.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};

/// `(file name without .sql, text)` of each migration of `dir`, in order.
macro_rules! embedded {
    ($dir:literal: $($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../migrations/", $dir, "/", $name, ".sql")))),*]
    };
}

/// `migrations/postgres`.
pub const POSTGRES: &[(&str, &str)] = embedded!("postgres":
    "0001_init", "0002_session_moves", "0003_replicas", "0004_session_owners",
    "0005_listed", "0006_event_payload_json", "0007_synced_listed", "0008_session_states",
    "0009_session_agent", "0010_webhooks", "0012_replica_agents", "0013_idempotency_keys",
    "0014_tenant_quotas", "0015_vanished", "0016_forwarded_keys", "0017_session_workspaces",
    "0018_session_people", "0019_prompt_queue", "0020_session_watchers",
    "0021_usage_ledger", "0022_installed_agents", "0023_installed_agents_logged_out",
    "0024_store_copies", "0025_session_shares",
);

/// `migrations/sqlite`.
pub const SQLITE: &[(&str, &str)] = embedded!("sqlite":
    "0001_init", "0002_session_moves", "0003_replicas", "0004_session_owners",
    "0005_listed", "0007_synced_listed", "0008_session_states", "0009_session_agent",
    "0010_webhooks", "0011_event_rowid", "0012_replica_agents", "0013_idempotency_keys",
    "0014_tenant_quotas", "0015_vanished", "0016_forwarded_keys", "0017_session_workspaces",
    "0018_session_people", "0019_prompt_queue", "0020_session_watchers",
    "0021_usage_ledger", "0022_installed_agents", "0023_installed_agents_logged_out",
    "0024_store_copies", "0025_session_shares",
);

/// A migrator applying `files` (one of the lists above).
pub fn migrator(files: &'static [(&'static str, &'static str)]) -> Migrator {
    let migrations = files
        .iter()
        .map(|(name, sql)| {
            let (version, words) = name.split_once('_').expect("NNNN_words");
            Migration::new(
                version.parse().expect("a numbered migration"),
                Cow::Owned(words.replace('_', " ")),
                MigrationType::Simple,
                Cow::Borrowed(*sql),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect::<Vec<_>>();
    Migrator {
        migrations: Cow::Owned(migrations),
        // A database a later release has migrated further keeps serving this one: migrations
        // only add (see docs/operations.md), so a replica can restart on the old release in
        // the middle of a rolling upgrade.
        ignore_missing: true,
        ..Migrator::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_file_is_embedded_in_order() {
        for (dir, files) in [("postgres", POSTGRES), ("sqlite", SQLITE)] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(dir);
            let mut on_disk: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            on_disk.sort();
            let embedded: Vec<String> = files.iter().map(|(n, _)| format!("{n}.sql")).collect();
            assert_eq!(
                embedded, on_disk,
                "migrations/{dir} and store/migrations.rs differ"
            );
            let versions: Vec<i64> = migrator(files).iter().map(|m| m.version).collect();
            assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        }
    }
}
