//! The session event logs: appends numbered from each session's counter (`session_seqs`) with
//! their webhook deliveries, the log writer with its own connection, and how retention prunes by
//! count.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnection, SqlitePool};

use super::checkpoint::{CHECKPOINT_EVERY, Checkpointer};
use super::store::{BEGIN_IMMEDIATE, BUSY_TIMEOUT, SqliteStore, micros};
use crate::store::error::{StoreError, StoreResult};
use crate::store::event::{Batch, LogWriter, StoredEvent};

/// Rows per multi-row `INSERT` (5 parameters each, far below SQLite's 32 766 limit).
const INSERT_CHUNK: usize = 1000;
/// Appends of up to this many events keep their (multi-statement) query prepared.
const PREPARED_BATCH: usize = 4;

const BUMP_SEQ: &str = "INSERT INTO session_seqs (session_id, last_seq) VALUES (?, ?) \
     ON CONFLICT (session_id) DO UPDATE SET last_seq = session_seqs.last_seq + excluded.last_seq \
     RETURNING last_seq";

/// Followed by `(ordinal, kind, payload)` rows and [`INSERT_EVENTS_TAIL`]; binds the session id,
/// the batch's event count and `created_at`, then the rows, then the session id again. Row
/// `ordinal` (from 1) gets sequence number `last_seq - count + ordinal`.
const INSERT_EVENTS_HEAD: &str = " INSERT INTO session_events \
     (session_id, seq, kind, payload, created_at) \
     SELECT ?, s.last_seq - ? + v.column1, v.column2, v.column3, ? FROM (VALUES ";
const INSERT_EVENTS_TAIL: &str = ") v, session_seqs s WHERE s.session_id = ?;";
/// The webhook deliveries of the batch just inserted (see [`sqlite_insert_deliveries!`]), to the
/// webhooks of its session's tenant (a session without a row, which there is not, gets none).
/// Binds the session id twice and the batch's event count: its events are the last that many
/// of the session's counter.
const INSERT_DELIVERIES: &str = concat!(
    sqlite_insert_deliveries!(
        from: "session_events i JOIN sessions s ON s.session_id = i.session_id",
        message_id: "i.session_id || '.' || i.seq",
        tenant: "s.tenant",
        where: "i.session_id = ? \
                AND i.seq > (SELECT last_seq FROM session_seqs WHERE session_id = ?) - ?",
    ),
    ";"
);
/// Whether any webhook is enabled: without one, an append has no deliveries to look for.
const ANY_WEBHOOK: &str = "SELECT EXISTS (SELECT 1 FROM webhooks WHERE enabled)";
/// Binds `updated_at`, the session id, `updated_at`; a no-op unless it raises `updated_at` (a
/// change of the gateway's own: the row is no longer what a listing made it).
const TOUCH_SESSION: &str = " UPDATE sessions SET updated_at = ?, listed = NULL \
     WHERE session_id = ? AND deleted_at IS NULL AND updated_at < ?;";

/// Deletes, in every session, the events beyond the latest `$1`.
pub(super) const PRUNE_BY_COUNT: &str = "DELETE FROM session_events WHERE seq <= \
     (SELECT s.last_seq FROM session_seqs s WHERE s.session_id = session_events.session_id) - $1";
/// The log writer of an SQLite store: a connection of its own beside the writer pool (SQLite's
/// write lock serializes the two; appends and metadata writes are short). An in-memory database
/// has one connection for everything, so there it takes the pool's in turn.
///
/// Its own connection is a `rusqlite` one, used on the calling thread: the event log's writer
/// has a thread to itself (see `events`), and an append there is a few library calls, where an
/// sqlx connection would hand every command to its worker thread and wake the caller for each
/// result (a dozen thread switches per prompt, each tens of microseconds of CPU on a VM).
///
/// It does not checkpoint the WAL when a commit crosses SQLite's threshold of a thousand pages
/// (`wal_autocheckpoint = 0`): copying that much back into the database in one go would land on
/// one append and, on a small machine, take the CPU from a prompt in flight. Instead it asks
/// its [`Checkpointer`] for a passive checkpoint every [`CHECKPOINT_EVERY`] appends, on a thread
/// of its own, so that the checkpoint's sync holds back no commit.
struct SqliteLogWriter {
    pool: SqlitePool,
    /// Use the pool's connection (an in-memory database).
    shared: bool,
    own: Option<(rusqlite::Connection, Checkpointer)>,
    /// Appends since the last checkpoint.
    appends: u32,
}

/// One event of an append, numbered by the caller (see [`append_here`]).
const INSERT_EVENT: &str = "INSERT INTO session_events \
     (session_id, seq, kind, payload, created_at) VALUES (?, ?, ?, ?, ?)";

