//! Where a session is live: the member a session goes to when it becomes live (the least-loaded
//! ready one, within the caps, waiting a bounded time for a starting one), attaching a saved
//! session (resume, else load; on another member when the request never reached the agent),
//! detaching it, closing idle ones, and which agent client a call about a session goes through.

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol_schema::v1::AGENT_METHOD_NAMES;
use serde_json::{Value, json};

use super::live::Busy;
use super::model::Status;
use super::{Error, Gateway};
use crate::acp::{CallError, Connection};
use crate::pool::client::AgentClient;
use crate::store::{Claimed, SessionRecord};

impl Gateway {
    /// Where a session that becomes live goes: the least-loaded ready member below the
    /// per-member cap, if the global cap allows another live session. While members start or
    /// restart, waits up to `--acquire-timeout` for one of them.
    pub(super) async fn place(&self, agent: &str) -> Result<(usize, AgentClient), Error> {
        let cfg = &self.inner.config;
        if cfg.max_sessions > 0 && self.inner.live.live_count() >= cfg.max_sessions {
            return Err(Error::NoCapacity(format!(
                "the gateway already holds its maximum of {} live sessions; close some or try again later",
                cfg.max_sessions
            )));
        }
        let of_agent = self.agent_named(agent)?;
        if of_agent.max_sessions > 0 {
            let live = self.inner.live.live_count_where(|m| of_agent.pool.has(m));
            if live >= of_agent.max_sessions {
                return Err(Error::NoCapacity(format!(
                    "the agent {agent:?} already holds its maximum of {} live sessions; close some or try again later",
                    of_agent.max_sessions
                )));
            }
        }
        let cap = match cfg.max_sessions_per_member {
            0 => usize::MAX,
            n => n,
        };
        let (member, conn) = self.acquire(agent, cap).await?;
        Ok((member, self.client_of(conn, of_agent.pool.caps())))
    }

    /// A ready member below `cap` (see [`crate::pool::Pool::acquire`]); 503 when none: a
    /// capacity cap (`NoCapacity`), or no member ready in time (`NoMember`, with the time to
    /// the next restart attempt).
    async fn acquire(&self, agent: &str, cap: usize) -> Result<(usize, Arc<Connection>), Error> {
        let wait = self.inner.config.acquire_timeout;
        let pool = &self.agent_named(agent)?.pool;
        pool.acquire(cap, wait).await.map_err(|no| {
            if no.full {
                Error::NoCapacity(no.reason)
            } else {
                Error::NoMember {
                    reason: no.reason,
                    retry_after: no.retry_after,
                }
            }
        })
    }

    /// Whether a create or an attach whose request never reached the agent (its connection was
    /// gone: `CallError::NotSent`) is tried again; counts the retry. That connection is never
    /// picked again, so each retry goes to another member's process, or to a restarted one;
    /// at most one per member. A request that did reach the agent is never repeated: it may
    /// have had effects.
    pub(super) fn retry_unsent(&self, agent: &str, retries: &mut usize) -> bool {
        *retries += 1;
        *retries <= self.agents.get(agent).map_or(0, |a| a.pool.size())
    }

    /// 503 for a session whose member is gone: why its agent has none ready.
    pub(super) fn no_member(&self, agent: &str) -> Error {
        Error::NoCapacity(
            self.agents
                .get(agent)
                .and_then(|a| a.pool.unready_reason())
                .unwrap_or_else(|| format!("no member of the agent {agent:?} is ready")),
        )
    }

    /// [`Gateway::no_member`] for the agent of member `member`.
    pub(super) fn no_member_at(&self, member: usize) -> Error {
        match self.agents.of_member(member) {
            Some(agent) => self.no_member(&agent.name),
            None => Error::NoCapacity("no agent member is ready".into()),
        }
    }

    /// Any ready member's client of `agent` (for calls about sessions no member holds),
    /// waiting like [`Gateway::place`] for a starting one.
    pub(super) async fn any_client(&self, agent: &str) -> Result<AgentClient, Error> {
        let (_, conn) = self.acquire(agent, usize::MAX).await?;
        Ok(self.client_of(conn, self.caps(agent)))
    }

    /// A ready member's client of `agent` now, if one is (for answers that must not wait).
    pub(super) fn ready_client(&self, agent: &str) -> Option<AgentClient> {
        let (_, conn) = self.agents.get(agent)?.pool.pick()?;
        Some(self.client_of(conn, self.caps(agent)))
    }

    /// The client of the member holding the session live, if one does.
    pub(super) fn client_if_live(&self, session_id: &str) -> Option<AgentClient> {
        self.client(self.inner.live.member(session_id)?)
    }

    /// The member holding the session, or any ready member of its agent.
    pub(super) async fn client_for(&self, record: &SessionRecord) -> Result<AgentClient, Error> {
        match self.client_if_live(&record.session_id) {
            Some(agent) => Ok(agent),
            None => self.any_client(&record.agent).await,
        }
    }

