//! The flags of per-tenant limits (`--tenant-max-sessions`, `--tenant-max-turns`,
//! `--tenant-prompts-per-minute`) and daily budgets (`--tenant-max-tokens-per-day`,
//! `--tenant-max-cost-per-day`), flattened into [`super::Config`], and a tenant's own limits,
//! budgets and default [`WhoAnswers`] from the `[tenants.NAME]` tables of the `--config` file.

use std::collections::BTreeMap;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use super::tenant_env::{TenantEnv, TenantProvider};

/// What every tenant may use at once across the replicas, and a tenant's own where set.
#[derive(Debug, Clone, Args)]
pub struct TenantFlags {
    /// Live sessions a tenant may hold at once, across replicas (0: no limit); more are 429.
    #[arg(
        long,
        env = "ACP_GATEWAY_TENANT_MAX_SESSIONS",
        default_value_t = 0,
        global = true
    )]
    pub tenant_max_sessions: u64,

    /// Turns a tenant may run at once, across replicas (0: no limit); more are 429.
    #[arg(
        long,
        env = "ACP_GATEWAY_TENANT_MAX_TURNS",
        default_value_t = 0,
        global = true
    )]
    pub tenant_max_turns: u64,

    /// Prompts a tenant may send per minute (a fixed window on the clock), across replicas (0:
    /// no limit); more are 429 until the next minute.
    #[arg(
        long,
        env = "ACP_GATEWAY_TENANT_PROMPTS_PER_MINUTE",
        default_value_t = 0,
        global = true
    )]
    pub tenant_prompts_per_minute: u64,

    /// Tokens (the agents' reported totals) a tenant may spend per UTC day, across replicas (0:
    /// no budget); past it, prompts are 429 until the day ends (a running turn finishes).
    #[arg(
        long,
        env = "ACP_GATEWAY_TENANT_MAX_TOKENS_PER_DAY",
        default_value_t = 0,
        global = true
    )]
    pub tenant_max_tokens_per_day: u64,

    /// The cost (as the agents report it) a tenant may spend per UTC day in a currency, as
    /// `CURRENCY=AMOUNT` (`USD=5`; comma-separated or repeated for several currencies), across
    /// replicas; past it, prompts are 429 until the day ends (a running turn finishes).
    #[arg(
        long,
        env = "ACP_GATEWAY_TENANT_MAX_COST_PER_DAY",
        value_delimiter = ',',
        value_parser = parse_cost_budget,
        global = true
    )]
    pub tenant_max_cost_per_day: Vec<(String, f64)>,

    /// The `[tenants.NAME]` tables of the --config file: a tenant's own limits.
    #[arg(skip)]
    pub own: BTreeMap<String, TenantLimits>,
}

/// A tenant's limits (0: none); in a `[tenants.NAME]` table, each one left out is the flag's.
/// Beside them, who answers in the tenant's sessions that do not say.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TenantLimits {
    pub max_sessions: Option<u64>,
    pub max_turns: Option<u64>,
    pub prompts_per_minute: Option<u64>,
    pub max_tokens_per_day: Option<u64>,
    /// Per currency: `max-cost-per-day = { USD = 5.0 }`.
    pub max_cost_per_day: Option<BTreeMap<String, f64>>,
    pub who_answers: Option<WhoAnswers>,
    /// `[tenants.NAME.env]`: the environment of the tenant's own agent processes.
    #[serde(skip)]
    pub env: Option<TenantEnv>,
    /// `[tenants.NAME.provider]`: the LLM provider set on the tenant's own agent processes.
    #[serde(skip)]
    pub provider: Option<TenantProvider>,
}

/// `CURRENCY=AMOUNT`, a positive amount.
fn parse_cost_budget(s: &str) -> Result<(String, f64), String> {
    let (currency, amount) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not CURRENCY=AMOUNT (USD=5)"))?;
    let amount: f64 = amount
        .trim()
        .parse()
        .map_err(|_| format!("{amount:?} is not an amount"))?;
    if !(amount.is_finite() && amount > 0.0) || currency.trim().is_empty() {
        return Err(format!("{s:?}: a currency and an amount above 0"));
    }
    Ok((currency.trim().to_owned(), amount))
}

/// Who may answer a session's permission requests and elicitations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WhoAnswers {
    /// Anyone who sees the session.
    #[default]
    Anyone,
    /// Only the user who created the session.
    Owner,
    /// Only the author of the turn that asked (the owner, outside a turn).
    Author,
}

impl WhoAnswers {
    pub fn as_str(self) -> &'static str {
        match self {
            WhoAnswers::Anyone => "anyone",
            WhoAnswers::Owner => "owner",
            WhoAnswers::Author => "author",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [WhoAnswers::Anyone, WhoAnswers::Owner, WhoAnswers::Author]
            .into_iter()
            .find(|w| w.as_str() == s)
    }
}

