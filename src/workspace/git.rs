//! Git, through the `git` command the host already has: a worktree of a repository on a branch
//! of the session's own, and what changed in a workspace, turn by turn.
//!
//! The gateway never touches what a person works with: not the repository's checkout, its index
//! or its branches (a worktree is added beside it), and not the worktree's own index either.
//! A workspace's changes are seen through an index file of the gateway's ([`Tracker`]), so a
//! snapshot is `git add -A` into it and `git write-tree`, stat-cached from one snapshot to the
//! next. A scratch workspace, which is no repository, gets a bare git directory of the gateway's
//! beside it instead, so it is tracked the same way and the agent sees no `.git`. Checkpoints
//! are commits on a ref of the gateway's (`refs/acp-gateway/<workspace>`), each the parent of
//! the next, the first one's parent the workspace's base. Repository hooks never run.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

pub use super::changes::{Checkpoint, FileChange};

/// Why a git operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The `git` command cannot be run.
    #[error("git cannot be run ({program}): {reason}")]
    Missing { program: String, reason: String },
    /// The folder is not a repository's top level.
    #[error("{0}")]
    NotARepository(String),
    /// The ref names no commit.
    #[error("{0:?} names no commit of the repository")]
    UnknownRef(String),
    /// A command failed.
    #[error("git {command} failed: {stderr}")]
    Failed { command: String, stderr: String },
}

/// The `git` command, known to run.
#[derive(Debug, Clone)]
pub struct Git {
    program: PathBuf,
}

impl Git {
    /// `program` (`git`, or a path), if it runs; its `--version` is logged by the caller.
    pub async fn probe(program: &Path) -> Result<(Git, String), GitError> {
        let git = Git {
            program: program.to_owned(),
        };
        let version = git.run(None, &[], ["--version"]).await?;
        Ok((git, version.trim().to_owned()))
    }

    /// A new worktree of `repository` (its top level) at `at`, checked out detached at
    /// `reference` (the repository's `HEAD` when `None`). Returns the base commit.
    pub async fn add_worktree(
        &self,
        repository: &Path,
        at: &Path,
        reference: Option<&str>,
    ) -> Result<String, GitError> {
        let top = self
            .run(Some(repository), &[], ["rev-parse", "--show-toplevel"])
            .await
            .map_err(|_| {
                GitError::NotARepository(format!(
                    "{} is not a git repository",
                    repository.display()
                ))
            })?;
        let top = PathBuf::from(top.trim());
        let (given, top_level) = (
            tokio::fs::canonicalize(repository).await.ok(),
            tokio::fs::canonicalize(&top).await.ok(),
        );
        if given != top_level {
            return Err(GitError::NotARepository(format!(
                "{} is a folder inside the repository {}: name its top level",
                repository.display(),
                top.display()
            )));
        }
        let reference = reference.unwrap_or("HEAD");
        let spec = format!("{reference}^{{commit}}");
        let base = self
            .run(
                Some(repository),
                &[],
                [
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    "--end-of-options",
                    &spec,
                ],
            )
            .await
            .map_err(|_| GitError::UnknownRef(reference.to_owned()))?;
        let base = base.trim().to_owned();
        let at = at.as_os_str();
        self.run(
            Some(repository),
            &[],
            [
                OsStr::new("worktree"),
                OsStr::new("add"),
                OsStr::new("--quiet"),
                OsStr::new("--detach"),
                at,
                OsStr::new(&base),
            ],
        )
        .await?;
        Ok(base)
    }

    /// Puts the worktree at `at` on a new branch `branch` at its commit (no file changes).
    pub async fn name_branch(&self, at: &Path, branch: &str) -> Result<(), GitError> {
        self.run(Some(at), &[], ["checkout", "--quiet", "-b", branch])
            .await
            .map(drop)
    }

    /// Removes the worktree at `at` of `repository`, its `branch` and the checkpoints of
    /// `tracker`; what is already gone is no error.
    pub async fn remove_worktree(
        &self,
        repository: &Path,
        at: &Path,
        branch: Option<&str>,
        tracker: &Tracker,
    ) -> Result<(), GitError> {
        let removed = self
            .run(
                Some(repository),
                &[],
                [
                    OsStr::new("worktree"),
                    OsStr::new("remove"),
                    OsStr::new("--force"),
                    at.as_os_str(),
                ],
            )
            .await;
        if removed.is_err() {
            // The folder may be gone already: git forgets worktrees whose folder is.
            self.run(Some(repository), &[], ["worktree", "prune"])
                .await?;
        }
        if let Some(branch) = branch {
            let _ = self
                .run(Some(repository), &[], ["branch", "--quiet", "-D", branch])
                .await;
        }
        let _ = self
            .run(
                Some(repository),
                &[],
                ["update-ref", "-d", &tracker.checkpoints],
            )
            .await;
        Ok(())
    }

