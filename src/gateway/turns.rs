//! Prompt turns and their cancellation. A turn's `turn_started` and `turn_ended` are queued in
//! the log's order around the agent's updates; a turn always gets its `turn_ended`, even when its
//! client hangs up ([`FinishOnDrop`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::Value;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::caller::Caller;
use super::changes::Changes;
use super::error::Error;
use super::event::{GatewayEvent, TurnEnded, TurnStarted};
use super::input::{Prompt, SessionId};
use super::output::TurnResult;
use super::parts::kicks::Kicks;
use super::parts::live::Busy;
use super::parts::meter::EndedTurn;
use super::parts::use_case;
use crate::agent_rpc::caps::PromptCapabilities;
use crate::store::PromptQueue;
use std::sync::Arc;

use_case! {
    /// The use case of prompts and cancels, with the parts it needs (`tasks`: the turns
    /// themselves).
    pub struct Turns {
        parts: [placement, records, views, log, states, requests, counters, tasks, workspaces, meter],
        /// A checkpoint of the workspace after each turn that changed its files.
        changes: Changes,
        /// How long a cancelled turn may take to end before its member is restarted.
        cancel_grace: Duration,
        /// Bound on the agent's answer to a cancel.
        control_timeout: Duration,
        /// The prompt queues: a queued turn's row goes when it ends.
        queue: Arc<dyn PromptQueue>,
        /// Where an ended turn's session is kicked, to run its next queued prompt.
        kicks: Arc<Kicks>,
    }
}

impl Turns {
    /// `POST /sessions/{id}/prompt`. With `wait = false` the turn runs in the background and
    /// this returns once it has started.
    pub async fn prompt(
        &self,
        caller: &Caller,
        id: &SessionId,
        prompt: Prompt,
        wait: bool,
    ) -> Result<Option<TurnResult>, Error> {
        (self.prompt_blocks(caller, id, prompt.into_blocks(), wait, None)).await
    }

