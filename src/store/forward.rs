//! The `impl Store` of a backend, written once: [`forward_store!`] forwards every method of the
//! trait to the backend's inherent method of the same name.
//!
//! A trait impl cannot span files, but a backend's use cases are spread over a file each
//! (`sessions.rs`, `events.rs`, `lifecycle.rs`): each file holds inherent methods, and this
//! macro joins them into the trait impl. An inherent method is found before a trait's, so none
//! of the generated methods calls itself.

/// `forward_store!(Backend)` implements [`Store`](crate::store::Store) for `Backend` by calling
/// its inherent methods; `forward_store!(Backend { items })` adds `items` (the trait's provided
/// methods the backend overrides) to the impl.
macro_rules! forward_store {
    ($backend:ty) => {
        forward_store!($backend {});
    };
    ($backend:ty { $($extra:tt)* }) => {
        #[async_trait::async_trait]
        impl $crate::store::Store for $backend {
            async fn ping(&self) -> $crate::store::StoreResult<()> {
                self.ping().await
            }

            async fn put_session(
                &self,
                record: &$crate::store::SessionRecord,
            ) -> $crate::store::StoreResult<bool> {
                self.put_session(record).await
            }

            async fn get_session(
                &self,
                session_id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::SessionRecord>> {
                self.get_session(session_id).await
            }

            async fn update_session(
                &self,
                session_id: &str,
                mutate: $crate::store::SessionMutation<'_>,
            ) -> $crate::store::StoreResult<Option<$crate::store::SessionRecord>> {
                self.update_session(session_id, mutate).await
            }

            async fn list_sessions(
                &self,
                query: &$crate::store::ListQuery,
            ) -> $crate::store::StoreResult<$crate::store::SessionList> {
                self.list_sessions(query).await
            }

            async fn synced_session_ids(&self) -> $crate::store::StoreResult<Vec<String>> {
                self.synced_session_ids().await
            }

            async fn prune_moves(
                &self,
                before: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::StoreResult<u64> {
                self.prune_moves(before).await
            }

            async fn tombstone_session(
                &self,
                session_id: &str,
                tenant: &str,
                at: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::StoreResult<bool> {
                self.tombstone_session(session_id, tenant, at).await
            }

            async fn append_events(
                &self,
                session_id: &str,
                events: &[$crate::store::NewEvent],
            ) -> $crate::store::StoreResult<Vec<$crate::store::StoredEvent>> {
                self.append_events(session_id, events).await
            }

            fn log_writer(&self) -> Box<dyn $crate::store::LogWriter> {
                self.log_writer()
            }

            async fn read_events(
                &self,
                session_id: &str,
                after: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::StoredEvent>> {
                self.read_events(session_id, after, limit).await
            }

            async fn prune_events(
                &self,
                max_events: Option<i64>,
                before: Option<chrono::DateTime<chrono::Utc>>,
            ) -> $crate::store::StoreResult<u64> {
                self.prune_events(max_events, before).await
            }

            async fn last_event_seq(&self, session_id: &str) -> $crate::store::StoreResult<i64> {
                self.last_event_seq(session_id).await
            }

            async fn append_lifecycle(
                &self,
                event: &$crate::store::NewLifecycleEvent,
            ) -> $crate::store::StoreResult<$crate::store::StoredLifecycleEvent> {
                self.append_lifecycle(event).await
            }

            async fn read_lifecycle(
                &self,
                tenant: Option<&str>,
                after: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::StoredLifecycleEvent>> {
                self.read_lifecycle(tenant, after, limit).await
            }

            async fn last_lifecycle_seq(&self) -> $crate::store::StoreResult<i64> {
                self.last_lifecycle_seq().await
            }

            $($extra)*
        }
    };
}
