//! The one gateway an SQLite file has: the lock that keeps a second one off, and the record
//! of the sessions it holds live ([`HeldSessions`]).

use async_trait::async_trait;

use sqlx::sqlite::SqliteConnectOptions;

use super::store::{BEGIN_IMMEDIATE, SqliteStore};
use crate::store::common::release_session;
use crate::store::error::StoreResult;
use crate::store::replicas::HeldSessions;

/// Held for as long as one gateway serves an SQLite database file: a second gateway on the same
/// file is refused, since each gateway assumes it is its database's only writer (the
/// list-page cache, the event writer). Released when dropped, or when the process ends.
#[derive(Debug)]
pub struct ReplicaLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Takes the [`ReplicaLock`] of the SQLite database `options` name (`None` for an in-memory
/// database, which no other process can open): an advisory lock on `<database>.gateway-lock`.
pub fn lock_single_replica(
    options: &SqliteConnectOptions,
    in_memory: bool,
) -> anyhow::Result<Option<ReplicaLock>> {
    if in_memory {
        return Ok(None);
    }
    let mut path = options.get_filename().as_os_str().to_owned();
    path.push(".gateway-lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(ReplicaLock { _lock: lock })),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => anyhow::bail!(
            "another gateway is already serving the SQLite database {}: SQLite allows one \
             gateway replica; use PostgreSQL to run several",
            options.get_filename().display()
        ),
        Err((_, e)) => anyhow::bail!("cannot lock {}: {e}", path.display()),
    }
}

/// One gateway serves an SQLite database at a time (see [`ReplicaLock`]): its live sessions are
/// rows of `session_owners`, without the registry's leases.
#[async_trait]
impl HeldSessions for SqliteStore {
    async fn hold(&self, session_id: &str, replica: &str) -> StoreResult<bool> {
        // The write lock up front: a deferred transaction that read first and then found the
        // log writer's connection writing would fail at once (SQLite waits for a lock only
        // when a transaction starts, not when a reading one turns into a writing one).
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let before: Option<String> =
            sqlx::query_scalar("SELECT replica_id FROM session_owners WHERE session_id = ?")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
        sqlx::query(
            "INSERT INTO session_owners (session_id, replica_id) VALUES (?, ?) \
             ON CONFLICT (session_id) DO UPDATE SET replica_id = excluded.replica_id",
        )
        .bind(session_id)
        .bind(replica)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(before.is_some_and(|b| b != replica))
    }

    async fn release(&self, session_id: &str, replica: &str) -> StoreResult<()> {
        release_session(&self.writer, session_id, replica).await
    }

    async fn release_all(&self, replica: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM session_owners WHERE replica_id = ?")
            .bind(replica)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn left(&self, replica: &str) -> StoreResult<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM session_owners WHERE replica_id <> ?")
                .bind(replica)
                .fetch_all(&self.writer)
                .await?,
        )
    }
}
