//! The session list's pages, for both backends: the statement that reads a page, written once
//! over the backend's `QueryBuilder` (only how a backend finds each session's first move since a
//! snapshot is its own: [`FirstMoves`]), and the ordering of the rows it returns into a page.

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, QueryBuilder, Type};

use super::error::StoreResult;
use super::records::{ListCursor, ListQuery, SessionList, SessionRecord};
use super::rows::{Columns, session_from};

/// How a backend selects, as rows `(session_id, from_updated_at)`, each session's first
/// recorded move after a snapshot: `head`, the snapshot (bound), `tail`.
pub(crate) struct FirstMoves {
    pub head: &'static str,
    pub tail: &'static str,
}

/// Pushes onto the empty `qb` the statement that reads the rows of `query`'s page, at most one
/// more than its limit. On the first page they come with the newest move (`snapshot`), read by
/// the same statement (one snapshot). On a later page, `at` is the cursor's `updated_at` as the
/// backend binds a timestamp, and the one statement, so that both parts see the same database,
/// reads the rows that have not moved since the snapshot, at their current position, and those
/// that moved since, at the position they had then (`list_key`).
pub(crate) fn push_page_query<'a, DB, K>(
    qb: &mut QueryBuilder<'a, DB>,
    query: &ListQuery,
    later: Option<(&ListCursor, K)>,
    moves: &FirstMoves,
) where
    DB: Database,
    K: Encode<'a, DB> + Type<DB> + Clone + 'a,
    bool: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    // `WHERE` over `sessions s`: live rows of the query's archive state, tenant, cwd and agent.
    let push_filters = |qb: &mut QueryBuilder<'a, DB>| {
        qb.push(" WHERE s.deleted_at IS NULL AND s.archived = ")
            .push_bind(query.archived.unwrap_or(false));
        if let Some(tenant) = &query.tenant {
            qb.push(" AND s.tenant = ").push_bind(tenant.clone());
        }
        if let Some(owner) = &query.owner {
            qb.push(" AND s.owner = ").push_bind(owner.clone());
        }
        if let Some(cwd) = &query.cwd {
            qb.push(" AND s.cwd = ").push_bind(cwd.clone());
        }
        if let Some(agent) = &query.agent {
            qb.push(" AND s.agent = ").push_bind(agent.clone());
        }
    };
    let limit = query.limit.max(1) + 1;
    let Some((after, at)) = later else {
        qb.push(concat!(
            "SELECT ",
            session_columns!(),
            ", (SELECT COALESCE(MAX(id), 0) FROM session_moves) AS snapshot FROM sessions s"
        ));
        push_filters(qb);
        qb.push(" ORDER BY updated_at DESC, session_id DESC LIMIT ")
            .push_bind(limit);
        return;
    };
    qb.push(concat!(
        "SELECT * FROM (SELECT ",
        session_columns!(),
        ", s.updated_at AS list_key FROM sessions s"
    ));
    push_filters(qb);
    qb.push(" AND (updated_at, session_id) < (")
        .push_bind(at.clone())
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
            ", m.from_updated_at AS list_key FROM ("
        ))
        .push(moves.head)
        .push_bind(after.snapshot)
        .push(moves.tail)
        .push(") m JOIN sessions s USING (session_id)");
    push_filters(qb);
    qb.push(" AND (m.from_updated_at, s.session_id) < (")
        .push_bind(at)
        .push(", ")
        .push_bind(after.session_id.clone())
        .push(") ORDER BY m.from_updated_at DESC, s.session_id DESC LIMIT ")
        .push_bind(limit)
        .push(") AS moved");
}

/// The page of `query` from the rows its [`push_page_query`] statement read.
pub(crate) fn page_of<R: Columns>(query: &ListQuery, rows: &[R]) -> StoreResult<SessionList> {
    let listed = |row: &R| -> StoreResult<ListedRow> {
        let record = session_from(row)?;
        let key = match query.after {
            // Not moved: its position is its `updated_at`.
            None => record.updated_at,
            Some(_) => row.time("list_key")?,
        };
        Ok(ListedRow { record, key })
    };
    let snapshot = match (&query.after, rows.first()) {
        (Some(after), _) => after.snapshot,
        (None, Some(row)) => row.get("snapshot")?,
        (None, None) => 0,
    };
    let rows = rows.iter().map(listed).collect::<StoreResult<_>>()?;
    Ok(merge_page(query, snapshot, rows))
}

/// A listed row and its position: `updated_at` as it was when the listing started.
struct ListedRow {
    record: SessionRecord,
    key: DateTime<Utc>,
}

/// Orders listed rows by position (a later page holds both rows that kept their position and
/// rows that moved since the snapshot, placed where they were) into a page of at most
/// `query.limit` rows.
fn merge_page(query: &ListQuery, snapshot: i64, mut rows: Vec<ListedRow>) -> SessionList {
    rows.sort_by(|a, b| (b.key, &b.record.session_id).cmp(&(a.key, &a.record.session_id)));
    let limit = query.limit.max(1) as usize;
    let next = (rows.len() > limit).then(|| {
        let last = &rows[limit - 1];
        ListCursor {
            snapshot,
            updated_at: last.key,
            session_id: last.record.session_id.clone(),
        }
    });
    rows.truncate(limit);
    SessionList {
        sessions: rows.into_iter().map(|l| l.record).collect(),
        next,
    }
}
