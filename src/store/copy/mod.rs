//! `acp-gateway migrate --from URL --to URL`: a whole store copied into another, SQLite to
//! PostgreSQL and back ([`copy_store`]). Every table that holds what the gateway keeps is copied
//! row by row with its keys (so every event keeps its id, and a client's `Last-Event-ID` means
//! the same on the target), from one snapshot of the source, in batches whose inserts skip rows
//! already there: a copy that stopped half-way is finished by running it again. What running
//! replicas hold (leases, watchers, slots) is not copied: they start afresh. Each table's rows
//! are counted and hashed on both sides at the end (`cells.rs`); a difference fails the copy.
//!
//! The target must be new, or the target of this same copy left unfinished (`store_copies`
//! says which); a store with data of its own, a finished copy, or a store a gateway is serving
//! (the SQLite lock, a PostgreSQL replica's recent heartbeat) is refused.

mod cells;
mod conn;
pub mod tables;

use sha2::{Digest, Sha256};

use self::cells::{Cell, Kind, RowsDigest};
use self::conn::StoreSide;
use self::tables::{COPIED, ESCAPED};
use super::database::{DatabaseUrl, open};
use super::error::{StoreError, StoreResult};

/// A finished copy: each table's rows, and the digest both stores agree on.
#[derive(Debug, Clone)]
pub struct CopyReport {
    pub tables: Vec<(&'static str, u64)>,
    /// SHA-256 of every table's name, row count and rows' digest.
    pub digest: String,
    /// Whether it finished a copy an earlier run had started.
    pub resumed: bool,
}

/// Where a copy is: `(table, rows copied, rows in the table)`, after each batch.
pub type CopyProgress<'a> = dyn FnMut(&str, u64, u64) + Send + 'a;

/// Copies the store at `from` into the one at `to` (both migrated to this release's schema
/// first), `source` naming `from` in the target's record of copies.
pub async fn copy_store(
    from: &DatabaseUrl,
    to: &DatabaseUrl,
    source: &str,
    progress: &mut CopyProgress<'_>,
) -> StoreResult<CopyReport> {
    if same_store(from, to) {
        return Err(StoreError::Refused(
            "--from and --to name the same database".into(),
        ));
    }
    if let DatabaseUrl::Sqlite { options, in_memory } = from {
        let file = options.get_filename();
        if *in_memory || !file.is_file() {
            return Err(StoreError::Refused(format!(
                "there is no SQLite store at {}",
                file.display()
            )));
        }
    }
    // The source is looked at before anything migrates it: a served one is left as it is.
    let mut source_conn = StoreSide::open(from, "the source").await?;
    source_conn.refuse_if_served("the source").await?;
    open(from, "migrate").await?;
    open(to, "migrate").await?;
    let mut target = StoreSide::open(to, "the target").await?;
    target.refuse_if_served("the target").await?;
    let resumed = target.claim(source).await?;
    let both_sqlite = source_conn.is_sqlite() && target.is_sqlite();
    source_conn.snapshot().await?;
    let mut tables = Vec::new();
    let mut whole = Sha256::new();
    for &table in COPIED {
        let columns = match (&mut source_conn, &mut target) {
            (StoreSide::Pg(..), _) => source_conn.columns(table).await?,
            (_, StoreSide::Pg(..)) => target.columns(table).await?,
            _ => source_conn.columns(table).await?,
        };
        let kinds: Vec<(Kind, String)> = columns
            .iter()
            .map(|(name, pg_type)| (kind_of(table, name, pg_type, both_sqlite), pg_type.clone()))
            .collect();
        let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
        let total = source_conn.count(table).await?;
        let mut read = RowsDigest::default();
        let mut copied = 0;
        progress(table, 0, total);
        let plain: Vec<Kind> = kinds.iter().map(|(k, _)| *k).collect();
        source_conn
            .each_batch(table, &names, &kinds, &mut async |rows: Vec<Vec<Cell>>| {
                for row in &rows {
                    read.add(row, &plain);
                }
                copied += rows.len() as u64;
                target.insert(table, &names, &plain, rows).await?;
                progress(table, copied, total);
                Ok(())
            })
            .await?;
        let mut written = RowsDigest::default();
        target
            .each_batch(table, &names, &kinds, &mut async |rows: Vec<Vec<Cell>>| {
                for row in &rows {
                    written.add(row, &plain);
                }
                Ok(())
            })
            .await?;
        if written != read {
            return Err(StoreError::Refused(format!(
                "table {table}: the target holds {} rows, the source {}, and they differ \
                 (digests {:032x} and {:032x}): the source changed since an earlier run began, \
                 or something else wrote the target. The copy is not marked finished; copy \
                 into a new database",
                written.rows, read.rows, written.sum, read.sum
            )));
        }
        whole.update(format!("{table} {} {:032x}\n", read.rows, read.sum));
        tables.push((table, read.rows));
    }
    source_conn.end_snapshot().await?;
    target.after_copy(source).await?;
    Ok(CopyReport {
        tables,
        digest: format!("{:x}", whole.finalize()),
        resumed,
    })
}

/// Whether `a` and `b` name one database: the same SQLite file, or the same PostgreSQL
/// database on the same host and port.
fn same_store(a: &DatabaseUrl, b: &DatabaseUrl) -> bool {
    match (a, b) {
        (DatabaseUrl::Sqlite { options: x, .. }, DatabaseUrl::Sqlite { options: y, .. }) => {
            let file = |o: &sqlx::sqlite::SqliteConnectOptions| {
                let name = o.get_filename();
                std::fs::canonicalize(name).unwrap_or_else(|_| name.to_path_buf())
            };
            file(x) == file(y)
        }
        (DatabaseUrl::Postgres(x), DatabaseUrl::Postgres(y)) => {
            let at = |url: &str| {
                url.parse::<sqlx::postgres::PgConnectOptions>()
                    .ok()
                    .map(|o| {
                        let db = o.get_database().map(str::to_owned);
                        (o.get_host().to_owned(), o.get_port(), db)
                    })
            };
            at(x) == at(y)
        }
        _ => false,
    }
}

/// What column `name` of `table` holds, from its PostgreSQL type (`both_sqlite`: copied as it
/// is).
fn kind_of(table: &str, name: &str, pg_type: &str, both_sqlite: bool) -> Kind {
    if both_sqlite {
        return Kind::Plain;
    }
    match pg_type {
        "integer" => Kind::Int4,
        "boolean" => Kind::Bool,
        "timestamp with time zone" => Kind::Time,
        "json" => Kind::Json(false),
        "jsonb" => Kind::Json(true),
        "text" if ESCAPED.contains(&(table, name)) => Kind::Escaped,
        "bigint" => Kind::Int8,
        "double precision" => Kind::Real,
        "bytea" => Kind::Bytes,
        _ => Kind::Text,
    }
}
