//! One side of a copy: a connection of its own to either backend ([`StoreSide`]), what it says of a
//! table (its columns, its rows a batch at a time), the inserts that skip rows already there,
//! whether a gateway is serving the store, and the target's record of copies.

use futures::TryStreamExt as _;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::sqlite::SqliteConnection;
use sqlx::{ConnectOptions as _, QueryBuilder, Row};

use super::cells::{self, Cell, Kind};
use super::tables::COPIED;
use crate::store::database::DatabaseUrl;
use crate::store::error::{StoreError, StoreResult};
use crate::store::sqlite::replica::{ReplicaLock, lock_single_replica};

/// Bound parameters per insert (below PostgreSQL's 65 535 and SQLite's 32 766).
const PARAMETERS: usize = 30_000;
/// A PostgreSQL replica whose heartbeat is this recent is taken to be running.
const HEARTBEAT_RECENT_SECS: i64 = 60;

/// A connection to one side of a copy; on SQLite, with the lock that keeps a gateway off the
/// file while the copy runs.
pub(super) enum StoreSide {
    Pg(PgConnection),
    /// The lock is held, never read.
    Lite(SqliteConnection, #[allow(dead_code)] Option<ReplicaLock>),
}

impl StoreSide {
    /// Connects to `url` (`side`: how errors name it), and on SQLite takes the gateway's lock.
    pub(super) async fn open(url: &DatabaseUrl, side: &str) -> StoreResult<StoreSide> {
        Ok(match url {
            DatabaseUrl::Postgres(url) => {
                let options: PgConnectOptions = url.parse()?;
                StoreSide::Pg(options.connect().await?)
            }
            DatabaseUrl::Sqlite { options, in_memory } => {
                let lock = lock_single_replica(options, *in_memory).map_err(|e| {
                    StoreError::Refused(format!("{side}: {e}; stop that gateway first"))
                })?;
                StoreSide::Lite(options.connect().await?, lock)
            }
        })
    }

    pub(super) fn is_sqlite(&self) -> bool {
        matches!(self, StoreSide::Lite(..))
    }

    /// Refuses a PostgreSQL store a replica has served within the last minute (an SQLite one is
    /// refused by its lock, at [`StoreSide::open`]).
    pub(super) async fn refuse_if_served(&mut self, side: &str) -> StoreResult<()> {
        let StoreSide::Pg(conn) = self else {
            return Ok(());
        };
        let running: Option<(String, String)> = sqlx::query_as(
            "SELECT id, address FROM replicas \
             WHERE heartbeat_at >= now() - $1 * interval '1 second' LIMIT 1",
        )
        .bind(HEARTBEAT_RECENT_SECS as f64)
        .fetch_optional(conn)
        .await?;
        match running {
            Some((id, address)) => Err(StoreError::Refused(format!(
                "{side} is being served: replica {id} at {address} beat within the last \
                 {HEARTBEAT_RECENT_SECS} s; stop every replica first"
            ))),
            None => Ok(()),
        }
    }

    /// On the target: records the copy from `source`, or finds it started by an earlier run
    /// (`true`); refuses a store with data of its own or another copy, and a finished one.
    pub(super) async fn claim(&mut self, source: &str) -> StoreResult<bool> {
        let copies: Vec<(String, Option<i64>)> = self
            .rows("SELECT source, finished_at FROM store_copies")
            .await?;
        for (from, finished) in &copies {
            if from != source {
                return Err(StoreError::Refused(format!(
                    "the target holds a copy of {from} already: it is in use"
                )));
            }
            if finished.is_some() {
                return Err(StoreError::Refused(format!(
                    "the target is a finished copy of {source}, and may have been served since: \
                     copy into a new database"
                )));
            }
        }
        if !copies.is_empty() {
            return Ok(true);
        }
        // Its sessions first: what an operator knows a used store by.
        let tables = COPIED.iter().filter(|t| **t != "sessions");
        for table in std::iter::once(&"sessions").chain(tables) {
            let rows = self.count(table).await?;
            if rows > 0 {
                return Err(StoreError::Refused(format!(
                    "the target is in use: its {table} holds {rows} rows; copy into a new database"
                )));
            }
        }
        let now = chrono::Utc::now().timestamp_micros();
        let record = "INSERT INTO store_copies (source, started_at) VALUES ($1, $2)";
        match self {
            StoreSide::Pg(c) => {
                sqlx::query(record)
                    .bind(source)
                    .bind(now)
                    .execute(c)
                    .await?;
            }
            StoreSide::Lite(c, _) => {
                sqlx::query(record)
                    .bind(source)
                    .bind(now)
                    .execute(c)
                    .await?;
            }
        };
        Ok(false)
    }

