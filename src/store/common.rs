//! What both backends run alike: the SQL text they share (numbered `$n` parameters, which
//! SQLite takes too), the helpers both call, and their impls of the store's traits, written
//! once by [`impl_store!`] (here: `Store`, `Ping`, `SessionRecords`; the others through the
//! macros it invokes, one per concern's file): the use cases whose SQL, binds and mapping are
//! the same on both, and a forward to the backend's inherent method of the same name for the
//! others. A trait impl cannot span files, but a backend's own use cases are spread over a file
//! each (`sessions.rs`, `events.rs`, `lifecycle.rs`): each file holds inherent methods, and the
//! macros join them into the trait impls. An inherent method is found before a trait's, so none
//! of the forwarding methods calls itself. What differs between the backends in the shared use
//! cases is a parameter of the macro: which pool reads and which writes, how a writing
//! transaction begins, how a timestamp and the session columns are bound, and the few
//! statements each writes in its own dialect.

/// One session's row, tombstoned or not.
pub(crate) const GET_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1"
);

/// The session columns as `$1`…`$17`, in [`session_columns!`] order; `session_id` ($1) is the
/// key and is not changed.
pub(crate) const UPDATE_SESSION: &str = "UPDATE sessions SET tenant = $2, cwd = $3, \
     additional_directories = $4, title = $5, updated_at = $6, created_at = $7, meta = $8, \
     archived = $9, origin = $10, deleted_at = $11, synced_at = $12, listed = $13, agent = $14, \
     owner = $15, owner_name = $16, who_answers = $17 WHERE session_id = $1";

/// A new session's row (the columns as `$1`…`$17`, in [`session_columns!`] order), unless its
/// id names a row already, tombstoned or not.
pub(crate) const INSERT_SESSION: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
     ON CONFLICT (session_id) DO NOTHING"
);

/// Gives the sessions recorded before agents had names (`agent = ''`) to agent `$1`.
pub(crate) const ADOPT_SESSIONS: &str = "UPDATE sessions SET agent = $1 WHERE agent = ''";

/// What an upsert of session rows does with an id that exists: replaces every column unless
/// the row is tombstoned or of another tenant, agent or origin (whose session it stays: one a
/// replica created between a sync's read, which found no row, and its write stays the
/// creator's), but `updated_at` only by a later one (a prompt's touch, committed by the event
/// writer, may land between a sync's read of the row and its write), and never who the
/// session is of (`owner`, `owner_name`, `who_answers`); then answers the ids written. `$max` is the backend's two-argument maximum.
macro_rules! replace_unless_tombstoned {
    ($max:literal) => {
        concat!(
            " ON CONFLICT (session_id) DO UPDATE SET \
             tenant = excluded.tenant, cwd = excluded.cwd, \
             additional_directories = excluded.additional_directories, title = excluded.title, \
             updated_at = ",
            $max,
            "(sessions.updated_at, excluded.updated_at), created_at = excluded.created_at, \
             meta = excluded.meta, archived = excluded.archived, deleted_at = excluded.deleted_at, \
             synced_at = excluded.synced_at, listed = excluded.listed, agent = excluded.agent \
             WHERE sessions.deleted_at IS NULL AND sessions.tenant = excluded.tenant \
             AND sessions.agent = excluded.agent AND sessions.origin = excluded.origin \
             RETURNING session_id"
        )
    };
}

/// `sessions_to_sync`'s statement, given the `FROM` item that makes the page a table `l` of
/// columns `id` and `digest`: each listed id the cache does not know (its row all NULL), holds
/// live with another digest, or holds tombstoned by the list sync (with its row).
macro_rules! sessions_to_sync {
    ($page:expr) => {
        concat!(
            "SELECT l.id AS listed_id, ",
            session_columns!(),
            " FROM ",
            $page,
            " LEFT JOIN sessions ON sessions.session_id = l.id \
             WHERE sessions.session_id IS NULL \
             OR (sessions.deleted_at IS NULL AND sessions.listed IS DISTINCT FROM l.digest) \
             OR sessions.vanished_at IS NOT NULL"
        )
    };
}

pub(crate) const TOMBSTONE_LIVE: &str =
    "UPDATE sessions SET deleted_at = $2 WHERE session_id = $1 AND deleted_at IS NULL";

