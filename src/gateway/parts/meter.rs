//! What turns spend ([`Meter`]): the cost an agent reports in its `usage_update`s (a session's
//! cumulative figure) is noted as it comes; at a turn's end, its tokens (the prompt result's
//! `usage`) and the growth of that figure since the session's previous turn are recorded in the
//! usage ledger, one turn after another in the order they ended (a worker, so that a session's
//! next turn always finds its previous one's figure), with the session's model then; counted in
//! `/metrics`; and checked against the tenant's daily budgets, whose 80 % and 100 % go to the
//! lifecycle log (and so to webhooks) once per tenant, day and budget, whichever replica sees
//! them. [`Meter::admit`] refuses a tenant's prompt past a budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::log::Log;
use super::quotas::refused;
use super::snapshots::States;
use crate::config::TenantFlags;
use crate::gateway::error::Error;
use crate::gateway::event::{GatewayLifecycleEvent, UsageBudget};
use crate::store::{Cost, Tokens, TurnUsage, UsageLedger, UsageSums};

/// Turns waiting to be recorded, at most.
const BACKLOG: usize = 1024;

/// How long a record the store refuses is tried again, at most.
const RETRY_FOR: Duration = Duration::from_secs(120);

/// A turn that ended, as [`Meter::turn_ended`] is told it.
pub(in crate::gateway) struct EndedTurn {
    pub session_id: String,
    pub tenant: String,
    pub user: Option<String>,
    pub agent: String,
    /// The prompt result's `usage`, when it had one.
    pub usage: Option<Value>,
}

struct Job {
    turn: TurnUsage,
    recorded: oneshot::Sender<()>,
}

/// The meter.
pub(in crate::gateway) struct Meter {
    ledger: Arc<dyn UsageLedger>,
    states: Arc<States>,
    log: Log,
    flags: TenantFlags,
    /// The latest cumulative cost each session's agent reported, until a turn's end takes it.
    reported: Mutex<HashMap<String, Cost>>,
    jobs: mpsc::Sender<Job>,
}

impl Meter {
    /// The meter, and its worker spawned on `tasks` until `stop` (then it records what waits).
    pub(in crate::gateway) fn start(
        ledger: Arc<dyn UsageLedger>,
        states: Arc<States>,
        log: Log,
        flags: TenantFlags,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let (jobs, rx) = mpsc::channel(BACKLOG);
        let meter = Arc::new(Meter {
            ledger,
            states,
            log,
            flags,
            reported: Mutex::default(),
            jobs,
        });
        tasks.spawn(meter.clone().work(rx, stop));
        meter
    }

    /// A `usage_update` of the session's agent (its `update`): its cumulative `cost`, if any.
    pub(in crate::gateway) fn note_update(&self, session_id: &str, update: &Value) {
        let cost = update
            .get("cost")
            .cloned()
            .and_then(|c| serde_json::from_value::<agent_client_protocol_schema::v1::Cost>(c).ok());
        if let Some(cost) = cost.filter(|c| c.amount.is_finite()) {
            self.reported.lock().expect("reported costs lock").insert(
                session_id.to_owned(),
                Cost {
                    amount: cost.amount,
                    currency: cost.currency,
                },
            );
        }
    }

