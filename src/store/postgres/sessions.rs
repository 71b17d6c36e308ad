//! The session cache: rows of `sessions`, their tombstones, and how the list finds the moves
//! recorded in `session_moves`.

use chrono::{DateTime, SubsecRound, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::types::Json;

use super::store::{PgStore, nul_safe, nul_safe_strings, text_in};
use crate::store::common::TOMBSTONE_LIVE;
use crate::store::error::StoreResult;
use crate::store::listing::FirstMoves;
use crate::store::records::{ListedSession, SessionRecord};

/// The row
/// [`SessionRecords::update_session`](crate::store::contract::SessionRecords::update_session)
/// changes: `FOR UPDATE` holds it until commit, so concurrent updates of one session queue up
/// instead of overwriting each other's changes.
pub(super) const LOCK_SESSION: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1 FOR UPDATE"
);

/// Session rows from one array per column, in [`session_columns!`] order: any number of rows
/// in one statement of seventeen parameters.
const PUT_SESSIONS: &str = concat!(
    "INSERT INTO sessions (",
    session_columns!(),
    ") SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], \
     $6::timestamptz[], $7::timestamptz[], $8::jsonb[], $9::boolean[], $10::text[], \
     $11::timestamptz[], $12::timestamptz[], $13::bigint[], $14::text[], $15::text[], \
     $16::text[], $17::text[])",
    replace_unless_tombstoned!("GREATEST")
);

/// The page as two arrays: ids (`$1`) and digests (`$2`).
const SESSIONS_TO_SYNC: &str =
    sessions_to_sync!("unnest($1::text[], $2::bigint[]) AS l(id, digest)");

/// [`SESSIONS_TO_SYNC`] of the page `listed`.
pub(super) fn to_sync_query(listed: &[ListedSession]) -> Query<'_, Postgres, PgArguments> {
    let ids: Vec<&str> = listed.iter().map(|l| l.session_id.as_str()).collect();
    let digests: Vec<i64> = listed.iter().map(|l| l.digest).collect();
    sqlx::query(SESSIONS_TO_SYNC).bind(ids).bind(digests)
}

/// A bare tombstone for an id the cache does not know. Such an id can only have come from the
/// agent, hence `origin = 'upstream'`.
const INSERT_TOMBSTONE: &str = "INSERT INTO sessions \
     (session_id, tenant, cwd, additional_directories, title, updated_at, created_at, meta, \
      archived, origin, deleted_at, synced_at) \
     VALUES ($1, $2, '', '[]'::jsonb, NULL, $3, $3, NULL, FALSE, 'upstream', $3, NULL) \
     ON CONFLICT (session_id) DO NOTHING";

/// Each session's first move since the snapshot: the earliest row per session (`DISTINCT ON`).
pub(super) const FIRST_MOVES: FirstMoves = FirstMoves {
    head: "SELECT DISTINCT ON (session_id) session_id, from_updated_at \
           FROM session_moves WHERE id > ",
    tail: " ORDER BY session_id, id",
};

/// Binds the seventeen session columns ($1…$17) in [`session_columns!`] order.
pub(super) fn bind_session<'q>(
    query: Query<'q, Postgres, PgArguments>,
    record: &'q SessionRecord,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(&record.session_id)
        .bind(&record.tenant)
        .bind(&record.cwd)
        .bind(nul_safe_strings(&record.additional_directories))
        .bind(record.title.as_deref().map(text_in))
        .bind(record.updated_at.trunc_subsecs(6))
        .bind(record.created_at.trunc_subsecs(6))
        .bind(record.meta.as_ref().map(|m| Json(nul_safe(m))))
        .bind(record.archived)
        .bind(record.origin.as_str())
        .bind(record.deleted_at.map(|at| at.trunc_subsecs(6)))
        .bind(record.synced_at.map(|at| at.trunc_subsecs(6)))
        .bind(record.listed)
        .bind(&record.agent)
        .bind(&record.people.owner)
        .bind(record.people.owner_name.as_deref().map(text_in))
        .bind(&record.people.who_answers)
}

impl PgStore {
    pub(super) async fn put_sessions(&self, records: &[SessionRecord]) -> StoreResult<Vec<String>> {
        fn column<'r, T>(
            records: &'r [SessionRecord],
            f: impl Fn(&'r SessionRecord) -> T,
        ) -> Vec<T> {
            records.iter().map(f).collect()
        }
        let time = |at: DateTime<Utc>| at.trunc_subsecs(6);
        Ok(sqlx::query_scalar(PUT_SESSIONS)
            .bind(column(records, |r| r.session_id.as_str()))
            .bind(column(records, |r| r.tenant.as_str()))
            .bind(column(records, |r| r.cwd.as_str()))
            .bind(column(records, |r| {
                nul_safe_strings(&r.additional_directories)
            }))
            .bind(column(records, |r| r.title.as_deref().map(text_in)))
            .bind(column(records, |r| time(r.updated_at)))
            .bind(column(records, |r| time(r.created_at)))
            .bind(column(records, |r| {
                r.meta.as_ref().map(|m| Json(nul_safe(m)))
            }))
            .bind(column(records, |r| r.archived))
            .bind(column(records, |r| r.origin.as_str()))
            .bind(column(records, |r| r.deleted_at.map(time)))
            .bind(column(records, |r| r.synced_at.map(time)))
            .bind(column(records, |r| r.listed))
            .bind(column(records, |r| r.agent.as_str()))
            .bind(column(records, |r| r.people.owner.as_deref()))
            .bind(column(records, |r| {
                r.people.owner_name.as_deref().map(text_in)
            }))
            .bind(column(records, |r| r.people.who_answers.as_deref()))
            .fetch_all(&self.pool)
            .await?)
    }

    /// [`SessionRecords::tombstone_session`](crate::store::contract::SessionRecords::tombstone_session),
    /// `at` to the microsecond.
    pub(super) async fn tombstone_session(
        &self,
        session_id: &str,
        tenant: &str,
        at: DateTime<Utc>,
    ) -> StoreResult<bool> {
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
}

impl PgStore {
    /// The events of an imported session (see
    /// [`SessionImports`](crate::store::imports::SessionImports)), in `tx`, with the escapes of
    /// U+0000 every append makes.
    pub(super) async fn insert_imported(
        &self,
        tx: &mut sqlx::PgConnection,
        session_id: &str,
        events: &[crate::store::event::StoredEvent],
    ) -> StoreResult<()> {
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        let kinds: Vec<_> = events.iter().map(|e| text_in(&e.kind)).collect();
        let kinds: Vec<&str> = kinds.iter().map(AsRef::as_ref).collect();
        let payloads: Vec<_> = events
            .iter()
            .map(|e| super::store::nul_safe_text(e.payload.as_str()))
            .collect();
        let payloads: Vec<&str> = payloads.iter().map(AsRef::as_ref).collect();
        let times: Vec<DateTime<Utc>> = events
            .iter()
            .map(|e| e.created_at.trunc_subsecs(6))
            .collect();
        sqlx::query(INSERT_IMPORTED)
            .bind(session_id)
            .bind(&seqs)
            .bind(&kinds)
            .bind(&payloads)
            .bind(&times)
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// Imported events, one array per column after the session id.
const INSERT_IMPORTED: &str = "INSERT INTO session_events \
     (session_id, seq, kind, payload, created_at) \
     SELECT $1, e.seq, e.kind, e.payload::json, e.at \
     FROM unnest($2::bigint[], $3::text[], $4::text[], $5::timestamptz[]) AS e(seq, kind, payload, at)";
