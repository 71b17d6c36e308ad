//! Opening a database: its URL read once ([`DatabaseUrl`]), the lock that keeps a second gateway
//! off an SQLite file, and the store with its replica registry ([`Database`]).

use std::sync::Arc;

use super::contract::Store;
use super::diagnosis;
use super::error::{StoreError, StoreResult};
use super::postgres::PgStore;
use super::replicas::Replicas;
use super::sqlite::SqliteStore;
use super::sqlite::replica::ReplicaLock;
use super::sqlite::{self, replica};

/// A database named by a URL, read once: `postgres://…` or `postgresql://…` for PostgreSQL;
/// `sqlite:PATH`, `sqlite://PATH` or a plain file path for SQLite (created when missing),
/// `sqlite::memory:` for a private in-memory one.
#[derive(Debug, Clone)]
pub enum DatabaseUrl {
    Postgres(String),
    Sqlite {
        options: Box<sqlx::sqlite::SqliteConnectOptions>,
        in_memory: bool,
    },
}

impl DatabaseUrl {
    /// `url` read, or why the gateway cannot use it: a scheme it does not speak, or an SQLite
    /// file in a folder that does not exist (see `diagnosis.rs`).
    pub fn parse(url: &str) -> StoreResult<DatabaseUrl> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(url.to_owned()));
        }
        if let Some(why) = diagnosis::refused_url(url) {
            return Err(StoreError::Refused(why));
        }
        let (options, in_memory) = sqlite::parse_url(url)?;
        if let Some(why) = (!in_memory)
            .then(|| diagnosis::missing_folder(options.get_filename()))
            .flatten()
        {
            return Err(StoreError::Refused(why));
        }
        Ok(DatabaseUrl::Sqlite {
            options: Box::new(options),
            in_memory,
        })
    }
}

impl DatabaseUrl {
    /// Why opening it failed with `e`, on one line: `database URL: what is wrong. What to do`
    /// (`shown`: the URL as given, its password masked).
    pub fn unusable(&self, shown: &str, e: &StoreError) -> String {
        let what = match self {
            DatabaseUrl::Postgres(url) => diagnosis::postgres(url, e),
            DatabaseUrl::Sqlite { options, .. } => {
                diagnosis::sqlite(&options.get_filename().display(), e)
            }
        };
        format!("database {shown}: {what}")
    }
}

/// For a gateway about to serve `database`: on SQLite, the lock that keeps a second gateway off
/// the same file (see [`ReplicaLock`]); PostgreSQL takes any number of replicas.
pub fn lock_single_replica(database: &DatabaseUrl) -> anyhow::Result<Option<ReplicaLock>> {
    match database {
        DatabaseUrl::Postgres(_) => Ok(None),
        DatabaseUrl::Sqlite { options, in_memory } => {
            replica::lock_single_replica(options, *in_memory)
        }
    }
}

/// A database opened by [`connect`]: its store, and how it records the gateway processes that
/// use it.
#[derive(Clone)]
pub struct Database {
    pub store: Arc<dyn Store>,
    pub replicas: Replicas,
}

/// Opens the database named by `url` and applies its migrations (see [`DatabaseUrl`] and
/// [`open`]).
pub async fn connect(url: &str, replica_id: &str) -> StoreResult<Database> {
    open(&DatabaseUrl::parse(url)?, replica_id).await
}

/// Opens `database` and applies its migrations. `replica_id` is the id of the gateway replica
/// the store serves (see [`PgStore::connect`]).
pub async fn open(database: &DatabaseUrl, replica_id: &str) -> StoreResult<Database> {
    match database {
        DatabaseUrl::Postgres(url) => {
            let db = Arc::new(PgStore::connect(url, replica_id).await?);
            Ok(Database {
                store: db.clone(),
                replicas: Replicas::Shared(db),
            })
        }
        DatabaseUrl::Sqlite { options, in_memory } => {
            let db = Arc::new(SqliteStore::open((**options).clone(), *in_memory).await?);
            Ok(Database {
                store: db.clone(),
                replicas: Replicas::Alone(db),
            })
        }
    }
}
