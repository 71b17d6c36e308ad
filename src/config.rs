//! Configuration (clap derive): every flag also reads an `ACP_GATEWAY_*` variable and a key of
//! the optional `--config` TOML file (`file`), in that order of precedence. The agents
//! (`--agent`, the file's `[agents.NAME]` tables) are read in `agents`, into the types of
//! `agent`; a tenant's own limits (`[tenants.NAME]`) in `tenants`.

mod access;
mod agent;
mod agents;
mod file;
mod flags;
mod install_flags;
mod keep;
mod oidc;
mod tenant_env;
mod tenants;
mod vars;
mod webhook_flags;
mod workspace_flags;

pub use access::{AccessFlags, McpServers};
pub use agent::{AgentSpec, DEFAULT_AGENT, FileAgent, valid_agent_name};
pub use flags::{AgentsCommand, Command, Config, LogFormat, PermissionPolicy};
pub use install_flags::InstallFlags;
pub use keep::KeepFlags;
pub use oidc::OidcFlags;
pub use tenant_env::{TenantEnv, TenantProvider};
pub use tenants::{TenantFlags, TenantLimits, WhoAnswers};
pub use webhook_flags::WebhookFlags;
pub use workspace_flags::WorkspaceFlags;