    /// On the target, once every table is copied and checked: PostgreSQL's sequences moved past
    /// the copied keys, and the copy recorded finished.
    pub(super) async fn after_copy(&mut self, source: &str) -> StoreResult<()> {
        let now = chrono::Utc::now().timestamp_micros();
        let finish = "UPDATE store_copies SET finished_at = $2 WHERE source = $1";
        match self {
            StoreSide::Pg(c) => {
                let serials: Vec<(String, String, String)> = sqlx::query_as(
                    "SELECT table_name::text, column_name::text, \
                     pg_get_serial_sequence(quote_ident(table_name), column_name) \
                     FROM information_schema.columns WHERE table_schema = current_schema() \
                     AND pg_get_serial_sequence(quote_ident(table_name), column_name) IS NOT NULL",
                )
                .fetch_all(&mut *c)
                .await?;
                for (table, column, sequence) in serials {
                    let set = format!(
                        "SELECT setval($1, COALESCE((SELECT max(\"{column}\") FROM \"{table}\"), 0) + 1, false)"
                    );
                    sqlx::query(&set).bind(sequence).execute(&mut *c).await?;
                }
                sqlx::query(finish)
                    .bind(source)
                    .bind(now)
                    .execute(c)
                    .await?;
            }
            StoreSide::Lite(c, _) => {
                sqlx::query(finish)
                    .bind(source)
                    .bind(now)
                    .execute(c)
                    .await?;
            }
        }
        Ok(())
    }

    /// Every table's reads from here on see the store as it is now.
    pub(super) async fn snapshot(&mut self) -> StoreResult<()> {
        match self {
            StoreSide::Pg(c) => {
                sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .execute(c)
                    .await?;
            }
            StoreSide::Lite(c, _) => {
                sqlx::query("BEGIN").execute(c).await?;
            }
        };
        Ok(())
    }

    pub(super) async fn end_snapshot(&mut self) -> StoreResult<()> {
        match self {
            StoreSide::Pg(c) => {
                sqlx::query("COMMIT").execute(c).await?;
            }
            StoreSide::Lite(c, _) => {
                sqlx::query("COMMIT").execute(c).await?;
            }
        };
        Ok(())
    }

    /// `table`'s columns in order, each with its PostgreSQL type (on SQLite, its declared one).
    pub(super) async fn columns(&mut self, table: &str) -> StoreResult<Vec<(String, String)>> {
        let columns: Vec<(String, String)> = match self {
            StoreSide::Pg(c) => {
                sqlx::query_as(
                    "SELECT column_name::text, data_type::text FROM information_schema.columns \
                     WHERE table_schema = current_schema() AND table_name = $1 \
                     ORDER BY ordinal_position",
                )
                .bind(table)
                .fetch_all(c)
                .await?
            }
            StoreSide::Lite(c, _) => {
                sqlx::query_as("SELECT name, type FROM pragma_table_info($1) ORDER BY cid")
                    .bind(table)
                    .fetch_all(c)
                    .await?
            }
        };
        match columns.is_empty() {
            true => Err(StoreError::Corrupt(format!("no table {table}"))),
            false => Ok(columns),
        }
    }

