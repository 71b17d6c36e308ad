//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order, each
//! append inserting its webhook deliveries.

use chrono::{SubsecRound, Utc};

use super::store::{BEGIN_IMMEDIATE, SqliteStore, micros, to_json};
use crate::store::error::StoreResult;
use crate::store::kind::EventKind;
use crate::store::records::{NewLifecycleEvent, StoredLifecycleEvent};

/// Lifecycle events per insert: five parameters each, within SQLite's 32,766.
const EVENTS_PER_INSERT: usize = 32_766 / 5;

/// The webhook deliveries of the events numbered from `?` on (those of this transaction: it
/// holds the write lock), but those of kind `?` (a session's deletion), which the session's own
/// log has too (see [`sqlite_insert_deliveries!`]).
const INSERT_DELIVERIES: &str = sqlite_insert_deliveries!(
    from: "lifecycle_events i",
    message_id: "'lifecycle:' || i.seq",
    tenant: "i.tenant",
    where: "i.seq >= ? AND i.kind <> ?",
);

/// `INSERT … VALUES` of `rows` lifecycle events. The parameters are anonymous (`?`): SQLite finds
/// a numbered one by its number in a list, which for thousands of them takes time.
fn insert_statement(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO lifecycle_events (session_id, tenant, kind, payload, created_at) VALUES ",
    );
    sql.push_str(&vec!["(?, ?, ?, ?, ?)"; rows].join(", "));
    sql.push_str(" RETURNING seq");
    sql
}

impl SqliteStore {
    pub(super) async fn append_lifecycle(
        &self,
        events: &[NewLifecycleEvent],
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        let created_at = Utc::now().trunc_subsecs(6);
        // On the single writer connection, numbers are handed out in commit order, so readers
        // polling `seq > after` never skip one. The inserts and their webhook deliveries go in
        // one transaction.
        let mut tx = self.writer.begin_with(BEGIN_IMMEDIATE).await?;
        let mut stored = Vec::with_capacity(events.len());
        for chunk in events.chunks(EVENTS_PER_INSERT) {
            let sql = insert_statement(chunk.len());
            let query = chunk.iter().fold(sqlx::query_scalar(&sql), |q, e| {
                q.bind(&e.session_id)
                    .bind(&e.tenant)
                    .bind(&e.kind)
                    .bind(to_json(&e.payload))
                    .bind(micros(created_at))
            });
            let seqs = query.fetch_all(&mut *tx).await?;
            stored.extend(NewLifecycleEvent::stored_all(chunk, seqs, created_at)?);
        }
        if let Some(first) = stored.first() {
            sqlx::query(INSERT_DELIVERIES)
                .bind(first.seq)
                .bind(EventKind::SessionDeleted.name())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(stored)
    }
}
