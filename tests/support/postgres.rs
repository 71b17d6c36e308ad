//! PostgreSQL for tests and benches: the server named by `DATABASE_URL` (an administrative
//! connection, e.g. `postgres://postgres@127.0.0.1:5432/test`) and throwaway databases on it.
//!
//! Unset, PostgreSQL is skipped, loudly ([`admin_url_or_skip`]: CI fails on the word SKIPPED);
//! set but not connectable (the server down, or the database it names missing), creating a
//! database panics and says which. Every database made here is named
//! `acpgw_<label>_<random>`, the pattern CI sweeps after killed runs.

use std::io::Write;

use sqlx::Connection;

/// The administrative URL from `DATABASE_URL`; `None` when it is unset or empty.
pub fn admin_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

/// [`admin_url`], or `None` after saying on the real stderr that `test` was skipped. Not
/// `eprintln!`: the test harness captures that and hides it for a passing test, and a skip
/// must be seen.
pub fn admin_url_or_skip(test: &str) -> Option<String> {
    let url = admin_url();
    if url.is_none() {
        let _ = writeln!(
            std::io::stderr(),
            "\n!!!!!!!! {test} SKIPPED: DATABASE_URL is not set, PostgreSQL was NOT tested !!!!!!!!\n"
        );
    }
    url
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
        let admin = admin_url().expect("DATABASE_URL is set");
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
