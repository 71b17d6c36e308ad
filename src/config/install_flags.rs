//! The flags of the agents installed from an ACP registry (`--registry`, `--agents-dir`),
//! flattened into [`super::Config`].

use std::path::PathBuf;

use clap::Args;

/// Where agents are installed from and to.
#[derive(Debug, Clone, Args)]
pub struct InstallFlags {
    /// The ACP agent registry `GET /registry` lists and `POST /agents` installs from: a URL of
    /// its `registry.json` (the official one's by default), or a file (a copy or a mirror, for
    /// machines without internet).
    #[arg(
        long,
        env = "ACP_GATEWAY_REGISTRY",
        default_value = "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json",
        global = true
    )]
    pub registry: String,

    /// The folder installed agents are kept in (`NAME/VERSION/`), created when first needed.
    /// Each replica keeps its own and installs there what any replica installed.
    #[arg(
        long,
        env = "ACP_GATEWAY_AGENTS_DIR",
        default_value = "acp-gateway-agents",
        global = true
    )]
    pub agents_dir: PathBuf,
}