    /// [`Turns::prompt`] of content blocks, the queued prompt `queued` when it is one: then its
    /// `turn_started` is stored before the prompt goes out, and its row removed when it ends.
    pub(in crate::gateway) async fn prompt_blocks(
        &self,
        caller: &Caller,
        id: &SessionId,
        prompt: Vec<Value>,
        wait: bool,
        queued: Option<String>,
    ) -> Result<Option<TurnResult>, Error> {
        // A live session's owner and archived flag are in memory: no store read (the hot case).
        let sees = |t: &str| caller.sees(t);
        let record = match self.placement.live().live_member(id.as_str(), sees) {
            Some(_) => None,
            None => Some(self.records.get_to_use(caller, id).await?),
        };
        let claim = self
            .placement
            .claim_waiting(id.as_str(), Busy::Turn)
            .await?;
        let member = match self.placement.live().live_member(id.as_str(), sees) {
            Some(m) => m,
            None => {
                let (record, vanished) = match record {
                    Some(found) => found,
                    None => self.records.get_to_use(caller, id).await?,
                };
                let member = self.placement.ensure_live(&record).await?;
                // Tombstoned by a list sync, and the agent serves it: it is back.
                if vanished {
                    self.views.revive(&record, "prompted").await?;
                }
                member
            }
        };
        let agent = self
            .placement
            .client(member)
            .ok_or_else(|| self.placement.no_member_at(member))?;
        check_content(&prompt, agent.caps().prompt)?;
        self.workspaces.check_links(id.as_str(), &prompt).await?;
        // Whose the turn's spend is: the session's tenant, the caller as its user.
        let spender = EndedTurn {
            session_id: id.as_str().to_owned(),
            tenant: (self.placement.live().tenant(id.as_str()))
                .unwrap_or_else(|| caller.tenant.clone()),
            user: caller.user.as_ref().map(|u| u.id.clone()),
            agent: (self.placement.agents().of_member(member))
                .map(|a| a.name().to_owned())
                .unwrap_or_default(),
            usage: None,
        };
        self.meter.admit(&spender.tenant).await?;
        let slot = self
            .placement
            .quotas()
            .turn(&caller.tenant, id.as_str())
            .await?;
        claim.mark_admitted();
        self.counters.turn_started();
        let sid = id.as_str().to_owned();
        // The turn, from its prompt to its `turn_ended`, as a span of the request's trace.
        let span = tracing::info_span!(
            "turn",
            "otel.name" = "turn",
            session_id = id.as_str(),
            stop_reason = tracing::field::Empty,
            usage_total_tokens = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        // What the turn appends is written in its trace, until its `turn_ended` is queued.
        let traced = self.log.traced_in(&sid, &span);
        // Queued, not awaited: the log's order is the queue's, so it precedes every update the
        // agent sends for this turn, and the prompt goes out without waiting for a commit. The
        // session's `updatedAt` moves with it, in the same commit.
        let started = TurnStarted {
            session_id: sid.clone(),
            prompt: prompt.clone(),
            author: Some(caller.author()),
            queue_id: queued.clone(),
        };
        self.log
            .enqueue_opening(id.as_str(), GatewayEvent::TurnStarted(started))
            .await;
        if queued.is_some() {
            // Stored before the agent has it: a queued prompt is never run twice.
            self.log.flush().await;
        }
        self.requests.turn_began(&sid, caller.author());
        let sent = agent.prompt(&sid, &prompt).instrument(span.clone()).await;
        claim.mark_sent();
        // A client hanging up never leaves the turn without its `turn_ended` event: waited for,
        // the turn finishes in a task of its own if the request is dropped; not waited for, it
        // runs in one from the start. Its events are queued in order, not awaited: the answer
        // does not wait for a commit, and log readers (`/history`) flush the queue first.
        let this = self.clone();
        let turn = async move {
            let (claim, traced) = (claim, traced);
            let outcome = match sent {
                Ok(call) => call.wait(None).await,
                Err(e) => Err(e),
            };
            let ended = match &outcome {
                Ok(result) => {
                    // What the prompt result says besides: its token `usage`, its `_meta`.
                    let given = |key| result.get(key).filter(|v: &&Value| !v.is_null()).cloned();
                    TurnEnded {
                        session_id: sid.clone(),
                        stop_reason: Some(result.get("stopReason").cloned().unwrap_or(Value::Null)),
                        usage: given("usage"),
                        meta: given("_meta"),
                        ..TurnEnded::default()
                    }
                }
                Err(e) => {
                    this.counters.turn_failed();
                    TurnEnded {
                        session_id: sid.clone(),
                        error: Some(Error::from(e.clone()).problem()),
                        ..TurnEnded::default()
                    }
                }
            };
            let span = tracing::Span::current();
            match ended.stop_reason.as_ref().and_then(Value::as_str) {
                Some(stop) => span.record("stop_reason", stop),
                None => span.record("otel.status_code", "ERROR"),
            };
            let tokens = ended.usage.as_ref().and_then(|u| u.get("totalTokens"));
            if let Some(tokens) = tokens.and_then(Value::as_u64) {
                span.record("usage_total_tokens", tokens as i64);
            }
            let usage = ended.usage.is_some();
            let spent = EndedTurn {
                usage: ended.usage.clone(),
                ..spender
            };
            // What the turn changed in the session's workspace is checkpointed before its
            // end is told, so a client seeing `turn_ended` finds the checkpoint.
            let cwd = this.placement.live().cwd(&sid);
            if !this.placement.live_elsewhere(&sid) {
                this.changes.after_turn(&sid, cwd.as_deref()).await;
            }
            // A client may see `turn_ended` and prompt again before the session is freed
            // here: marked as ending, it waits for that instead of being refused.
            claim.mark_ending();
            this.requests.turn_over(&sid);
            let ended = GatewayEvent::TurnEnded(ended);
            this.log.enqueue_now(&sid, ended).await;
            drop(traced);
            this.states.refresh_after_turn(&sid, usage);
            // Recorded before the session is free: its next prompt is checked against it.
            this.meter.turn_ended(spent).await;
            // The turn has ended: the session is free (a next turn's events queue after this
            // one's end) before the answer waits for the store, if it must.
            drop(claim);
            if let Some(slot) = slot {
                this.placement.quotas().release(slot).await;
            }
            this.placement.release_after_turn(&sid).await;
            if let Some(queue_id) = &queued
                && let Err(e) = this.queue.remove_prompt(&sid, queue_id, false).await
            {
                tracing::warn!(session = sid, error = %e, "a queued prompt's turn ended but it stays queued until the sweep finds its turn_started");
            }
            this.kicks.kick(&sid);
            // During a store outage the answer waits until the turn is in the log: a client
            // told the turn ended must find it there, and not before the store is back.
            if this.log.hub().log_failing() {
                this.log.hub().stored().await;
            }
            outcome
        };
        let turn = turn.instrument(span);
        if !wait {
            self.tasks.spawn(turn);
            return Ok(None);
        }
        let result = FinishOnDrop::new(turn, &self.tasks).await?;
        let stop_reason = result
            .get("stopReason")
            .and_then(Value::as_str)
            .unwrap_or("end_turn")
            .to_owned();
        Ok(Some(TurnResult {
            stop_reason,
            result,
        }))
    }

    /// `POST /sessions/{id}/cancel`.
    pub async fn cancel(&self, caller: &Caller, id: &SessionId) -> Result<(), Error> {
        self.records.get(caller, id).await?;
        self.requests.cancel_session(id.as_str()).await;
        let Some((member, mut done)) = self.placement.running_turn(id.as_str()).await else {
            return Ok(());
        };
        if let Some(agent) = self.placement.client(member) {
            agent.cancel(id.as_str()).await?;
        }
        // The turn must end promptly: an agent that ignores the cancel is restarted, which
        // fails the turn (and its waiter) with `agent_exited`. The watch runs in its own task so
        // that it happens even if this request is dropped (client gone, request timeout).
        let (pool, grace, bound) = (
            self.placement.agents().clone(),
            self.cancel_grace,
            self.control_timeout,
        );
        let watch = self.tasks.spawn(async move {
            if tokio::time::timeout(grace, done.changed()).await.is_err() {
                pool.restart_member(member, "a turn ignored session/cancel");
                let _ = tokio::time::timeout(bound, done.changed()).await;
            }
        });
        let _ = watch.await;
        Ok(())
    }
}

/// Refuses a content block the agent did not advertise (`promptCapabilities`): ACP says a
/// client must not send one, and an agent fails or ignores it.
fn check_content(prompt: &[Value], caps: PromptCapabilities) -> Result<(), Error> {
    for (i, block) in prompt.iter().enumerate() {
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(capability) = caps.missing_for(kind) {
            return Err(Error::Invalid(format!(
                "prompt[{i}] is an `{kind}` block, but the session's agent does not advertise the `{capability}` prompt capability"
            )));
        }
    }
    Ok(())
}

/// A future run by its caller that, if dropped unfinished (the client hung up), is finished in
/// a task of `tasks` instead. Unlike spawning it from the start, this costs no task and no
/// wake-up of another runtime thread in the common case.
struct FinishOnDrop<T: Send + 'static> {
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    tasks: TaskTracker,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    fn new(future: impl Future<Output = T> + Send + 'static, tasks: &TaskTracker) -> Self {
        FinishOnDrop {
            future: Some(Box::pin(future)),
            tasks: tasks.clone(),
        }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let future = self
            .future
            .as_mut()
            .expect("FinishOnDrop polled after it finished");
        let out = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let (Some(future), Ok(runtime)) =
            (self.future.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        self.tasks.spawn_on(
            async move {
                future.await;
            },
            &runtime,
        );
    }
}
