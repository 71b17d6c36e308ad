//! PostgreSQL for tests and benches: the server named by `DATABASE_URL` (an administrative
//! connection, e.g. `postgres://postgres@127.0.0.1:5432/test`) and throwaway databases on it.
//!
//! Whether a test needs it is said where the test is declared: built without `DATABASE_URL`
//! (`cfg(database_url)`, set by `build.rs`), such a test is ignored with the reason
//! [`NEEDS_POSTGRES`] names, so cargo's summary counts it. Run anyway, or with `DATABASE_URL`
//! set but not connectable (the server down, or the database it names missing), it fails and
//! says why. Every database made here is named `acpgw_<label>_<random>`, the pattern CI sweeps
//! after killed runs.

use sqlx::Connection;

/// The reason a test that needs the server of `DATABASE_URL` is ignored without it; every such
/// test's `ignore` says this (an attribute takes a literal, not this constant), and CI fails
/// when a run ignored any test for it.
pub const NEEDS_POSTGRES: &str = "needs PostgreSQL: set DATABASE_URL";

/// The administrative URL from `DATABASE_URL`; `None` when it is unset or empty.
pub fn admin_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// [`admin_url`] for a test that needs it; panics, saying so, when `DATABASE_URL` is unset (a
/// test ignored for that reason and run anyway with `--ignored`).
pub fn required_admin_url() -> String {
    admin_url().unwrap_or_else(|| panic!("{NEEDS_POSTGRES}: it is not set"))
}

/// `url` with its database name replaced by `database` (user, host, port and `?params` kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (base, params) = match url.split_once('?') {
        Some((base, params)) => (base, Some(params)),
        None => (url, None),
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

/// How a fresh database orders text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collation {
    /// The server's default (what the gateway tests and the benches measure on).
    ServerDefault,
    /// ICU `en-US`, where text order is not byte order ("a" < "B"): proves that a store does
    /// not depend on the server's collation. Falls back to the default, with a note, on a
    /// server without ICU.
    IcuEnUs,
}

/// A database of its own on the server of `DATABASE_URL`, for one test or one measurement.
/// [`FreshDatabase::remove`] drops it; one that is never removed (a test that panicked) is
/// dropped when this value is.
pub struct FreshDatabase {
    /// Its URL: the admin URL with the database name replaced.
    pub url: String,
    pub name: String,
    admin: String,
    removed: bool,
}

impl FreshDatabase {
    /// Creates `acpgw_<label>_<random>`. Panics when `DATABASE_URL` is unset or unreachable.
    pub async fn create(label: &str, collation: Collation) -> FreshDatabase {
        let admin = required_admin_url();
        let name = format!("acpgw_{label}_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "DATABASE_URL is set, but connecting to {admin} failed: {e} (the server must \
                     run and the database named must exist: `createdb` makes it)"
                )
            });
        let plain = format!("CREATE DATABASE {name}");
        if collation == Collation::IcuEnUs {
            let icu = format!("{plain} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'");
            match sqlx::query(&icu).execute(&mut conn).await {
                Ok(_) => return FreshDatabase::named(admin, name),
                Err(e) => eprintln!("note: no ICU database ({e}); using the server's default"),
            }
        }
        sqlx::query(&plain)
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        FreshDatabase::named(admin, name)
    }

    fn named(admin: String, name: String) -> FreshDatabase {
        FreshDatabase {
            url: with_database(&admin, &name),
            name,
            admin,
            removed: false,
        }
    }

    /// Drops the database, closing whatever is still connected to it.
    pub async fn remove(mut self) {
        self.removed = true;
        drop_database(&self.admin, &self.name).await;
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        // Drop cannot await, and may run on a runtime's thread: a runtime of its own, on a
        // thread of its own.
        let (admin, name) = (self.admin.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(drop_database(&admin, &name))
        })
        .join();
    }
}

async fn drop_database(admin: &str, name: &str) {
    let dropped = match sqlx::PgConnection::connect(admin).await {
        Ok(mut conn) => sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = dropped {
        eprintln!("warning: could not drop database {name}: {e}");
    }
}
