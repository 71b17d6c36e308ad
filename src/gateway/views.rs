//! Sessions as clients see them: a record with where it is live and what it waits for, and the
//! gateway's own changes to a record, announced.

use std::sync::Arc;

use serde_json::json;

use super::Error;
use super::live::LiveTable;
use super::log::Log;
use super::output::{Activity, SessionView, Status};
use super::records::Records;
use super::requests::Requests;
use super::snapshots::States;
use crate::store::{SessionMutation, SessionRecord, StoreResult};

/// A record's view: its status from the live table and the pending requests.
pub(super) struct Views {
    live: Arc<LiveTable>,
    requests: Arc<Requests>,
    records: Arc<Records>,
    log: Log,
    states: Arc<States>,
}

impl Views {
    pub(super) fn new(
        live: Arc<LiveTable>,
        requests: Arc<Requests>,
        records: Arc<Records>,
        log: Log,
        states: Arc<States>,
    ) -> Self {
        Views {
            live,
            requests,
            records,
            log,
            states,
        }
    }

    /// The session's view with its state.
    pub(super) async fn view_with_state(
        &self,
        record: &SessionRecord,
    ) -> Result<SessionView, Error> {
        let mut view = self.view(record);
        self.log.flush().await;
        view.state = Some(Box::new(
            self.states.state_of(&record.session_id).await?.state,
        ));
        Ok(view)
    }

    /// The session's status here.
    pub(super) fn status_of(&self, session_id: &str) -> (Status, Option<Activity>) {
        self.status_if_owner(session_id, |_| true)
    }

    /// The session's status, as live only if it is live and `owner_ok` accepts its owner.
    pub(super) fn status_if_owner(
        &self,
        session_id: &str,
        owner_ok: impl FnOnce(&str) -> bool,
    ) -> (Status, Option<Activity>) {
        self.live.status_if_owner(session_id, owner_ok, || {
            if self.requests.permissions.has_pending(session_id) {
                Some(Activity::AwaitingPermission)
            } else if self.requests.elicitations.has_pending(session_id) {
                Some(Activity::AwaitingInput)
            } else {
                None
            }
        })
    }

    /// Changes a cached session on the gateway's own authority (see
    /// [`super::records::Records::update_cached`]); a live session learns its new record.
    pub(super) async fn update_cached(
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
    pub(super) async fn updated(&self, r: &SessionRecord) {
        self.log
            .lifecycle(r, "session_updated", json!({"session": self.view(r)}))
            .await;
    }

    /// The record as clients see it.
    pub(super) fn view(&self, r: &SessionRecord) -> SessionView {
        let (status, activity) = self.status_of(&r.session_id);
        SessionView::new(r, status, activity)
    }
}