/// [`TOMBSTONE_LIVE`], marked as the list sync's (`SessionRecords::vanish_session`).
pub(crate) const VANISH_LIVE: &str = "UPDATE sessions SET deleted_at = $2, vanished_at = $2 \
     WHERE session_id = $1 AND deleted_at IS NULL";

/// Undoes [`VANISH_LIVE`], and only it (`SessionRecords::revive_session`).
pub(crate) const REVIVE_VANISHED: &str = "UPDATE sessions \
     SET deleted_at = NULL, vanished_at = NULL, listed = NULL \
     WHERE session_id = $1 AND vanished_at IS NOT NULL";

/// Whether a session is tombstoned by [`VANISH_LIVE`].
pub(crate) const VANISHED: &str =
    "SELECT EXISTS (SELECT 1 FROM sessions WHERE session_id = $1 AND vanished_at IS NOT NULL)";

/// The live rows a sync has seen listed (`visit_synced`): their ids and their digests, each
/// aggregated by the backend into one JSON array (two values to fetch, not
/// a row each; in the same row order, as aggregates over one scan are).
macro_rules! synced_sessions {
    ($ids:literal, $digests:literal) => {
        concat!(
            "SELECT ",
            $ids,
            ", ",
            $digests,
            " FROM sessions WHERE deleted_at IS NULL AND synced_at IS NOT NULL AND agent = $1"
        )
    };
}

/// Hands `visit` each id of `ids` (a JSON array's text) with the digest at the same place in
/// `digests`, as the ids are parsed: nothing collected but the digests.
pub(crate) fn visit_ids_and_digests(
    ids: &str,
    digests: &str,
    visit: &mut crate::store::records::SyncedVisitor<'_>,
) -> crate::store::error::StoreResult<()> {
    struct Ids<'v, 'f> {
        digests: std::vec::IntoIter<Option<i64>>,
        visit: &'v mut crate::store::records::SyncedVisitor<'f>,
    }
    impl<'de> serde::de::Visitor<'de> for Ids<'_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an array of ids, one per digest")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            use serde::de::Error as _;
            while let Some(id) = seq.next_element::<std::borrow::Cow<'de, str>>()? {
                let digest = self
                    .digests
                    .next()
                    .ok_or_else(|| A::Error::custom("more ids"))?;
                (self.visit)(&id, digest);
            }
            match self.digests.next() {
                Some(_) => Err(A::Error::custom("more digests than ids")),
                None => Ok(()),
            }
        }
    }
    let corrupt = |e: serde_json::Error| {
        crate::store::error::StoreError::Corrupt(format!("synced sessions: {e}"))
    };
    let digests: Vec<Option<i64>> = serde_json::from_str(digests).map_err(corrupt)?;
    let mut de = serde_json::Deserializer::from_str(ids);
    let ids = Ids {
        digests: digests.into_iter(),
        visit,
    };
    serde::Deserializer::deserialize_seq(&mut de, ids)
        .and_then(|()| de.end())
        .map_err(corrupt)
}

pub(crate) const PRUNE_MOVES: &str = "DELETE FROM session_moves WHERE moved_at < $1";

/// Ends `replica`'s hold on `session_id` (nothing if another replica holds it), through `pool`.
pub(crate) async fn release_session<DB>(
    pool: &sqlx::Pool<DB>,
    session_id: &str,
    replica: &str,
) -> crate::store::error::StoreResult<()>
where
    DB: sqlx::Database,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    sqlx::query("DELETE FROM session_owners WHERE session_id = $1 AND replica_id = $2")
        .bind(session_id)
        .bind(replica)
        .execute(pool)
        .await?;
    Ok(())
}

/// Nothing, without a round trip, for no `items`; else what `use_case` answers (a future, which
/// does nothing until awaited).
pub(crate) async fn unless_empty<T, R>(
    items: &[T],
    use_case: impl Future<Output = crate::store::error::StoreResult<Vec<R>>>,
) -> crate::store::error::StoreResult<Vec<R>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    use_case.await
}

