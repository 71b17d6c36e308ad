//! A column's value on its way between two stores: read from a row of either backend into a
//! [`Cell`] (SQLite's own forms: times as unix microseconds, booleans as 0 and 1, JSON as its
//! text, PostgreSQL's escapes of U+0000 undone), bound into the other's insert, and hashed into
//! a table's digest in one canonical form (JSON with its keys sorted and its integral numbers
//! as integers), so that a table read on either backend hashes alike.

use chrono::DateTime;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, TypeInfo, ValueRef};

use crate::store::error::{StoreError, StoreResult};
use crate::store::postgres::store::{NUL_SAFE, nul_safe_text, text_in, text_out};

/// What a column holds, as PostgreSQL declares it (the SQLite side stores each in its own
/// form; between two SQLite stores every column is [`Kind::Plain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Copied as it is read (between two SQLite stores).
    Plain,
    /// PostgreSQL `bigint`.
    Int8,
    /// PostgreSQL `integer`.
    Int4,
    Real,
    Text,
    Bytes,
    Bool,
    Time,
    /// `json` or `jsonb` (`jsonb`: `true`).
    Json(bool),
    /// Text PostgreSQL keeps with U+0000 escaped (a title, an event's kind).
    Escaped,
}

/// One value in SQLite's forms.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Bytes(Vec<u8>),
}

/// Row `i`'s cells of an SQLite row, as stored.
pub(super) fn from_sqlite(row: &SqliteRow, columns: usize) -> StoreResult<Vec<Cell>> {
    (0..columns)
        .map(|i| {
            let raw = row.try_get_raw(i)?;
            if raw.is_null() {
                return Ok(Cell::Null);
            }
            Ok(match raw.type_info().name() {
                "INTEGER" => Cell::Int(row.try_get(i)?),
                "REAL" => Cell::Real(row.try_get(i)?),
                "BLOB" => Cell::Bytes(row.try_get(i)?),
                _ => Cell::Text(row.try_get(i)?),
            })
        })
        .collect()
}

/// A PostgreSQL row's cells (its JSON columns selected as text), in SQLite's forms.
pub(super) fn from_postgres(row: &PgRow, kinds: &[Kind]) -> StoreResult<Vec<Cell>> {
    let cell = |i: usize, kind: Kind| -> StoreResult<Cell> {
        if row.try_get_raw(i)?.is_null() {
            return Ok(Cell::Null);
        }
        Ok(match kind {
            Kind::Int4 => Cell::Int(row.try_get::<i32, _>(i)?.into()),
            Kind::Bool => Cell::Int(row.try_get::<bool, _>(i)?.into()),
            Kind::Time => {
                let at: DateTime<chrono::Utc> = row.try_get(i)?;
                Cell::Int(at.timestamp_micros())
            }
            Kind::Json(_) => Cell::Text(unwrapped(row.try_get(i)?)),
            Kind::Escaped => Cell::Text(text_out(row.try_get(i)?)),
            Kind::Int8 => Cell::Int(row.try_get(i)?),
            Kind::Real => Cell::Real(row.try_get(i)?),
            Kind::Bytes => Cell::Bytes(row.try_get(i)?),
            Kind::Text | Kind::Plain => Cell::Text(row.try_get(i)?),
        })
    };
    (0..kinds.len()).map(|i| cell(i, kinds[i])).collect()
}

/// A JSON value's text, out of the wrapper PostgreSQL keeps a value holding U+0000 in.
fn unwrapped(text: String) -> String {
    if !text.contains(NUL_SAFE) {
        return text;
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(o)) if o.len() == 1 => match o.get(NUL_SAFE) {
            Some(Value::String(inner)) => inner.clone(),
            _ => text,
        },
        _ => text,
    }
}

