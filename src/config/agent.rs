//! One agent of a configuration: its name (the [`DEFAULT_AGENT`], [`valid_agent_name`]), a
//! `[agents.NAME]` table of the `--config` file as written ([`FileAgent`]), and what the gateway
//! runs, the flags applied ([`AgentSpec`]). `agents.rs` makes them from the flags and tables.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

use crate::agent_rpc::AgentCommand;

/// The name of the agent of a plain `--agent "CMD ARGS"`, and the default agent when several are
/// configured and `--default-agent` names none.
pub const DEFAULT_AGENT: &str = "default";

/// One agent the gateway runs: from `--agent NAME=CMD ARGS`, the single `--agent "CMD ARGS"`
/// (named `default`), or a `[agents.NAME]` table of the TOML file.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub name: String,
    /// Program, args, env, cwd and max line bytes set (global --agent-env/--agent-cwd apply to
    /// agents that set none of their own; --max-line-bytes to all).
    pub command: AgentCommand,
    /// Per-agent `pool-size`, else the global --pool-size.
    pub pool_size: usize,
    /// Per-agent `auth-method`, else the global --agent-auth-method.
    pub auth_method: Option<String>,
    /// `_meta` sent with `authenticate`, environment references resolved.
    pub auth_meta: Option<Value>,
    /// Most live sessions this agent holds at once (0: no limit).
    pub max_sessions: usize,
    /// The URLs of an agent reached over ACP's HTTP or WebSocket transport (its members bridge
    /// to them, in turn); empty for a command the gateway runs.
    pub remote: Vec<String>,
    /// The bearer token the remote side requires (`${VAR}` references resolved).
    pub remote_token: Option<String>,
}

/// A `[agents.NAME]` table of the `--config` file, as written (nothing resolved yet). Keys are
/// spelled with `-` or `_`, like the file's other keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileAgent {
    #[serde(skip)]
    pub name: String,
    /// What the gateway runs; or
    pub command: Option<String>,
    /// where it reaches the agent over ACP's network transport (one URL or several: its hosts),
    /// with
    pub url: Option<Urls>,
    /// the bearer token the remote side requires (`${VAR}` references resolved), and
    pub token: Option<String>,
    /// the seconds of its silence after which it is asked something (as long again without
    /// an answer and the connection counts as dropped; default 10).
    pub heartbeat: Option<u64>,
    pub pool_size: Option<u16>,
    pub env: Option<BTreeMap<String, String>>,
    pub cwd: Option<PathBuf>,
    pub auth_method: Option<String>,
    /// Any table; string values may hold `${VAR}` references.
    pub auth_meta: Option<toml::Table>,
    pub max_sessions: Option<usize>,
}

/// One URL, or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Urls {
    One(String),
    Several(Vec<String>),
}

impl Urls {
    pub(super) fn all(&self) -> Vec<String> {
        match self {
            Urls::One(url) => vec![url.clone()],
            Urls::Several(urls) => urls.clone(),
        }
    }
}

impl FileAgent {
    /// The `agents` table of a `--config` file: one [`FileAgent`] per sub-table.
    pub(super) fn parse_all(value: toml::Value) -> anyhow::Result<Vec<FileAgent>> {
        let toml::Value::Table(tables) = value else {
            anyhow::bail!("agents must be a table of [agents.NAME] tables");
        };
        tables
            .into_iter()
            .map(|(name, table)| {
                let toml::Value::Table(table) = table else {
                    anyhow::bail!("agents.{name} must be a table ([agents.{name}])");
                };
                // `pool_size` as well as `pool-size`, as for the file's other keys; the keys of
                // `env` and `auth-meta` stay as written.
                let table: toml::Table = table
                    .into_iter()
                    .map(|(k, v)| (k.replace('_', "-"), v))
                    .collect();
                let mut agent: FileAgent = toml::Value::Table(table)
                    .try_into()
                    .with_context(|| format!("[agents.{name}]"))?;
                agent.name = name;
                Ok(agent)
            })
            .collect()
    }

    /// The table for the log: the environment's values and every `auth-meta` string redacted.
    pub(super) fn shown(&self) -> String {
        let mut out = serde_json::Map::new();
        if let Some(command) = &self.command {
            out.insert("command".into(), command.clone().into());
        }
        if let Some(urls) = &self.url {
            let shown: Vec<String> = urls.all().iter().map(|u| crate::redact::url(u)).collect();
            out.insert("url".into(), shown.into());
        }
        if self.token.is_some() {
            out.insert("token".into(), REDACTED.into());
        }
        if let Some(n) = self.heartbeat {
            out.insert("heartbeat".into(), n.into());
        }
        if let Some(n) = self.pool_size {
            out.insert("pool-size".into(), n.into());
        }
        if let Some(env) = &self.env {
            let env = env.keys().map(|k| (k.clone(), REDACTED.into())).collect();
            out.insert("env".into(), Value::Object(env));
        }
        if let Some(cwd) = &self.cwd {
            out.insert("cwd".into(), cwd.display().to_string().into());
        }
        if let Some(m) = &self.auth_method {
            out.insert("auth-method".into(), m.clone().into());
        }
        if let Some(meta) = &self.auth_meta {
            let mut meta = serde_json::to_value(meta).unwrap_or_default();
            redact_strings(&mut meta);
            out.insert("auth-meta".into(), meta);
        }
        if let Some(n) = self.max_sessions {
            out.insert("max-sessions".into(), n.into());
        }
        Value::Object(out).to_string()
    }
}

const REDACTED: &str = "<redacted>";

fn redact_strings(value: &mut Value) {
    match value {
        Value::String(s) => *s = REDACTED.into(),
        Value::Array(items) => items.iter_mut().for_each(redact_strings),
        Value::Object(map) => map.values_mut().for_each(redact_strings),
        _ => {}
    }
}

/// Whether `name` can name an agent: `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn valid_agent_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}
