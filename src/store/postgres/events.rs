//! The session event logs: appends in one statement that numbers them from the session's
//! counter (`session_seqs`), inserts their webhook deliveries and notifies the other replicas,
//! the log writer with its own connection, and how retention prunes by count.

use async_trait::async_trait;
use chrono::SubsecRound;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use super::store::{PgStore, nul_safe_text, text_in};
use crate::store::error::StoreResult;
use crate::store::event::{Batch, LogWriter, StoredEvent};

/// The outbox insert of [`APPEND`] and [`APPEND_ALL`] (see [`pg_insert_deliveries!`]): the
/// deliveries of the events `inserted` returns, to the webhooks of their session's tenant. A
/// session without a row (there is none) gets none.
macro_rules! deliveries_of_inserted {
    () => {
        pg_insert_deliveries!(
            from: "inserted i JOIN sessions s ON s.session_id = i.session_id",
            message_id: "i.session_id || '.' || i.seq",
            tenant: "s.tenant",
            payload: "i.payload::jsonb",
            filter: "",
        )
    };
}

/// Appends a batch to a session's log in one statement: raises the session's counter by the
/// batch's size (`$2`), inserts the events (`$5` kinds, `$6` payloads as JSON text) numbered
/// from the counter's old value, raises the session's `updated_at` to `$7` if given and later
/// (a change of the gateway's own: the row is no longer what a listing made it), inserts the
/// events' webhook deliveries ([`deliveries_of_inserted!`]), and notifies the other replicas at
/// commit: "REPLICA SEQ SESSION" on
/// [`EVENTS_CHANNEL`](super::replicas::EVENTS_CHANNEL). The upsert locks the counter row until
/// commit: a concurrent appender of the same session waits, then sees our committed total, so
/// sequence numbers are gapless and become visible in order.
const APPEND: &str = concat!(
    "WITH bumped AS (\
     INSERT INTO session_seqs (session_id, last_seq) VALUES ($1, $2) \
     ON CONFLICT (session_id) DO UPDATE SET last_seq = session_seqs.last_seq + EXCLUDED.last_seq \
     RETURNING last_seq), \
     inserted AS (\
     INSERT INTO session_events (session_id, seq, kind, payload, created_at) \
     SELECT $1, b.last_seq - $2 + e.ord, e.kind, e.payload::json, $4 \
     FROM bumped b, unnest($5::text[], $6::text[]) WITH ORDINALITY AS e(kind, payload, ord) \
     RETURNING session_id, seq, kind, payload, created_at), \
     touched AS (\
     UPDATE sessions SET updated_at = $7, listed = NULL \
     WHERE session_id = $1 AND deleted_at IS NULL AND updated_at < $7), \
     delivered AS (",
    deliveries_of_inserted!(),
    ") SELECT last_seq FROM bumped, \
     pg_notify('acp_gateway_events', $3 || ' ' || last_seq || ' ' || $1)"
);

/// [`APPEND`] for several sessions at once (their ids distinct): `$1`–`$4` one element per
/// session (id, event count, `created_at`, touch or NULL), `$5`–`$8` one per event (session id,
/// ordinal in its session from 1, kind, payload), `$9` the replica. The counters are raised in
/// session id order, so that two such statements lock them in the same order.
const APPEND_ALL: &str = concat!(
    "WITH c AS (\
     SELECT * FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::timestamptz[]) \
     AS c(session_id, n, created_at, touch)), \
     bumped AS (\
     INSERT INTO session_seqs (session_id, last_seq) SELECT session_id, n FROM c ORDER BY session_id \
     ON CONFLICT (session_id) DO UPDATE SET last_seq = session_seqs.last_seq + EXCLUDED.last_seq \
     RETURNING session_id, last_seq), \
     inserted AS (\
     INSERT INTO session_events (session_id, seq, kind, payload, created_at) \
     SELECT e.session_id, b.last_seq - c.n + e.ord, e.kind, e.payload::json, c.created_at \
     FROM unnest($5::text[], $6::bigint[], $7::text[], $8::text[]) AS e(session_id, ord, kind, payload) \
     JOIN bumped b ON b.session_id = e.session_id JOIN c ON c.session_id = e.session_id \
     RETURNING session_id, seq, kind, payload, created_at), \
     touched AS (\
     UPDATE sessions s SET updated_at = c.touch, listed = NULL FROM c \
     WHERE s.session_id = c.session_id AND c.touch IS NOT NULL AND s.deleted_at IS NULL \
     AND s.updated_at < c.touch), \
     delivered AS (",
    deliveries_of_inserted!(),
    ") SELECT session_id, last_seq, \
     pg_notify('acp_gateway_events', $9 || ' ' || last_seq || ' ' || session_id) FROM bumped"
);

/// Deletes, in every session, the events beyond the latest `$1`.
pub(super) const PRUNE_BY_COUNT: &str = "DELETE FROM session_events e USING session_seqs s \
     WHERE e.session_id = s.session_id AND e.seq <= s.last_seq - $1";
/// The `application_name` of the log writer's connection (as `pg_stat_activity` shows it).
pub const PG_LOG_WRITER_NAME: &str = "acp-gateway event log";

/// The log writer of a PostgreSQL store: a connection of its own, outside the pool.
struct PgLogWriter {
    options: PgConnectOptions,
    own: Option<PgConnection>,
    /// See [`PgStore::replica`].
    replica: String,
}

