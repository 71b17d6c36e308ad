//! The event logs' use cases both backends run alike ([`EventLog`](super::EventLog) and
//! [`StateSnapshots`](super::StateSnapshots)): their SQL, and [`impl_event_log!`], which writes
//! both impls for a backend (invoked by [`impl_store!`](crate::store::common)). Appends, whose
//! numbering and outbox differ by dialect, forward to each backend's `events.rs` and
//! `lifecycle.rs`.

/// The time of a session's latest event.
pub(crate) const LAST_EVENT_AT: &str =
    "SELECT created_at FROM session_events WHERE session_id = $1 ORDER BY seq DESC LIMIT 1";

pub(crate) const READ_EVENTS: &str = "SELECT session_id, seq, kind, payload, created_at \
     FROM session_events WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3";

pub(crate) const SESSION_STATE: &str =
    "SELECT seq, state FROM session_states WHERE session_id = $1";

/// A later snapshot is never replaced by an earlier one.
pub(crate) const PUT_SESSION_STATE: &str = "INSERT INTO session_states (session_id, seq, state) \
     VALUES ($1, $2, $3) ON CONFLICT (session_id) DO UPDATE \
     SET seq = excluded.seq, state = excluded.state WHERE session_states.seq < excluded.seq";

pub(crate) const PRUNE_EVENTS_BY_AGE: &str = "DELETE FROM session_events WHERE created_at < $1";

pub(crate) const LAST_EVENT_SEQ: &str =
    "SELECT COALESCE((SELECT last_seq FROM session_seqs WHERE session_id = $1), 0)";

/// The kind of a session's latest turn event (of kinds `$2` and `$3`), if any.
pub(crate) const LAST_TURN_EVENT: &str = "SELECT kind FROM session_events \
     WHERE session_id = $1 AND kind IN ($2, $3) ORDER BY seq DESC LIMIT 1";

pub(crate) const READ_LIFECYCLE_ALL: &str = "SELECT seq, session_id, tenant, kind, payload, \
     created_at FROM lifecycle_events WHERE seq > $1 ORDER BY seq LIMIT $2";

pub(crate) const READ_LIFECYCLE_TENANT: &str = "SELECT seq, session_id, tenant, kind, payload, \
     created_at FROM lifecycle_events WHERE tenant = $3 AND seq > $1 ORDER BY seq LIMIT $2";

pub(crate) const LAST_LIFECYCLE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM lifecycle_events";

