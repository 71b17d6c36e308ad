//! The workspaces the gateway makes for sessions under `--workspace-dir`: scratch folders and git
//! worktrees, each recorded as its session's (`session_workspaces`), opened for the files
//! routes, tracked through git for what changed (a checkpoint after each turn that changed
//! files), and removed with the session (unless `--keep-workspaces`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::gateway::error::Error;
use crate::store::{SessionWorkspaces, WorkspaceRecord};
use crate::workspace::changes::{Checkpoint, FileChange};
use crate::workspace::files::{FileError, WorkFiles};
use crate::workspace::git::{Git, GitError, Tracker};
use crate::workspace::path::WorkPath;

/// The kind of a scratch workspace, as stored and shown.
pub(in crate::gateway) const SCRATCH: &str = "scratch";
/// The kind of a worktree workspace, as stored and shown.
pub(in crate::gateway) const WORKTREE: &str = "worktree";

/// What a new session's workspace is made from.
#[derive(Debug, Clone, Copy)]
pub(in crate::gateway) enum Source<'a> {
    /// Nothing: an empty folder.
    Empty,
    /// A worktree of this repository (its top level) at this ref (its `HEAD` when `None`).
    Repository(&'a str, Option<&'a str>),
    /// The files of this workspace as they are (a fork's parent's).
    Copy(&'a WorkspaceRecord),
}

/// The sessions' workspaces.
pub(in crate::gateway) struct Workspaces {
    store: Arc<dyn SessionWorkspaces>,
    /// Where new workspaces are made (absolute).
    dir: PathBuf,
    /// Whether a deleted session's workspace stays on disk.
    keep: bool,
    /// The host's git, or why there is none.
    git: Result<Git, String>,
}

impl Workspaces {
    pub(in crate::gateway) fn new(
        store: Arc<dyn SessionWorkspaces>,
        dir: PathBuf,
        keep: bool,
        git: Result<Git, String>,
    ) -> Self {
        Workspaces {
            store,
            dir,
            keep,
            git,
        }
    }

    /// A new workspace, for a session not made yet (named by a fresh id, recorded once the
    /// session is: its `session_id` is empty until then): an empty folder, a worktree, or a
    /// copy of another workspace's files (a worktree of the same repository at a commit of
    /// them when that one is a worktree). Tracked through git when the host has it.
    pub(in crate::gateway) async fn make(
        &self,
        source: Source<'_>,
    ) -> Result<WorkspaceRecord, Error> {
        let path = self.dir.join(uuid::Uuid::new_v4().simple().to_string());
        let mut made = WorkspaceRecord {
            session_id: String::new(),
            kind: SCRATCH.to_owned(),
            path: path.to_string_lossy().into_owned(),
            repository: None,
            base: None,
            branch: None,
        };
        let result = match source {
            Source::Repository(repository, reference) => {
                self.make_worktree(&mut made, repository, reference).await
            }
            Source::Copy(from) if from.kind == WORKTREE => {
                let repository = from.repository.clone().unwrap_or_default();
                let tracker = self.tracker(from)?;
                let base = from.base.as_deref().unwrap_or_default();
                let at = tracker.snapshot_commit(base).await.map_err(git_error)?;
                self.make_worktree(&mut made, &repository, Some(&at)).await
            }
            Source::Copy(from) => self.make_scratch(&mut made, Some(from)).await,
            Source::Empty => self.make_scratch(&mut made, None).await,
        };
        match result {
            Ok(()) => Ok(made),
            Err(e) => {
                self.discard(&made).await;
                Err(e)
            }
        }
    }

