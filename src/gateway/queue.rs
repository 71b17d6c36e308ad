//! Each session's prompt queue (`Prefer: queue`, `Prefer: interrupt`): prompts stored in the
//! database until their turn has ended, run one at a time in order where the session is served.
//! A prompt runs when it is queued and the session is free, when a turn of the session ends
//! (`parts::kicks`, from `turns`), and when the sweep (every [`SWEEP`]) finds it waiting, which is
//! how a queue survives a restart and how a replica's queued prompts go on when it dies.
//!
//! Never lost, never run twice: one replica at a time starts a session's next prompt (the
//! store's `start_next_prompt`), its `turn_started` (naming its `queueId`) is stored before the
//! prompt goes to the agent, and its row goes once the turn has ended. A prompt started by a
//! replica that is gone is either finished (its `turn_started` is in the log) or put back.

use std::sync::Arc;
use std::time::Duration;

use super::caller::{Author, Caller};
use super::clock::now;
use super::error::Error;
use super::event::{GatewayEvent, PromptQueued, PromptWithdrawn};
use super::input::{Prompt, SessionId};
use super::output::QueuedView;
use super::parts::kicks::Kicks;
use super::parts::use_case;
use super::turns::Turns;
use crate::store::{EventKind, PromptQueue, QueuedPrompt};

/// How often every queue is looked at.
const SWEEP: Duration = Duration::from_secs(1);
/// Log events read at a time, looking back for a queued prompt's turn.
const PAGE: i64 = 1000;

use_case! {
    /// The use case of queued prompts, with the parts it needs.
    pub struct Queue {
        parts: [placement, records, log, tasks, stop],
        turns: Turns,
        store: Arc<dyn PromptQueue>,
        kicks: Arc<Kicks>,
        /// Waiting prompts a session may have (`--max-queued-prompts`).
        max: usize,
    }
}

impl Queue {
    /// `POST /sessions/{id}/prompt` with `Prefer: queue` (or `interrupt`: ahead of the queue,
    /// and the running turn cancelled). The prompt runs at once when the session is free.
    pub async fn enqueue(
        &self,
        caller: &Caller,
        id: &SessionId,
        prompt: Prompt,
        interrupt: bool,
    ) -> Result<QueuedView, Error> {
        let (record, _) = self.records.get_to_use(caller, id).await?;
        if record.archived {
            return Err(Error::Conflict(
                "the session is archived: unarchive it first".into(),
            ));
        }
        let blocks = prompt.into_blocks();
        let author = caller.author();
        let queued = QueuedPrompt {
            queue_id: format!("q_{}", uuid::Uuid::new_v4().simple()),
            session_id: id.as_str().to_owned(),
            prompt: serde_json::to_string(&blocks).expect("blocks serialise"),
            author: serde_json::to_string(&author).expect("an author serialises"),
            interrupt,
            created_at: now().timestamp_micros(),
            started_by: None,
        };
        let position =
            (self.store.enqueue_prompt(&queued, self.max as i64).await?).ok_or_else(|| {
                Error::QueueFull(format!(
                    "{} prompts of this session wait already (--max-queued-prompts)",
                    self.max
                ))
            })?;
        let view = QueuedView::of(&queued, position);
        let event = GatewayEvent::PromptQueued(PromptQueued {
            session_id: id.as_str().to_owned(),
            queued: view.clone(),
        });
        self.log.append(id.as_str(), event).await;
        if interrupt {
            self.turns.cancel(caller, id).await?;
        }
        self.kicks.mark(id.as_str(), true);
        self.kicks.kick(id.as_str());
        Ok(view)
    }

    /// `GET /sessions/{id}/queue`: the started prompt, if any, then the waiting ones in order.
    pub async fn list(&self, caller: &Caller, id: &SessionId) -> Result<Vec<QueuedView>, Error> {
        self.records.get(caller, id).await?;
        let queued = self.store.queued_prompts(id.as_str()).await?;
        let mut position = 0;
        Ok(queued
            .iter()
            .map(|q| {
                position += i64::from(q.started_by.is_none());
                QueuedView::of(q, if q.started_by.is_some() { 0 } else { position })
            })
            .collect())
    }

    /// `DELETE /sessions/{id}/queue/{queueId}`: a prompt that has not started, by its author,
    /// the session's owner or an admin.
    pub async fn withdraw(
        &self,
        caller: &Caller,
        id: &SessionId,
        queue_id: &str,
    ) -> Result<(), Error> {
        let record = self.records.get(caller, id).await?;
        let queued = self.store.queued_prompts(id.as_str()).await?;
        let Some(q) = queued.iter().find(|q| q.queue_id == queue_id) else {
            return Err(Error::NotFound(format!(
                "no queued prompt {queue_id} on this session"
            )));
        };
        let author: Author = serde_json::from_str(&q.author).unwrap_or(caller.author());
        let owner = super::caller::owner_of(&record);
        if !caller.admin && !caller.is(&author) && !caller.is(&owner) {
            return Err(Error::Forbidden(
                "only the prompt's author, the session's owner or an admin may withdraw it".into(),
            ));
        }
        if !(self
            .store
            .remove_prompt(id.as_str(), queue_id, true)
            .await?)
        {
            return Err(Error::Conflict(
                "its turn has started: cancel the turn instead".into(),
            ));
        }
        let event = GatewayEvent::PromptWithdrawn(PromptWithdrawn {
            session_id: id.as_str().to_owned(),
            queue_id: queue_id.to_owned(),
            by: Some(caller.author()),
            reason: "withdrawn".into(),
        });
        self.log.append(id.as_str(), event).await;
        Ok(())
    }