    /// Records what `turn` spent, if its agent reported anything; resolves once recorded (or
    /// given up on).
    pub(in crate::gateway) async fn turn_ended(&self, turn: EndedTurn) {
        let cumulative = self
            .reported
            .lock()
            .expect("reported costs lock")
            .remove(&turn.session_id);
        let tokens = tokens_of(turn.usage.as_ref());
        if !tokens.any() && cumulative.is_none() {
            return;
        }
        let now = Utc::now();
        let record = TurnUsage {
            session_id: turn.session_id,
            tenant: turn.tenant,
            user: turn.user,
            agent: turn.agent,
            model: None,
            ended_at: now.timestamp_micros(),
            day: day_of(now),
            tokens,
            cost: None,
            cumulative,
        };
        let (recorded, done) = oneshot::channel();
        let job = Job {
            turn: record,
            recorded,
        };
        if self.jobs.send(job).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Refuses a prompt of `tenant` once it has spent a daily budget.
    pub(in crate::gateway) async fn admit(&self, tenant: &str) -> Result<(), Error> {
        let budgets = Budgets::of(&self.flags, tenant);
        if budgets.is_empty() {
            return Ok(());
        }
        let now = Utc::now();
        let spent = self.ledger.tenant_day_usage(tenant, &day_of(now)).await?;
        let Some(passed) = budgets.passed(&spent, 1.0).into_iter().next() else {
            return Ok(());
        };
        let left = seconds_to_midnight(now);
        Err(refused(
            tenant,
            passed.name,
            passed.quota_units(),
            Some(86_400),
            left,
            format!(
                "tenant {tenant:?} has spent its {} of {} for today (UTC); prompts are refused until the day ends",
                passed.what(),
                passed.shown()
            ),
        ))
    }

    async fn work(self: Arc<Self>, mut rx: mpsc::Receiver<Job>, stop: CancellationToken) {
        loop {
            let job = tokio::select! {
                job = rx.recv() => job,
                () = stop.cancelled() => break,
            };
            let Some(job) = job else { return };
            self.record(job).await;
        }
        rx.close();
        while let Ok(job) = rx.try_recv() {
            self.record(job).await;
        }
    }

    async fn record(&self, job: Job) {
        let Job { mut turn, recorded } = job;
        // The model as committed (no flush: the turn's answer does not wait for a commit).
        if let Ok(at) = self.states.state_of(&turn.session_id).await {
            turn.model = at.state.model();
        }
        let started = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            match self.try_record(&mut turn).await {
                Ok(()) => break,
                Err(e) if started.elapsed() < RETRY_FOR => {
                    tracing::warn!(session = turn.session_id, error = %e, "a turn's usage is not recorded yet; trying again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::error!(session = turn.session_id, error = %e, "a turn's usage was not recorded");
                    return;
                }
            }
        }
        let _ = recorded.send(());
        count(&turn);
        if let Err(e) = self.alert(&turn).await {
            tracing::warn!(tenant = turn.tenant, error = %e, "the tenant's budgets were not checked");
        }
    }

    async fn try_record(&self, turn: &mut TurnUsage) -> Result<(), crate::store::StoreError> {
        if let Some(now) = &turn.cumulative {
            let before = self.ledger.last_session_cost(&turn.session_id).await?;
            turn.cost = Some(grown(before.as_ref(), now));
        }
        self.ledger.record_usage(turn).await
    }

    /// The lifecycle events of the budgets `turn` made its tenant pass.
    async fn alert(&self, turn: &TurnUsage) -> Result<(), Error> {
        let budgets = Budgets::of(&self.flags, &turn.tenant);
        if budgets.is_empty() {
            return Ok(());
        }
        let spent = self
            .ledger
            .tenant_day_usage(&turn.tenant, &turn.day)
            .await?;
        for percent in [80, 100] {
            for passed in budgets.passed(&spent, f64::from(percent) / 100.0) {
                let budget = passed.key();
                if !self
                    .ledger
                    .claim_usage_alert(&turn.tenant, &turn.day, &budget, i64::from(percent))
                    .await?
                {
                    continue;
                }
                let event = GatewayLifecycleEvent::UsageBudget(UsageBudget {
                    session_id: turn.session_id.clone(),
                    tenant: turn.tenant.clone(),
                    budget: passed.name.to_owned(),
                    currency: passed.currency.clone(),
                    limit: passed.limit,
                    spent: passed.spent,
                    percent,
                    day: turn.day.clone(),
                });
                self.log.lifecycle_of(&turn.tenant, event).await;
            }
        }
        Ok(())
    }
}

/// A tenant's daily budgets.
struct Budgets {
    tokens: Option<u64>,
    costs: Vec<(String, f64)>,
}

/// A budget spent past a share of it.
struct Passed {
    name: &'static str,
    currency: Option<String>,
    limit: f64,
    spent: f64,
}

impl Passed {
    /// The budget's name in the alerts table.
    fn key(&self) -> String {
        match &self.currency {
            Some(c) => format!("{}:{c}", self.name),
            None => self.name.to_owned(),
        }
    }

    /// The quota in the `RateLimit-Policy` header: tokens, or millionths of the currency.
    fn quota_units(&self) -> u64 {
        match self.currency {
            Some(_) => (self.limit * 1e6).round() as u64,
            None => self.limit as u64,
        }
    }

    fn what(&self) -> &'static str {
        match self.currency {
            Some(_) => "cost budget",
            None => "token budget",
        }
    }

    fn shown(&self) -> String {
        match &self.currency {
            Some(c) => format!("{} {c}", self.limit),
            None => format!("{} tokens", self.limit),
        }
    }
}

