//! What the system routes read of the service: readiness, the agent and the pool (`/agent`),
//! and the numbers `/metrics` publishes.

use std::sync::atomic::Ordering;

use super::model::AgentView;
use super::{Error, Gateway};
use crate::pool::MemberView;

/// How long `/readyz` waits for the database to answer a ping.
const READY_PING: std::time::Duration = std::time::Duration::from_secs(2);

/// What `/metrics` shows of the service, read at once.
#[derive(Debug)]
pub struct Stats {
    pub members: Vec<MemberView>,
    pub members_ready: usize,
    pub sessions_live: usize,
    pub replicas: usize,
    pub replicas_live: usize,
    pub events_appended: u64,
    pub event_commits: u64,
    pub sse_open: u64,
    pub sse_lagged: u64,
    pub sse_closed: u64,
    pub turns_started: u64,
    pub turns_failed: u64,
    pub member_exits: u64,
    pub permissions_pending: usize,
    pub elicitations_pending: usize,
}

impl Gateway {
    /// Ready = the store answers, the event log is written (not retrying a failed append) and
    /// at least one member is ready.
    pub async fn ready(&self) -> Result<(), Error> {
        self.unready_reason()
            .await
            .map_or(Ok(()), |why| Err(Error::NoCapacity(why)))
    }

    /// Why the gateway is not ready, if it is not.
    async fn unready_reason(&self) -> Option<String> {
        // Bounded: while the server is down the pool waits for a connection (its acquire
        // timeout), longer than a probe should.
        match tokio::time::timeout(READY_PING, self.store().ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness: the database does not answer");
                return Some("the database does not answer".to_owned());
            }
            Err(_) => {
                tracing::warn!(timeout = ?READY_PING, "readiness: the database does not answer");
                return Some("the database does not answer in time".to_owned());
            }
        }
        if self.inner.hub.log_failing() {
            return Some("the event log cannot be written; appends are retried".to_owned());
        }
        self.pool.unready_reason()
    }

    /// `GET /agent`.
    pub fn agent(&self) -> AgentView {
        AgentView {
            initialize: self.pool.init(),
            members: self.pool.members(),
            replicas: self.inner.cluster.view(),
        }
    }

    /// The numbers `/metrics` publishes.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        let replicas = self.inner.cluster.view();
        let streams = self.inner.hub.streams();
        Stats {
            members: self.pool.members(),
            members_ready: self.pool.ready_count(),
            sessions_live: self.inner.live.live_count(),
            replicas: replicas.len(),
            replicas_live: replicas.iter().filter(|r| r.live).count(),
            events_appended: self.inner.hub.appended(),
            event_commits: self.inner.hub.commits(),
            sse_open: streams.open.load(Ordering::Relaxed),
            sse_lagged: streams.lagged.load(Ordering::Relaxed),
            sse_closed: streams.closed.load(Ordering::Relaxed),
            turns_started: c.turns_started.load(Ordering::Relaxed),
            turns_failed: c.turns_failed.load(Ordering::Relaxed),
            member_exits: c.member_exits.load(Ordering::Relaxed),
            permissions_pending: self.inner.permissions.pending_count(),
            elicitations_pending: self.inner.elicitations.pending_count(),
        }
    }
}
