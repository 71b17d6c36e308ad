//! The PostgreSQL implementation of [`Store`] and [`ReplicaRegistry`]: [`PgStore`].
//!
//! Schema: `migrations/postgres`. Timestamps are `timestamptz` (microsecond resolution), JSON is
//! `jsonb`. All queries are checked at run time (no `DATABASE_URL` is needed to build).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound, Utc};
use futures::stream::BoxStream;
use serde_json::Value;
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgConnection, PgListener, PgNotification, PgPool, PgPoolOptions,
    PgRow,
};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{ConnectOptions, Postgres, QueryBuilder, Row};

use super::{
    Appended, ListQuery, Listed, LogWriter, NewEvent, NewLifecycleEvent, Origin, Replica,
    ReplicaRegistry, SessionList, SessionMutation, SessionRecord, Store, StoreError, StoreResult,
    StoredEvent, StoredLifecycleEvent, batch_of, merge_page, numbered,
};

/// Connections in the pool.
const MAX_CONNECTIONS: u32 = 10;
/// How long a query waits for a free connection before failing.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Transaction-scoped advisory lock that serialises lifecycle appends (see `append_lifecycle`).
const LIFECYCLE_LOCK_KEY: i64 = 0x6163_7067_775f_6c63; // "acpgw_lc"

/// The `sessions` columns, in the order [`session_from_row`] and [`bind_session`] use.
macro_rules! session_columns {
    () => {
        "session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
         archived, origin, deleted_at, synced_at"
    };
}

const PUT_SESSION: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (session_id) DO UPDATE SET \
     tenant = EXCLUDED.tenant, cwd = EXCLUDED.cwd, \
     additional_directories = EXCLUDED.additional_directories, title = EXCLUDED.title, \
     updated_at = EXCLUDED.updated_at, created_at = EXCLUDED.created_at, meta = EXCLUDED.meta, \
     archived = EXCLUDED.archived, origin = EXCLUDED.origin, deleted_at = EXCLUDED.deleted_at, \
     synced_at = EXCLUDED.synced_at \
     WHERE sessions.deleted_at IS NULL"
);

const GET_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1"
);

const LOCK_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1 FOR UPDATE"
);

/// Same parameter order as [`PUT_SESSION`]; `session_id` ($1) is the key and is not changed.
const UPDATE_SESSION: &str = "UPDATE sessions SET tenant = $2, cwd = $3, \
     additional_directories = $4, title = $5, updated_at = $6, created_at = $7, meta = $8, \
     archived = $9, origin = $10, deleted_at = $11, synced_at = $12 WHERE session_id = $1";

const TOMBSTONE_LIVE: &str =
    "UPDATE sessions SET deleted_at = $2 WHERE session_id = $1 AND deleted_at IS NULL";

/// A bare tombstone for an id the cache does not know. Such an id can only have come from the
/// agent, hence `origin = 'upstream'`.
const INSERT_TOMBSTONE: &str = "INSERT INTO sessions \
     (session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
      archived, origin, deleted_at, synced_at) \
     VALUES ($1, $2, '', '[]'::jsonb, NULL, $3, $3, NULL, FALSE, 'upstream', $3, NULL) \
     ON CONFLICT (session_id) DO NOTHING";

/// Appends a batch to a session's log in one statement: raises the session's counter by the
/// batch's size (`$2`), inserts the events (`$5` kinds, `$6` payloads as JSON text) numbered
/// from the counter's old value, raises the session's `updated_at` to `$7` if given and later,
/// and notifies the other replicas at commit: "REPLICA SEQ SESSION" on [`EVENTS_CHANNEL`]. The
/// upsert locks the counter row until commit: a concurrent appender of the same session waits,
/// then sees our committed total, so sequence numbers are gapless and become visible in order.
const APPEND: &str = "WITH bumped AS (\
     INSERT INTO session_seqs (session_id, last_seq) VALUES ($1, $2) \
     ON CONFLICT (session_id) DO UPDATE SET last_seq = session_seqs.last_seq + EXCLUDED.last_seq \
     RETURNING last_seq), \
     inserted AS (\
     INSERT INTO session_events (session_id, seq, kind, payload, created_at) \
     SELECT $1, b.last_seq - $2 + e.ord, e.kind, e.payload::jsonb, $4 \
     FROM bumped b, unnest($5::text[], $6::text[]) WITH ORDINALITY AS e(kind, payload, ord)), \
     touched AS (\
     UPDATE sessions SET updated_at = $7 \
     WHERE session_id = $1 AND deleted_at IS NULL AND updated_at < $7) \
     SELECT last_seq FROM bumped, \
     pg_notify('acp_gateway_events', $3 || ' ' || last_seq || ' ' || $1)";

