//! The flags themselves: [`Config`], every flag of the gateway (clap derive), its subcommands,
//! and which flags a run set and where each value came from ([`effective`]).
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::access::AccessFlags;
use super::agent;
use super::install_flags::InstallFlags;
use super::keep::KeepFlags;
use super::oidc::OidcFlags;
use super::tenants::TenantFlags;
use super::webhook_flags::WebhookFlags;
use super::workspace_flags::WorkspaceFlags;
use clap::{ArgMatches, CommandFactory, Parser, Subcommand, ValueEnum};

/// HTTP + Server-Sent Events gateway in front of ACP coding agents.
#[derive(Debug, Clone, Parser)]
#[command(name = "acp-gateway", version, about)]
pub struct Config {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// A TOML file of settings: the long flag names as keys (`pool-size = 2`,
    /// `api-key = ["alice:…"]`). Flags and `ACP_GATEWAY_*` variables take precedence.
    #[arg(long, env = "ACP_GATEWAY_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Every setting and where it came from, secrets redacted (logged at start).
    #[arg(skip)]
    pub effective: Vec<(String, String)>,

    /// An agent to run (repeatable): `NAME=CMD ARGS`, or a plain command line, e.g.
    /// "npx -y @agentclientprotocol/claude-agent-acp", which is the agent named `default`.
    /// More, with settings of their own, as `[agents.NAME]` tables of the --config file.
    #[arg(long, env = "ACP_GATEWAY_AGENT", global = true)]
    pub agent: Vec<String>,

    /// The agent that serves requests naming none (required with several agents, unless one is
    /// named `default`).
    #[arg(long, env = "ACP_GATEWAY_DEFAULT_AGENT", global = true)]
    pub default_agent: Option<String>,

    /// The `[agents.NAME]` tables of the --config file, as written.
    #[arg(skip)]
    pub file_agents: Vec<agent::FileAgent>,

    /// Extra environment for the agent processes, `KEY=VALUE` (repeatable).
    #[arg(long = "agent-env", env = "ACP_GATEWAY_AGENT_ENV", value_delimiter = ',', value_parser = parse_key_value, global = true)]
    pub agent_env: Vec<(String, String)>,

    /// Working directory of the agent processes (default: the gateway's).
    #[arg(long, env = "ACP_GATEWAY_AGENT_CWD", global = true)]
    pub agent_cwd: Option<PathBuf>,

    /// Authenticate every member with this `authMethods[].id` right after `initialize`.
    #[arg(long, env = "ACP_GATEWAY_AGENT_AUTH_METHOD", global = true)]
    pub agent_auth_method: Option<String>,

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

