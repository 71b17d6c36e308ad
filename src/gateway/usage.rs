//! What turns spent, read back (`Usage`): a session's turns and totals
//! (`GET /sessions/{id}/usage`, still there once the session is deleted) and the ledger summed
//! by tenant, user, agent, model, session or day (`GET /usage`); a tenant reads its own, an
//! admin every tenant's. A figure no turn of a group reported is `null`, never 0.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::caller::Caller;
use super::error::Error;
use super::input::SessionId;
use super::parts::use_case;
use crate::store::{
    Cost, Tokens, TurnUsage, UsageGroup, UsageKey, UsageLedger, UsageQuery, UsageSums,
};

use_case! {
    /// The use case of reading the usage ledger.
    pub struct Usage {
        parts: [records],
        ledger: Arc<dyn UsageLedger>,
    }
}

/// An amount in a currency (or another unit the agent names, as `credits`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CostView {
    pub amount: f64,
    #[schema(example = "USD")]
    pub currency: String,
}

/// Tokens and cost, each `null` when the agent did not report it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpendView {
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub thought_tokens: Option<i64>,
    pub cache_read_tokens: Option<i64>,
    pub cache_write_tokens: Option<i64>,
    pub total_tokens: Option<i64>,
    /// The cost, when it is in one currency (`costs` lists every one).
    pub cost: Option<CostView>,
}

/// Sums of turns.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TotalsView {
    /// The turns whose agent reported tokens or cost.
    pub turns: i64,
    #[serde(flatten)]
    pub spend: SpendView,
    /// The cost in each currency the turns reported, by currency.
    pub costs: Vec<CostView>,
}

/// One turn's spend.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnUsageView {
    pub ended_at: DateTime<Utc>,
    pub tenant: String,
    /// Who prompted, when a user did.
    pub user: Option<String>,
    pub agent: String,
    /// The session's model at the turn's end, when the agent names one.
    pub model: Option<String>,
    #[serde(flatten)]
    pub spend: SpendView,
}

/// `GET /sessions/{id}/usage`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"sessionId": "sess_1f2e3d4c", "totals": {"turns": 1, "inputTokens": 1200, "outputTokens": 300, "thoughtTokens": null, "cacheReadTokens": 800, "cacheWriteTokens": null, "totalTokens": 2300, "cost": {"amount": 0.042, "currency": "USD"}, "costs": [{"amount": 0.042, "currency": "USD"}]}, "turns": [{"endedAt": "2026-11-29T12:00:00Z", "tenant": "acme", "user": "ann", "agent": "claude", "model": "sonnet", "inputTokens": 1200, "outputTokens": 300, "thoughtTokens": null, "cacheReadTokens": 800, "cacheWriteTokens": null, "totalTokens": 2300, "cost": {"amount": 0.042, "currency": "USD"}}]}))]
pub struct SessionUsageView {
    pub session_id: String,
    pub totals: TotalsView,
    /// Oldest first.
    pub turns: Vec<TurnUsageView>,
}

/// One group of `GET /usage`: the values of its keys (only those grouped by; `null` for turns
/// without one, as a turn of no user) and its sums.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageRowKey {
    #[schema(value_type = Option<String>)]
    pub tenant: Option<Option<String>>,
    #[schema(value_type = Option<String>)]
    pub user: Option<Option<String>>,
    #[schema(value_type = Option<String>)]
    pub agent: Option<Option<String>>,
    #[schema(value_type = Option<String>)]
    pub model: Option<Option<String>>,
    #[schema(value_type = Option<String>)]
    pub session: Option<Option<String>>,
    /// `YYYY-MM-DD` (UTC).
    #[schema(value_type = Option<String>)]
    pub day: Option<Option<String>>,
}

/// A row of `GET /usage`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    #[serde(flatten)]
    pub key: UsageRowKey,
    #[serde(flatten)]
    pub totals: TotalsView,
}

/// `GET /usage`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"from": "2026-11-01T00:00:00Z", "to": null, "groupBy": ["tenant", "day"], "rows": [{"tenant": "acme", "day": "2026-11-29", "turns": 12, "inputTokens": 52000, "outputTokens": 9100, "thoughtTokens": null, "cacheReadTokens": 31000, "cacheWriteTokens": 2000, "totalTokens": 94100, "cost": {"amount": 1.87, "currency": "USD"}, "costs": [{"amount": 1.87, "currency": "USD"}]}]}))]
pub struct UsageReport {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    #[schema(example = json!(["tenant"]))]
    pub group_by: Vec<String>,
    /// In key order.
    pub rows: Vec<UsageRow>,
}