#[async_trait]
impl LogWriter for PgLogWriter {
    async fn append_batch(&mut self, batch: &Batch<'_>) -> StoreResult<Vec<StoredEvent>> {
        // A failed append drops the connection, and the next one opens another. The server
        // saying the connection is shut down (SQLSTATE 57P or 08: a restart, an idle timeout,
        // `pg_terminate_backend`) means the statement did not commit, so it is sent once more
        // on a new connection. An I/O error is not retried here: the append may have
        // committed before the answer was lost, and the event hub's writer, which retries,
        // first checks the log for it.
        let mut retried = false;
        loop {
            let conn = match &mut self.own {
                Some(conn) => conn,
                own => own.insert(self.options.connect().await?),
            };
            match append_on(&mut *conn, &self.replica, batch).await {
                Ok(stored) => return Ok(stored),
                Err(e) => {
                    self.own = None;
                    if retried || !e.is_shut_down_by_server() {
                        return Err(e);
                    }
                    tracing::info!(error = %e, "the event log's connection was closed by the server; reconnecting");
                    retried = true;
                }
            }
        }
    }

    async fn append_batches(
        &mut self,
        batches: &[Batch<'_>],
    ) -> Option<StoreResult<Vec<Vec<StoredEvent>>>> {
        Some(self.append_together(batches).await)
    }
}

impl PgLogWriter {
    /// [`LogWriter::append_batches`]: one statement for all of them, [`APPEND_ALL`]. After a
    /// failure the connection is dropped (the hub's writer then appends each alone, retrying).
    async fn append_together(
        &mut self,
        batches: &[Batch<'_>],
    ) -> StoreResult<Vec<Vec<StoredEvent>>> {
        let conn = match &mut self.own {
            Some(conn) => conn,
            own => own.insert(self.options.connect().await?),
        };
        let appended = append_all_on(conn, &self.replica, batches).await;
        if appended.is_err() {
            self.own = None;
        }
        appended
    }
}

/// Appends `batch` (and applies its `touch`, see [`LogWriter::append`]) with one statement,
/// [`APPEND`]: one round trip, atomic without an explicit transaction. The notification is
/// tagged with `replica`.
async fn append_on<'e>(
    db: impl sqlx::PgExecutor<'e>,
    replica: &str,
    batch: &Batch<'_>,
) -> StoreResult<Vec<StoredEvent>> {
    let events = batch.events;
    let kinds: Vec<_> = events.iter().map(|e| text_in(&e.kind)).collect();
    let kinds: Vec<&str> = kinds.iter().map(AsRef::as_ref).collect();
    let payloads: Vec<_> = events
        .iter()
        .map(|e| nul_safe_text(e.payload.as_str()))
        .collect();
    let payloads: Vec<&str> = payloads.iter().map(AsRef::as_ref).collect();
    let last: i64 = sqlx::query_scalar(APPEND)
        .bind(batch.session_id)
        .bind(batch.count)
        .bind(replica)
        .bind(batch.created_at)
        .bind(&kinds)
        .bind(&payloads)
        .bind(batch.touch.map(|at| at.trunc_subsecs(6)))
        .fetch_one(db)
        .await?;
    Ok(batch.stored(last))
}

/// [`APPEND_ALL`] of `batches` (their sessions distinct) on `conn`.
async fn append_all_on(
    conn: &mut PgConnection,
    replica: &str,
    batches: &[Batch<'_>],
) -> StoreResult<Vec<Vec<StoredEvent>>> {
    let sessions: Vec<&str> = batches.iter().map(|b| b.session_id).collect();
    let counts: Vec<i64> = batches.iter().map(|b| b.count).collect();
    let created: Vec<_> = batches.iter().map(|b| b.created_at).collect();
    let touches: Vec<_> = batches
        .iter()
        .map(|b| b.touch.map(|at| at.trunc_subsecs(6)))
        .collect();
    let (mut of, mut ords, mut kinds, mut payloads) = (vec![], vec![], vec![], vec![]);
    for batch in batches {
        for (ord, e) in (1i64..).zip(batch.events) {
            of.push(batch.session_id);
            ords.push(ord);
            kinds.push(text_in(&e.kind));
            payloads.push(nul_safe_text(e.payload.as_str()));
        }
    }
    let kinds: Vec<&str> = kinds.iter().map(AsRef::as_ref).collect();
    let payloads: Vec<&str> = payloads.iter().map(AsRef::as_ref).collect();
    let rows: Vec<(String, i64)> = sqlx::query_as(APPEND_ALL)
        .bind(&sessions)
        .bind(&counts)
        .bind(&created)
        .bind(&touches)
        .bind(&of)
        .bind(&ords)
        .bind(&kinds)
        .bind(&payloads)
        .bind(replica)
        .fetch_all(conn)
        .await?;
    let last: std::collections::HashMap<String, i64> = rows.into_iter().collect();
    batches
        .iter()
        .map(|batch| match last.get(batch.session_id) {
            Some(&last) => Ok(batch.stored(last)),
            None => Err(crate::store::error::StoreError::Corrupt(format!(
                "no sequence number for session {:?} in a grouped append",
                batch.session_id
            ))),
        })
        .collect()
}

impl PgStore {
    pub(super) async fn append_batch(&self, batch: &Batch<'_>) -> StoreResult<Vec<StoredEvent>> {
        append_on(&self.pool, &self.replica, batch).await
    }

    pub(super) fn log_writer(&self) -> Box<dyn LogWriter> {
        let options = (*self.pool.connect_options())
            .clone()
            .application_name(PG_LOG_WRITER_NAME);
        Box::new(PgLogWriter {
            options,
            own: None,
            replica: self.replica.clone(),
        })
    }
}