/// Where appends to session logs are announced (see [`APPEND`]).
const EVENTS_CHANNEL: &str = "acp_gateway_events";
/// Where appends to the lifecycle log are announced: "REPLICA SEQ".
const LIFECYCLE_CHANNEL: &str = "acp_gateway_lifecycle";

const READ_EVENTS: &str = "SELECT session_id, seq, kind, payload, created_at FROM session_events \
     WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3";

const PRUNE_BY_COUNT: &str = "DELETE FROM session_events e USING session_seqs s \
     WHERE e.session_id = s.session_id AND e.seq <= s.last_seq - $1";
const PRUNE_BY_AGE: &str = "DELETE FROM session_events WHERE created_at < $1";
const LAST_EVENT_SEQ: &str =
    "SELECT COALESCE((SELECT last_seq FROM session_seqs WHERE session_id = $1), 0)";

const INSERT_LIFECYCLE: &str = "INSERT INTO lifecycle_events \
     (session_id, tenant, kind, payload, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING seq";

const READ_LIFECYCLE_ALL: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE seq > $1 ORDER BY seq LIMIT $2";

const READ_LIFECYCLE_TENANT: &str = "SELECT seq, session_id, tenant, kind, payload, created_at \
     FROM lifecycle_events WHERE tenant = $3 AND seq > $1 ORDER BY seq LIMIT $2";

const LAST_LIFECYCLE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM lifecycle_events";

/// The store on a PostgreSQL database (a pool of [`MAX_CONNECTIONS`] connections).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The id of the replica this store serves: the tag of the notifications its appends send,
    /// by which it knows its own among those it receives.
    replica: String,
}

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
    async fn append(
        &mut self,
        session_id: &str,
        events: &[NewEvent],
        touch: Option<DateTime<Utc>>,
    ) -> StoreResult<Vec<StoredEvent>> {
        // A connection the server has closed since the last append (a restart, an idle
        // timeout) is replaced once; any other error drops it too, and the next append opens
        // another.
        let mut retried = false;
        loop {
            let conn = match &mut self.own {
                Some(conn) => conn,
                own => own.insert(self.options.connect().await?),
            };
            match append_on(&mut *conn, &self.replica, session_id, events, touch).await {
                Ok(stored) => return Ok(stored),
                Err(e) => {
                    self.own = None;
                    if retried || !e.is_connection_lost() {
                        return Err(e);
                    }
                    tracing::info!(error = %e, "the event log's connection was lost; reconnecting");
                    retried = true;
                }
            }
        }
    }
}

/// Appends `events` (and applies `touch`, see [`LogWriter::append`]) with one statement,
/// [`APPEND`]: one round trip, atomic without an explicit transaction. The notification is
/// tagged with `replica`.
async fn append_on<'e>(
    db: impl sqlx::PgExecutor<'e>,
    replica: &str,
    session_id: &str,
    events: &[NewEvent],
    touch: Option<DateTime<Utc>>,
) -> StoreResult<Vec<StoredEvent>> {
    let Some((count, created_at)) = batch_of(events)? else {
        return Ok(Vec::new());
    };
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let payloads: Vec<String> = events.iter().map(|e| e.payload.to_string()).collect();
    let last: i64 = sqlx::query_scalar(APPEND)
        .bind(session_id)
        .bind(count)
        .bind(replica)
        .bind(created_at)
        .bind(&kinds)
        .bind(&payloads)
        .bind(touch.map(|at| at.trunc_subsecs(6)))
        .fetch_one(db)
        .await?;
    Ok(numbered(session_id, events, last - count + 1, created_at))
}