/// `impl_store!(Backend { … } { items })` implements [`Store`](crate::store::contract::Store)
/// and each of its traits for `Backend`. Its shared use cases read through the pool `self.reads`
/// and write through `self.writes`, open a writing transaction with `self.writes.begin_write`,
/// bind a timestamp as `time(at)` and the session columns with `bind_session(query, record)`,
/// read a row to update with `lock_session` (its `$1`: the id; the row must stay unchanged by
/// others until commit), prune events beyond a count with `prune_events_by_count` (its `$1`: how
/// many to keep), count a person's streams of a session with `watcher_streams` (its `$1`–`$4`:
/// the session, the watcher, the replica adding or removing one, the lease in microseconds; see
/// [`SessionWatchers`](crate::store::SessionWatchers)), find the moves of listed sessions with
/// `first_moves` (see
/// [`FirstMoves`](crate::store::listing::FirstMoves)), the sessions to sync of a page with
/// `to_sync_query(listed)` (its statement, the page bound) and the synced sessions with
/// `synced_sessions` (its two values: their ids and their digests, each a JSON array's text).
/// Here it writes the `Store`, `Ping` and `SessionRecords` impls; the others are written, from
/// the same parameters, by [`impl_event_log!`](crate::store::event_log) (`EventLog` and
/// `StateSnapshots`, with `items`: the provided methods of `EventLog` the backend overrides),
/// [`impl_webhooks!`](crate::store::webhooks), [`impl_idempotency!`](crate::store::idempotency)
/// and [`impl_quotas!`](crate::store::quotas). Each impl is written whole by one macro because
/// `#[async_trait]` rewrites the `async fn`s it is given, not those a macro inside the impl
/// would write.
macro_rules! impl_store {
    (
        $backend:ty {
            reads: $reads:ident,
            writes: $writes:ident,
            begin_write: $begin:ident($($begin_arg:expr)?),
            time: $time:path,
            bind_session: $bind_session:path,
            lock_session: $lock_session:path,
            prune_events_by_count: $prune_by_count:path,
            watcher_streams: $watcher_streams:path,
            first_moves: $first_moves:path,
            to_sync_query: $to_sync_query:path,
            synced_sessions: $synced_sessions:expr $(,)?
        } { $($extra:tt)* }
    ) => {
        #[async_trait::async_trait]
        impl $crate::store::contract::Store for $backend {
            async fn cluster_secret(&self, fresh: &[u8]) -> $crate::store::error::StoreResult<Vec<u8>> {
                use $crate::store::idempotency as sql;
                sqlx::query(sql::PUT_SECRET)
                    .bind(fresh)
                    .execute(&self.$writes)
                    .await?;
                Ok(sqlx::query_scalar(sql::SECRET)
                    .fetch_one(&self.$writes)
                    .await?)
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::contract::Ping for $backend {
            async fn ping(&self) -> $crate::store::error::StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.$reads).await?;
                Ok(())
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::contract::SessionRecords for $backend {
            async fn put_sessions(
                &self,
                records: &[$crate::store::records::SessionRecord],
            ) -> $crate::store::error::StoreResult<Vec<String>> {
                $crate::store::common::unless_empty(records, self.put_sessions(records)).await
            }

            async fn insert_session(
                &self,
                record: &$crate::store::records::SessionRecord,
            ) -> $crate::store::error::StoreResult<bool> {
                let done = $bind_session(sqlx::query($crate::store::common::INSERT_SESSION), record)
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn get_session(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::records::SessionRecord>> {
                let row = sqlx::query($crate::store::common::GET_SESSION)
                    .bind(session_id)
                    .fetch_optional(&self.$reads)
                    .await?;
                row.as_ref().map($crate::store::rows::session_from).transpose()
            }

            async fn sessions_to_sync(
                &self,
                listed: &[$crate::store::records::ListedSession],
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::records::ToSync>> {
                if listed.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = $to_sync_query(listed).fetch_all(&self.$reads).await?;
                rows.iter().map($crate::store::rows::to_sync_from).collect()
            }

            async fn update_session(
                &self,
                session_id: &str,
                mutate: $crate::store::records::SessionMutation<'_>,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::records::SessionRecord>> {
                let mut tx = self.$writes.$begin($($begin_arg)?).await?;
                let row = sqlx::query($lock_session)
                    .bind(session_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                let current = row.as_ref().map($crate::store::rows::session_from).transpose()?;
                let Some(record) = $crate::store::records::apply_mutation(current, session_id, mutate)
                else {
                    return Ok(None);
                };
                $bind_session(sqlx::query($crate::store::common::UPDATE_SESSION), &record)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(Some(record))
            }

            async fn list_sessions(
                &self,
                query: &$crate::store::records::ListQuery,
            ) -> $crate::store::error::StoreResult<$crate::store::records::SessionList> {
                use chrono::SubsecRound;
                let later = query.after.as_ref().map(|after| {
                    // At the precision both backends store.
                    (after, $time(after.updated_at.trunc_subsecs(6)))
                });
                let mut qb = sqlx::QueryBuilder::new("");
                $crate::store::listing::push_page_query(&mut qb, query, later, &$first_moves);
                let rows = qb.build().fetch_all(&self.$reads).await?;
                $crate::store::listing::page_of(query, &rows)
            }

            async fn visit_synced(
                &self,
                agent: &str,
                visit: &mut $crate::store::records::SyncedVisitor<'_>,
            ) -> $crate::store::error::StoreResult<()> {
                let (ids, digests): (String, String) = sqlx::query_as($synced_sessions)
                    .bind(agent)
                    .fetch_one(&self.$reads)
                    .await?;
                $crate::store::common::visit_ids_and_digests(&ids, &digests, visit)
            }

            async fn adopt_sessions(&self, agent: &str) -> $crate::store::error::StoreResult<u64> {
                Ok(sqlx::query($crate::store::common::ADOPT_SESSIONS)
                    .bind(agent)
                    .execute(&self.$writes)
                    .await?
                    .rows_affected())
            }

            async fn prune_moves(
                &self,
                before: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::error::StoreResult<u64> {
                Ok(sqlx::query($crate::store::common::PRUNE_MOVES)
                    .bind($time(before))
                    .execute(&self.$writes)
                    .await?
                    .rows_affected())
            }

            async fn tombstone_session(
                &self,
                session_id: &str,
                tenant: &str,
                at: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::error::StoreResult<bool> {
                use chrono::SubsecRound;
                self.tombstone_session(session_id, tenant, $time(at.trunc_subsecs(6)))
                    .await
            }

            async fn vanish_session(
                &self,
                session_id: &str,
                at: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::error::StoreResult<bool> {
                use chrono::SubsecRound;
                let done = sqlx::query($crate::store::common::VANISH_LIVE)
                    .bind(session_id)
                    .bind($time(at.trunc_subsecs(6)))
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn revive_session(&self, session_id: &str) -> $crate::store::error::StoreResult<bool> {
                let done = sqlx::query($crate::store::common::REVIVE_VANISHED)
                    .bind(session_id)
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn vanished(&self, session_id: &str) -> $crate::store::error::StoreResult<bool> {
                Ok(sqlx::query_scalar($crate::store::common::VANISHED)
                    .bind(session_id)
                    .fetch_one(&self.$reads)
                    .await?)
            }
        }

        impl_event_log!($backend {
            reads: $reads,
            writes: $writes,
            time: $time,
            prune_events_by_count: $prune_by_count,
        } { $($extra)* });
        impl_webhooks!($backend { reads: $reads, writes: $writes, time: $time });
        impl_idempotency!($backend { reads: $reads, writes: $writes, time: $time });
        impl_workspaces!($backend { reads: $reads, writes: $writes });
        impl_queue!($backend { reads: $reads, writes: $writes });
        impl_watchers!($backend {
            reads: $reads,
            writes: $writes,
            begin_write: $begin($($begin_arg)?),
            streams: $watcher_streams,
        });
        impl_usage!($backend { reads: $reads, writes: $writes });
        impl_installs!($backend { reads: $reads, writes: $writes });
        impl_shares!($backend { reads: $reads, writes: $writes });
        impl_imports!($backend {
            writes: $writes,
            begin_write: $begin($($begin_arg)?),
            bind_session: $bind_session,
            lock_session: $lock_session,
        });
        impl_quotas!($backend {
            reads: $reads,
            writes: $writes,
            begin_write: $begin($($begin_arg)?),
            time: $time,
        });
    };
}