    /// A tenant's API key, `TENANT:KEY`, or one person's, `TENANT/USER:KEY` (repeatable; at
    /// least 16 characters of key). With any
    /// key configured, every route but /healthz, /readyz, /docs and /openapi.json needs
    /// `Authorization: Bearer KEY` (SSE and WebSocket routes also take `?access_token=KEY`).
    #[arg(
        long = "api-key",
        env = "ACP_GATEWAY_API_KEYS",
        value_delimiter = ',',
        global = true
    )]
    pub api_keys: Vec<String>,

    /// An admin API key (repeatable): sees and manages every tenant's sessions.
    #[arg(
        long = "admin-api-key",
        env = "ACP_GATEWAY_ADMIN_API_KEYS",
        value_delimiter = ',',
        global = true
    )]
    pub admin_api_keys: Vec<String>,

    /// A file of API keys, one `TENANT:KEY` or `TENANT/USER:KEY` per line (`*:KEY` for an admin
    /// key; `#` comments).
    #[arg(long, env = "ACP_GATEWAY_API_KEYS_FILE", global = true)]
    pub api_keys_file: Option<PathBuf>,

    /// A directory sessions must work in (repeatable): `cwd` and `additionalDirectories` must
    /// lie inside one of them, symlinks resolved (else 422). None: any absolute path.
    #[arg(
        long = "workspace-root",
        env = "ACP_GATEWAY_WORKSPACE_ROOTS",
        value_delimiter = ',',
        global = true
    )]
    pub workspace_roots: Vec<PathBuf>,

    /// Requests per second each tenant may make (burst of the same size; 0: no limit); beyond
    /// it, 429 with Retry-After.
    #[arg(
        long,
        env = "ACP_GATEWAY_RATE_LIMIT",
        default_value_t = 0,
        global = true
    )]
    pub rate_limit: u32,

    /// Requests each tenant may have in flight at once, waiting prompts included (0: no limit).
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_CONCURRENT_REQUESTS",
        default_value_t = 0,
        global = true
    )]
    pub max_concurrent_requests: usize,

    /// Open SSE streams each tenant may hold (0: no limit).
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_STREAMS",
        default_value_t = 0,
        global = true
    )]
    pub max_streams: usize,

    /// Seconds a request may take, streams and waiting prompts excepted (0: no limit); then 504.
    #[arg(
        long,
        env = "ACP_GATEWAY_REQUEST_TIMEOUT",
        default_value_t = 60,
        global = true
    )]
    pub request_timeout: u64,

    /// A browser origin allowed to call the gateway (repeatable), e.g. `https://app.example.com`.
    #[arg(
        long = "cors-origin",
        env = "ACP_GATEWAY_CORS_ORIGINS",
        value_delimiter = ',',
        global = true
    )]
    pub cors_origins: Vec<String>,

    /// Allow a non-loopback --listen address without API keys: anyone who can reach the port can
    /// make the agent run tools on this host.
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

    /// Seconds a request that needs an agent member waits for one that is starting or
    /// restarting to become ready, before 503 (0: no wait).
    #[arg(
        long,
        env = "ACP_GATEWAY_ACQUIRE_TIMEOUT",
        default_value_t = 5,
        global = true
    )]
    pub acquire_timeout: u64,

    /// Seconds a starting agent has to answer `initialize` before it is killed and restarted.
    #[arg(
        long,
        env = "ACP_GATEWAY_INIT_TIMEOUT",
        default_value_t = 60,
        global = true
    )]
    pub init_timeout: u64,

    /// Seconds to wait after `session/cancel` for the turn to end before restarting its member.
    #[arg(
        long,
        env = "ACP_GATEWAY_CANCEL_GRACE",
        default_value_t = 5,
        global = true
    )]
    pub cancel_grace: u64,

    /// Seconds a permission request or an elicitation may wait for an answer before it fails
    /// closed (a `reject_*` option; an elicitation is declined) (0: forever).
    #[arg(
        long,
        env = "ACP_GATEWAY_PERMISSION_TIMEOUT",
        default_value_t = 300,
        global = true
    )]
    pub permission_timeout: u64,

    /// Requests of one session that may wait for a client at once (permission requests and
    /// elicitations together); an agent asking for more is answered at once with a JSON-RPC
    /// error, counted as garbage (0: no limit).
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_PENDING_REQUESTS",
        default_value_t = 64,
        global = true
    )]
    pub max_pending_requests: usize,

    /// Prompts that may wait in one session's queue (`Prefer: queue`); past it 429.
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_QUEUED_PROMPTS",
        default_value_t = 16,
        value_parser = clap::value_parser!(u64).range(1..=10_000),
        global = true
    )]
    pub max_queued_prompts: u64,

    /// `session/update`s one session's agent may send from the start of a turn to the start of
    /// the next; beyond it they are dropped, counted as garbage and warned of once (0: no limit).
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_UPDATES_PER_TURN",
        default_value_t = 100_000,
        global = true
    )]
    pub max_updates_per_turn: u64,

    /// How permission requests are answered: by a client (`ask`), or at once (`allow`, `reject`;
    /// elicitations are then declined at once).
    #[arg(long, env = "ACP_GATEWAY_PERMISSION_POLICY", value_enum, default_value_t = PermissionPolicy::Ask, global = true)]
    pub permission_policy: PermissionPolicy,

    /// Live sessions one member may hold (0: no limit); beyond it, 503 with Retry-After.
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_SESSIONS_PER_MEMBER",
        default_value_t = 0,
        global = true
    )]
    pub max_sessions_per_member: usize,

    /// Live sessions the whole pool may hold (0: no limit); beyond it, 503 with Retry-After.
    #[arg(
        long,
        env = "ACP_GATEWAY_MAX_SESSIONS",
        default_value_t = 0,
        global = true
    )]
    pub max_sessions: usize,

    /// Seconds after which an idle live session is closed, when the agent supports
    /// `session/close` (0: never).
    #[arg(
        long,
        env = "ACP_GATEWAY_IDLE_TIMEOUT",
        default_value_t = 1800,
        global = true
    )]
    pub idle_timeout: u64,

    /// Seconds between syncs of the session cache with the agent's `session/list` (when the
    /// agent lists sessions). The cache is also synced at start and on
    /// `GET /sessions?refresh=true`. 0: only then.
    #[arg(
        long,
        env = "ACP_GATEWAY_SYNC_INTERVAL",
        default_value_t = 60,
        global = true
    )]
    pub sync_interval: u64,

    /// The URL other replicas reach this one at, as registered in the shared database.
    /// Default: `http://` + the address the listener is bound to.
    #[arg(long, env = "ACP_GATEWAY_ADVERTISE_URL", global = true)]
    pub advertise_url: Option<String>,

    /// Seconds between this replica's heartbeats in the shared database; a replica silent for
    /// three intervals is shown as not live.
    #[arg(
        long,
        env = "ACP_GATEWAY_HEARTBEAT_INTERVAL",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..),
        global = true
    )]
    pub heartbeat_interval: u64,

    /// Seconds that shutdown gives running turns and live sessions to cancel and close before
    /// the agent processes are terminated.
    #[arg(
        long,
        env = "ACP_GATEWAY_SHUTDOWN_TIMEOUT",
        default_value_t = 10,
        global = true
    )]
    pub shutdown_timeout: u64,

    /// Seconds a client may leave a write to its connection unread before the connection is
    /// closed (an event stream so cut resumes with `Last-Event-ID`); 0: never.
    #[arg(
        long,
        env = "ACP_GATEWAY_STALL_TIMEOUT",
        default_value_t = 30,
        global = true
    )]
    pub stall_timeout: u64,

    /// Longest line accepted from an agent, in bytes; longer lines are dropped and counted.
    #[arg(long, env = "ACP_GATEWAY_MAX_LINE_BYTES", default_value_t = 64 * 1024 * 1024, global = true)]
    pub max_line_bytes: usize,

    /// Largest accepted request body in bytes (larger → 413).
    #[arg(long, env = "ACP_GATEWAY_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024, global = true)]
    pub max_body_bytes: usize,

    #[command(flatten)]
    pub keep: KeepFlags,

    #[command(flatten)]
    pub access: AccessFlags,

    #[command(flatten)]
    pub oidc: OidcFlags,

    #[command(flatten)]
    pub tenants: TenantFlags,

    #[command(flatten)]
    pub webhooks: WebhookFlags,

    #[command(flatten)]
    pub workspaces: WorkspaceFlags,

    #[command(flatten)]
    pub installs: InstallFlags,

    /// An OTLP collector to export traces to (HTTP/protobuf, `URL/v1/traces`), as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` does; the other `OTEL_*` variables apply.
    #[arg(long, env = "ACP_GATEWAY_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,

    /// The agents export their own telemetry to the gateway's collector: their processes get
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL` and `OTEL_SERVICE_NAME`
    /// (`acp-agent-NAME`) unless their own environment sets them. Without it, the gateway's
    /// `OTEL_*` variables are not passed on to them.
    #[arg(long, env = "ACP_GATEWAY_AGENT_OTEL", global = true)]
    pub agent_otel: bool,

    /// Log format.
    #[arg(long, env = "ACP_GATEWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty, global = true)]
    pub log_format: LogFormat,
}

/// Operator subcommands; without one the gateway serves.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve HTTP (the default).
    Serve,
    /// Apply the database migrations and exit; with `--from` and `--to`, copy a whole store into
    /// a new one instead (SQLite to PostgreSQL and back): every session, event (with its id),
    /// state, webhook and its outbox, idempotency key, usage record and installed agent. Stop
    /// the gateways of the source first. A copy that stopped half-way is finished by running
    /// it again; a target with data of its own is refused.
    Migrate {
        /// The store to copy (a database URL as `--database-url` takes).
        #[arg(long, requires = "to")]
        from: Option<String>,
        /// The new store to copy it into.
        #[arg(long, requires = "from")]
        to: Option<String>,
    },
    /// Write a consistent copy of the SQLite store of `--database-url` to a new file, while the
    /// gateway serves it; restore it with `migrate --from sqlite:FILE --to URL`. (For
    /// PostgreSQL, use `pg_dump`: see docs/operations.md.)
    Backup {
        /// The file to write (it must not exist).
        #[arg(long)]
        to: std::path::PathBuf,
    },
    /// Start each configured agent once, initialize it (and authenticate it when it has an auth
    /// method), print its info and capabilities, and exit; non-zero naming each agent that cannot
    /// be used, with the reason.
    CheckAgent {
        /// Check only the agent of this name.
        #[arg(long)]
        only: Option<String>,
    },
    /// Change the agents installed from the registry in the gateway's database, which every
    /// replica runs: `acp-gateway agents add ID[@VERSION]`.
    Agents {
        #[command(subcommand)]
        action: AgentsCommand,
    },
    /// Bridge stdin/stdout to a gateway's ACP endpoint, for editors that launch agents as
    /// commands: `acp-gateway connect https://gw.example/acp --api-key KEY` (here `--api-key`
    /// is the key itself, sent as `Authorization: Bearer`). Reconnects and resumes the open
    /// sessions on its own. Over a WebSocket, `--max-line-bytes` caps a message (and a frame)
    /// from the other side: a larger one ends the connection.
    Connect {
        /// The gateway (`http(s)://` for HTTP/SSE, `ws(s)://` for a WebSocket); `/acp` is
        /// appended unless the path ends with it.
        url: String,
        /// Exit when the connection drops instead of connecting again (how a gateway runs its
        /// remote agents' members: its supervisor restarts them and resumes their sessions).
        #[arg(long)]
        once: bool,
        /// Seconds of silence from the other side after which it is asked something; as long
        /// again without an answer and the connection counts as dropped (0: never).
        #[arg(long, default_value_t = 0)]
        heartbeat: u64,
        /// The URL is the endpoint itself: `/acp` is not appended.
        #[arg(long)]
        exact_url: bool,
        /// The bearer token to send (else the last `--api-key`, taken as the key itself).
        #[arg(long, env = "ACP_GATEWAY_CONNECT_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

/// `acp-gateway agents …`.
#[derive(Debug, Clone, Subcommand)]
pub enum AgentsCommand {
    /// Install the registry's agent ID (at VERSION, else the registry's) under `--agents-dir`
    /// and record it; the gateways using the database start it within seconds.
    Add {
        /// `ID` or `ID@VERSION`.
        agent: String,
        /// The name sessions use for it (default: its id).
        #[arg(long)]
        name: Option<String>,
    },
    /// List the installed agents.
    List,
}

/// Who answers `session/request_permission`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PermissionPolicy {
    /// Keep the request pending until a client answers it (or it times out).
    Ask,
    /// Select an `allow_*` option at once (allow_once first).
    Allow,
    /// Select a `reject_*` option at once (reject_once first), else cancel.
    Reject,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Pretty,
    Json,
}

