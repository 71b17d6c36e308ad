//! Why a database cannot be used, said once for the person who named it: which URL, what is
//! wrong and what to do (`DatabaseUrl::unusable`, and [`refused_url`] and [`missing_folder`]
//! before anything connects). The store's own errors carry the driver's chain of
//! causes, which repeats itself and names no host; this reads the cause out of it.

use std::io::ErrorKind;
use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use super::error::StoreError;

/// What is wrong with the PostgreSQL database `url` that `e` says, and what to do.
pub(super) fn postgres(url: &str, e: &StoreError) -> String {
    let options = PgConnectOptions::from_str(url).ok();
    let host = options
        .as_ref()
        .map_or("?".into(), |o| o.get_host().to_owned());
    let port = options.as_ref().map_or(5432, PgConnectOptions::get_port);
    let db = options
        .as_ref()
        .and_then(|o| o.get_database().map(str::to_owned))
        .unwrap_or_else(|| "(the user's)".into());
    let server = format!("the PostgreSQL server at {host}:{port}");
    match e {
        StoreError::Db(sqlx::Error::Io(io)) => match io.kind() {
            ErrorKind::ConnectionRefused => format!(
                "cannot reach {server}: connection refused. Start it, or fix the host and port \
                 in the URL"
            ),
            ErrorKind::TimedOut => format!(
                "{server} did not answer in time. Check that the host is reachable and the \
                 port is PostgreSQL's"
            ),
            _ => format!("cannot reach {server}: {io}. Check the host and port in the URL"),
        },
        StoreError::Db(sqlx::Error::Database(d)) => match d.code().as_deref() {
            Some("3D000") => format!(
                "the database {db:?} does not exist on {server}. Create it (createdb -h {host} \
                 -p {port} {db}) or name one that exists"
            ),
            Some("28P01" | "28000") => format!(
                "{server} refused the login: {}. Check the user and password in the URL",
                d.message()
            ),
            Some("42501") => format!(
                "the user may not create the gateway's tables in {db:?}: {}. Grant it CREATE \
                 on the database, or name another user",
                d.message()
            ),
            _ => format!("{server} refused: {}", d.message()),
        },
        StoreError::Db(sqlx::Error::Tls(tls)) => {
            format!("no TLS connection to {server}: {tls}. Check `sslmode` in the URL")
        }
        other => common(other),
    }
}

/// What is wrong with the SQLite file `path` that `e` says, and what to do.
pub(super) fn sqlite(path: &impl std::fmt::Display, e: &StoreError) -> String {
    let code = match e {
        StoreError::Db(sqlx::Error::Database(d)) => d.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    match code.map(|c| c & 0xff) {
        Some(14) => format!(
            "cannot open the SQLite file {path}. Check that its folder exists and the gateway \
             may write there"
        ),
        Some(26) => format!("{path} is not an SQLite database. Name another file"),
        Some(8) => format!("the SQLite file {path} is read-only. Let the gateway write it"),
        _ => common(e),
    }
}

/// What both backends say alike: the migrations, and anything else once.
fn common(e: &StoreError) -> String {
    match e {
        StoreError::Migrate(m) => format!("cannot apply the gateway's migrations: {m}"),
        StoreError::Db(sqlx::Error::PoolTimedOut) => {
            "no connection within the pool's timeout. Check that the server is up and reachable"
                .into()
        }
        other => other.to_string(),
    }
}

/// Why `url` is not a database the gateway can use, before anything connects to it: a scheme
/// it does not speak, or an SQLite file in a folder that does not exist.
pub fn refused_url(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    let known = ["postgres", "postgresql", "sqlite"];
    let looks_like_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    (looks_like_scheme && !known.contains(&scheme.to_ascii_lowercase().as_str())).then(|| {
        format!(
            "{scheme}:// is not a database the gateway speaks. Name a PostgreSQL database \
             (postgres://HOST:PORT/DATABASE, the user and password before the host) or an SQLite file (sqlite:PATH, or a path)"
        )
    })
}

/// Why the SQLite file `path` cannot be made: its folder does not exist.
pub fn missing_folder(path: &std::path::Path) -> Option<String> {
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty())?;
    (!folder.is_dir()).then(|| {
        format!(
            "the folder {} of the SQLite file does not exist. Create it (mkdir -p {}) or name \
             a file in a folder that exists",
            folder.display(),
            folder.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_other_databases_are_refused_before_connecting() {
        let refused = refused_url("mysql://root@127.0.0.1/test").unwrap();
        assert!(
            refused.starts_with("mysql:// is not a database"),
            "{refused}"
        );
        for fine in [
            "postgres://u@h/db",
            "postgresql://h/db",
            "sqlite:///tmp/x.db",
            "sqlite:x.db",
            "/tmp/x.db",
            "x.db",
        ] {
            assert_eq!(refused_url(fine), None, "{fine}");
        }
        let missing = missing_folder(std::path::Path::new("/nonexistent/dir/x.db")).unwrap();
        assert!(missing.contains("/nonexistent/dir"), "{missing}");
        assert_eq!(missing_folder(std::path::Path::new("x.db")), None);
    }
}