    /// Runs git in `dir` with `env`, returning its standard output.
    pub(super) async fn run<I, S>(
        &self,
        dir: Option<&Path>,
        env: &[(&str, &OsStr)],
        args: I,
    ) -> Result<String, GitError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let mut command = Command::new(&self.program);
        command
            .args(["-c", "core.hooksPath=/dev/null", "-c", "core.quotePath=off"])
            .args(&args)
            .envs(env.iter().copied())
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_AUTHOR_NAME", "acp-gateway")
            .env("GIT_AUTHOR_EMAIL", "acp-gateway@localhost")
            .env("GIT_COMMITTER_NAME", "acp-gateway")
            .env("GIT_COMMITTER_EMAIL", "acp-gateway@localhost")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
        let output = command.output().await.map_err(|e| GitError::Missing {
            program: self.program.display().to_string(),
            reason: e.to_string(),
        })?;
        if !output.status.success() {
            let command = args
                .first()
                .map(|a| a.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            return Err(GitError::Failed { command, stderr });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// How the gateway sees one workspace's files through git.
#[derive(Debug, Clone)]
pub struct Tracker {
    git: Git,
    /// The workspace's folder.
    work_tree: PathBuf,
    /// A scratch workspace's bare git directory (a worktree has its own).
    git_dir: Option<PathBuf>,
    /// The gateway's index of the workspace.
    index: PathBuf,
    /// The ref of its checkpoints.
    checkpoints: String,
}

impl Tracker {
    /// The tracker of the workspace at `work_tree`, whose git state of the gateway's is kept in
    /// `state` (a folder), under `name` (the workspace's folder's name); `scratch`: it is no
    /// repository, and gets a git directory there.
    pub fn new(git: Git, work_tree: &Path, state: &Path, name: &str, scratch: bool) -> Self {
        Tracker {
            git,
            work_tree: work_tree.to_owned(),
            git_dir: scratch.then(|| state.join(format!("{name}.git"))),
            index: state.join(format!("{name}.index")),
            checkpoints: format!("refs/acp-gateway/{name}"),
        }
    }

    /// Starts tracking a new workspace: a scratch one gets its git directory and a first commit
    /// of its files (its base, returned); a worktree's index is seeded from the worktree's own,
    /// so the first snapshot reads only what changed.
    pub async fn start(&self, worktree_index: Option<&Path>) -> Result<Option<String>, GitError> {
        if let Some(parent) = self.index.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| self.io("mkdir", e))?;
        }
        if let Some(from) = worktree_index {
            let _ = tokio::fs::copy(from, &self.index).await;
        }
        let Some(git_dir) = &self.git_dir else {
            return Ok(None);
        };
        self.git
            .run(
                None,
                &[],
                [
                    OsStr::new("init"),
                    OsStr::new("--quiet"),
                    OsStr::new("--bare"),
                    git_dir.as_os_str(),
                ],
            )
            .await?;
        let tree = self.snapshot().await?;
        let base = self
            .run(["commit-tree", "-m", "the workspace as it was made", &tree])
            .await?;
        Ok(Some(base.trim().to_owned()))
    }

    /// The git directory of a worktree at `at` (its index is `index` in it).
    pub async fn worktree_git_dir(git: &Git, at: &Path) -> Result<PathBuf, GitError> {
        let dir = git
            .run(Some(at), &[], ["rev-parse", "--absolute-git-dir"])
            .await?;
        Ok(PathBuf::from(dir.trim()))
    }

    /// Removes the gateway's git state of the workspace (its index, a scratch one's git
    /// directory).
    pub async fn forget(&self) {
        let _ = tokio::fs::remove_file(&self.index).await;
        if let Some(dir) = &self.git_dir {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
    }

    /// The workspace's files as they are now: a tree id (ignored files left out).
    pub async fn snapshot(&self) -> Result<String, GitError> {
        self.run(["add", "--all", "--", "."]).await?;
        Ok(self.run(["write-tree"]).await?.trim().to_owned())
    }

    /// The files that differ from `from` to `to` (trees or commits), with their patches.
    pub async fn diff(&self, from: &str, to: &str) -> Result<Vec<FileChange>, GitError> {
        let listed = self
            .run([
                "diff-tree",
                "-r",
                "-M",
                "-z",
                "--raw",
                "--numstat",
                "--no-ext-diff",
                "--no-textconv",
                from,
                to,
            ])
            .await?;
        let patch = self.patch(from, to).await?;
        Ok(super::changes::parse(&listed, &patch))
    }

    /// The whole unified patch from `from` to `to`.
    pub async fn patch(&self, from: &str, to: &str) -> Result<String, GitError> {
        self.run([
            "diff-tree",
            "-r",
            "-M",
            "-p",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            from,
            to,
        ])
        .await
    }

    /// The latest checkpoint, or `base` when there is none.
    pub async fn head(&self, base: &str) -> Result<String, GitError> {
        match self
            .run(["rev-parse", "--verify", "--quiet", &self.checkpoints])
            .await
        {
            Ok(id) => Ok(id.trim().to_owned()),
            Err(_) => Ok(base.to_owned()),
        }
    }

    /// The files as they are now, as a commit on no ref whose parent is the latest checkpoint
    /// (`base` when there is none): what a fork's worktree starts from.
    pub async fn snapshot_commit(&self, base: &str) -> Result<String, GitError> {
        let tree = self.snapshot().await?;
        let parent = self.head(base).await?;
        self.commit(&tree, &parent, "the files a fork started from")
            .await
    }

    /// A checkpoint of the files as they are, if they differ from the latest one (`base` when
    /// there is none): a commit whose parent is that one, saying `reason`, with what changed.
    pub async fn checkpoint(
        &self,
        base: &str,
        reason: &str,
    ) -> Result<Option<(Checkpoint, Vec<FileChange>)>, GitError> {
        let tree = self.snapshot().await?;
        let parent = self.head(base).await?;
        let parent_tree = self
            .run(["rev-parse", &format!("{parent}^{{tree}}")])
            .await?;
        if parent_tree.trim() == tree {
            return Ok(None);
        }
        let changes = self.diff(&parent, &tree).await?;
        let commit = self.commit(&tree, &parent, reason).await?;
        self.run([
            "update-ref",
            &self.checkpoints,
            &commit,
            parent_ref(&parent, base),
        ])
        .await?;
        let listed = self.list(&format!("{commit}^!")).await?;
        let checkpoint = listed.into_iter().next().ok_or_else(|| GitError::Failed {
            command: "log".into(),
            stderr: format!("the new checkpoint {commit} is not found"),
        })?;
        Ok(Some((checkpoint, changes)))
    }

    async fn commit(&self, tree: &str, parent: &str, message: &str) -> Result<String, GitError> {
        let commit = self
            .run(["commit-tree", "-p", parent, "-m", message, tree])
            .await?;
        Ok(commit.trim().to_owned())
    }

    /// The checkpoints since `base`, newest first.
    pub async fn checkpoints(&self, base: &str) -> Result<Vec<Checkpoint>, GitError> {
        let head = self.head(base).await?;
        if head == base {
            return Ok(Vec::new());
        }
        self.list(&format!("{base}..{head}")).await
    }

    /// The workspace's files made as they were at `to` (a checkpoint or the base): what was
    /// added since is removed, ignored files are left alone.
    pub async fn restore(&self, to: &str) -> Result<(), GitError> {
        self.snapshot().await?;
        self.run(["read-tree", "-u", "--reset", to]).await.map(drop)
    }

    async fn list(&self, range: &str) -> Result<Vec<Checkpoint>, GitError> {
        let out = self
            .run([
                "log",
                "--first-parent",
                "--format=%H%x1f%P%x1f%cI%x1f%s%x1e",
                range,
            ])
            .await?;
        Ok(super::changes::parse_log(&out))
    }

    async fn run<const N: usize>(&self, args: [&str; N]) -> Result<String, GitError> {
        // The untracked cache lets a snapshot skip the folders that did not change (a third of
        // the time of a 10,000-file worktree's, `bench/workspace.sh`).
        let mut env: Vec<(&str, &OsStr)> = vec![
            ("GIT_INDEX_FILE", self.index.as_os_str()),
            ("GIT_CONFIG_COUNT", OsStr::new("1")),
            ("GIT_CONFIG_KEY_0", OsStr::new("core.untrackedCache")),
            ("GIT_CONFIG_VALUE_0", OsStr::new("true")),
        ];
        if let Some(dir) = &self.git_dir {
            env.push(("GIT_DIR", dir.as_os_str()));
            env.push(("GIT_WORK_TREE", self.work_tree.as_os_str()));
        }
        self.git.run(Some(&self.work_tree), &env, args).await
    }

    fn io(&self, command: &str, e: std::io::Error) -> GitError {
        GitError::Failed {
            command: command.into(),
            stderr: format!("{}: {e}", self.index.display()),
        }
    }
}

/// What the checkpoints ref must hold for an update to `parent`'s child: `parent`, or nothing
/// (the empty string) when `parent` is the base and the ref is made now.
fn parent_ref<'a>(parent: &'a str, base: &str) -> &'a str {
    if parent == base { "" } else { parent }
}