    pub(super) async fn count(&mut self, table: &str) -> StoreResult<u64> {
        let sql = format!("SELECT count(*) FROM \"{table}\"");
        let (n,): (i64,) = match self {
            StoreSide::Pg(c) => sqlx::query_as(&sql).fetch_one(c).await?,
            StoreSide::Lite(c, _) => sqlx::query_as(&sql).fetch_one(c).await?,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// `table`'s rows, in batches handed to `f` as they are read.
    pub(super) async fn each_batch(
        &mut self,
        table: &str,
        names: &[&str],
        kinds: &[(Kind, String)],
        f: &mut impl AsyncFnMut(Vec<Vec<Cell>>) -> StoreResult<()>,
    ) -> StoreResult<()> {
        let per_batch = (PARAMETERS / names.len().max(1)).clamp(1, 2000);
        let list: Vec<String> = (names.iter().zip(kinds))
            .map(|(name, (kind, _))| match (kind, &*self) {
                (Kind::Json(_), StoreSide::Pg(_)) => format!("\"{name}\"::text"),
                _ => format!("\"{name}\""),
            })
            .collect();
        let sql = format!("SELECT {} FROM \"{table}\"", list.join(", "));
        let mut batch = Vec::with_capacity(per_batch);
        match self {
            StoreSide::Pg(c) => {
                let kinds: Vec<Kind> = kinds.iter().map(|(k, _)| *k).collect();
                let mut rows = sqlx::query(&sql).fetch(c);
                while let Some(row) = rows.try_next().await? {
                    batch.push(cells::from_postgres(&row, &kinds)?);
                    if batch.len() == per_batch {
                        f(std::mem::take(&mut batch)).await?;
                    }
                }
            }
            StoreSide::Lite(c, _) => {
                let mut rows = sqlx::query(&sql).fetch(c);
                while let Some(row) = rows.try_next().await? {
                    batch.push(cells::from_sqlite(&row, row.len())?);
                    if batch.len() == per_batch {
                        f(std::mem::take(&mut batch)).await?;
                    }
                }
            }
        }
        if !batch.is_empty() {
            f(batch).await?;
        }
        Ok(())
    }

    /// Inserts `rows` into `table`, skipping any whose key is there already.
    pub(super) async fn insert(
        &mut self,
        table: &str,
        names: &[&str],
        kinds: &[Kind],
        rows: Vec<Vec<Cell>>,
    ) -> StoreResult<()> {
        let head = format!(
            "INSERT INTO \"{table}\" ({}) ",
            names
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        match self {
            StoreSide::Pg(c) => {
                let mut insert = QueryBuilder::new(head);
                let mut failed = None;
                insert.push_values(rows, |mut values, row| {
                    for (cell, kind) in row.into_iter().zip(kinds) {
                        if let Err(e) = cells::bind_postgres(&mut values, cell, *kind) {
                            failed.get_or_insert(e);
                        }
                    }
                });
                if let Some(e) = failed {
                    return Err(e);
                }
                insert.push(" ON CONFLICT DO NOTHING");
                insert.build().execute(c).await?;
            }
            StoreSide::Lite(c, _) => {
                let mut insert = QueryBuilder::new(head);
                insert.push_values(rows, |mut values, row| {
                    for cell in row {
                        cells::bind_sqlite(&mut values, cell);
                    }
                });
                insert.push(" ON CONFLICT DO NOTHING");
                insert.build().execute(c).await?;
            }
        }
        Ok(())
    }

    /// The rows of `sql` (no parameters), on either backend.
    async fn rows<T>(&mut self, sql: &str) -> StoreResult<Vec<T>>
    where
        T: Send + Unpin,
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
        T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>,
    {
        Ok(match self {
            StoreSide::Pg(c) => sqlx::query_as(sql).fetch_all(c).await?,
            StoreSide::Lite(c, _) => sqlx::query_as(sql).fetch_all(c).await?,
        })
    }
}
