//! The named agents of a configuration ([`Config::agents`]): `--agent NAME=CMD ARGS`
//! (repeatable), the single `--agent "CMD ARGS"` (the agent named `default`) and the
//! `[agents.NAME]` tables of the `--config` file, each completed by the global agent flags into
//! an [`AgentSpec`] (`agent.rs` holds those types); which one is the default; and `${VAR}`
//! references in `auth-meta`, resolved from the environment so that keys stay out of the file.

use anyhow::Context;
use serde_json::Value;

use super::agent::{AgentSpec, DEFAULT_AGENT, valid_agent_name};
use super::flags::Config;
use super::vars::substitute;
use crate::agent_rpc::AgentCommand;

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
        // An empty value names no agent: how a deployment clears an image's default
        // `ACP_GATEWAY_AGENT` when its agents are `[agents.NAME]` tables.
        for value in self.agent.iter().filter(|v| !v.trim().is_empty()) {
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
            let spec = match remote_urls(line) {
                Some(urls) => self
                    .spec(name, AgentCommand::default())
                    .reached_at(urls, None, None)?,
                None => {
                    let command = AgentCommand::parse(line)
                        .with_context(|| format!("cannot parse --agent {value:?}"))?;
                    self.spec(name, command)
                }
            };
            self.add(&mut specs, spec)?;
        }
        for file in &self.file_agents {
            let at = format!("[agents.{}] of --config", file.name);
            anyhow::ensure!(
                valid_agent_name(&file.name),
                "{at}: {:?} is not a valid agent name (lowercase letters, digits, `-` and `_`, starting with a letter or digit, at most 63 characters)",
                file.name
            );
            let mut spec = match (&file.command, &file.url) {
                (Some(command), None) => {
                    let command = AgentCommand::parse(command)
                        .with_context(|| format!("{at}: cannot parse command {command:?}"))?;
                    self.spec(&file.name, command)
                }
                (None, Some(urls)) => {
                    let urls = urls.all();
                    let bad = urls
                        .iter()
                        .find(|u| remote_urls(u).is_none_or(|u| u.len() != 1));
                    anyhow::ensure!(
                        bad.is_none() && !urls.is_empty(),
                        "{at}: url must start with ws://, wss://, http:// or https://, not {bad:?}"
                    );
                    let token = file.token.as_deref().map(|t| substitute(t, &env));
                    let token = token.transpose().with_context(|| format!("{at}: token"))?;
                    let spec = self.spec(&file.name, AgentCommand::default());
                    spec.reached_at(urls, token, file.heartbeat)?
                }
                _ => anyhow::bail!(
                    "{at}: give either command (an agent the gateway runs) or url (one it reaches over ACP's HTTP or WebSocket transport)"
                ),
            };
            anyhow::ensure!(
                spec.remote.is_empty() || (file.env.is_none() && file.cwd.is_none()),
                "{at}: env and cwd are for an agent the gateway runs, not one given by url"
            );
            anyhow::ensure!(
                !spec.remote.is_empty() || (file.token.is_none() && file.heartbeat.is_none()),
                "{at}: token and heartbeat are for an agent given by url"
            );
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
        for spec in &mut specs {
            self.otel_env(spec, &env)?;
        }
        Ok((specs, default))
    }

    /// `--agent-otel`: the agent's process exports to the gateway's collector, under a name of
    /// its own; without it, none of the gateway's `OTEL_*` variables reach it.
    fn otel_env(
        &self,
        spec: &mut AgentSpec,
        env: &impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<()> {
        let command = &mut spec.command;
        if !self.agent_otel {
            let otel: Vec<String> = std::env::vars_os()
                .filter_map(|(k, _)| k.into_string().ok())
                .filter(|k| k.starts_with("OTEL_"))
                .filter(|k| !command.env.iter().any(|(own, _)| own == k))
                .collect();
            command.env_remove.extend(otel);
            return Ok(());
        }
        let endpoint = self
            .otlp_endpoint
            .clone()
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .filter(|e| !e.is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--agent-otel needs a collector: --otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT"
                )
            })?;
        for (key, value) in [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
            ("OTEL_SERVICE_NAME", format!("acp-agent-{}", spec.name)),
        ] {
            if !command.env.iter().any(|(own, _)| own == key) {
                command.env.push((key.to_owned(), value));
            }
        }
        Ok(())
    }

    /// An agent's spec from the global flags alone.
    /// An agent installed from the registry, run as a configured one is (`--agent-env` and
    /// `--agent-cwd`, the pool size, the auth method), its install's environment over
    /// `--agent-env`.
    pub fn installed_agent(&self, name: &str, command: AgentCommand) -> AgentSpec {
        let own = command.env.clone();
        let mut spec = self.spec(name, command);
        spec.command
            .env
            .retain(|(k, _)| own.iter().all(|(o, _)| o != k));
        spec.command.env.extend(own);
        if let Err(e) = self.otel_env(&mut spec, &|name: &str| std::env::var(name).ok()) {
            tracing::warn!(agent = %name, error = %e, "the installed agent's telemetry variables");
        }
        spec
    }

    fn spec(&self, name: &str, mut command: AgentCommand) -> AgentSpec {
        command.env = self.agent_env.clone();
        command.cwd = self.agent_cwd.clone();
        command.max_line_bytes = self.max_line_bytes;
        // None of the gateway's own settings (its keys, its database URL) reach an agent, which
        // runs tools on a prompt's say; its own `env` still sets any variable.
        command.env_remove = gateway_variables();
        AgentSpec {
            name: name.to_owned(),
            command,
            pool_size: self.pool_size.into(),
            auth_method: self.agent_auth_method.clone(),
            auth_meta: None,
            max_sessions: 0,
            remote: Vec::new(),
            remote_token: None,
        }
    }

    fn add(&self, specs: &mut Vec<AgentSpec>, mut spec: AgentSpec) -> anyhow::Result<()> {
        // A member for each host, at least.
        spec.pool_size = spec.pool_size.max(spec.remote.len());
        anyhow::ensure!(
            !specs.iter().any(|s| s.name == spec.name),
            "the agent name {:?} is used twice (--agent values and the [agents.NAME] tables of --config share one set of names)",
            spec.name
        );
        specs.push(spec);
        Ok(())
    }
}

