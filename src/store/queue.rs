//! Each session's queue of prompts waiting for their turn (`Prefer: queue`, `Prefer: interrupt`):
//! a row per prompt until its turn has ended or it is withdrawn, ordered by `rank` (an interrupt
//! ranks before every prompt of its session). A prompt is *started* by one replica at a time
//! (`started_by`), and a session has at most one started. Ranks are unique per session, so that
//! prompts queued at once on several connections each get a place of their own. Times are unix microseconds on both
//! backends, so that the SQL is the same; [`impl_queue!`] implements [`PromptQueue`] for each.

use async_trait::async_trait;

use super::error::StoreResult;
use super::rows::Columns;

/// A prompt in a session's queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedPrompt {
    pub queue_id: String,
    pub session_id: String,
    /// The ACP `ContentBlock[]`, as JSON text.
    pub prompt: String,
    /// Who queued it, as JSON text.
    pub author: String,
    /// Whether it runs ahead of the prompts already waiting.
    pub interrupt: bool,
    /// Unix microseconds.
    pub created_at: i64,
    /// The replica that started its turn, once one has.
    pub started_by: Option<String>,
}

/// The sessions' prompt queues.
#[async_trait]
pub trait PromptQueue: Send + Sync + 'static {
    /// Adds `prompt` (not started) to its session's queue, unless `max` of the session's prompts
    /// already wait: its position among those waiting (1: next), or `None` when full.
    async fn enqueue_prompt(&self, prompt: &QueuedPrompt, max: i64) -> StoreResult<Option<i64>>;

    /// The session's prompts: the started one first, then those waiting, in order.
    async fn queued_prompts(&self, session_id: &str) -> StoreResult<Vec<QueuedPrompt>>;

    /// Marks the session's next waiting prompt started by `replica` and returns it; `None`
    /// when none waits or one of the session's prompts is started already.
    async fn start_next_prompt(
        &self,
        session_id: &str,
        replica: &str,
    ) -> StoreResult<Option<QueuedPrompt>>;

    /// Puts a started prompt back among those waiting, in its place.
    async fn unstart_prompt(&self, queue_id: &str) -> StoreResult<()>;

    /// Removes a prompt of the session (only a waiting one when `waiting_only`); whether it was
    /// there.
    async fn remove_prompt(
        &self,
        session_id: &str,
        queue_id: &str,
        waiting_only: bool,
    ) -> StoreResult<bool>;

    /// Every session with queued prompts, with the replica that started one of them, if any.
    async fn queued_sessions(&self) -> StoreResult<Vec<(String, Option<String>)>>;
}

/// A row of `prompt_queue`.
pub(crate) fn queued_from(row: &impl Columns) -> StoreResult<QueuedPrompt> {
    Ok(QueuedPrompt {
        queue_id: row.get("queue_id")?,
        session_id: row.get("session_id")?,
        prompt: row.get("prompt")?,
        author: row.get("author")?,
        interrupt: row.get("interrupt")?,
        created_at: row.get("created_at")?,
        started_by: row.get("started_by")?,
    })
}

/// `$1`…`$6`: the prompt's columns but `started_by`; `$7` the bound on waiting prompts.
pub const ENQUEUE: &str = "INSERT INTO prompt_queue \
     (queue_id, session_id, prompt, author, interrupt, created_at, rank) \
     SELECT $1, $2, $3, $4, $5, $6, \
     CASE WHEN $5 THEN COALESCE(MIN(rank), 0) - 1 ELSE COALESCE(MAX(rank), 0) + 1 END \
     FROM prompt_queue WHERE session_id = $2 \
     HAVING COUNT(*) FILTER (WHERE started_by IS NULL) < $7";
/// The position of prompt `$2` among the waiting prompts of session `$1`.
pub const POSITION: &str = "SELECT COUNT(*) FROM prompt_queue WHERE session_id = $1 \
     AND started_by IS NULL \
     AND rank <= (SELECT rank FROM prompt_queue WHERE queue_id = $2)";
pub const LIST: &str = "SELECT queue_id, session_id, prompt, author, interrupt, created_at, \
     started_by FROM prompt_queue WHERE session_id = $1 \
     ORDER BY started_by IS NULL, rank, created_at";
