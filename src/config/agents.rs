//! The named agents of a configuration: `--agent NAME=CMD ARGS` (repeatable), the single
//! `--agent "CMD ARGS"` (the agent named `default`) and the `[agents.NAME]` tables of the
//! `--config` file, each completed by the global agent flags into an [`AgentSpec`]; which one is
//! the default; and `${VAR}` references in `auth-meta`, resolved from the environment so that
//! keys stay out of the file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

use super::Config;
use crate::acp::AgentCommand;

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
}

/// A `[agents.NAME]` table of the `--config` file, as written (nothing resolved yet). Keys are
/// spelled with `-` or `_`, like the file's other keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileAgent {
    #[serde(skip)]
    pub name: String,
    pub command: String,
    pub pool_size: Option<u16>,
    pub env: Option<BTreeMap<String, String>>,
    pub cwd: Option<PathBuf>,
    pub auth_method: Option<String>,
    /// Any table; string values may hold `${VAR}` references.
    pub auth_meta: Option<toml::Table>,
    pub max_sessions: Option<usize>,
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
        out.insert("command".into(), self.command.clone().into());
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

/// `NAME=CMD ARGS` → `(NAME, CMD ARGS)` when the value starts with a valid name immediately
/// followed by `=` and something; `None` for a plain command line.
fn split_named(value: &str) -> Option<(&str, &str)> {
    let (name, rest) = value.split_once('=')?;
    (valid_agent_name(name) && !rest.trim().is_empty()).then_some((name, rest))
}

impl Config {
    /// Every configured agent, in a stable order (the default one first, then the others by
    /// name), and the default's name. Errors: none configured; a name used twice; a bad name
    /// (names: `[a-z0-9][a-z0-9_-]{0,62}`); `--default-agent` naming an unknown agent; an unset
    /// environment variable referenced by `auth-meta`.
    pub fn agents(&self) -> anyhow::Result<(Vec<AgentSpec>, String)> {
        self.agents_with(|name| std::env::var(name).ok())
    }

    /// [`Config::agents`] with `${VAR}` references looked up by `env`.
    pub fn agents_with(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<(Vec<AgentSpec>, String)> {
        let mut specs: Vec<AgentSpec> = Vec::new();
        let mut plain: Option<&str> = None;
        for value in &self.agent {
            let (name, line) = match split_named(value) {
                Some(named) => named,
                None => {
                    if let Some(first) = plain {
                        anyhow::bail!(
                            "--agent is given two plain command lines ({first:?} and {value:?}): only one agent may go unnamed (it is named {DEFAULT_AGENT:?}); name the others, --agent NAME=\"CMD ARGS\""
                        );
                    }
                    plain = Some(value);
                    (DEFAULT_AGENT, value.as_str())
                }
            };
            let command = AgentCommand::parse(line)
                .with_context(|| format!("cannot parse --agent {value:?}"))?;
            self.add(&mut specs, self.spec(name, command))?;
        }
        for file in &self.file_agents {
            let at = format!("[agents.{}] of --config", file.name);
            anyhow::ensure!(
                valid_agent_name(&file.name),
                "{at}: {:?} is not a valid agent name (lowercase letters, digits, `-` and `_`, starting with a letter or digit, at most 63 characters)",
                file.name
            );
            let command = AgentCommand::parse(&file.command)
                .with_context(|| format!("{at}: cannot parse command {:?}", file.command))?;
            let mut spec = self.spec(&file.name, command);
            if let Some(env) = &file.env {
                spec.command.env = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            }
            if let Some(cwd) = &file.cwd {
                spec.command.cwd = Some(cwd.clone());
            }
            if let Some(n) = file.pool_size {
                anyhow::ensure!(
                    (1..=256).contains(&n),
                    "{at}: pool-size must be 1 to 256, not {n}"
                );
                spec.pool_size = n.into();
            }
            if file.auth_method.is_some() {
                spec.auth_method = file.auth_method.clone();
            }
            if let Some(meta) = &file.auth_meta {
                anyhow::ensure!(
                    spec.auth_method.is_some(),
                    "{at}: auth-meta is sent with `authenticate`, which needs auth-method (or --agent-auth-method)"
                );
                let mut meta = serde_json::to_value(meta).context("auth-meta")?;
                resolve(&mut meta, &env).with_context(|| format!("{at}: auth-meta"))?;
                spec.auth_meta = Some(meta);
            }
            spec.max_sessions = file.max_sessions.unwrap_or(0);
            self.add(&mut specs, spec)?;
        }
        let names = || {
            let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            names.sort_unstable();
            names.join(", ")
        };
        let default = match &self.default_agent {
            Some(name) => {
                anyhow::ensure!(
                    specs.iter().any(|s| &s.name == name),
                    "--default-agent {name:?} is not a configured agent; the agents are: {}",
                    names()
                );
                name.clone()
            }
            None if specs.len() == 1 => specs[0].name.clone(),
            None if specs.iter().any(|s| s.name == DEFAULT_AGENT) => DEFAULT_AGENT.to_owned(),
            None if specs.is_empty() => anyhow::bail!(
                "no agent configured: pass --agent \"CMD ARGS\" (or ACP_GATEWAY_AGENT), --agent NAME=\"CMD ARGS\", or [agents.NAME] tables in the --config file"
            ),
            None => anyhow::bail!(
                "several agents are configured ({}) and none is named {DEFAULT_AGENT:?}: say which one serves requests that name none with --default-agent NAME",
                names()
            ),
        };
        specs.sort_by(|a, b| (a.name != default, &a.name).cmp(&(b.name != default, &b.name)));
        Ok((specs, default))
    }

    /// An agent's spec from the global flags alone.
    fn spec(&self, name: &str, mut command: AgentCommand) -> AgentSpec {
        command.env = self.agent_env.clone();
        command.cwd = self.agent_cwd.clone();
        command.max_line_bytes = self.max_line_bytes;
        AgentSpec {
            name: name.to_owned(),
            command,
            pool_size: self.pool_size.into(),
            auth_method: self.agent_auth_method.clone(),
            auth_meta: None,
            max_sessions: 0,
        }
    }

    fn add(&self, specs: &mut Vec<AgentSpec>, spec: AgentSpec) -> anyhow::Result<()> {
        anyhow::ensure!(
            !specs.iter().any(|s| s.name == spec.name),
            "the agent name {:?} is used twice (--agent values and the [agents.NAME] tables of --config share one set of names)",
            spec.name
        );
        specs.push(spec);
        Ok(())
    }
}

/// Replaces every `${NAME}` in the strings of `value` (not in its keys) by the environment
/// variable NAME.
fn resolve(value: &mut Value, env: &impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
    match value {
        Value::String(s) => *s = substitute(s, env)?,
        Value::Array(items) => items.iter_mut().try_for_each(|v| resolve(v, env))?,
        Value::Object(map) => map.values_mut().try_for_each(|v| resolve(v, env))?,
        _ => {}
    }
    Ok(())
}

fn substitute(text: &str, env: &impl Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name = after
            .find('}')
            .map(|end| &after[..end])
            .filter(|n| is_variable_name(n))
            // A typo must not send `${OPENAI_API_KEY` as the key.
            .context("`${` must be followed by an environment variable's name and `}`")?;
        let value =
            env(name).with_context(|| format!("the environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[name.len() + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_variable_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests;
