//! Sessions brought in whole (`POST /sessions/import`): a session's row, its events with their
//! own numbers and times, and its state, written in one transaction
//! ([`SessionImports`](super::SessionImports)), and
//! [`impl_imports!`], which implements it for each backend. How the events are inserted differs
//! by dialect (PostgreSQL's escapes of U+0000, SQLite's integer times) and is each backend's
//! `insert_imported`.

/// Rows per multi-row insert of imported events (five parameters each: far below both
/// backends' limits).
pub(crate) const IMPORT_CHUNK: usize = 1000;

/// The session's counter, set to its last imported event.
pub(crate) const SET_SEQ: &str = "INSERT INTO session_seqs (session_id, last_seq) VALUES ($1, $2) \
     ON CONFLICT (session_id) DO UPDATE SET last_seq = excluded.last_seq";

/// `impl_imports!(Backend { writes, begin_write, bind_session, lock_session, insert, update })`
/// implements [`SessionImports`] for `Backend`, from the parameters of the same names of
/// [`impl_store!`](crate::store::common), which invokes it with its statements that insert and
/// update a session's row; the events go through the backend's own
/// `insert_imported(tx, session_id, events)`.
macro_rules! impl_imports {
    (
        $backend:ty {
            writes: $writes:ident,
            begin_write: $begin:ident($($begin_arg:expr)?),
            bind_session: $bind_session:path,
            lock_session: $lock_session:path $(,)?
        }
    ) => {
        #[async_trait::async_trait]
        impl $crate::store::contract::SessionImports for $backend {
            async fn import_session(
                &self,
                record: &$crate::store::records::SessionRecord,
                events: &[$crate::store::event::StoredEvent],
                state: Option<(i64, &serde_json::Value)>,
                adopt: bool,
            ) -> $crate::store::error::StoreResult<bool> {
                let id = record.session_id.as_str();
                let mut tx = self.$writes.$begin($($begin_arg)?).await?;
                let row = sqlx::query($lock_session)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
                let statement = match row.as_ref().map($crate::store::rows::session_from).transpose()? {
                    None => $crate::store::common::INSERT_SESSION,
                    Some(found) if adopt
                        && found.origin == $crate::store::records::Origin::Upstream
                        && found.deleted_at.is_none() =>
                    {
                        let last: i64 = sqlx::query_scalar($crate::store::event_log::LAST_EVENT_SEQ)
                            .bind(id)
                            .fetch_one(&mut *tx)
                            .await?;
                        if last > 0 {
                            return Ok(false);
                        }
                        $crate::store::common::UPDATE_SESSION
                    }
                    Some(_) => return Ok(false),
                };
                let written = $bind_session(sqlx::query(statement), record)
                    .execute(&mut *tx)
                    .await?;
                // A row made meanwhile (a list sync's), which the lock could not hold off.
                if written.rows_affected() != 1 {
                    return Ok(false);
                }
                for chunk in events.chunks($crate::store::imports::IMPORT_CHUNK) {
                    self.insert_imported(&mut tx, id, chunk).await?;
                }
                let last = events.last().map(|e| e.seq).max(state.map(|(seq, _)| seq));
                if let Some(last) = last {
                    sqlx::query($crate::store::imports::SET_SEQ)
                        .bind(id)
                        .bind(last)
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some((seq, state)) = state {
                    sqlx::query($crate::store::event_log::PUT_SESSION_STATE)
                        .bind(id)
                        .bind(seq)
                        .bind(state.to_string())
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(true)
            }
        }
    };
}
