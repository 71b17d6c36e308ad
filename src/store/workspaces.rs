//! Where each session with a workspace of the gateway's own works: its folder, and for a git
//! worktree the repository, base commit and branch it was made from. A row per such session,
//! written when the session is created and removed with its workspace. The SQL both backends
//! run alike, and [`impl_workspaces!`] that implements [`SessionWorkspaces`] for each.

use async_trait::async_trait;

use super::error::StoreResult;

/// A session's workspace, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRecord {
    pub session_id: String,
    /// `scratch` or `worktree`.
    pub kind: String,
    /// The folder the agent works in (the session's `cwd`).
    pub path: String,
    /// A worktree's repository (its top folder).
    pub repository: Option<String>,
    /// The commit a worktree started from.
    pub base: Option<String>,
    /// A worktree's branch.
    pub branch: Option<String>,
}

/// The sessions' workspaces.
#[async_trait]
pub trait SessionWorkspaces: Send + Sync + 'static {
    /// Stores `workspace` as its session's (replacing the one it had).
    async fn put_workspace(&self, workspace: &WorkspaceRecord) -> StoreResult<()>;

    /// The workspace of `session_id`, if it has one.
    async fn workspace_of(&self, session_id: &str) -> StoreResult<Option<WorkspaceRecord>>;

    /// Forgets the workspace of `session_id` (nothing if it has none).
    async fn remove_workspace(&self, session_id: &str) -> StoreResult<()>;
}

pub const PUT: &str = "INSERT INTO session_workspaces \
     (session_id, kind, path, repository, base, branch) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (session_id) DO UPDATE SET kind = excluded.kind, path = excluded.path, \
     repository = excluded.repository, base = excluded.base, branch = excluded.branch";
pub const GET: &str = "SELECT session_id, kind, path, repository, base, branch \
     FROM session_workspaces WHERE session_id = $1";
pub const REMOVE: &str = "DELETE FROM session_workspaces WHERE session_id = $1";

/// `impl_workspaces!(Backend { reads, writes })` implements [`SessionWorkspaces`] for
/// `Backend`, from the parameters of the same names of
/// [`impl_store!`](crate::store::common), which invokes it.
macro_rules! impl_workspaces {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::workspaces::SessionWorkspaces for $backend {
            async fn put_workspace(
                &self,
                w: &$crate::store::workspaces::WorkspaceRecord,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::workspaces::PUT)
                    .bind(&w.session_id)
                    .bind(&w.kind)
                    .bind(&w.path)
                    .bind(&w.repository)
                    .bind(&w.base)
                    .bind(&w.branch)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn workspace_of(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<
                Option<$crate::store::workspaces::WorkspaceRecord>,
            > {
                use sqlx::Row as _;
                let row = sqlx::query($crate::store::workspaces::GET)
                    .bind(session_id)
                    .fetch_optional(&self.$reads)
                    .await?;
                row.map(|r| {
                    Ok($crate::store::workspaces::WorkspaceRecord {
                        session_id: r.try_get("session_id")?,
                        kind: r.try_get("kind")?,
                        path: r.try_get("path")?,
                        repository: r.try_get("repository")?,
                        base: r.try_get("base")?,
                        branch: r.try_get("branch")?,
                    })
                })
                .transpose()
            }

            async fn remove_workspace(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<()> {
                sqlx::query($crate::store::workspaces::REMOVE)
                    .bind(session_id)
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }
        }
    };
}