    async fn make_scratch(
        &self,
        made: &mut WorkspaceRecord,
        from: Option<&WorkspaceRecord>,
    ) -> Result<(), Error> {
        let (to, from) = (
            PathBuf::from(&made.path),
            from.map(|w| PathBuf::from(&w.path)),
        );
        let copied = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&to)?;
            match from {
                Some(from) => WorkFiles::open(&from)?.copy_into(&to),
                None => Ok(()),
            }
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|copied| copied);
        if let Err(e) = copied {
            tracing::error!(dir = %self.dir.display(), error = %e, "cannot make a workspace");
            return Err(Error::FileSystem(format!(
                "the gateway cannot make a workspace in --workspace-dir {}: {e}",
                self.dir.display()
            )));
        }
        if self.git.is_ok() {
            let tracker = self.tracker(made)?;
            made.base = tracker.start(None).await.map_err(git_error)?;
        }
        Ok(())
    }

    async fn make_worktree(
        &self,
        made: &mut WorkspaceRecord,
        repository: &str,
        reference: Option<&str>,
    ) -> Result<(), Error> {
        let git = self
            .git
            .as_ref()
            .map_err(|why| Error::NotSupported(format!("worktree workspaces are off: {why}")))?;
        made.kind = WORKTREE.to_owned();
        made.repository = Some(repository.to_owned());
        tokio::fs::create_dir_all(&self.dir).await.map_err(|e| {
            Error::FileSystem(format!("--workspace-dir {}: {e}", self.dir.display()))
        })?;
        let at = PathBuf::from(&made.path);
        let base = git
            .add_worktree(Path::new(repository), &at, reference)
            .await
            .map_err(git_error)?;
        made.base = Some(base);
        let own_index = Tracker::worktree_git_dir(git, &at)
            .await
            .map_err(git_error)?
            .join("index");
        self.tracker(made)?
            .start(Some(&own_index))
            .await
            .map_err(git_error)?;
        Ok(())
    }

    /// Records `made` as the workspace of `session_id` (a worktree's checkout put on its branch
    /// `acp/<session id>` first), and returns the record; one that cannot be is discarded.
    pub(in crate::gateway) async fn record(
        &self,
        session_id: &str,
        mut made: WorkspaceRecord,
    ) -> Result<WorkspaceRecord, Error> {
        made.session_id = session_id.to_owned();
        let recorded = async {
            if made.kind == WORKTREE
                && let Ok(git) = &self.git
            {
                let branch = branch_name(session_id, &made.path);
                git.name_branch(Path::new(&made.path), &branch)
                    .await
                    .map_err(git_error)?;
                made.branch = Some(branch);
            }
            self.store.put_workspace(&made).await.map_err(Error::from)
        }
        .await;
        match recorded {
            Ok(()) => Ok(made),
            Err(e) => {
                self.discard(&made).await;
                Err(e)
            }
        }
    }

    /// Records `hosted`, the workspace a remote agent's host made, as `session_id`'s: shown in
    /// its view, its files served by the host.
    pub(in crate::gateway) async fn record_hosted(
        &self,
        session_id: &str,
        mut hosted: WorkspaceRecord,
    ) -> Result<(), Error> {
        hosted.session_id = session_id.to_owned();
        Ok(self.store.put_workspace(&hosted).await?)
    }

    /// Whether `workspace` is one this gateway made: in its `--workspace-dir`. Only those are
    /// served, tracked or removed here (a remote agent's host chose where its own are).
    fn here(&self, workspace: &WorkspaceRecord) -> bool {
        Path::new(&workspace.path).starts_with(&self.dir)
    }

    /// The workspace of `session_id`, if the gateway made it one.
    pub(in crate::gateway) async fn of(
        &self,
        session_id: &str,
    ) -> Result<Option<WorkspaceRecord>, Error> {
        Ok(self.store.workspace_of(session_id).await?)
    }

    /// The files of the workspace of `session_id`, its folder, and whether it is a worktree
    /// (409 if it has none).
    pub(in crate::gateway) async fn files(
        &self,
        session_id: &str,
    ) -> Result<(Arc<WorkFiles>, String, bool), Error> {
        let workspace = self.of(session_id).await?.ok_or_else(no_workspace)?;
        if !self.here(&workspace) {
            return Err(not_here(&workspace));
        }
        let path = PathBuf::from(&workspace.path);
        let opened = tokio::task::spawn_blocking(move || WorkFiles::open(&path))
            .await
            .map_err(|e| Error::Conflict(format!("the workspace could not be opened: {e}")))?;
        match opened {
            Ok(files) => Ok((Arc::new(files), workspace.path, workspace.kind == WORKTREE)),
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

    /// Removes the workspace of a deleted session: its folder, a worktree's branch and the
    /// gateway's git state of it (unless `--keep-workspaces`, or the workspace is not `here`
    /// but on the host of a remote agent, which removes it), and its record. A failure is
    /// logged: the session is deleted all the same.
    pub(in crate::gateway) async fn remove(&self, session_id: &str, here: bool) {
        let workspace = match self.of(session_id).await {
            Ok(Some(w)) => w,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(session = session_id, error = %e, "cannot read the deleted session's workspace");
                return;
            }
        };
        if here && !self.keep {
            self.discard(&workspace).await;
        }
        if let Err(e) = self.store.remove_workspace(session_id).await {
            tracing::warn!(session = session_id, error = %e, "cannot forget the deleted session's workspace");
        }
    }

    /// Removes a workspace no session has (any more): a worktree from its repository, with
    /// its branch, the gateway's git state of it, and its folder.
    pub(in crate::gateway) async fn discard(&self, workspace: &WorkspaceRecord) {
        let path = Path::new(&workspace.path);
        if !self.here(workspace) {
            tracing::warn!(path = %path.display(), "a workspace outside --workspace-dir is not this gateway's to remove");
            return;
        }
        if let (Ok(git), Some(tracker)) = (&self.git, self.tracker(workspace).ok()) {
            if let (WORKTREE, Some(repository)) = (workspace.kind.as_str(), &workspace.repository)
                && let Err(e) = git
                    .remove_worktree(
                        Path::new(repository),
                        path,
                        workspace.branch.as_deref(),
                        &tracker,
                    )
                    .await
            {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a worktree");
            }
            tracker.forget().await;
        }
        if let Err(e) = tokio::fs::remove_dir_all(path).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a workspace's folder");
        }
    }

    /// How the gateway sees what changed in `workspace` (501 without git, or for a workspace
    /// made without it).
    pub(in crate::gateway) fn tracker(
        &self,
        workspace: &WorkspaceRecord,
    ) -> Result<Tracker, Error> {
        if !self.here(workspace) {
            return Err(not_here(workspace));
        }
        let git = self.git.as_ref().map_err(|why| {
            Error::NotSupported(format!(
                "what changed in a workspace is git's to say: {why}"
            ))
        })?;
        let name = Path::new(&workspace.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let scratch = workspace.kind != WORKTREE;
        Ok(Tracker::new(
            git.clone(),
            Path::new(&workspace.path),
            &self.dir.join(".git-state"),
            &name,
            scratch,
        ))
    }

    /// The tracker and base of the workspace of `session_id` (409 without a workspace, 501
    /// when it is not tracked).
    pub(in crate::gateway) async fn tracked(
        &self,
        session_id: &str,
    ) -> Result<(Tracker, String), Error> {
        let workspace = self.of(session_id).await?.ok_or_else(no_workspace)?;
        let tracker = self.tracker(&workspace)?;
        let base = workspace.base.clone().ok_or_else(|| {
            Error::NotSupported("the workspace was made when the gateway had no git: what changed in it is not known".into())
        })?;
        Ok((tracker, base))
    }

    /// After a turn of `session_id`: a checkpoint of its workspace's files if they changed,
    /// with what changed since the one before. `None` for a session without a tracked
    /// workspace (the common case costs no store read: `cwd` outside `--workspace-dir`).
    pub(in crate::gateway) async fn checkpoint(
        &self,
        session_id: &str,
        cwd: Option<&str>,
        reason: &str,
    ) -> Result<Option<(Checkpoint, Vec<FileChange>)>, Error> {
        if cwd.is_some_and(|cwd| !Path::new(cwd).starts_with(&self.dir)) || self.git.is_err() {
            return Ok(None);
        }
        let Some(workspace) = self.of(session_id).await? else {
            return Ok(None);
        };
        let (Ok(tracker), Some(base)) = (self.tracker(&workspace), &workspace.base) else {
            return Ok(None);
        };
        tracker.checkpoint(base, reason).await.map_err(git_error)
    }
}