#[async_trait]
impl LogWriter for SqliteLogWriter {
    async fn append_batch(&mut self, batch: &Batch<'_>) -> StoreResult<Vec<StoredEvent>> {
        if self.shared {
            let mut conn = self.pool.acquire().await?;
            return append_on(&mut conn, batch).await;
        }
        let appended = self.append_batches(std::slice::from_ref(batch)).await;
        appended
            .unwrap_or_else(|| Err(StoreError::Corrupt("no own connection".into())))
            .map(|mut all| all.remove(0))
    }

    async fn append_batches(
        &mut self,
        batches: &[Batch<'_>],
    ) -> Option<StoreResult<Vec<Vec<StoredEvent>>>> {
        if self.shared {
            return None;
        }
        let (conn, _) = match &mut self.own {
            Some(own) => own,
            own => {
                let options = self.pool.connect_options();
                let path = options.get_filename();
                match open_log_connection(path)
                    .and_then(|conn| Ok((conn, Checkpointer::start(path, open_log_connection)?)))
                {
                    Ok(opened) => own.insert(opened),
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        let appended = append_here(conn, batches);
        Some(self.appended(appended))
    }
}

impl SqliteLogWriter {
    /// Counts an append on the own connection, has the WAL checkpointed every
    /// [`CHECKPOINT_EVERY`], and drops the connection after a failure.
    fn appended<T>(&mut self, appended: StoreResult<T>) -> StoreResult<T> {
        let Some((conn, checkpointer)) = &self.own else {
            return appended;
        };
        self.appends += 1;
        if appended.is_ok() && self.appends >= CHECKPOINT_EVERY {
            self.appends = 0;
            checkpointer.after_appends(conn);
        }
        if appended.is_err() {
            self.own = None;
        }
        appended
    }
}

/// The log writer's own connection to the database file the pool was opened on (it exists:
/// the pool has run the migrations), with the pool's busy timeout and durability.
fn open_log_connection(path: &std::path::Path) -> StoreResult<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

/// Appends `batches` (and applies their `touch`, see [`LogWriter::append`]) on `conn`, on this
/// thread, in one `BEGIN IMMEDIATE` transaction (rolled back when dropped on an error): for
/// each, the bump returns the new last sequence number, from which its events are numbered;
/// then their webhook deliveries are inserted.
fn append_here(
    conn: &mut rusqlite::Connection,
    batches: &[Batch<'_>],
) -> StoreResult<Vec<Vec<StoredEvent>>> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Read under the write lock, which creating or enabling a webhook also takes.
    let webhooks: bool = tx
        .prepare_cached(ANY_WEBHOOK)?
        .query_row([], |row| row.get(0))?;
    let stored = batches
        .iter()
        .map(|batch| append_in(&tx, batch, webhooks))
        .collect::<StoreResult<_>>()?;
    tx.commit()?;
    Ok(stored)
}

/// One batch of [`append_here`], in its transaction; its webhook deliveries are looked for only
/// when some webhook is enabled.
fn append_in(
    tx: &rusqlite::Transaction<'_>,
    batch: &Batch<'_>,
    webhooks: bool,
) -> StoreResult<Vec<StoredEvent>> {
    let session_id = batch.session_id;
    let created_micros = micros(batch.created_at);
    let last: i64 = tx
        .prepare_cached(BUMP_SEQ)?
        .query_row((session_id, batch.count), |row| row.get(0))?;
    {
        let mut insert = tx.prepare_cached(INSERT_EVENT)?;
        for (seq, event) in (batch.first(last)..).zip(batch.events) {
            let payload = event.payload.as_str();
            insert.execute((session_id, seq, &event.kind, payload, created_micros))?;
        }
    }
    if webhooks {
        tx.prepare_cached(INSERT_DELIVERIES)?
            .execute((session_id, session_id, batch.count))?;
    }
    if let Some(at) = batch.touch {
        let at = micros(at);
        tx.prepare_cached(TOUCH_SESSION)?
            .execute((at, session_id, at))?;
    }
    Ok(batch.stored(last))
}

/// Appends `batch` (and applies its `touch`, see [`LogWriter::append`]) on `conn`, in one
/// transaction sent as one command: the connection's thread runs it without coming back
/// between statements (a round trip costs two thread wake-ups), and SQLite's write lock is
/// never held while a task waits to be polled, so a `rusqlite` log writer blocking a runtime
/// thread on that lock cannot stall it. The inserts number their rows from the counter the bump
/// has just raised; the webhook deliveries follow them.
async fn append_on(
    conn: &mut SqliteConnection,
    batch: &Batch<'_>,
) -> StoreResult<Vec<StoredEvent>> {
    let Batch {
        session_id,
        events,
        count,
        created_at,
        touch,
    } = *batch;
    let created_micros = micros(created_at);

    let mut sql = format!("{BEGIN_IMMEDIATE}; {BUMP_SEQ};");
    for chunk in events.chunks(INSERT_CHUNK) {
        sql.push_str(INSERT_EVENTS_HEAD);
        sql.push_str(&vec!["(?, ?, ?)"; chunk.len()].join(", "));
        sql.push_str(INSERT_EVENTS_TAIL);
    }
    sql.push(' ');
    sql.push_str(INSERT_DELIVERIES);
    if touch.is_some() {
        sql.push_str(TOUCH_SESSION);
    }
    sql.push_str(" COMMIT");
    let mut query = sqlx::query(&sql)
        .persistent(events.len() <= PREPARED_BATCH)
        .bind(session_id)
        .bind(count);
    for (start, chunk) in (0..).step_by(INSERT_CHUNK).zip(events.chunks(INSERT_CHUNK)) {
        query = query.bind(session_id).bind(count).bind(created_micros);
        for (k, event) in chunk.iter().enumerate() {
            query = query
                .bind(i64::try_from(start + k + 1).unwrap_or(i64::MAX))
                .bind(&event.kind)
                .bind(event.payload.as_str());
        }
        query = query.bind(session_id);
    }
    query = query.bind(session_id).bind(session_id).bind(count);
    if let Some(at) = touch {
        let at = micros(at);
        query = query.bind(at).bind(session_id).bind(at);
    }
    let rows = match query.fetch_all(&mut *conn).await {
        Ok(rows) => rows,
        Err(e) => {
            // Whichever statement failed, the transaction must not stay open on the connection.
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            return Err(e.into());
        }
    };
    let last: i64 = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("the sequence bump returned no row".into()))?
        .try_get(0)?;
    Ok(batch.stored(last))
}

impl SqliteStore {
    pub(super) async fn append_batch(&self, batch: &Batch<'_>) -> StoreResult<Vec<StoredEvent>> {
        let mut conn = self.writer.acquire().await?;
        append_on(&mut conn, batch).await
    }

    pub(super) fn log_writer(&self) -> Box<dyn LogWriter> {
        Box::new(SqliteLogWriter {
            pool: self.writer.clone(),
            shared: self.in_memory,
            own: None,
            appends: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use sqlx::sqlite::SqliteConnectOptions;

    use crate::store::event::NewEvent;
    use crate::store::migrations::{SQLITE, migrator};

    /// A log written before migration 0011 made `session_events` a rowid table keeps every
    /// event through it: each session's read back in order with its payload, and appends go
    /// on numbering after them, through the store and its log writer.
    #[tokio::test]
    async fn events_written_before_the_rowid_table_survive_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("old.db").display());
        let old = sqlx::SqlitePool::connect_with(
            SqliteConnectOptions::from_str(&url)
                .unwrap()
                .create_if_missing(true),
        )
        .await
        .unwrap();
        let before = SQLITE
            .iter()
            .position(|(name, _)| *name == "0011_event_rowid")
            .unwrap();
        migrator(&SQLITE[..before]).run(&old).await.unwrap();
        for (session, count) in [("a", 3), ("b", 2)] {
            for seq in 1..=count {
                sqlx::query(
                    "INSERT INTO session_events (session_id, seq, kind, payload, created_at) \
                     VALUES (?, ?, 'agent_message_chunk', ?, ?)",
                )
                .bind(session)
                .bind(seq)
                .bind(format!(r#"{{"n":"{session}{seq}"}}"#))
                .bind(1_700_000_000_000_000_i64 + seq)
                .execute(&old)
                .await
                .unwrap();
            }
            sqlx::query("INSERT INTO session_seqs (session_id, last_seq) VALUES (?, ?)")
                .bind(session)
                .bind(count)
                .execute(&old)
                .await
                .unwrap();
        }
        old.close().await;

        let store = crate::store::database::connect(&url, "test-replica")
            .await
            .unwrap()
            .store;
        for (session, count) in [("a", 3), ("b", 2)] {
            let events = store.read_events(session, 0, 100).await.unwrap();
            let seen: Vec<_> = events
                .iter()
                .map(|e| (e.seq, e.payload.as_str().to_owned()))
                .collect();
            let expected: Vec<_> = (1..=count)
                .map(|seq| (seq, format!(r#"{{"n":"{session}{seq}"}}"#)))
                .collect();
            assert_eq!(seen, expected, "session {session}");
        }
        let event = || NewEvent {
            kind: "x".into(),
            payload: serde_json::json!({"new": true}).into(),
        };
        let appended = store.append_events("a", &[event()]).await.unwrap();
        assert_eq!(appended[0].seq, 4);
        let mut writer = store.log_writer();
        let written = writer
            .append_all(&[("a", &[event()][..], None), ("b", &[event()][..], None)])
            .await
            .unwrap()
            .unwrap();
        assert_eq!((written[0][0].seq, written[1][0].seq), (5, 3));
        assert_eq!(store.read_events("a", 3, 100).await.unwrap().len(), 2);
    }
}