impl TenantFlags {
    /// The `[tenants]` table of a --config file: `NAME = { max-turns = 2, … }` each.
    pub fn parse_tables(value: toml::Value) -> anyhow::Result<BTreeMap<String, TenantLimits>> {
        let toml::Value::Table(tables) = value else {
            anyhow::bail!("[tenants] must be a table of [tenants.NAME] tables");
        };
        tables
            .into_iter()
            .map(|(name, mut limits)| {
                let (env, provider) = match &mut limits {
                    toml::Value::Table(t) => (t.remove("env"), t.remove("provider")),
                    _ => (None, None),
                };
                let mut limits = limits.try_into::<TenantLimits>().with_context(|| {
                    format!("[tenants.{name}] (max-sessions, max-turns, prompts-per-minute, max-tokens-per-day, max-cost-per-day, who-answers, env)")
                })?;
                let vars = |var: &str| std::env::var(var).ok();
                let at = || format!("[tenants.{name}]");
                if let Some(env) = env {
                    limits.env = Some(TenantEnv::resolve(env, &vars).with_context(at)?);
                }
                if let Some(provider) = provider {
                    limits.provider = Some(TenantProvider::resolve(provider, &vars).with_context(at)?);
                }
                Ok((name, limits))
            })
            .collect()
    }

    /// `tenant`'s limits and budgets: its own where its table sets them, else the flags' (its
    /// `env` and `provider` are not limits, and stay out: this runs for every prompt).
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        let none = TenantLimits::default();
        let own = self.own.get(tenant).unwrap_or(&none);
        let flag_costs = || self.tenant_max_cost_per_day.iter().cloned().collect();
        TenantLimits {
            max_sessions: own.max_sessions.or(Some(self.tenant_max_sessions)),
            max_turns: own.max_turns.or(Some(self.tenant_max_turns)),
            prompts_per_minute: own
                .prompts_per_minute
                .or(Some(self.tenant_prompts_per_minute)),
            max_tokens_per_day: own
                .max_tokens_per_day
                .or(Some(self.tenant_max_tokens_per_day)),
            max_cost_per_day: (own.max_cost_per_day.clone()).or_else(|| Some(flag_costs())),
            who_answers: own.who_answers,
            env: None,
            provider: None,
        }
    }

    /// Who answers in `tenant`'s sessions that do not say: its table's `who-answers`, else
    /// anyone.
    pub fn who_answers(&self, tenant: &str) -> WhoAnswers {
        self.own
            .get(tenant)
            .and_then(|t| t.who_answers)
            .unwrap_or_default()
    }

    /// The tenants that bring their own agent environment or LLM provider, with them.
    pub fn own_agents(
        &self,
    ) -> impl Iterator<Item = (&str, Option<&TenantEnv>, Option<&TenantProvider>)> {
        (self.own.iter())
            .filter(|(_, t)| t.env.is_some() || t.provider.is_some())
            .map(|(name, t)| (name.as_str(), t.env.as_ref(), t.provider.as_ref()))
    }

    /// The tables as the effective configuration shows them (an environment by its names).
    pub fn shown(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.own
            .iter()
            .map(|(name, limits)| (format!("tenants.{name}"), format!("{limits:?}")))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tenants_own_limits_and_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "tenant-max-turns = 4\n[tenants.acme]\nmax-turns = 1\nprompts-per-minute = 9\nwho-answers = \"author\"\nmax-cost-per-day = { EUR = 2.5 }\n",
        )
        .unwrap();
        let config = crate::config::Config::load_from([
            "acp-gateway",
            "--agent",
            "x",
            "--tenant-max-sessions",
            "3",
            "--tenant-max-tokens-per-day",
            "1000",
            "--tenant-max-cost-per-day",
            "USD=5,EUR=4",
            "--config",
            file.to_str().unwrap(),
        ])
        .unwrap();
        let flags = &config.tenants;
        let acme = flags.limits("acme");
        assert_eq!(
            (acme.max_sessions, acme.max_turns, acme.prompts_per_minute),
            (Some(3), Some(1), Some(9))
        );
        assert_eq!(acme.max_tokens_per_day, Some(1000));
        let eur = |l: &super::TenantLimits| l.max_cost_per_day.clone().unwrap_or_default();
        assert_eq!(
            eur(&acme).into_iter().collect::<Vec<_>>(),
            [("EUR".to_owned(), 2.5)]
        );
        assert_eq!(
            eur(&flags.limits("globex")).into_iter().collect::<Vec<_>>(),
            [("EUR".to_owned(), 4.0), ("USD".to_owned(), 5.0)]
        );
        assert_eq!(flags.who_answers("acme"), super::WhoAnswers::Author);
        assert_eq!(flags.who_answers("globex"), super::WhoAnswers::Anyone);
        let other = flags.limits("globex");
        assert_eq!(
            (
                other.max_sessions,
                other.max_turns,
                other.prompts_per_minute
            ),
            (Some(3), Some(4), Some(0))
        );

        std::fs::write(&file, "[tenants.acme]\nmax-turn = 1\n").unwrap();
        let refused = crate::config::Config::load_from([
            "acp-gateway",
            "--agent",
            "x",
            "--config",
            file.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(format!("{refused:#}").contains("max-turn"), "{refused:#}");
    }
}