/// The workspace a remote agent's host (another gateway) made for a session it started, as its
/// answer's `_meta.workspace` shows it.
pub(in crate::gateway) fn made_by_host(answer: &Value) -> Option<WorkspaceRecord> {
    let shown = answer.get("_meta")?.get("workspace")?;
    let text = |key: &str| shown.get(key).and_then(Value::as_str).map(str::to_owned);
    Some(WorkspaceRecord {
        session_id: String::new(),
        kind: text("kind")?,
        path: text("path")?,
        repository: text("repository"),
        base: text("base"),
        branch: text("branch"),
    })
}

/// 409: the session's workspace is outside this gateway's `--workspace-dir`.
fn not_here(workspace: &WorkspaceRecord) -> Error {
    Error::Conflict(format!(
        "the session's workspace {} is not in this gateway's --workspace-dir: its files are not served or changed here",
        workspace.path
    ))
}

/// 409: the session has no workspace of the gateway's.
pub(in crate::gateway) fn no_workspace() -> Error {
    Error::Conflict(
        "this session has no workspace of the gateway's (create it with \"workspace\": {\"kind\": \"scratch\"} or {\"kind\": \"worktree\"}); its files are not served".into(),
    )
}

/// A git failure as the client sees it: a wrong repository or ref is theirs (422), a git that
/// cannot run is the host's (501), anything else the gateway's (500).
pub(in crate::gateway) fn git_error(e: GitError) -> Error {
    match e {
        GitError::NotARepository(_) | GitError::UnknownRef(_) => Error::Invalid(e.to_string()),
        GitError::Missing { .. } => Error::NotSupported(e.to_string()),
        GitError::Failed { .. } => Error::FileSystem(e.to_string()),
    }
}

/// The branch of a session's worktree: `acp/<session id>`, or `acp/<workspace folder>` for an
/// id git would not take as a branch name.
fn branch_name(session_id: &str, path: &str) -> String {
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with(['.', '-'])
            && !s.contains("..")
            && !s.ends_with(".lock")
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    if plain(session_id) {
        return format!("acp/{session_id}");
    }
    let folder = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    format!("acp/{}", folder.unwrap_or_default())
}
