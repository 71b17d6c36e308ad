//! Who is watching each session: a row per open event stream (`GET /sessions/{id}/events`, an
//! `/acp` client following it), with the replica serving it and its watcher as JSON, removed
//! when the stream ends. A replica that dies leaves its rows; readers skip the replicas that are
//! gone and [`SessionWatchers::forget_watchers_of`] removes them. Adding or removing a row
//! answers how many streams of the session its watcher has then (on its replica, and on the
//! others that beat within the lease), counted under a lock of the session's watchers (an
//! advisory lock on PostgreSQL, the write lock on SQLite), so that of streams opening or ending
//! at once on any replicas, exactly one is told it was its watcher's first or last. The SQL
//! both backends run alike, and [`impl_watchers!`] that implements [`SessionWatchers`] for
//! each.

use std::time::Duration;

use async_trait::async_trait;

use super::error::StoreResult;

/// One open stream of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatcherRecord {
    pub watcher_id: String,
    pub session_id: String,
    /// The replica serving the stream.
    pub replica: String,
    /// Who, as JSON text.
    pub author: String,
    /// Unix microseconds.
    pub since: i64,
}

/// The sessions' watchers.
#[async_trait]
pub trait SessionWatchers: Send + Sync + 'static {
    /// Adds the row (once: an id added again is not counted twice); how many of the session's
    /// rows are its watcher's now, on its replica and on the replicas that beat within `lease`
    /// (a dead replica's rows do not count).
    async fn add_watcher(&self, watcher: &WatcherRecord, lease: Duration) -> StoreResult<u64>;

    /// Removes the row (if it is still there); how many of the session's rows are its
    /// watcher's now, counted as by [`SessionWatchers::add_watcher`].
    async fn remove_watcher(&self, watcher: &WatcherRecord, lease: Duration) -> StoreResult<u64>;

    /// The session's open streams, oldest first.
    async fn watchers_of(&self, session_id: &str) -> StoreResult<Vec<WatcherRecord>>;

    /// Removes the rows of a replica that is gone.
    async fn forget_watchers_of(&self, replica: &str) -> StoreResult<()>;
}

pub const ADD: &str = "INSERT INTO session_watchers (watcher_id, session_id, replica, author, since) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (watcher_id) DO NOTHING";
pub const REMOVE: &str = "DELETE FROM session_watchers WHERE watcher_id = $1";
pub const OF: &str = "SELECT watcher_id, session_id, replica, author, since \
     FROM session_watchers WHERE session_id = $1 ORDER BY since, watcher_id";
pub const FORGET: &str = "DELETE FROM session_watchers WHERE replica = $1";

/// `impl_watchers!(Backend { reads, writes, begin_write, streams })` implements
/// [`SessionWatchers`] for `Backend`, from the parameters of the same names of
/// [`impl_store!`](crate::store::common) (`streams`: its `watcher_streams`); the backend's
/// `lock_watchers(tx, session_id)` holds off other changes of the session's watchers until the
/// transaction ends.
macro_rules! impl_watchers {
    (
        $backend:ty {
            reads: $reads:ident,
            writes: $writes:ident,
            begin_write: $begin:ident($($begin_arg:expr)?),
            streams: $streams:path $(,)?
        }
    ) => {
        #[async_trait::async_trait]
        impl $crate::store::watchers::SessionWatchers for $backend {
            async fn add_watcher(
                &self,
                w: &$crate::store::watchers::WatcherRecord,
                lease: std::time::Duration,
            ) -> $crate::store::error::StoreResult<u64> {
                self.change_watcher(w, lease, true).await
            }

            async fn remove_watcher(
                &self,
                w: &$crate::store::watchers::WatcherRecord,
                lease: std::time::Duration,
            ) -> $crate::store::error::StoreResult<u64> {
                self.change_watcher(w, lease, false).await
            }

            async fn watchers_of(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::watchers::WatcherRecord>>
            {
                use sqlx::Row as _;
                let rows = sqlx::query($crate::store::watchers::OF)
                    .bind(session_id)
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok($crate::store::watchers::WatcherRecord {
                            watcher_id: r.try_get("watcher_id")?,
                            session_id: r.try_get("session_id")?,
                            replica: r.try_get("replica")?,
                            author: r.try_get("author")?,
                            since: r.try_get("since")?,
                        })
                    })
                    .collect()
            }

            async fn forget_watchers_of(
                &self,
                replica: &str,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::watchers::FORGET)
                    .bind(replica)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }
        }

        impl $backend {
            /// Adds (`add`) or removes `w`'s row, then counts its watcher's rows of the session,
            /// under the lock of the session's watchers.
            async fn change_watcher(
                &self,
                w: &$crate::store::watchers::WatcherRecord,
                lease: std::time::Duration,
                add: bool,
            ) -> $crate::store::error::StoreResult<u64> {
                let mut tx = self.$writes.$begin($($begin_arg)?).await?;
                self.lock_watchers(&mut tx, &w.session_id).await?;
                let change = if add {
                    sqlx::query($crate::store::watchers::ADD)
                        .bind(&w.watcher_id)
                        .bind(&w.session_id)
                        .bind(&w.replica)
                        .bind(&w.author)
                        .bind(w.since)
                } else {
                    sqlx::query($crate::store::watchers::REMOVE).bind(&w.watcher_id)
                };
                change.execute(&mut *tx).await?;
                let lease = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
                let streams: i64 = sqlx::query_scalar($streams)
                    .bind(&w.session_id)
                    .bind(&w.author)
                    .bind(&w.replica)
                    .bind(lease)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(u64::try_from(streams).unwrap_or(0))
            }
        }
    };
}
