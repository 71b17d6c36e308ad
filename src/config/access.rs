//! The flags of who may reach the gateway and what a caller may hand the agent
//! (`--allowed-host`, `--mcp-servers`), flattened into [`super::Config`].

use clap::{Args, ValueEnum};

/// Access settings besides the keys.
#[derive(Debug, Clone, Args)]
pub struct AccessFlags {
    /// A name the gateway answers to besides loopback addresses and `localhost` (repeatable):
    /// `gw.example.com`, `.example.com` (the name and every subdomain), or `*` (any). Without API
    /// keys a request whose `Host` is none of these is refused (403), so that no web page can
    /// reach a gateway on loopback through DNS rebinding; with keys, only when this is set.
    #[arg(
        long = "allowed-host",
        env = "ACP_GATEWAY_ALLOWED_HOSTS",
        value_delimiter = ',',
        global = true
    )]
    pub allowed_hosts: Vec<String>,

    /// Which `mcpServers` a create or fork may hand the agent: `any` (stdio servers are commands
    /// the agent runs on its host), `http` (only `http` and `sse` servers). Default: `any`
    /// without API keys, `http` with keys.
    #[arg(long, env = "ACP_GATEWAY_MCP_SERVERS", value_enum, global = true)]
    pub mcp_servers: Option<McpServers>,
}

/// What `--mcp-servers` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum McpServers {
    /// Every kind, `stdio` commands included.
    Any,
    /// Only servers reached over the network (`http`, `sse`).
    Http,
}

impl AccessFlags {
    /// The effective `--mcp-servers`, given whether API keys are configured.
    pub fn mcp_servers(&self, keyed: bool) -> McpServers {
        self.mcp_servers.unwrap_or(if keyed {
            McpServers::Http
        } else {
            McpServers::Any
        })
    }
}