/// The URLs of an agent reached over ACP's network transport (`ws://`, `wss://`, `http://`,
/// `https://`), when every word of `line` is one.
fn remote_urls(line: &str) -> Option<Vec<String>> {
    let is_url = |word: &&str| {
        ["ws://", "wss://", "http://", "https://"]
            .iter()
            .any(|scheme| word.starts_with(scheme))
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    (!words.is_empty() && words.iter().all(is_url))
        .then(|| words.into_iter().map(str::to_owned).collect())
}

impl AgentSpec {
    /// The agent is reached at `urls` (each the endpoint itself): each member is the gateway's
    /// own bridge to one of them (`acp-gateway connect --once --exact-url --max-line-bytes N`, the
    /// agent's limit on a message from it, the URL last; members take the URLs in turn, and there
    /// is at least one per URL), a child process like a local agent's, which exits when its
    /// connection drops (or falls silent past two heartbeats). It is sent `token` as its
    /// bearer (`ACP_GATEWAY_CONNECT_TOKEN`), and, as any agent, none of the gateway's own
    /// `ACP_GATEWAY_*` settings (its keys among them).
    fn reached_at(
        mut self,
        urls: Vec<String>,
        token: Option<String>,
        heartbeat: Option<u64>,
    ) -> anyhow::Result<Self> {
        let heartbeat = heartbeat.unwrap_or(REMOTE_HEARTBEAT);
        anyhow::ensure!(heartbeat > 0, "heartbeat must be 1 second or more");
        let heartbeat = heartbeat.to_string();
        let max_line_bytes = self.command.max_line_bytes.to_string();
        let exe = std::env::current_exe()
            .context("the gateway's own executable, which bridges to a remote agent")?;
        let command = &mut self.command;
        command.program = exe.to_string_lossy().into_owned();
        let args = [
            "connect",
            "--once",
            "--exact-url",
            "--heartbeat",
            &heartbeat,
            "--max-line-bytes",
            &max_line_bytes,
            &urls[0],
        ];
        command.args = args.map(str::to_owned).into();
        command.env = token
            .clone()
            .map(|t| ("ACP_GATEWAY_CONNECT_TOKEN".to_owned(), t))
            .into_iter()
            .collect();
        command.cwd = None;
        // A gateway host asks for no `authenticate`; a table's own `auth-method` still applies.
        self.auth_method = None;
        self.remote = urls;
        self.remote_token = token;
        Ok(self)
    }
}

/// The gateway's own variables in its environment (`ACP_GATEWAY_*`).
fn gateway_variables() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("ACP_GATEWAY_"))
        .collect()
}

/// Seconds of silence from a remote agent before it is asked something (see
/// `acp-gateway connect --heartbeat`).
const REMOTE_HEARTBEAT: u64 = 10;

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

#[cfg(test)]
mod tests;