impl Config {
    /// Reads the command line, the environment and the `--config` file; exits with clap's
    /// message on a usage error (or after `--help`).
    pub fn load() -> anyhow::Result<Config> {
        match Self::load_from(std::env::args_os()) {
            Err(e) => match e.downcast::<clap::Error>() {
                Ok(clap_error) => clap_error.exit(),
                Err(e) => Err(e),
            },
            ok => ok,
        }
    }

    pub fn control_timeout(&self) -> Duration {
        Duration::from_secs(self.control_timeout)
    }
    pub fn init_timeout(&self) -> Duration {
        Duration::from_secs(self.init_timeout)
    }
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_secs(self.acquire_timeout)
    }
    /// `None` when the flag is 0.
    pub fn secs_or_never(secs: u64) -> Option<Duration> {
        (secs > 0).then(|| Duration::from_secs(secs))
    }
}

/// Every setting's value as given or defaulted, with API keys, the agents' environment values
/// and the credentials of every URL (the database's, an agent's, the OTLP endpoint) redacted (the `[agents.NAME]` tables are added by the caller).
pub(in crate::config) fn effective(matches: &ArgMatches) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for arg in Config::command().get_arguments() {
        let id = arg.get_id().as_str();
        let Some(values) = matches.get_raw(id) else {
            continue;
        };
        let values: Vec<String> = values.map(|v| v.to_string_lossy().into_owned()).collect();
        let shown = match id {
            "api_keys" | "admin_api_keys" => format!("<{} redacted>", values.len()),
            "agent_env" => values
                .iter()
                .map(|kv| format!("{}=<redacted>", kv.split('=').next().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(","),
            // Every other URL (an agent's, the OTLP endpoint, the issuer) without credentials.
            _ => crate::redact::text(&values.join(",")).into_owned(),
        };
        out.push((arg.get_long().unwrap_or(id).to_owned(), shown));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_settings_yield_to_flags_and_show_no_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(
            &path,
            r#"
pool-size = 3
listen = "127.0.0.1:9000"
allow_unauthenticated = true
api-key = ["alice:0123456789abcdef", "bob:fedcba9876543210"]
database-url = "postgres://gw:hunter2@db/acp"
agent-env = ["ANTHROPIC_API_KEY=sk-secret"]
"#,
        )
        .unwrap();
        let config = Config::load_from([
            "acp-gateway",
            "--config",
            path.to_str().unwrap(),
            "--pool-size",
            "2",
        ])
        .unwrap();
        assert_eq!(config.pool_size, 2, "the flag wins over the file");
        assert_eq!(config.listen.port(), 9000);
        assert!(config.allow_unauthenticated);
        assert_eq!(config.api_keys.len(), 2);
        assert_eq!(config.database_url, "postgres://gw:hunter2@db/acp");
        let shown = format!("{:?}", config.effective);
        for secret in ["0123456789abcdef", "hunter2", "sk-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        let get = |k: &str| {
            config
                .effective
                .iter()
                .find(|(n, _)| n == k)
                .unwrap()
                .1
                .clone()
        };
        assert_eq!(get("database-url"), "postgres://***@db/acp");
        assert_eq!(get("agent-env"), "ANTHROPIC_API_KEY=<redacted>");
        assert_eq!(get("pool-size"), "2");
    }

    #[test]
    fn unknown_file_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, "pool-sise = 2\n").unwrap();
        let err =
            Config::load_from(["acp-gateway", "--config", path.to_str().unwrap()]).unwrap_err();
        assert!(
            format!("{err:#}").contains("unknown setting \"pool-sise\""),
            "{err:#}"
        );
    }
}