pub const START_NEXT: &str = "UPDATE prompt_queue SET started_by = $2 \
     WHERE queue_id = (SELECT queue_id FROM prompt_queue WHERE session_id = $1 \
     AND started_by IS NULL ORDER BY rank, created_at LIMIT 1) \
     AND started_by IS NULL \
     AND NOT EXISTS (SELECT 1 FROM prompt_queue WHERE session_id = $1 AND started_by IS NOT NULL) \
     RETURNING queue_id, session_id, prompt, author, interrupt, created_at, started_by";
pub const UNSTART: &str = "UPDATE prompt_queue SET started_by = NULL WHERE queue_id = $1";
pub const REMOVE: &str = "DELETE FROM prompt_queue WHERE session_id = $1 AND queue_id = $2 \
     AND (started_by IS NULL OR NOT $3)";
pub const SESSIONS: &str = "SELECT session_id, MAX(started_by) AS started_by FROM prompt_queue \
     GROUP BY session_id";

/// `impl_queue!(Backend { reads, writes })` implements [`PromptQueue`] for `Backend`, from
/// the parameters of the same names of [`impl_store!`](crate::store::common), which invokes it.
macro_rules! impl_queue {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::queue::PromptQueue for $backend {
            async fn enqueue_prompt(
                &self,
                p: &$crate::store::queue::QueuedPrompt,
                max: i64,
            ) -> $crate::store::error::StoreResult<Option<i64>> {
                // Prompts queued at once may compute the same rank: all but one then meet
                // the unique index and are tried again, on the queue as it is now.
                let mut tries = 0;
                let added = loop {
                    let added = sqlx::query($crate::store::queue::ENQUEUE)
                        .bind(&p.queue_id)
                        .bind(&p.session_id)
                        .bind(&p.prompt)
                        .bind(&p.author)
                        .bind(p.interrupt)
                        .bind(p.created_at)
                        .bind(max)
                        .execute(&self.$writes)
                        .await;
                    match added {
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() && tries < 64 => {
                            tries += 1;
                        }
                        other => break other?,
                    }
                };
                if added.rows_affected() == 0 {
                    return Ok(None);
                }
                let position: i64 = sqlx::query_scalar($crate::store::queue::POSITION)
                    .bind(&p.session_id)
                    .bind(&p.queue_id)
                    .fetch_one(&self.$writes)
                    .await?;
                Ok(Some(position))
            }

            async fn queued_prompts(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::queue::QueuedPrompt>> {
                let rows = sqlx::query($crate::store::queue::LIST)
                    .bind(session_id)
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter().map($crate::store::queue::queued_from).collect()
            }

            async fn start_next_prompt(
                &self,
                session_id: &str,
                replica: &str,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::queue::QueuedPrompt>> {
                let row = sqlx::query($crate::store::queue::START_NEXT)
                    .bind(session_id)
                    .bind(replica)
                    .fetch_optional(&self.$writes)
                    .await?;
                row.as_ref()
                    .map($crate::store::queue::queued_from)
                    .transpose()
            }

            async fn unstart_prompt(
                &self,
                queue_id: &str,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::queue::UNSTART)
                    .bind(queue_id)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn remove_prompt(
                &self,
                session_id: &str,
                queue_id: &str,
                waiting_only: bool,
            ) -> $crate::store::error::StoreResult<bool> {
                let removed = sqlx::query($crate::store::queue::REMOVE)
                    .bind(session_id)
                    .bind(queue_id)
                    .bind(waiting_only)
                    .execute(&self.$writes)
                    .await?;
                Ok(removed.rows_affected() == 1)
            }

            async fn queued_sessions(
                &self,
            ) -> $crate::store::error::StoreResult<Vec<(String, Option<String>)>> {
                use sqlx::Row as _;
                let rows = sqlx::query($crate::store::queue::SESSIONS)
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter()
                    .map(|r| Ok((r.try_get("session_id")?, r.try_get("started_by")?)))
                    .collect()
            }
        }
    };
}
