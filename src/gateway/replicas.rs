//! This replica's place among the replicas sharing the database: its heartbeat, the sessions
//! it holds (recorded so that the others forward to it), taking over the sessions of replicas
//! that died, and where a request for a session held elsewhere goes.

use serde_json::json;

use super::{Error, Gateway, Inner};

impl Gateway {
    /// Sessions held by a replica whose lease expired are `saved` now: their logs get
    /// `agent_exited` (without a member, which was the dead replica's), and the next prompt
    /// resumes them on whichever replica receives it.
    async fn take_over_orphans(&self) {
        let orphans = match self.inner.cluster.release_orphans().await {
            Ok(orphans) => orphans,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for sessions of replicas that died");
                return;
            }
        };
        for id in orphans {
            tracing::warn!(
                session = id,
                "the replica holding the session stopped beating; the session is saved"
            );
            let payload = json!({"sessionId": id, "member": null, "code": null, "signal": null});
            self.inner.append(&id, "agent_exited", payload).await;
            // A turn the dead replica was running never gets its end from it: its clients and
            // any later replay see it end here, as a member's crash ends one.
            match self.store().turn_open(&id).await {
                Ok(true) => {
                    let gone = Error::AgentGone(
                        "the gateway replica running the turn stopped before it ended".into(),
                    );
                    let error = (self.inner.config.describe_error)(gone);
                    let payload = json!({"sessionId": id, "error": error});
                    self.inner.append(&id, "turn_ended", payload).await;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(session = id, error = %e, "cannot tell whether a turn was left running")
                }
            }
        }
    }

    /// Beats in the cluster every heartbeat interval until shutdown, then leaves it.
    pub(super) async fn heartbeat_forever(&self) {
        let cluster = &self.inner.cluster;
        loop {
            let live = i64::try_from(self.inner.live.live_count()).unwrap_or(i64::MAX);
            if let Err(e) = cluster.beat(live).await {
                tracing::warn!(error = %e, "replica heartbeat failed");
            }
            self.take_over_orphans().await;
            tokio::select! {
                _ = tokio::time::sleep(cluster.interval()) => {}
                _ = self.inner.stop.cancelled() => break,
            }
        }
        if let Err(e) = cluster.leave().await {
            tracing::warn!(error = %e, "could not unregister this replica");
        }
    }

    /// The address of the other replica holding `session_id` live, if one does.
    pub async fn owner_elsewhere(&self, session_id: &str) -> Result<Option<String>, Error> {
        if self.inner.live.here(session_id) {
            return Ok(None);
        }
        Ok(self.inner.cluster.owner_elsewhere(session_id).await?)
    }

    /// The other replica a new session should be created on, if one holds fewer sessions.
    pub fn place_elsewhere(&self) -> Option<String> {
        let here = i64::try_from(self.inner.live.live_count()).unwrap_or(i64::MAX);
        self.inner.cluster.place_elsewhere(here)
    }

    /// The HTTP client that forwards requests to other replicas.
    pub fn forwarder(&self) -> &reqwest::Client {
        &self.inner.forwarder
    }
}

impl Inner {
    /// Records that this replica holds a session it made live.
    pub(super) async fn hold(&self, session_id: &str) {
        if let Err(e) = self.cluster.claim(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot record that this replica holds the session");
        }
    }

    /// Records that this replica no longer holds a session.
    pub(super) async fn release(&self, session_id: &str) {
        if let Err(e) = self.cluster.release(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot record that this replica gave the session up");
        }
    }
}
