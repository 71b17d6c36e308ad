//! Who is watching each session: a row per open event stream (`GET /sessions/{id}/events`, an
//! `/acp` client following it), with the replica serving it and its watcher as JSON, removed
//! when the stream ends. A replica that dies leaves its rows; readers skip the replicas that are
//! gone and [`SessionWatchers::forget_watchers_of`] removes them. The SQL both backends run
//! alike, and [`impl_watchers!`] that implements [`SessionWatchers`] for each.

use async_trait::async_trait;

use super::error::StoreResult;

/// One open stream of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    async fn add_watcher(&self, watcher: &WatcherRecord) -> StoreResult<()>;

    async fn remove_watcher(&self, watcher_id: &str) -> StoreResult<()>;

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

/// `impl_watchers!(Backend { reads, writes })` implements [`SessionWatchers`] for `Backend`,
/// from the parameters of the same names of [`impl_store!`](crate::store::common).
macro_rules! impl_watchers {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::watchers::SessionWatchers for $backend {
            async fn add_watcher(
                &self,
                w: &$crate::store::watchers::WatcherRecord,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::watchers::ADD)
                    .bind(&w.watcher_id)
                    .bind(&w.session_id)
                    .bind(&w.replica)
                    .bind(&w.author)
                    .bind(w.since)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn remove_watcher(
                &self,
                watcher_id: &str,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::watchers::REMOVE)
                    .bind(watcher_id)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
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
    };
}
