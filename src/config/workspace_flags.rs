//! The flags of the workspaces the gateway makes for sessions (`--workspace-dir`,
//! `--keep-workspaces`, `--git`), flattened into [`super::Config`].

use std::path::PathBuf;

use clap::Args;

/// Where sessions' workspaces are made, and whether they outlive their sessions.
#[derive(Debug, Clone, Args)]
pub struct WorkspaceFlags {
    /// The folder the gateway makes sessions' workspaces in (`"workspace": {"kind":
    /// "scratch"}`: an empty folder of the session's own), created when first needed.
    #[arg(
        long,
        env = "ACP_GATEWAY_WORKSPACE_DIR",
        default_value = "acp-gateway-workspaces",
        global = true
    )]
    pub workspace_dir: PathBuf,

    /// Keep a session's workspace when the session is deleted (removed by default).
    #[arg(long, env = "ACP_GATEWAY_KEEP_WORKSPACES", global = true)]
    pub keep_workspaces: bool,

    /// The git command worktree workspaces, diffs and checkpoints run; without one, the
    /// gateway serves scratch workspaces and their files only.
    #[arg(long, env = "ACP_GATEWAY_GIT", default_value = "git", global = true)]
    pub git: PathBuf,
}