/// Binds `cell` of a column of `kind` into a PostgreSQL insert.
pub(super) fn bind_postgres(
    values: &mut sqlx::query_builder::Separated<'_, '_, sqlx::Postgres, &str>,
    cell: Cell,
    kind: Kind,
) -> StoreResult<()> {
    let cast = match kind {
        Kind::Json(true) => "::jsonb",
        Kind::Json(false) => "::json",
        _ => "",
    };
    match (cell, kind) {
        (Cell::Null, Kind::Bool) => values.push_bind(None::<bool>),
        (Cell::Null, Kind::Time) => values.push_bind(None::<DateTime<chrono::Utc>>),
        (Cell::Null, Kind::Int4) => values.push_bind(None::<i32>),
        (Cell::Null, Kind::Int8) => values.push_bind(None::<i64>),
        (Cell::Null, Kind::Real) => values.push_bind(None::<f64>),
        (Cell::Null, Kind::Bytes) => values.push_bind(None::<Vec<u8>>),
        (Cell::Null, _) => values.push_bind(None::<String>),
        (Cell::Int(n), Kind::Int4) => {
            let n = i32::try_from(n).map_err(|_| {
                StoreError::Corrupt(format!("{n} does not fit a PostgreSQL integer"))
            })?;
            values.push_bind(n)
        }
        (Cell::Int(n), Kind::Bool) => values.push_bind(n != 0),
        (Cell::Int(n), Kind::Time) => {
            let at = DateTime::from_timestamp_micros(n)
                .ok_or_else(|| StoreError::Corrupt(format!("timestamp {n} out of range")))?;
            values.push_bind(at)
        }
        (Cell::Int(n), _) => values.push_bind(n),
        (Cell::Real(x), _) => values.push_bind(x),
        (Cell::Bytes(b), _) => values.push_bind(b),
        (Cell::Text(t), Kind::Json(_)) => values.push_bind(nul_safe_text(&t).into_owned()),
        (Cell::Text(t), Kind::Escaped) => values.push_bind(text_in(&t).into_owned()),
        (Cell::Text(t), _) => values.push_bind(t),
    }
    .push_unseparated(cast);
    Ok(())
}

/// Binds `cell` into an SQLite insert, as it is.
pub(super) fn bind_sqlite(
    values: &mut sqlx::query_builder::Separated<'_, '_, sqlx::Sqlite, &str>,
    cell: Cell,
) {
    match cell {
        Cell::Null => values.push_bind(None::<String>),
        Cell::Int(n) => values.push_bind(n),
        Cell::Real(x) => values.push_bind(x),
        Cell::Text(t) => values.push_bind(t),
        Cell::Bytes(b) => values.push_bind(b),
    };
}

/// An order-free digest of a table's rows: the wrapping sum of each row's hash, so that two
/// stores that list a table in different orders agree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct RowsDigest {
    pub(super) rows: u64,
    pub(super) sum: u128,
}

impl RowsDigest {
    pub(super) fn add(&mut self, row: &[Cell], kinds: &[Kind]) {
        let mut hash = Sha256::new();
        for (cell, kind) in row.iter().zip(kinds) {
            match cell {
                Cell::Null => hash.update(b"n"),
                Cell::Int(n) => hash.update(format!("i{n}")),
                Cell::Real(x) => hash.update(format!("r{x:?}")),
                Cell::Bytes(b) => {
                    hash.update(format!("b{}:", b.len()));
                    hash.update(b);
                }
                Cell::Text(t) => {
                    let text = match kind {
                        Kind::Json(_) => canonical_json(t),
                        _ => t.clone(),
                    };
                    hash.update(format!("t{}:", text.len()));
                    hash.update(text);
                }
            }
        }
        let hash = hash.finalize();
        let bytes: [u8; 16] = hash[..16].try_into().expect("16 bytes of 32");
        self.sum = self.sum.wrapping_add(u128::from_le_bytes(bytes));
        self.rows += 1;
    }
}

/// `text`'s JSON with object keys sorted and integral numbers written as integers (how
/// `jsonb` keeps a value does not change it); the text itself when it is not JSON.
fn canonical_json(text: &str) -> String {
    fn canonical(value: Value) -> Value {
        match value {
            Value::Object(o) => {
                let mut sorted: Vec<(String, Value)> = o.into_iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(sorted.into_iter().map(|(k, v)| (k, canonical(v))).collect())
            }
            Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
            Value::Number(n) if n.as_i64().is_none() && n.as_u64().is_none() => match n.as_f64() {
                Some(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Value::from(x as i64),
                _ => Value::Number(n),
            },
            other => other,
        }
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value) => canonical(value).to_string(),
        Err(_) => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_hashes_alike_however_a_backend_keeps_it() {
        let kinds = [Kind::Json(true)];
        let (mut a, mut b) = (RowsDigest::default(), RowsDigest::default());
        a.add(
            &[Cell::Text(r#"{"b": 1e2, "a": [1.0, "x"]}"#.into())],
            &kinds,
        );
        b.add(&[Cell::Text(r#"{"a":[1,"x"],"b":100}"#.into())], &kinds);
        assert_eq!(a, b);
        b.add(&[Cell::Text("{}".into())], &kinds);
        assert_ne!(a, b);
    }

    #[test]
    fn a_wrapped_value_is_unwrapped_to_its_own_text() {
        let inner = r#"{"t":"a\u0000b"}"#;
        let wrapped = serde_json::json!({ NUL_SAFE: inner }).to_string();
        assert_eq!(unwrapped(wrapped), inner);
        assert_eq!(unwrapped("{\"x\":1}".into()), "{\"x\":1}");
    }
}
