//! What changed in a session's workspace: `GET /sessions/{id}/diff` (against the workspace's
//! base, or one checkpoint's own), `GET /sessions/{id}/checkpoints` and `POST
//! /sessions/{id}/revert`. The checkpoints themselves are made after each turn that changed
//! files ([`Changes::after_turn`]); a revert makes one too, so it can be undone in turn.

use serde::Serialize;
use utoipa::ToSchema;

use super::caller::Caller;
use super::error::Error;
use super::event::{GatewayEvent, WorkspaceChanged};
use super::input::SessionId;
use super::parts::live::Busy;
use super::parts::use_case;
use super::parts::workspaces::git_error;
pub use crate::workspace::changes::{Checkpoint, FileChange};
use crate::workspace::git::Tracker;

use_case! {
    /// The use case of what changed in sessions' workspaces, with the parts it needs.
    pub struct Changes {
        parts: [records, workspaces, placement, log],
    }
}

/// The files that differ between two states of a workspace.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"from": "9fceb02d0ae598e95dc970b74767f19372d61af8", "to": null, "files": [{"path": "src/main.rs", "status": "modified", "additions": 2, "deletions": 1, "binary": false, "patch": "diff --git a/src/main.rs b/src/main.rs\n…"}]}))]
pub struct DiffView {
    /// The commit compared from: the workspace's base, or the checkpoint's parent.
    pub from: String,
    /// The checkpoint compared to; `null`: the files as they are now.
    pub to: Option<String>,
    pub files: Vec<FileChange>,
}

/// A workspace's checkpoints.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"base": "9fceb02d0ae598e95dc970b74767f19372d61af8", "checkpoints": [{"id": "1b2e8f4c5d6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c", "parent": "9fceb02d0ae598e95dc970b74767f19372d61af8", "createdAt": "2026-11-29T10:00:00+00:00", "reason": "turn"}]}))]
pub struct CheckpointsView {
    /// The commit the workspace started from (`"to": "base"` reverts to it).
    pub base: String,
    /// Newest first.
    pub checkpoints: Vec<Checkpoint>,
}

impl Changes {
    /// The caller's session's workspace, tracked through git, and its base.
    async fn tracked(&self, caller: &Caller, id: &SessionId) -> Result<(Tracker, String), Error> {
        let record = self.records.get(caller, id).await?;
        self.placement.files_here(&record)?;
        self.workspaces.tracked(id.as_str()).await
    }

    /// `GET /sessions/{id}/diff`: the files as they are against the base, or (`checkpoint`)
    /// what that checkpoint changed against the one before it.
    pub async fn diff(
        &self,
        caller: &Caller,
        id: &SessionId,
        checkpoint: Option<&str>,
    ) -> Result<DiffView, Error> {
        let (tracker, from, to) = self.compared(caller, id, checkpoint).await?;
        let files = match &to {
            Some(to) => tracker.diff(&from, to).await,
            None => match tracker.snapshot().await {
                Ok(now) => tracker.diff(&from, &now).await,
                Err(e) => Err(e),
            },
        }
        .map_err(git_error)?;
        Ok(DiffView { from, to, files })
    }

    /// The same as one unified patch (`Accept: text/x-diff`).
    pub async fn patch(
        &self,
        caller: &Caller,
        id: &SessionId,
        checkpoint: Option<&str>,
    ) -> Result<String, Error> {
        let (tracker, from, to) = self.compared(caller, id, checkpoint).await?;
        let to = match to {
            Some(to) => to,
            None => tracker.snapshot().await.map_err(git_error)?,
        };
        tracker.patch(&from, &to).await.map_err(git_error)
    }

    /// `GET /sessions/{id}/checkpoints`.
    pub async fn checkpoints(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<CheckpointsView, Error> {
        let (tracker, base) = self.tracked(caller, id).await?;
        let checkpoints = tracker.checkpoints(&base).await.map_err(git_error)?;
        Ok(CheckpointsView { base, checkpoints })
    }

    /// `POST /sessions/{id}/revert`: the workspace's files made as they were at checkpoint
    /// `to` (or `base`), as a new checkpoint (409 while a turn runs: the session is held as
    /// if one did, so none starts meanwhile). Returns the checkpoint the files are now at.
    pub async fn revert(
        &self,
        caller: &Caller,
        id: &SessionId,
        to: &str,
    ) -> Result<Checkpoint, Error> {
        let (tracker, base) = self.tracked(caller, id).await?;
        let target = match to {
            "base" => base.clone(),
            id => find(&tracker, &base, id).await?.id,
        };
        let _claim = self
            .placement
            .claim_waiting(id.as_str(), Busy::Turn)
            .await?;
        tracker.restore(&target).await.map_err(git_error)?;
        let reason = format!("revert to {to}");
        match tracker
            .checkpoint(&base, &reason)
            .await
            .map_err(git_error)?
        {
            Some(made) => {
                let checkpoint = made.0.clone();
                self.announce(id.as_str(), made).await;
                Ok(checkpoint)
            }
            // Already as they were: the latest checkpoint stands.
            None => {
                let listed = tracker.checkpoints(&base).await.map_err(git_error)?;
                listed
                    .into_iter()
                    .next()
                    .ok_or_else(|| Error::Conflict("the workspace is at its base already".into()))
            }
        }
    }

    /// After a turn of `session_id` (working in `cwd`, if known): a checkpoint if it changed
    /// the workspace's files, announced as `workspace_changed`. A failure is logged, never
    /// the turn's.
    pub(in crate::gateway) async fn after_turn(&self, session_id: &str, cwd: Option<&str>) {
        match self.workspaces.checkpoint(session_id, cwd, "turn").await {
            Ok(Some(made)) => self.announce(session_id, made).await,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(session = session_id, error = %e, "cannot checkpoint the workspace after a turn");
            }
        }
    }

    async fn announce(
        &self,
        session_id: &str,
        (checkpoint, changes): (Checkpoint, Vec<FileChange>),
    ) {
        let changed = WorkspaceChanged {
            session_id: session_id.to_owned(),
            checkpoint,
            paths: changes.into_iter().map(|c| c.path).collect(),
        };
        let changed = GatewayEvent::WorkspaceChanged(changed);
        self.log.enqueue_now(session_id, changed).await;
    }

    /// The tracker of the caller's session's workspace, and what a diff compares: from the
    /// base to the files now, or from a checkpoint's parent to it.
    async fn compared(
        &self,
        caller: &Caller,
        id: &SessionId,
        checkpoint: Option<&str>,
    ) -> Result<(Tracker, String, Option<String>), Error> {
        let (tracker, base) = self.tracked(caller, id).await?;
        let Some(checkpoint) = checkpoint else {
            return Ok((tracker, base, None));
        };
        let found = find(&tracker, &base, checkpoint).await?;
        Ok((tracker, found.parent, Some(found.id)))
    }
}

/// The checkpoint `id` of a workspace whose base is `base` (404 when it is none of them).
async fn find(tracker: &Tracker, base: &str, id: &str) -> Result<Checkpoint, Error> {
    let listed = tracker.checkpoints(base).await.map_err(git_error)?;
    let found = listed.into_iter().find(|c| c.id == id);
    found.ok_or_else(|| Error::NotFound(format!("{id:?} is not a checkpoint of this session")))
}
