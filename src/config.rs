//! Command-line configuration (clap derive); every flag also reads an `ACP_GATEWAY_*` variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// HTTP + Server-Sent Events gateway in front of ACP coding agents.
#[derive(Debug, Clone, Parser)]
#[command(name = "acp-gateway", version, about)]
pub struct Config {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The agent command line, e.g. "npx -y @agentclientprotocol/claude-agent-acp".
    #[arg(long, env = "ACP_GATEWAY_AGENT", global = true)]
    pub agent: Option<String>,

    /// Number of agent processes in the pool.
    #[arg(long, env = "ACP_GATEWAY_POOL_SIZE", default_value_t = 1, global = true, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub pool_size: u16,

    /// Address to listen on.
    #[arg(
        long,
        env = "ACP_GATEWAY_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub listen: SocketAddr,

    /// Allow a non-loopback --listen address although no API keys exist yet: anyone who can
    /// reach the port can make the agent run tools on this host.
    #[arg(long, env = "ACP_GATEWAY_ALLOW_UNAUTHENTICATED", global = true)]
    pub allow_unauthenticated: bool,

    /// `postgres://…` for PostgreSQL, or an SQLite file (`sqlite:PATH` or a path), created on first run.
    #[arg(
        long,
        env = "ACP_GATEWAY_DATABASE_URL",
        default_value = "sqlite:acp-gateway.db",
        global = true
    )]
    pub database_url: String,

    /// Seconds to wait for upstream control calls (new, load, resume, list, delete, status, close).
    #[arg(
        long,
        env = "ACP_GATEWAY_CONTROL_TIMEOUT",
        default_value_t = 30,
        global = true
    )]
    pub control_timeout: u64,

    /// Seconds a starting agent has to answer `initialize` before it is killed and restarted.
    #[arg(
        long,
        env = "ACP_GATEWAY_INIT_TIMEOUT",
        default_value_t = 60,
        global = true
    )]
    pub init_timeout: u64,

    /// Largest accepted request body in bytes (larger → 413).
    #[arg(long, env = "ACP_GATEWAY_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024, global = true)]
    pub max_body_bytes: usize,

    /// Log format.
    #[arg(long, env = "ACP_GATEWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty, global = true)]
    pub log_format: LogFormat,
}

/// Operator subcommands; without one the gateway serves.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve HTTP (the default).
    Serve,
    /// Apply the database migrations and exit.
    Migrate,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

impl Config {
    pub fn control_timeout(&self) -> Duration {
        Duration::from_secs(self.control_timeout)
    }
    pub fn init_timeout(&self) -> Duration {
        Duration::from_secs(self.init_timeout)
    }
}
