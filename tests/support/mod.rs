//! What the integration tests and the benchmarks share: the echo agent ([`agent`]), throwaway
//! PostgreSQL databases ([`postgres`]) and clusters of a test's own ([`pgcluster`]), the gateway
//! binary ([`gateway`]) and a test's [`World`] around it ([`world`]), one SSE reader ([`sse`]), what `/proc` says about a process ([`process`]), a webhook
//! receiver that checks signatures with the reference library ([`webhooks`]), checks on
//! problem documents ([`problem`]), and the secrets no gateway may log ([`secrets`]).
//!
//! The tests' crate (`tests/main.rs`) declares it first, so its macros reach every test file;
//! benches include it through `benches/support/mod.rs`, which adds what only they need (load
//! generators, baselines, reports) on top of it. Each bench is a crate of its own that uses part
//! of this (and of the re-exports below), hence the `allow`.
#![allow(dead_code, unused_imports)]

pub mod acp;
pub mod agent;
pub mod balancer;
pub mod cluster;
pub mod gateway;
pub mod git;
pub mod pgcluster;
pub mod postgres;
pub mod problem;
pub mod process;
pub mod raw;
pub mod registry;
pub mod secrets;
pub mod seen;
pub mod sse;
pub mod webhooks;
pub mod world;

use std::time::Duration;

pub use agent::{DirectClient, echo_agent};
pub use gateway::Gateway;
pub use pgcluster::{NEEDS_INITDB, PgCluster};
pub use postgres::{FreshDatabase, NEEDS_POSTGRES, required_admin_url};
pub use problem::{assert_kind, assert_problem};
pub use process::{pid_alive, processes_with_env};
pub use secrets::secret;
pub use sse::{Sse, SseEvent, chunk_text, find_event, last_event, positions, seqs};
pub use world::{Database, Options, World};

/// Upper bound for anything a test waits for: a hang fails the test instead of blocking CI.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Which store a gateway runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The stores to measure or test here: SQLite, and PostgreSQL when `DATABASE_URL` is set.
    pub fn available() -> Vec<Backend> {
        let mut backends = vec![Backend::Sqlite];
        if postgres::admin_url().is_some() {
            backends.push(Backend::Postgres);
        }
        backends
    }

    /// The name tables and messages use.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        }
    }
}

/// Generates `sqlite::NAME` and `postgres::NAME` tests from `async fn NAME(backend: Backend)`;
/// the PostgreSQL one is ignored, with its reason, when built without `DATABASE_URL`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name($crate::support::Backend::Sqlite).await } )* }
        mod postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(not(database_url), ignore = "needs PostgreSQL: set DATABASE_URL")]
            async fn $name() { super::$name($crate::support::Backend::Postgres).await }
        )* }
    };
}