/// A duration in whole microseconds, for `$n * interval '1 microsecond'`.
fn micros_of(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// An append announced by another replica; `None` for this replica's own, and for anything
/// malformed.
fn parse_notification(me: &str, n: &PgNotification) -> Option<Appended> {
    let mut parts = n.payload().splitn(3, ' ');
    let (replica, seq) = (parts.next()?, parts.next()?.parse().ok()?);
    if replica == me {
        return None;
    }
    match (n.channel(), parts.next()) {
        (EVENTS_CHANNEL, Some(session_id)) => Some(Appended::Session {
            session_id: session_id.to_owned(),
            seq,
        }),
        (LIFECYCLE_CHANNEL, None) => Some(Appended::Lifecycle { seq }),
        _ => None,
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://…`) and applies the migrations in `migrations/postgres`.
    /// `replica` tags the notifications of this store's appends (see [`Store::appended_elsewhere`]).
    pub async fn connect(url: &str, replica: &str) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        Ok(Self {
            pool,
            replica: replica.to_owned(),
        })
    }
}

/// Truncates every timestamp of `record` to the microsecond, the precision that is stored.
fn truncate_timestamps(record: &mut SessionRecord) {
    record.updated_at = record.updated_at.trunc_subsecs(6);
    record.created_at = record.created_at.trunc_subsecs(6);
    record.deleted_at = record.deleted_at.map(|at| at.trunc_subsecs(6));
    record.synced_at = record.synced_at.map(|at| at.trunc_subsecs(6));
}

/// Binds the twelve session columns ($1…$12) in [`session_columns!`] order.
fn bind_session<'q>(
    query: Query<'q, Postgres, PgArguments>,
    record: &'q SessionRecord,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(&record.session_id)
        .bind(&record.tenant)
        .bind(&record.cwd)
        .bind(Json(&record.additional_directories))
        .bind(&record.title)
        .bind(record.updated_at.trunc_subsecs(6))
        .bind(record.created_at.trunc_subsecs(6))
        .bind(record.meta.as_ref())
        .bind(record.archived)
        .bind(record.origin.as_str())
        .bind(record.deleted_at.map(|at| at.trunc_subsecs(6)))
        .bind(record.synced_at.map(|at| at.trunc_subsecs(6)))
}

fn session_from_row(row: &PgRow) -> StoreResult<SessionRecord> {
    let session_id: String = row.try_get("session_id")?;
    let dirs: Value = row.try_get("additional_directories")?;
    let additional_directories = serde_json::from_value(dirs).map_err(|e| {
        StoreError::Corrupt(format!(
            "session {session_id:?}: additional_directories is not an array of strings: {e}"
        ))
    })?;
    let origin: String = row.try_get("origin")?;
    Ok(SessionRecord {
        tenant: row.try_get("tenant")?,
        cwd: row.try_get("cwd")?,
        additional_directories,
        title: row.try_get("title")?,
        updated_at: row.try_get("updated_at")?,
        created_at: row.try_get("created_at")?,
        meta: row.try_get("meta")?,
        archived: row.try_get("archived")?,
        origin: Origin::parse(&origin)?,
        deleted_at: row.try_get("deleted_at")?,
        synced_at: row.try_get("synced_at")?,
        session_id,
    })
}

/// A listed row that has not moved: its position is its `updated_at`.
fn listed_at_updated(row: &PgRow) -> StoreResult<Listed> {
    let record = session_from_row(row)?;
    Ok(Listed {
        key: record.updated_at,
        record,
    })
}

/// `WHERE` for the list queries over `sessions s`: live rows of the query's archive state,
/// tenant and cwd.
fn push_list_filters(qb: &mut QueryBuilder<'_, Postgres>, query: &ListQuery) {
    qb.push(" WHERE s.deleted_at IS NULL AND s.archived = ")
        .push_bind(query.archived.unwrap_or(false));
    if let Some(tenant) = &query.tenant {
        qb.push(" AND s.tenant = ").push_bind(tenant.clone());
    }
    if let Some(cwd) = &query.cwd {
        qb.push(" AND s.cwd = ").push_bind(cwd.clone());
    }
}

fn event_from_row(row: &PgRow) -> StoreResult<StoredEvent> {
    Ok(StoredEvent {
        session_id: row.try_get("session_id")?,
        seq: row.try_get("seq")?,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        created_at: row.try_get("created_at")?,
    })
}

