//! Sessions as clients see them: a record with where it is live and what it waits for, and the
//! gateway's own changes to a record, announced.

use std::sync::Arc;

use super::counters::Counters;
use super::live::LiveTable;
use super::log::Log;
use super::records::Records;
use super::requests::Requests;
use super::snapshots::States;
use super::workspaces::Workspaces;
use crate::gateway::error::Error;
use crate::gateway::event::GatewayLifecycleEvent;
use crate::gateway::output::{Activity, SessionView, Status, WorkspaceView};
use crate::store::{SessionMutation, SessionRecord, StoreResult};

/// A record's view: its status from the live table and the pending requests. Built from what
/// it holds, in this order (`Views::new`).
#[derive(derive_more::Constructor)]
pub(in crate::gateway) struct Views {
    live: Arc<LiveTable>,
    requests: Arc<Requests>,
    records: Arc<Records>,
    log: Log,
    states: Arc<States>,
    counters: Arc<Counters>,
    workspaces: Arc<Workspaces>,
}

impl Views {
    /// The session's view with its state and its workspace.
    pub(in crate::gateway) async fn view_with_state(
        &self,
        record: &SessionRecord,
    ) -> Result<SessionView, Error> {
        let mut view = self.view(record);
        self.log.flush().await;
        view.state = Some(Box::new(
            self.states.state_of(&record.session_id).await?.state,
        ));
        view.workspace = self
            .workspaces
            .of(&record.session_id)
            .await?
            .map(WorkspaceView::from);
        Ok(view)
    }

    /// The session's status here.
    pub(in crate::gateway) fn status_of(&self, session_id: &str) -> (Status, Option<Activity>) {
        self.status_if_owner(session_id, |_| true)
    }

    /// The session's status, as live only if it is live and `owner_ok` accepts its owner.
    pub(in crate::gateway) fn status_if_owner(
        &self,
        session_id: &str,
        owner_ok: impl FnOnce(&str) -> bool,
    ) -> (Status, Option<Activity>) {
        self.live.status_if_owner(session_id, owner_ok, || {
            if self.requests.awaits_permission(session_id) {
                Some(Activity::AwaitingPermission)
            } else if self.requests.awaits_input(session_id) {
                Some(Activity::AwaitingInput)
            } else {
                None
            }
        })
    }

    /// Changes a cached session on the gateway's own authority (see
    /// [`super::records::Records::update_cached`]); a live session learns its new record.
    pub(in crate::gateway) async fn update_cached(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        let updated = self.records.update_cached(session_id, mutate).await;
        if let Ok(Some(r)) = &updated {
            self.live.record_changed(r);
        }
        updated
    }

    /// The `session_updated` lifecycle event of a changed cached session.
    pub(in crate::gateway) async fn updated(&self, r: &SessionRecord) {
        let updated = GatewayLifecycleEvent::updated(r, self.view(r));
        self.log.lifecycle(r, updated).await;
    }

    /// Brings back a session the list sync tombstoned (and no other), which the agent has
    /// shown it knows (`how`: it listed or served it): logged, counted and announced as
    /// created again. `true` if it was such a one.
    pub(in crate::gateway) async fn revive(
        &self,
        r: &SessionRecord,
        how: &str,
    ) -> StoreResult<bool> {
        let id = r.session_id.as_str();
        if !self.records.rows().revive_session(id).await? {
            return Ok(false);
        }
        self.records.sessions_changed();
        self.counters.session_revived();
        tracing::warn!(
            session = id,
            how,
            "a session marked deleted by the list sync is back"
        );
        let live = SessionRecord {
            deleted_at: None,
            ..r.clone()
        };
        self.live.record_changed(&live);
        let view = self.view(&live);
        let created = GatewayLifecycleEvent::created(&live, view);
        self.log.lifecycle(&live, created).await;
        Ok(true)
    }

    /// The record as clients see it.
    pub(in crate::gateway) fn view(&self, r: &SessionRecord) -> SessionView {
        let (status, activity) = self.status_of(&r.session_id);
        SessionView::new(r, status, activity)
    }
}
