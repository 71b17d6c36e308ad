//! A tenant's own agent environment: the `[tenants.NAME.env]` table of the `--config` file,
//! whose values are text (with `${VAR}` replaced by the gateway's environment variable VAR) or
//! `{ file = "PATH" }` (the file's text, without its final newline), read once at start; and
//! its own LLM provider, `[tenants.NAME.provider]` (`id`, `api-type`, `base-url` and `headers`,
//! whose values are given as the environment's), set on its agent processes with ACP's
//! `providers/set`. Their values are secrets (a provider's key, an account's token): they reach
//! the tenant's agent processes and nothing else — never a log line, the effective
//! configuration or an answer.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;

use super::vars::substitute;

/// The variables, resolved. Shown with its names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TenantEnv(Vec<(String, String)>);

/// A value as the table gives it.
#[derive(Deserialize)]
#[serde(untagged)]
enum Given {
    Text(String),
    File { file: PathBuf },
}

impl TenantEnv {
    /// The table's variables, their values read from `env` (the gateway's environment) or the
    /// files they name.
    pub(super) fn resolve(
        table: toml::Value,
        env: &impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<TenantEnv> {
        let given: BTreeMap<String, Given> = table
            .try_into()
            .context("env: each value is text or { file = \"PATH\" }")?;
        let mut vars = Vec::new();
        for (name, value) in given {
            anyhow::ensure!(
                !name.is_empty() && !name.contains(['=', '\0']),
                "env: {name:?} is not a variable name"
            );
            let value = match value {
                Given::Text(text) => {
                    substitute(&text, env).with_context(|| format!("env.{name}"))?
                }
                Given::File { file } => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("env.{name}: cannot read {}", file.display()))?;
                    text.strip_suffix('\n').unwrap_or(&text).to_owned()
                }
            };
            vars.push((name, value));
        }
        Ok(TenantEnv(vars))
    }

    /// The variables, for the tenant's agent processes.
    pub fn vars(&self) -> &[(String, String)] {
        &self.0
    }
}

/// A tenant's LLM provider, as `providers/set` takes it. Shown without its headers' values.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantProvider {
    pub id: String,
    /// `anthropic`, `openai`, `azure`, `vertex`, `bedrock`, or another the agent knows.
    pub api_type: String,
    pub base_url: String,
    pub headers: TenantEnv,
}

/// The table as given, its headers apart.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct GivenProvider {
    id: String,
    api_type: String,
    base_url: String,
    #[serde(default)]
    headers: Option<toml::Value>,
}

impl TenantProvider {
    pub(super) fn resolve(
        table: toml::Value,
        env: &impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<TenantProvider> {
        let given: GivenProvider = table
            .try_into()
            .context("provider: id, api-type, base-url and headers")?;
        let headers = match given.headers {
            Some(h) => TenantEnv::resolve(h, env).context("provider.headers")?,
            None => TenantEnv::default(),
        };
        Ok(TenantProvider {
            id: given.id,
            api_type: given.api_type,
            base_url: substitute(&given.base_url, env).context("provider.base-url")?,
            headers,
        })
    }

    /// The params of `providers/set`.
    pub fn params(&self) -> serde_json::Value {
        let headers: serde_json::Map<String, serde_json::Value> = (self.headers.vars().iter())
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        serde_json::json!({
            "providerId": self.id,
            "apiType": self.api_type,
            "baseUrl": self.base_url,
            "headers": headers,
        })
    }
}

impl std::fmt::Debug for TenantProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantProvider")
            .field("id", &self.id)
            .field("api_type", &self.api_type)
            .field("base_url", &crate::redact::url(&self.base_url))
            .field("headers", &self.headers)
            .finish()
    }
}

impl std::fmt::Debug for TenantEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, _)| (k, "<redacted>")))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_from_the_environment_or_a_file_and_are_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, "from-the-file\n").unwrap();
        let table: toml::Value = toml::from_str(&format!(
            "KEY = \"sk-${{ACME}}-x\"\nFILED = {{ file = {:?} }}\n",
            key_file.display().to_string()
        ))
        .unwrap();
        let env = |name: &str| (name == "ACME").then(|| "secret-value".to_owned());
        let resolved = TenantEnv::resolve(table, &env).unwrap();
        assert_eq!(
            resolved.vars(),
            [
                ("FILED".to_owned(), "from-the-file".to_owned()),
                ("KEY".to_owned(), "sk-secret-value-x".to_owned())
            ]
        );
        let shown = format!("{resolved:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("from-the"),
            "{shown}"
        );
        assert!(shown.contains("KEY"), "{shown}");

        let unset: toml::Value = toml::from_str("KEY = \"${NOPE}\"").unwrap();
        let refused = TenantEnv::resolve(unset, &env).unwrap_err();
        assert!(format!("{refused:#}").contains("NOPE"), "{refused:#}");
    }
}