fn lifecycle_from_row(row: &PgRow) -> StoreResult<StoredLifecycleEvent> {
    Ok(StoredLifecycleEvent {
        seq: row.try_get("seq")?,
        session_id: row.try_get("session_id")?,
        tenant: row.try_get("tenant")?,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        created_at: row.try_get("created_at")?,
    })
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn put_session(&self, record: &SessionRecord) -> StoreResult<bool> {
        // One statement: the upsert's `WHERE` leaves a tombstoned row untouched (0 rows).
        let done = bind_session(sqlx::query(PUT_SESSION), record)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(GET_SESSION)
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    async fn update_session(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        let mut tx = self.pool.begin().await?;
        // `FOR UPDATE` holds the row until commit, so concurrent updates of one session queue
        // up instead of overwriting each other's changes.
        let row = sqlx::query(LOCK_SESSION)
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut record = session_from_row(&row)?;
        if record.deleted_at.is_some() {
            return Ok(None);
        }
        mutate(&mut record);
        // The id is the row's key: a mutation cannot move the row to another id.
        record.session_id = session_id.to_owned();
        truncate_timestamps(&mut record);
        bind_session(sqlx::query(UPDATE_SESSION), &record)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(record))
    }

    async fn list_sessions(&self, query: &ListQuery) -> StoreResult<SessionList> {
        let limit = query.limit.max(1) + 1;
        let Some(after) = &query.after else {
            // First page: the rows and the newest move, read by one statement (one snapshot).
            let mut qb = QueryBuilder::<Postgres>::new(concat!(
                "SELECT ",
                session_columns!(),
                ", (SELECT COALESCE(MAX(id), 0) FROM session_moves) AS snapshot FROM sessions s"
            ));
            push_list_filters(&mut qb, query);
            qb.push(" ORDER BY updated_at DESC, session_id DESC LIMIT ")
                .push_bind(limit);
            let rows = qb.build().fetch_all(&self.pool).await?;
            let snapshot = match rows.first() {
                Some(row) => row.try_get("snapshot")?,
                None => 0,
            };
            let rows = rows
                .iter()
                .map(listed_at_updated)
                .collect::<StoreResult<_>>()?;
            return Ok(merge_page(query, snapshot, rows));
        };
        let at = after.updated_at.trunc_subsecs(6);
        // One statement, so that both parts see the same database: rows that have not moved
        // since the snapshot, at their current position, and rows that moved since, at the
        // position they had then.
        let mut qb = QueryBuilder::<Postgres>::new(concat!(
            "SELECT * FROM (SELECT ",
            session_columns!(),
            ", s.updated_at AS list_key FROM sessions s"
        ));
        push_list_filters(&mut qb, query);
        qb.push(" AND (updated_at, session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(
                ") AND NOT EXISTS (SELECT 1 FROM session_moves m \
                 WHERE m.session_id = s.session_id AND m.id > ",
            )
            .push_bind(after.snapshot)
            .push(") ORDER BY updated_at DESC, session_id DESC LIMIT ")
            .push_bind(limit)
            .push(concat!(
                ") AS kept UNION ALL SELECT * FROM (SELECT ",
                session_columns!(),
                ", m.from_updated_at AS list_key FROM (SELECT DISTINCT ON (session_id) session_id, from_updated_at \
                 FROM session_moves WHERE id > "
            ))
            .push_bind(after.snapshot)
            .push(" ORDER BY session_id, id) m JOIN sessions s USING (session_id)");
        push_list_filters(&mut qb, query);
        qb.push(" AND (m.from_updated_at, s.session_id) < (")
            .push_bind(at)
            .push(", ")
            .push_bind(after.session_id.clone())
            .push(") ORDER BY m.from_updated_at DESC, s.session_id DESC LIMIT ")
            .push_bind(limit)
            .push(") AS moved");
        let rows = qb.build().fetch_all(&self.pool).await?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok(Listed {
                    key: row.try_get("list_key")?,
                    record: session_from_row(row)?,
                })
            })
            .collect::<StoreResult<_>>()?;
        Ok(merge_page(query, after.snapshot, rows))
    }

    async fn synced_session_ids(&self) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT session_id FROM sessions WHERE deleted_at IS NULL AND synced_at IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn prune_moves(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        Ok(sqlx::query("DELETE FROM session_moves WHERE moved_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
        let at = at.trunc_subsecs(6);
        let tombstone_live = || {
            sqlx::query(TOMBSTONE_LIVE)
                .bind(session_id)
                .bind(at)
                .execute(&self.pool)
        };
        if tombstone_live().await?.rows_affected() == 1 {
            return Ok(true);
        }
        let inserted = sqlx::query(INSERT_TOMBSTONE)
            .bind(session_id)
            .bind(tenant)
            .bind(at)
            .execute(&self.pool)
            .await?;
        if inserted.rows_affected() == 1 {
            return Ok(false);
        }
        // The row appeared between the two statements (a concurrent insert). Rows are never
        // removed, so this second attempt is decisive: it either tombstones a live row or finds
        // one that is already deleted.
        Ok(tombstone_live().await?.rows_affected() == 1)
    }

    async fn append_events(
        &self,
        session_id: &str,
        events: &[NewEvent],
    ) -> StoreResult<Vec<StoredEvent>> {
        append_on(&self.pool, &self.replica, session_id, events, None).await
    }

    fn log_writer(&self) -> Box<dyn LogWriter> {
        let options = (*self.pool.connect_options())
            .clone()
            .application_name(PG_LOG_WRITER_NAME);
        Box::new(PgLogWriter {
            options,
            own: None,
            replica: self.replica.clone(),
        })
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredEvent>> {
        let rows = sqlx::query(READ_EVENTS)
            .bind(session_id)
            .bind(after)
            .bind(limit.max(0))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(event_from_row).collect()
    }

    async fn prune_events(
        &self,
        max_events: Option<i64>,
        before: Option<DateTime<Utc>>,
    ) -> StoreResult<u64> {
        let mut deleted = 0;
        if let Some(keep) = max_events {
            deleted += sqlx::query(PRUNE_BY_COUNT)
                .bind(keep.max(0))
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        if let Some(before) = before {
            deleted += sqlx::query(PRUNE_BY_AGE)
                .bind(before)
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        Ok(deleted)
    }

    async fn last_event_seq(&self, session_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(LAST_EVENT_SEQ)
            .bind(session_id)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn append_lifecycle(
        &self,
        event: &NewLifecycleEvent,
    ) -> StoreResult<StoredLifecycleEvent> {
        let created_at = Utc::now().trunc_subsecs(6);
        let mut tx = self.pool.begin().await?;
        // A bare `bigserial` hands out numbers at insert time, but concurrent transactions may
        // commit in another order, so a reader polling `seq > after` could move past a number
        // that becomes visible only later and miss that event for good. Taking this lock before
        // the insert and holding it to commit makes numbering order equal commit order.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(LIFECYCLE_LOCK_KEY)
            .execute(&mut *tx)
            .await?;
        let seq: i64 = sqlx::query_scalar(INSERT_LIFECYCLE)
            .bind(&event.session_id)
            .bind(&event.tenant)
            .bind(&event.kind)
            .bind(&event.payload)
            .bind(created_at)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(LIFECYCLE_CHANNEL)
            .bind(format!("{} {seq}", self.replica))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(StoredLifecycleEvent {
            seq,
            session_id: event.session_id.clone(),
            tenant: event.tenant.clone(),
            kind: event.kind.clone(),
            payload: event.payload.clone(),
            created_at,
        })
    }

    async fn read_lifecycle(
        &self,
        tenant: Option<&str>,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        let query = match tenant {
            None => sqlx::query(READ_LIFECYCLE_ALL),
            Some(_) => sqlx::query(READ_LIFECYCLE_TENANT),
        };
        let mut query = query.bind(after).bind(limit.max(0));
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(lifecycle_from_row).collect()
    }

    async fn last_lifecycle_seq(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(LAST_LIFECYCLE_SEQ)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn appended_elsewhere(&self) -> StoreResult<Option<BoxStream<'static, Appended>>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener
            .listen_all([EVENTS_CHANNEL, LIFECYCLE_CHANNEL])
            .await?;
        let me = self.replica.clone();
        let stream = futures::stream::unfold((listener, me), |(mut listener, me)| {
            async move {
                loop {
                    // `Ok(None)`: the connection was lost (the listener reconnects on the next
                    // call); an error: reconnecting failed, so pause before trying again.
                    let notification = match listener.try_recv().await {
                        Ok(Some(n)) => n,
                        Ok(None) => return Some((Appended::Lost, (listener, me))),
                        Err(e) => {
                            tracing::warn!(error = %e, "listening for other replicas' appends failed; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            return Some((Appended::Lost, (listener, me)));
                        }
                    };
                    if let Some(appended) = parse_notification(&me, &notification) {
                        return Some((appended, (listener, me)));
                    }
                }
            }
        });
        Ok(Some(Box::pin(stream)))
    }
}

#[async_trait]
impl ReplicaRegistry for PgStore {
    async fn heartbeat_replica(
        &self,
        id: &str,
        address: &str,
        started_at: DateTime<Utc>,
        sessions_live: i64,
        forget_after: Duration,
    ) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO replicas (id, address, started_at, heartbeat_at, sessions_live) \
             VALUES ($1, $2, $3, now(), $4) ON CONFLICT (id) DO UPDATE SET \
             address = excluded.address, heartbeat_at = now(), sessions_live = excluded.sessions_live",
        )
        .bind(id)
        .bind(address)
        .bind(started_at.trunc_subsecs(6))
        .bind(sessions_live)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM replicas WHERE heartbeat_at < now() - $1 * interval '1 microsecond'",
        )
        .bind(i64::try_from(forget_after.as_micros()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn replicas(&self) -> StoreResult<Vec<Replica>> {
        let rows = sqlx::query(
            "SELECT id, address, started_at, heartbeat_at, sessions_live, \
             GREATEST(0, (EXTRACT(EPOCH FROM clock_timestamp() - heartbeat_at) * 1000000)::BIGINT) AS silent \
             FROM replicas ORDER BY started_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Replica {
                    id: r.try_get("id")?,
                    address: r.try_get("address")?,
                    started_at: r.try_get("started_at")?,
                    heartbeat_at: r.try_get("heartbeat_at")?,
                    sessions_live: r.try_get("sessions_live")?,
                    silent_for: Duration::from_micros(r.try_get::<i64, _>("silent")?.max(0) as u64),
                })
            })
            .collect()
    }

    async fn remove_replica(&self, id: &str) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM session_owners WHERE replica_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let removed = sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(removed > 0)
    }

    async fn claim_session(
        &self,
        session_id: &str,
        replica: &str,
        lease: Duration,
    ) -> StoreResult<bool> {
        let claimed: Option<String> = sqlx::query_scalar(
            "INSERT INTO session_owners (session_id, replica_id) VALUES ($1, $2) \
             ON CONFLICT (session_id) DO UPDATE SET replica_id = excluded.replica_id \
             WHERE session_owners.replica_id = excluded.replica_id OR NOT EXISTS (\
             SELECT 1 FROM replicas r WHERE r.id = session_owners.replica_id \
             AND r.heartbeat_at >= now() - $3 * interval '1 microsecond') \
             RETURNING replica_id",
        )
        .bind(session_id)
        .bind(replica)
        .bind(micros_of(lease))
        .fetch_optional(&self.pool)
        .await?;
        Ok(claimed.is_some())
    }

    async fn release_session(&self, session_id: &str, replica: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM session_owners WHERE session_id = $1 AND replica_id = $2")
            .bind(session_id)
            .bind(replica)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn session_owner(
        &self,
        session_id: &str,
        lease: Duration,
    ) -> StoreResult<Option<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT o.replica_id, r.address FROM session_owners o \
             JOIN replicas r ON r.id = o.replica_id WHERE o.session_id = $1 \
             AND r.heartbeat_at >= now() - $2 * interval '1 microsecond'",
        )
        .bind(session_id)
        .bind(micros_of(lease))
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn release_orphans(&self, lease: Duration) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "DELETE FROM session_owners o WHERE NOT EXISTS (SELECT 1 FROM replicas r \
             WHERE r.id = o.replica_id AND r.heartbeat_at >= now() - $1 * interval '1 microsecond') \
             RETURNING o.session_id",
        )
        .bind(micros_of(lease))
        .fetch_all(&self.pool)
        .await?)
    }
}
