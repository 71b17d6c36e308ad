//! The lifecycle log (`GET /events`): one global sequence, numbered in commit order.

use chrono::{SubsecRound, Utc};

use super::{BEGIN_IMMEDIATE, SqliteStore, micros, to_json};
use crate::store::{NewLifecycleEvent, StoreResult, StoredLifecycleEvent};

/// Lifecycle events per insert: five parameters each, within SQLite's 32,766.
const EVENTS_PER_INSERT: usize = 32_766 / 5;

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
        // polling `seq > after` never skip one. More events than one insert takes go in one
        // transaction.
        let mut tx = match events.len() > EVENTS_PER_INSERT {
            true => Some(self.writer.begin_with(BEGIN_IMMEDIATE).await?),
            false => None,
        };
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
            let seqs = match &mut tx {
                Some(tx) => query.fetch_all(&mut **tx).await?,
                None => query.fetch_all(&self.writer).await?,
            };
            stored.extend(NewLifecycleEvent::stored_all(chunk, seqs, created_at)?);
        }
        if let Some(tx) = tx {
            tx.commit().await?;
        }
        Ok(stored)
    }
}
