//! `acp-gateway backup --to FILE`: a consistent copy of a live SQLite store in a new file
//! (SQLite's `VACUUM INTO`, which reads one snapshot while the gateway goes on writing). A
//! PostgreSQL store is backed up with `pg_dump` (docs/operations.md); either is restored with
//! `migrate --from`.

use std::path::Path;

use sqlx::ConnectOptions as _;

use super::database::DatabaseUrl;
use super::error::{StoreError, StoreResult};

/// Writes the SQLite store of `database` to `to`, which must not exist; answers its size.
pub async fn backup_sqlite(database: &DatabaseUrl, to: &Path) -> StoreResult<u64> {
    let DatabaseUrl::Sqlite { options, in_memory } = database else {
        return Err(StoreError::Refused(
            "backup writes an SQLite store's file; back up PostgreSQL with pg_dump \
             (docs/operations.md)"
                .into(),
        ));
    };
    let file = options.get_filename();
    if *in_memory || !file.is_file() {
        return Err(StoreError::Refused(format!(
            "there is no SQLite store at {}",
            file.display()
        )));
    }
    if to.exists() {
        return Err(StoreError::Refused(format!(
            "{} exists already: a backup is written to a new file",
            to.display()
        )));
    }
    let mut conn = (**options)
        .clone()
        .create_if_missing(false)
        .connect()
        .await?;
    sqlx::query("VACUUM INTO ?")
        .bind(to.to_string_lossy().into_owned())
        .execute(&mut conn)
        .await?;
    Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
}
