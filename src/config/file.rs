//! The `--config` TOML file: its keys as the flags they name (flags and `ACP_GATEWAY_*`
//! variables take precedence), and its tables of agents and tenants.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory};

use clap::FromArgMatches;

use super::agent::FileAgent;
use super::flags::{Config, effective};
use super::tenants::{TenantFlags, TenantLimits};

impl Config {
    /// [`Config::load`] from the given arguments (the first is the program name).
    pub fn load_from(
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> anyhow::Result<Config> {
        let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let first = Config::command().try_get_matches_from(&args)?;
        let mut tables = Tables::default();
        if let Some(path) = first.get_one::<PathBuf>("config") {
            let file;
            (file, tables) = file_args(path, &first)?;
            args.extend(file);
        }
        let matches = Config::command().try_get_matches_from(&args)?;
        let mut config = Config::from_arg_matches(&matches)?;
        config.effective = effective(&matches);
        config.effective.extend(
            tables
                .agents
                .iter()
                .map(|a| (format!("agents.{}", a.name), a.shown())),
        );
        config.file_agents = tables.agents;
        config.tenants.own = tables.tenants;
        config.effective.extend(config.tenants.shown());
        Ok(config)
    }
}

/// The tables of a `--config` file that are not settings of a flag.
#[derive(Default)]
pub(super) struct Tables {
    /// `[agents.NAME]`, which add to the `--agent` flags.
    pub(super) agents: Vec<FileAgent>,
    /// `[tenants.NAME]`, a tenant's own limits.
    pub(super) tenants: BTreeMap<String, TenantLimits>,
}

/// The settings of a `--config` file as arguments, leaving out those the command line or the
/// environment already set; and its [`Tables`].
pub(super) fn file_args(
    path: &Path,
    given: &ArgMatches,
) -> anyhow::Result<(Vec<OsString>, Tables)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --config {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("--config {}", path.display()))?;
    let command = Config::command();
    let mut out = Vec::new();
    let mut tables = Tables::default();
    for (key, value) in table {
        let context = || format!("--config {}", path.display());
        match key.as_str() {
            "agents" => {
                tables.agents = FileAgent::parse_all(value).with_context(context)?;
                continue;
            }
            "tenants" => {
                tables.tenants = TenantFlags::parse_tables(value).with_context(context)?;
                continue;
            }
            _ => {}
        }
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .with_context(|| {
                format!(
                    "--config {}: unknown setting {key:?} (the keys are the long flag names of --help)",
                    path.display()
                )
            })?;
        if matches!(
            given.value_source(arg.get_id().as_str()),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let values = match value {
            toml::Value::Array(items) => items,
            one => vec![one],
        };
        for value in values {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Boolean(b) if matches!(arg.get_action(), ArgAction::SetTrue) => {
                    if b {
                        out.push(format!("--{long}").into());
                    }
                    continue;
                }
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => anyhow::bail!(
                    "--config {}: {key} must be a string, number or boolean, not {}",
                    path.display(),
                    other.type_str()
                ),
            };
            out.push(format!("--{long}={text}").into());
        }
    }
    Ok((out, tables))
}