    /// Runs queued prompts until shutdown: the sessions kicked, and every [`SWEEP`] all of them.
    pub(in crate::gateway) async fn run_forever(self) {
        let Some(mut kicked) = self.kicks.take_receiver() else {
            return;
        };
        let mut sweep = tokio::time::interval(SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                Some(id) = kicked.recv() => {
                    let this = self.clone();
                    self.tasks.spawn(async move { this.run_next(&id).await });
                }
                _ = sweep.tick() => self.sweep().await,
            }
        }
    }

    /// Every queued session: those waiting run; a prompt a gone replica started is finished
    /// or put back.
    async fn sweep(&self) {
        let sessions = match self.store.queued_sessions().await {
            Ok(sessions) => sessions,
            Err(e) => {
                tracing::warn!(error = %e, "the prompt queues cannot be read now");
                return;
            }
        };
        let cluster = self.placement.cluster();
        let me = crate::cluster::replica_id();
        for (id, started_by) in sessions {
            self.kicks.mark(&id, true);
            match started_by {
                None => self.run_next(&id).await,
                // Its turn ended here but the row stayed (the store failed then).
                Some(replica) if replica == me => {
                    if self.placement.live().turn_done(&id).is_none() {
                        self.recover(&id, false).await;
                    }
                }
                Some(replica) if matches!(cluster.gone(&replica).await, Ok(true)) => {
                    self.recover(&id, true).await;
                    self.run_next(&id).await;
                }
                Some(_) => {}
            }
        }
    }

    /// The session's started prompt: removed when its turn started (it is in the log), else
    /// put back in its place when `put_back` (its replica is gone).
    async fn recover(&self, id: &str, put_back: bool) {
        let queued = self.store.queued_prompts(id).await.unwrap_or_default();
        let Some(started) = queued.iter().find(|q| q.started_by.is_some()) else {
            return;
        };
        let Ok(ran) = self.logged(id, started).await else {
            return;
        };
        let queue_id = &started.queue_id;
        let done = match (ran, put_back) {
            (true, _) => self
                .store
                .remove_prompt(id, queue_id, false)
                .await
                .map(drop),
            (false, true) => self.store.unstart_prompt(queue_id).await,
            (false, false) => return,
        };
        if let Err(e) = done {
            tracing::warn!(session = id, error = %e, "a queued prompt of a gone replica was not recovered");
        }
    }

    /// Whether the log holds the `turn_started` of queued prompt `q`: read back from its end a
    /// page at a time, down to the events older than `q`.
    async fn logged(&self, id: &str, q: &QueuedPrompt) -> crate::store::StoreResult<bool> {
        let events = self.log.events();
        let mut upto = events.last_event_seq(id).await?;
        while upto > 0 {
            let from = (upto - PAGE).max(0);
            let page = events.read_events(id, from, PAGE).await?;
            let of_q = |e: &&crate::store::StoredEvent| {
                e.kind == EventKind::TurnStarted.name()
                    && e.payload.to_value()["queueId"] == q.queue_id.as_str()
            };
            if page.iter().any(|e| of_q(&e)) {
                return Ok(true);
            }
            let older = page
                .first()
                .map(|e| e.created_at.timestamp_micros() < q.created_at);
            if older != Some(false) {
                return Ok(false);
            }
            upto = from;
        }
        Ok(false)
    }

    /// Starts the session's next queued prompt, if it has one, none is started and the session
    /// is served here (or nowhere).
    async fn run_next(&self, id: &str) {
        // Stopping: the next replica (or this one, restarted) runs it.
        if self.stop.is_cancelled() || self.placement.live_elsewhere(id) {
            return;
        }
        // A turn runs here: its end kicks the queue again.
        if self.placement.live().turn_done(id).is_some() {
            return;
        }
        let replica = crate::cluster::replica_id();
        let next = match self.store.start_next_prompt(id, replica).await {
            Ok(Some(next)) => next,
            Ok(None) => {
                let left = self.store.queued_prompts(id).await;
                if left.is_ok_and(|q| q.is_empty()) {
                    self.kicks.mark(id, false);
                }
                return;
            }
            Err(e) => {
                tracing::warn!(session = id, error = %e, "a queued prompt cannot be started now");
                return;
            }
        };
        let view = QueuedView::of(&next, 0);
        // Run as its author, whose right to prompt the session was checked when it was queued.
        let caller = Caller {
            tenant: view.author.tenant.clone(),
            admin: true,
            user: view.author.user.clone().map(|id| super::caller::User {
                id,
                name: view.author.name.clone(),
            }),
        };
        let session = SessionId::known(id.to_owned());
        let queued = Some(next.queue_id.clone());
        match (self.turns)
            .prompt_blocks(&caller, &session, view.prompt, false, queued)
            .await
        {
            Ok(_) => {}
            // Another turn got in first: this one runs after it.
            Err(Error::Conflict(_)) | Err(Error::HeldElsewhere(_)) => {
                let _ = self.store.unstart_prompt(&next.queue_id).await;
            }
            Err(e) => {
                tracing::warn!(session = id, queue = next.queue_id, error = %e, "a queued prompt could not run; withdrawn");
                let _ = self.store.remove_prompt(id, &next.queue_id, false).await;
                let event = GatewayEvent::PromptWithdrawn(PromptWithdrawn {
                    session_id: id.to_owned(),
                    queue_id: next.queue_id,
                    by: None,
                    reason: e.to_string(),
                });
                self.log.append(id, event).await;
                self.kicks.kick(id);
            }
        }
    }
}
