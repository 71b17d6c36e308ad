//! What can go wrong in the store ([`StoreError`]), and how a caller tells a database it cannot
//! reach now from data it refuses.

/// What can go wrong in the store. Callers log it and answer 500/503; it never reaches a body.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// From the SQLite event log's own connection (see `sqlite`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A database URL the gateway cannot use, and why (see `diagnosis.rs`).
    #[error("{0}")]
    Refused(String),
}

impl StoreError {
    /// The connection was found closed or shut down by the server (SQLSTATE classes 08 and
    /// 57P, or an I/O error). The statement may or may not have run: an I/O error while its
    /// answer was on the way leaves a commit unknown.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Io(_))) || self.is_shut_down_by_server()
    }

    /// The server reported the connection shut down (SQLSTATE classes 08 and 57P) in answer to
    /// a statement: it did not commit.
    pub fn is_shut_down_by_server(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => e
                .code()
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
            _ => false,
        }
    }

    /// The database cannot be reached or cannot write now, and may again later: a lost
    /// connection, no connection from the pool in time, or an SQLite file that is busy,
    /// read-only, full or failing I/O. A request failing so answers 503 with `Retry-After`.
    pub fn is_unavailable(&self) -> bool {
        self.is_connection_lost()
            || match self {
                StoreError::Db(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed) => true,
                StoreError::Db(sqlx::Error::Database(e)) => {
                    sqlite_code(e.as_ref()).is_some_and(|c| SQLITE_UNAVAILABLE.contains(&c))
                }
                StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                    SQLITE_UNAVAILABLE.contains(&(e.extended_code & 0xff))
                }
                _ => false,
            }
    }

    /// The data itself was refused (PostgreSQL's SQLSTATE classes 22 and 23, SQLite's
    /// constraint, too-big and mismatch codes, a value that does not encode): writing it
    /// again fails again.
    pub fn is_about_the_data(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => match sqlite_code(e.as_ref()) {
                Some(c) => SQLITE_DATA.contains(&c),
                None => e
                    .code()
                    .is_some_and(|c| c.starts_with("22") || c.starts_with("23")),
            },
            StoreError::Db(sqlx::Error::Encode(_)) => true,
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                SQLITE_DATA.contains(&(e.extended_code & 0xff))
            }
            StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(_)) => true,
            _ => false,
        }
    }
}

/// The primary result code of an SQLite error; `None` for another database's.
fn sqlite_code(e: &dyn sqlx::error::DatabaseError) -> Option<i32> {
    e.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    e.code()?.parse::<i32>().ok().map(|c| c & 0xff)
}

/// SQLite's primary result codes for "cannot write now": BUSY, LOCKED, READONLY, IOERR, FULL,
/// CANTOPEN.
const SQLITE_UNAVAILABLE: [i32; 6] = [5, 6, 8, 10, 13, 14];
/// SQLite's primary result codes for refused data: TOOBIG, CONSTRAINT, MISMATCH.
const SQLITE_DATA: [i32; 3] = [18, 19, 20];

pub type StoreResult<T> = Result<T, StoreError>;