    /// Returns the member holding the session, attaching it (resume, else load) if needed.
    /// The caller holds a [`super::live::Claim`].
    pub(super) async fn ensure_live(&self, record: &SessionRecord) -> Result<usize, Error> {
        let id = record.session_id.as_str();
        let held = self.inner.live.member(id);
        // Before the live shortcut: an agent that can neither archive nor close keeps an
        // archived session in memory, and it still must not be prompted.
        if record.archived {
            return Err(Error::Conflict(format!(
                "session {id} is archived: unarchive it (POST /sessions/{id}/unarchive) first"
            )));
        }
        if let Some(m) = held {
            return Ok(m);
        }
        match self.inner.cluster.claim(id).await? {
            Claimed::Refused => {
                return Err(Error::HeldElsewhere(format!(
                    "session {id} is live on another gateway replica; retry"
                )));
            }
            Claimed::Orphan => self.inner.close_orphan(id).await,
            Claimed::Taken => {}
        }
        let attached = self.attach_here(record).await;
        if attached.is_err() {
            self.inner.release(id).await;
        }
        attached
    }

    /// Resumes (else loads) the session on a member of this replica's pool; again, on another
    /// ready process, when the request never reached the agent (see [`Gateway::retry_unsent`]).
    async fn attach_here(&self, record: &SessionRecord) -> Result<usize, Error> {
        let id = record.session_id.as_str();
        let mut retries = 0;
        let (member, (method, result)) = loop {
            let (member, agent) = self.place(&record.agent).await?;
            match self.resume_or_load(&agent, record).await? {
                Err(CallError::NotSent(why)) if self.retry_unsent(&record.agent, &mut retries) => {
                    tracing::warn!(
                        session = id,
                        member,
                        why,
                        "attach never reached the agent; trying another member"
                    );
                }
                attached => {
                    let attached = attached.map_err(|e| self.auth_hint(&record.agent, e.into()))?;
                    break (member, attached);
                }
            }
        };
        self.inner.live.attach(record, member, &self.agents);
        self.inner
            .log
            .lifecycle(record, "session_status", json!({"status": Status::Live}))
            .await;
        // A fresh process may say otherwise of its modes and options than the log does.
        if let Err(e) = self.note_state(id, method, &result).await {
            tracing::warn!(session = id, error = %e, "cannot record the attached session's state");
        }
        Ok(member)
    }

    /// `session/resume`, else `session/load`, through `agent`. The outer error is the gateway's
    /// own (the store, a missing capability), the inner one the agent call's.
    async fn resume_or_load(
        &self,
        agent: &AgentClient,
        record: &SessionRecord,
    ) -> Result<Result<(&'static str, Value), CallError>, Error> {
        let id = record.session_id.as_str();
        let caps = agent.caps();
        if caps.resume {
            let method = AGENT_METHOD_NAMES.session_resume;
            Ok(agent
                .resume_session(id, &record.cwd)
                .await
                .map(|r| (method, r)))
        } else if caps.load {
            let log_empty = self.store().last_event_seq(id).await? == 0;
            self.inner
                .replaying
                .lock()
                .expect("replaying lock")
                .insert(id.to_owned(), log_empty);
            let r = agent.load_session(id, &record.cwd).await;
            self.inner
                .replaying
                .lock()
                .expect("replaying lock")
                .remove(id);
            Ok(r.map(|r| (AGENT_METHOD_NAMES.session_load, r)))
        } else {
            Err(Error::NotSupported(
                "the session is not live and the agent supports neither session/resume nor session/load".into(),
            ))
        }
    }

    /// Forgets where the session is live and that this replica holds it, before answering:
    /// another replica asked next may take it at once (and a release left to run later could
    /// undo a hold taken again meanwhile). Returns the member it was on.
    pub(super) async fn detach(&self, session_id: &str) -> Option<usize> {
        let member = self.inner.live.detach(session_id, &self.agents);
        if member.is_some() {
            self.inner.release(session_id).await;
        }
        member
    }

    /// Closes live sessions that have been idle longer than `idle`, when the agent can close.
    pub(super) async fn reap_idle(&self, idle: Duration) {
        let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = self.inner.stop.cancelled() => return,
            }
            for (id, member) in self.inner.live.idle_for(idle) {
                if !self.client(member).is_some_and(|a| a.caps().close) {
                    continue;
                }
                if self.inner.requests.awaits_client(&id) {
                    continue;
                }
                let Ok(_claim) = self.claim(&id, Busy::Attaching) else {
                    continue;
                };
                if let Some(agent) = self.client(member)
                    && let Err(e) = agent.close_session(&id).await
                {
                    tracing::warn!(session = id, error = %e, "closing an idle session failed");
                    continue;
                }
                self.detach(&id).await;
                tracing::info!(session = id, "closed an idle session");
                if let Ok(Some(record)) = self.store().get_session(&id).await {
                    let status = json!({"status": Status::Saved, "reason": "idle"});
                    self.inner
                        .log
                        .lifecycle(&record, "session_status", status)
                        .await;
                }
            }
        }
    }
}
