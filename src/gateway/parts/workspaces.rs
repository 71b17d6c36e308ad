//! The workspaces the gateway makes for sessions: scratch folders under `--workspace-dir`, each
//! recorded as its session's (`session_workspaces`), opened for the files routes, and removed
//! with the session (unless `--keep-workspaces`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::gateway::error::Error;
use crate::store::{SessionWorkspaces, WorkspaceRecord};
use crate::workspace::files::{FileError, WorkFiles};
use crate::workspace::path::WorkPath;

/// The kind of a scratch workspace, as stored and shown.
pub(in crate::gateway) const SCRATCH: &str = "scratch";

/// The sessions' workspaces.
pub(in crate::gateway) struct Workspaces {
    store: Arc<dyn SessionWorkspaces>,
    /// Where new workspaces are made (absolute).
    dir: PathBuf,
    /// Whether a deleted session's workspace stays on disk.
    keep: bool,
}

impl Workspaces {
    pub(in crate::gateway) fn new(
        store: Arc<dyn SessionWorkspaces>,
        dir: PathBuf,
        keep: bool,
    ) -> Self {
        Workspaces { store, dir, keep }
    }

    /// A new folder of a session's own, for a scratch workspace (its session not made yet:
    /// named by a fresh id, recorded once the session is): empty, or holding a copy of the
    /// files of `from` (a fork's parent's workspace).
    pub(in crate::gateway) async fn make_scratch(
        &self,
        from: Option<&WorkspaceRecord>,
    ) -> Result<PathBuf, Error> {
        let path = self.dir.join(uuid::Uuid::new_v4().simple().to_string());
        let (to, from) = (path.clone(), from.map(|w| PathBuf::from(&w.path)));
        let made = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&to)?;
            match from {
                Some(from) => WorkFiles::open(&from)?.copy_into(&to),
                None => Ok(()),
            }
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|made| made);
        if let Err(e) = made {
            tracing::error!(dir = %self.dir.display(), error = %e, "cannot make a workspace");
            self.discard(&path).await;
            return Err(Error::FileSystem(format!(
                "the gateway cannot make a workspace in --workspace-dir {}: {e}",
                self.dir.display()
            )));
        }
        Ok(path)
    }

    /// Records `path` as the scratch workspace of `session_id`.
    pub(in crate::gateway) async fn record_scratch(
        &self,
        session_id: &str,
        path: &Path,
    ) -> Result<(), Error> {
        let record = WorkspaceRecord {
            session_id: session_id.to_owned(),
            kind: SCRATCH.to_owned(),
            path: path.to_string_lossy().into_owned(),
            repository: None,
            base: None,
            branch: None,
        };
        Ok(self.store.put_workspace(&record).await?)
    }

    /// The workspace of `session_id`, if the gateway made it one.
    pub(in crate::gateway) async fn of(
        &self,
        session_id: &str,
    ) -> Result<Option<WorkspaceRecord>, Error> {
        Ok(self.store.workspace_of(session_id).await?)
    }

    /// The files of the workspace of `session_id`, and its folder (409 if it has none).
    pub(in crate::gateway) async fn files(
        &self,
        session_id: &str,
    ) -> Result<(Arc<WorkFiles>, String), Error> {
        let Some(workspace) = self.of(session_id).await? else {
            return Err(Error::Conflict(
                "this session has no workspace of the gateway's (create it with \"workspace\": {\"kind\": \"scratch\"}); its files are not served".into(),
            ));
        };
        let path = PathBuf::from(&workspace.path);
        let opened = tokio::task::spawn_blocking(move || WorkFiles::open(&path))
            .await
            .map_err(|e| Error::Conflict(format!("the workspace could not be opened: {e}")))?;
        match opened {
            Ok(files) => Ok((Arc::new(files), workspace.path)),
            Err(e) => Err(Error::Conflict(format!(
                "the session's workspace {} cannot be opened here: {e}",
                workspace.path
            ))),
        }
    }

    /// Checks the `resource_link` blocks of a prompt to `session_id` that name a `file://`
    /// URI: with a workspace of the gateway's, each must lead to a path inside it (lexically,
    /// and through its symlinks when it exists), else 422. A session without one is not
    /// checked (its agent works where its client said). Reads the store only for a prompt
    /// that holds such a link.
    pub(in crate::gateway) async fn check_links(
        &self,
        session_id: &str,
        blocks: &[Value],
    ) -> Result<(), Error> {
        let uris: Vec<&str> = blocks
            .iter()
            .filter(|b| b["type"] == "resource_link")
            .filter_map(|b| b["uri"].as_str())
            .filter(|u| {
                u.get(..7)
                    .is_some_and(|s| s.eq_ignore_ascii_case("file://"))
            })
            .collect();
        if uris.is_empty() {
            return Ok(());
        }
        let Some(workspace) = self.of(session_id).await? else {
            return Ok(());
        };
        let root = PathBuf::from(&workspace.path);
        let mut paths = Vec::new();
        for uri in uris {
            let outside = || {
                Error::Invalid(format!(
                    "resource_link {uri:?} is outside the session's workspace ({}): a prompt may link only the workspace's files",
                    workspace.path
                ))
            };
            let path = url::Url::parse(uri)
                .ok()
                .and_then(|u| u.to_file_path().ok())
                .ok_or_else(outside)?;
            let inside = path.strip_prefix(&root).map_err(|_| outside())?;
            let inside = WorkPath::parse(&inside.to_string_lossy()).map_err(|_| outside())?;
            paths.push((inside, outside()));
        }
        let checked = tokio::task::spawn_blocking(move || -> Result<Result<(), Error>, String> {
            let files = WorkFiles::open(&root).map_err(|e| e.to_string())?;
            for (path, outside) in paths {
                if let Err(FileError::Escapes(_)) = files.info(&path) {
                    return Ok(Err(outside));
                }
            }
            Ok(Ok(()))
        })
        .await;
        match checked {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(Error::Conflict(format!(
                "the session's workspace {} cannot be opened here: {e}",
                workspace.path
            ))),
            Err(e) => Err(Error::FileSystem(e.to_string())),
        }
    }

    /// Removes the workspace of a deleted session: its folder (unless `--keep-workspaces`) and
    /// its record. A failure is logged: the session is deleted all the same.
    pub(in crate::gateway) async fn remove(&self, session_id: &str) {
        let workspace = match self.of(session_id).await {
            Ok(Some(w)) => w,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(session = session_id, error = %e, "cannot read the deleted session's workspace");
                return;
            }
        };
        if !self.keep {
            self.discard(Path::new(&workspace.path)).await;
        }
        if let Err(e) = self.store.remove_workspace(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot forget the deleted session's workspace");
        }
    }

    /// Removes the folder of a workspace no session has (any more).
    pub(in crate::gateway) async fn discard(&self, path: &Path) {
        if let Err(e) = tokio::fs::remove_dir_all(path).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a workspace's folder");
        }
    }
}