impl Budgets {
    fn of(flags: &TenantFlags, tenant: &str) -> Self {
        let limits = flags.limits(tenant);
        Budgets {
            tokens: limits.max_tokens_per_day.filter(|t| *t > 0),
            costs: limits
                .max_cost_per_day
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, a)| *a > 0.0)
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.tokens.is_none() && self.costs.is_empty()
    }

    /// The budgets of which `spent` is at least `share`.
    fn passed(&self, spent: &UsageSums, share: f64) -> Vec<Passed> {
        let mut passed = Vec::new();
        if let Some(limit) = self.tokens {
            let used = spent.tokens.total.unwrap_or(0) as f64;
            if used >= share * limit as f64 {
                passed.push(Passed {
                    name: "tokens-per-day",
                    currency: None,
                    limit: limit as f64,
                    spent: used,
                });
            }
        }
        for (currency, limit) in &self.costs {
            let used = spent
                .costs
                .iter()
                .find(|c| &c.currency == currency)
                .map_or(0.0, |c| c.amount);
            if used >= share * limit {
                passed.push(Passed {
                    name: "cost-per-day",
                    currency: Some(currency.clone()),
                    limit: *limit,
                    spent: used,
                });
            }
        }
        passed
    }
}

/// The prompt result's `usage` as ACP's `Usage`; nothing known when it is absent or not one.
fn tokens_of(usage: Option<&Value>) -> Tokens {
    let Some(usage) = usage
        .cloned()
        .and_then(|u| serde_json::from_value::<agent_client_protocol_schema::v1::Usage>(u).ok())
    else {
        return Tokens::default();
    };
    let n = |v: u64| Some(i64::try_from(v).unwrap_or(i64::MAX));
    Tokens {
        input: n(usage.input_tokens),
        output: n(usage.output_tokens),
        thought: usage.thought_tokens.and_then(n),
        cache_read: usage.cached_read_tokens.and_then(n),
        cache_write: usage.cached_write_tokens.and_then(n),
        total: n(usage.total_tokens),
    }
}

/// A turn's cost: what the session's cumulative figure grew by since `before`; all of `now`
/// when there was none, it was in another currency, or it fell (the agent counted afresh, as
/// a new process does).
fn grown(before: Option<&Cost>, now: &Cost) -> Cost {
    let amount = match before {
        Some(b) if b.currency == now.currency && b.amount <= now.amount => now.amount - b.amount,
        _ => now.amount,
    };
    Cost {
        amount,
        currency: now.currency.clone(),
    }
}

fn day_of(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d").to_string()
}

fn seconds_to_midnight(now: DateTime<Utc>) -> u64 {
    let next = (now.date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    u64::try_from((next - now).num_seconds())
        .unwrap_or(0)
        .max(1)
}

/// The `/metrics` counters of a recorded turn.
fn count(turn: &TurnUsage) {
    let t = &turn.tokens;
    for (kind, n) in [
        ("input", t.input),
        ("output", t.output),
        ("thought", t.thought),
        ("cache_read", t.cache_read),
        ("cache_write", t.cache_write),
        ("total", t.total),
    ] {
        if let Some(n) = n.and_then(|n| u64::try_from(n).ok()) {
            metrics::counter!("acp_gateway_usage_tokens_total",
                "tenant" => turn.tenant.clone(), "agent" => turn.agent.clone(), "kind" => kind)
            .increment(n);
        }
    }
    if let Some(cost) = &turn.cost {
        let micros = (cost.amount * 1e6).round().max(0.0) as u64;
        metrics::counter!("acp_gateway_usage_cost_micros_total",
            "tenant" => turn.tenant.clone(), "agent" => turn.agent.clone(),
            "currency" => cost.currency.clone())
        .increment(micros);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_cost_is_what_the_cumulative_figure_grew_by() {
        let usd = |amount| Cost {
            amount,
            currency: "USD".into(),
        };
        assert_eq!(grown(None, &usd(0.5)), usd(0.5));
        assert_eq!(grown(Some(&usd(0.5)), &usd(0.75)), usd(0.25));
        // Counted afresh (a new agent process), or in another unit: all of it.
        assert_eq!(grown(Some(&usd(0.5)), &usd(0.125)), usd(0.125));
        let credits = Cost {
            amount: 3.0,
            currency: "credits".into(),
        };
        assert_eq!(grown(Some(&usd(0.5)), &credits), credits);
    }

    #[test]
    fn tokens_not_reported_are_unknown() {
        assert!(!tokens_of(None).any());
        assert!(!tokens_of(Some(&serde_json::json!({"total": 3}))).any());
        let t = tokens_of(Some(&serde_json::json!(
            {"totalTokens": 15, "inputTokens": 10, "outputTokens": 5, "cachedReadTokens": 2}
        )));
        assert_eq!(
            (t.total, t.input, t.output, t.cache_read, t.cache_write),
            (Some(15), Some(10), Some(5), Some(2), None)
        );
    }

    #[test]
    fn the_day_ends_at_midnight_utc() {
        let at = DateTime::parse_from_rfc3339("2026-11-29T23:59:30Z")
            .unwrap()
            .to_utc();
        assert_eq!(day_of(at), "2026-11-29");
        assert_eq!(seconds_to_midnight(at), 30);
    }
}