/// `impl_event_log!(Backend { reads, writes, time, prune_events_by_count } { items })`
/// implements [`EventLog`](crate::store::contract::EventLog), with `items` (the provided methods
/// the backend overrides), and [`StateSnapshots`](crate::store::contract::StateSnapshots) for
/// `Backend`, from [`impl_store!`](crate::store::common)'s parameters of the same names.
macro_rules! impl_event_log {
    (
        $backend:ty {
            reads: $reads:ident,
            writes: $writes:ident,
            time: $time:path,
            prune_events_by_count: $prune_by_count:path $(,)?
        } { $($extra:tt)* }
    ) => {
        #[async_trait::async_trait]
        impl $crate::store::contract::EventLog for $backend {
            async fn append_events(
                &self,
                session_id: &str,
                events: &[$crate::store::event::NewEvent],
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::event::StoredEvent>> {
                match $crate::store::event::Batch::new(session_id, events, None)? {
                    Some(batch) => self.append_batch(&batch).await,
                    None => Ok(Vec::new()),
                }
            }

            fn log_writer(&self) -> Box<dyn $crate::store::event::LogWriter> {
                self.log_writer()
            }

            async fn read_events(
                &self,
                session_id: &str,
                after: i64,
                limit: i64,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::event::StoredEvent>> {
                let rows = sqlx::query($crate::store::event_log::READ_EVENTS)
                    .bind(session_id)
                    .bind(after)
                    .bind(limit.max(0))
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter().map($crate::store::rows::event_from).collect()
            }

            async fn read_events_of_kinds(
                &self,
                session_id: &str,
                (after, upto): $crate::store::event::SeqRange,
                kinds: &[&str],
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::event::StoredEvent>> {
                if kinds.is_empty() {
                    return Ok(Vec::new());
                }
                let mut qb = sqlx::QueryBuilder::new(
                    "SELECT session_id, seq, kind, payload, created_at FROM session_events \
                     WHERE session_id = ",
                );
                qb.push_bind(session_id)
                    .push(" AND seq > ")
                    .push_bind(after)
                    .push(" AND seq <= ")
                    .push_bind(upto)
                    .push(" AND kind IN (");
                let mut list = qb.separated(", ");
                for kind in kinds {
                    list.push_bind(*kind);
                }
                qb.push(") ORDER BY seq");
                let rows = qb.build().fetch_all(&self.$reads).await?;
                rows.iter().map($crate::store::rows::event_from).collect()
            }

            async fn last_event_seq(&self, session_id: &str) -> $crate::store::error::StoreResult<i64> {
                Ok(sqlx::query_scalar($crate::store::event_log::LAST_EVENT_SEQ)
                    .bind(session_id)
                    .fetch_one(&self.$reads)
                    .await?)
            }

            async fn last_event_at(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Option<chrono::DateTime<chrono::Utc>>> {
                use $crate::store::rows::Columns as _;
                let row = sqlx::query($crate::store::event_log::LAST_EVENT_AT)
                    .bind(session_id)
                    .fetch_optional(&self.$reads)
                    .await?;
                row.map(|r| r.time("created_at")).transpose()
            }

            async fn turn_open(&self, session_id: &str) -> $crate::store::error::StoreResult<bool> {
                use $crate::store::kind::EventKind;
                let kind: Option<String> = sqlx::query_scalar($crate::store::event_log::LAST_TURN_EVENT)
                    .bind(session_id)
                    .bind(EventKind::TurnStarted.name())
                    .bind(EventKind::TurnEnded.name())
                    .fetch_optional(&self.$reads)
                    .await?;
                Ok(kind.as_deref() == Some(EventKind::TurnStarted.name()))
            }

            async fn prune_events(
                &self,
                max_events: Option<i64>,
                before: Option<chrono::DateTime<chrono::Utc>>,
            ) -> $crate::store::error::StoreResult<u64> {
                let mut deleted = 0;
                if let Some(keep) = max_events {
                    deleted += sqlx::query($prune_by_count)
                        .bind(keep.max(0))
                        .execute(&self.$writes)
                        .await?
                        .rows_affected();
                }
                if let Some(before) = before {
                    deleted += sqlx::query($crate::store::event_log::PRUNE_EVENTS_BY_AGE)
                        .bind($time(before))
                        .execute(&self.$writes)
                        .await?
                        .rows_affected();
                }
                Ok(deleted)
            }

            async fn append_lifecycle(
                &self,
                events: &[$crate::store::records::NewLifecycleEvent],
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::records::StoredLifecycleEvent>> {
                $crate::store::common::unless_empty(events, self.append_lifecycle(events)).await
            }

            async fn read_lifecycle(
                &self,
                tenant: Option<&str>,
                after: i64,
                limit: i64,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::records::StoredLifecycleEvent>> {
                let query = match tenant {
                    None => sqlx::query($crate::store::event_log::READ_LIFECYCLE_ALL),
                    Some(_) => sqlx::query($crate::store::event_log::READ_LIFECYCLE_TENANT),
                };
                let mut query = query.bind(after).bind(limit.max(0));
                if let Some(tenant) = tenant {
                    query = query.bind(tenant);
                }
                let rows = query.fetch_all(&self.$reads).await?;
                rows.iter().map($crate::store::rows::lifecycle_from).collect()
            }

            async fn last_lifecycle_seq(&self) -> $crate::store::error::StoreResult<i64> {
                Ok(sqlx::query_scalar($crate::store::event_log::LAST_LIFECYCLE_SEQ)
                    .fetch_one(&self.$reads)
                    .await?)
            }

            $($extra)*
        }

        #[async_trait::async_trait]
        impl $crate::store::contract::StateSnapshots for $backend {
            async fn session_state(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Option<(i64, serde_json::Value)>> {
                let row: Option<(i64, String)> =
                    sqlx::query_as($crate::store::event_log::SESSION_STATE)
                        .bind(session_id)
                        .fetch_optional(&self.$reads)
                        .await?;
                row.map(|(seq, text)| {
                    serde_json::from_str(&text).map(|state| (seq, state)).map_err(|e| {
                        $crate::store::error::StoreError::Corrupt(format!(
                            "state of session {session_id:?}: {e}"
                        ))
                    })
                })
                .transpose()
            }

            async fn put_session_state(
                &self,
                session_id: &str,
                seq: i64,
                state: &serde_json::Value,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::event_log::PUT_SESSION_STATE)
                    .bind(session_id)
                    .bind(seq)
                    .bind(state.to_string())
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }
        }
    };
}
