//! What the system routes read of the service: readiness, the agent and the pool (`/agent`),
//! and the numbers `/metrics` publishes.

use std::sync::atomic::Ordering;

use super::Gateway;
use super::model::AgentView;
use crate::pool::MemberView;

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
}

impl Gateway {
    /// Ready = the store answers and at least one member is ready.
    pub async fn ready(&self) -> Result<(), String> {
        self.store().ping().await.map_err(|e| {
            tracing::warn!(error = %e, "readiness: the database does not answer");
            "the database does not answer".to_owned()
        })?;
        match self.pool.unready_reason() {
            Some(why) => Err(why),
            None => Ok(()),
        }
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
        }
    }
}