/// What `GET /usage` asks for.
#[derive(Debug, Clone)]
pub struct UsageAsk {
    /// Only this tenant's (an admin's filter; a tenant's caller always reads its own).
    pub tenant: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// The `groupBy` names, comma-separated (default `tenant`).
    pub group_by: Option<String>,
}

impl Usage {
    /// `GET /sessions/{id}/usage`: its turns, also once it is deleted.
    pub async fn of_session(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<SessionUsageView, Error> {
        let tenant = (!caller.admin).then_some(caller.tenant.as_str());
        let turns = self.ledger.session_usage(id.as_str(), tenant).await?;
        if turns.is_empty() {
            // No turn spent anything: the session must be one the caller sees.
            self.records.get(caller, id).await?;
        }
        let mut sums = UsageSums::default();
        for t in &turns {
            sums.add(1, &t.tokens, t.cost.as_ref());
        }
        Ok(SessionUsageView {
            session_id: id.as_str().to_owned(),
            totals: totals_view(&sums),
            turns: turns.iter().map(turn_view).collect(),
        })
    }

    /// `GET /usage`.
    pub async fn report(&self, caller: &Caller, ask: UsageAsk) -> Result<UsageReport, Error> {
        let group_by = parse_keys(ask.group_by.as_deref().unwrap_or("tenant"))?;
        let tenant = match (caller.admin, ask.tenant) {
            (true, tenant) => tenant,
            (false, Some(t)) if t != caller.tenant => {
                return Err(Error::Forbidden(format!(
                    "a key of tenant {:?} reads only its own usage",
                    caller.tenant
                )));
            }
            (false, _) => Some(caller.tenant.clone()),
        };
        if let (Some(from), Some(to)) = (ask.from, ask.to)
            && from > to
        {
            return Err(Error::Invalid("`from` is after `to`".into()));
        }
        let query = UsageQuery {
            tenant,
            from: ask.from.map_or(i64::MIN, |t| t.timestamp_micros()),
            to: ask.to.map_or(i64::MAX, |t| t.timestamp_micros()),
            group_by: group_by.clone(),
        };
        let groups = self.ledger.usage_groups(&query).await?;
        Ok(UsageReport {
            from: ask.from,
            to: ask.to,
            group_by: group_by.iter().map(|k| k.name().to_owned()).collect(),
            rows: groups.iter().map(|g| row_view(&group_by, g)).collect(),
        })
    }
}

/// `groupBy`: names of [`UsageKey`], comma-separated, each once.
fn parse_keys(names: &str) -> Result<Vec<UsageKey>, Error> {
    let mut keys = Vec::new();
    for name in names.split(',').map(str::trim) {
        let key = UsageKey::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "groupBy: {name:?} is not one of tenant, user, agent, model, session, day"
                ))
            })?;
        if keys.contains(&key) {
            return Err(Error::Invalid(format!("groupBy names {name:?} twice")));
        }
        keys.push(key);
    }
    Ok(keys)
}

fn cost_view(c: &Cost) -> CostView {
    CostView {
        amount: c.amount,
        currency: c.currency.clone(),
    }
}

fn spend_view(tokens: &Tokens, cost: Option<&Cost>) -> SpendView {
    SpendView {
        input_tokens: tokens.input,
        output_tokens: tokens.output,
        thought_tokens: tokens.thought,
        cache_read_tokens: tokens.cache_read,
        cache_write_tokens: tokens.cache_write,
        total_tokens: tokens.total,
        cost: cost.map(cost_view),
    }
}

fn totals_view(sums: &UsageSums) -> TotalsView {
    let one = match sums.costs.as_slice() {
        [one] => Some(one),
        _ => None,
    };
    TotalsView {
        turns: sums.turns,
        spend: spend_view(&sums.tokens, one),
        costs: sums.costs.iter().map(cost_view).collect(),
    }
}

fn turn_view(t: &TurnUsage) -> TurnUsageView {
    TurnUsageView {
        ended_at: DateTime::from_timestamp_micros(t.ended_at).unwrap_or_default(),
        tenant: t.tenant.clone(),
        user: t.user.clone(),
        agent: t.agent.clone(),
        model: t.model.clone(),
        spend: spend_view(&t.tokens, t.cost.as_ref()),
    }
}

fn row_view(keys: &[UsageKey], g: &UsageGroup) -> UsageRow {
    let mut key = UsageRowKey::default();
    for (k, value) in keys.iter().zip(&g.key) {
        let slot = match k {
            UsageKey::Tenant => &mut key.tenant,
            UsageKey::User => &mut key.user,
            UsageKey::Agent => &mut key.agent,
            UsageKey::Model => &mut key.model,
            UsageKey::Session => &mut key.session,
            UsageKey::Day => &mut key.day,
        };
        *slot = Some(value.clone());
    }
    UsageRow {
        key,
        totals: totals_view(&g.sums),
    }
}
