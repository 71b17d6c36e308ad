//! The usage ledger: what each turn spent, as its agent reported it (tokens, and the cost the
//! session's cumulative figure grew by), with whose it was (tenant, user, agent, model,
//! session), kept when the session is deleted; its sums by any of those and by day; each
//! tenant's spend of a day, for the budgets; and the budget alerts sent, one per tenant, day,
//! budget and threshold. A figure nobody reported stays `None` (SQL `NULL`) through every sum.
//! Times are unix microseconds on both backends, so that the SQL is the same; [`impl_usage!`]
//! implements [`UsageLedger`] for each.

use async_trait::async_trait;

use super::error::StoreResult;
use super::rows::Columns;

/// One turn's spend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnUsage {
    pub session_id: String,
    pub tenant: String,
    /// Who prompted, when the caller was a user.
    pub user: Option<String>,
    pub agent: String,
    /// The session's model at the turn's end, when the agent names one.
    pub model: Option<String>,
    /// Unix microseconds.
    pub ended_at: i64,
    /// `ended_at`'s UTC date, `YYYY-MM-DD`.
    pub day: String,
    pub tokens: Tokens,
    /// The turn's own cost, and its currency (or other unit).
    pub cost: Option<Cost>,
    /// The session's cumulative cost the agent reported by the turn's end.
    pub cumulative: Option<Cost>,
}

/// Token counts; each `None` when not reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: Option<i64>,
    pub output: Option<i64>,
    pub thought: Option<i64>,
    pub cache_read: Option<i64>,
    pub cache_write: Option<i64>,
    pub total: Option<i64>,
}

impl Tokens {
    /// Each count summed with `other`'s, unknown only when both are.
    pub fn add(&mut self, other: &Tokens) {
        let sum = |a: &mut Option<i64>, b: Option<i64>| {
            if let Some(b) = b {
                *a = Some(a.unwrap_or(0) + b);
            }
        };
        sum(&mut self.input, other.input);
        sum(&mut self.output, other.output);
        sum(&mut self.thought, other.thought);
        sum(&mut self.cache_read, other.cache_read);
        sum(&mut self.cache_write, other.cache_write);
        sum(&mut self.total, other.total);
    }

    /// Whether any count is known.
    pub fn any(&self) -> bool {
        *self != Tokens::default()
    }
}

/// An amount in a currency (an ISO 4217 code, or another unit an agent names).
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub amount: f64,
    pub currency: String,
}

/// Sums of turns: their count, tokens, and cost per currency (in currency order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageSums {
    pub turns: i64,
    pub tokens: Tokens,
    pub costs: Vec<Cost>,
}

impl UsageSums {
    /// Adds `turns` turns of `tokens` and `cost`.
    pub fn add(&mut self, turns: i64, tokens: &Tokens, cost: Option<&Cost>) {
        self.turns += turns;
        self.tokens.add(tokens);
        let Some(cost) = cost else { return };
        match self.costs.iter_mut().find(|c| c.currency == cost.currency) {
            Some(known) => known.amount += cost.amount,
            None => {
                self.costs.push(cost.clone());
                self.costs.sort_by(|a, b| a.currency.cmp(&b.currency));
            }
        }
    }
}

/// What the ledger is summed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageKey {
    Tenant,
    User,
    Agent,
    Model,
    Session,
    Day,
}

impl UsageKey {
    pub const ALL: [UsageKey; 6] = [
        UsageKey::Tenant,
        UsageKey::User,
        UsageKey::Agent,
        UsageKey::Model,
        UsageKey::Session,
        UsageKey::Day,
    ];

    /// Its name in `groupBy`.
    pub fn name(self) -> &'static str {
        match self {
            UsageKey::Tenant => "tenant",
            UsageKey::User => "user",
            UsageKey::Agent => "agent",
            UsageKey::Model => "model",
            UsageKey::Session => "session",
            UsageKey::Day => "day",
        }
    }

    fn column(self) -> &'static str {
        match self {
            UsageKey::Tenant => "tenant",
            UsageKey::User => "user_id",
            UsageKey::Agent => "agent",
            UsageKey::Model => "model",
            UsageKey::Session => "session_id",
            UsageKey::Day => "day",
        }
    }
}

/// Which turns to sum, and by what.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    /// Only this tenant's (`None`: every tenant's).
    pub tenant: Option<String>,
    /// Turns that ended in `[from, to)`, unix microseconds.
    pub from: i64,
    pub to: i64,
    /// At least one key, none twice.
    pub group_by: Vec<UsageKey>,
}

/// One group's sums: its key's values in `group_by` order (`None`: not known, as a turn of no
/// user).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageGroup {
    pub key: Vec<Option<String>>,
    pub sums: UsageSums,
}

/// The ledger.
#[async_trait]
pub trait UsageLedger: Send + Sync + 'static {
    /// Records a turn's spend.
    async fn record_usage(&self, turn: &TurnUsage) -> StoreResult<()>;

    /// The session's latest cumulative cost recorded, from which its next turn's is taken.
    async fn last_session_cost(&self, session_id: &str) -> StoreResult<Option<Cost>>;

    /// The session's turns in order (only `tenant`'s when given).
    async fn session_usage(
        &self,
        session_id: &str,
        tenant: Option<&str>,
    ) -> StoreResult<Vec<TurnUsage>>;

    /// The sums of the turns `query` names, by its keys, in key order.
    async fn usage_groups(&self, query: &UsageQuery) -> StoreResult<Vec<UsageGroup>>;

    /// What `tenant` spent on `day`.
    async fn tenant_day_usage(&self, tenant: &str, day: &str) -> StoreResult<UsageSums>;

    /// Marks the alert that `tenant` passed `percent` of `budget` on `day` as sent: true for
    /// the one caller that marks it first.
    async fn claim_usage_alert(
        &self,
        tenant: &str,
        day: &str,
        budget: &str,
        percent: i64,
    ) -> StoreResult<bool>;
}

/// `$1`…`$16`: the turn's columns.
pub const RECORD: &str = "INSERT INTO usage_ledger (session_id, tenant, user_id, agent, model, \
     ended_at, day, input_tokens, output_tokens, thought_tokens, cache_read_tokens, \
     cache_write_tokens, total_tokens, cost_amount, cost_currency, cost_cumulative) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";
pub const LAST_COST: &str = "SELECT cost_cumulative, cost_currency FROM usage_ledger \
     WHERE session_id = $1 AND cost_cumulative IS NOT NULL ORDER BY id DESC LIMIT 1";
pub const SESSION: &str = "SELECT * FROM usage_ledger WHERE session_id = $1 \
     AND ($2 IS NULL OR tenant = $2) ORDER BY id";
/// The sums of a group of turns, per currency (`GROUP BY … cost_currency`): the columns
/// [`groups_from`] reads.
macro_rules! usage_sums {
    () => {
        "COUNT(*) AS turns, \
         CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, \
         CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
         CAST(SUM(thought_tokens) AS BIGINT) AS thought_tokens, \
         CAST(SUM(cache_read_tokens) AS BIGINT) AS cache_read_tokens, \
         CAST(SUM(cache_write_tokens) AS BIGINT) AS cache_write_tokens, \
         CAST(SUM(total_tokens) AS BIGINT) AS total_tokens, \
         SUM(cost_amount) AS cost_amount, cost_currency"
    };
}
pub const TENANT_DAY: &str = concat!(
    "SELECT ",
    usage_sums!(),
    " FROM usage_ledger WHERE tenant = $1 AND day = $2 GROUP BY cost_currency"
);
pub const CLAIM_ALERT: &str = "INSERT INTO usage_alerts (tenant, day, budget, percent) \
     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/// The statement of [`UsageLedger::usage_groups`]: `$1` the tenant or `NULL`, `$2` and `$3`
/// the times; a row per group and currency, in key order.
pub fn groups_sql(keys: &[UsageKey]) -> String {
    let columns: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} AS k{i}", k.column()))
        .collect();
    let by: Vec<&str> = keys.iter().map(|k| k.column()).collect();
    let by = by.join(", ");
    format!(
        concat!(
            "SELECT {}, ",
            usage_sums!(),
            " FROM usage_ledger WHERE ($1 IS NULL OR tenant = $1) AND ended_at >= $2 \
             AND ended_at < $3 GROUP BY {by}, cost_currency ORDER BY {by}, cost_currency"
        ),
        columns.join(", "),
        by = by
    )
}

fn tokens_from(row: &impl Columns) -> StoreResult<Tokens> {
    Ok(Tokens {
        input: row.get("input_tokens")?,
        output: row.get("output_tokens")?,
        thought: row.get("thought_tokens")?,
        cache_read: row.get("cache_read_tokens")?,
        cache_write: row.get("cache_write_tokens")?,
        total: row.get("total_tokens")?,
    })
}

/// The cost of column `amount`, in `cost_currency`, when both are known.
pub(crate) fn cost_from(row: &impl Columns, amount: &str) -> StoreResult<Option<Cost>> {
    let amount: Option<f64> = row.get(amount)?;
    let currency: Option<String> = row.get("cost_currency")?;
    Ok(amount
        .zip(currency)
        .map(|(amount, currency)| Cost { amount, currency }))
}

/// A row of `usage_ledger`.
pub(crate) fn turn_from(row: &impl Columns) -> StoreResult<TurnUsage> {
    Ok(TurnUsage {
        session_id: row.get("session_id")?,
        tenant: row.get("tenant")?,
        user: row.get("user_id")?,
        agent: row.get("agent")?,
        model: row.get("model")?,
        ended_at: row.get("ended_at")?,
        day: row.get("day")?,
        tokens: tokens_from(row)?,
        cost: cost_from(row, "cost_amount")?,
        cumulative: cost_from(row, "cost_cumulative")?,
    })
}

/// Rows of [`groups_sql`] (or of [`TENANT_DAY`], with no key), a group's currencies
/// merged into one group.
pub(crate) fn groups_from<R: Columns>(rows: &[R], keys: usize) -> StoreResult<Vec<UsageGroup>> {
    let mut groups: Vec<UsageGroup> = Vec::new();
    for row in rows {
        let key = if keys == 0 {
            vec![None]
        } else {
            (0..keys)
                .map(|i| row.get::<Option<String>>(&format!("k{i}")))
                .collect::<StoreResult<Vec<_>>>()?
        };
        if groups.last().is_none_or(|g| g.key != key) {
            groups.push(UsageGroup {
                key,
                sums: UsageSums::default(),
            });
        }
        let group = groups.last_mut().expect("pushed");
        let cost = cost_from(row, "cost_amount")?;
        group
            .sums
            .add(row.get("turns")?, &tokens_from(row)?, cost.as_ref());
    }
    Ok(groups)
}

/// `impl_usage!(Backend { reads, writes })` implements [`UsageLedger`] for `Backend`, from
/// the parameters of the same names of [`impl_store!`](crate::store::common), which invokes it.
macro_rules! impl_usage {
    ($backend:ty { reads: $reads:ident, writes: $writes:ident $(,)? }) => {
        #[async_trait::async_trait]
        impl $crate::store::usage::UsageLedger for $backend {
            async fn record_usage(
                &self,
                t: &$crate::store::usage::TurnUsage,
            ) -> $crate::store::error::StoreResult<()> {
                let cost = t.cost.as_ref().or(t.cumulative.as_ref());
                sqlx::query($crate::store::usage::RECORD)
                    .bind(&t.session_id)
                    .bind(&t.tenant)
                    .bind(&t.user)
                    .bind(&t.agent)
                    .bind(&t.model)
                    .bind(t.ended_at)
                    .bind(&t.day)
                    .bind(t.tokens.input)
                    .bind(t.tokens.output)
                    .bind(t.tokens.thought)
                    .bind(t.tokens.cache_read)
                    .bind(t.tokens.cache_write)
                    .bind(t.tokens.total)
                    .bind(t.cost.as_ref().map(|c| c.amount))
                    .bind(cost.map(|c| c.currency.clone()))
                    .bind(t.cumulative.as_ref().map(|c| c.amount))
                    .execute(&self.$writes)
                    .await?;
                Ok(())
            }

            async fn last_session_cost(
                &self,
                session_id: &str,
            ) -> $crate::store::error::StoreResult<Option<$crate::store::usage::Cost>> {
                let row = sqlx::query($crate::store::usage::LAST_COST)
                    .bind(session_id)
                    .fetch_optional(&self.$writes)
                    .await?;
                let cost = row.map(|r| $crate::store::usage::cost_from(&r, "cost_cumulative"));
                Ok(cost.transpose()?.flatten())
            }

            async fn session_usage(
                &self,
                session_id: &str,
                tenant: Option<&str>,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::usage::TurnUsage>> {
                let rows = sqlx::query($crate::store::usage::SESSION)
                    .bind(session_id)
                    .bind(tenant)
                    .fetch_all(&self.$reads)
                    .await?;
                rows.iter().map($crate::store::usage::turn_from).collect()
            }

            async fn usage_groups(
                &self,
                q: &$crate::store::usage::UsageQuery,
            ) -> $crate::store::error::StoreResult<Vec<$crate::store::usage::UsageGroup>> {
                let sql = $crate::store::usage::groups_sql(&q.group_by);
                let rows = sqlx::query(&sql)
                    .bind(&q.tenant)
                    .bind(q.from)
                    .bind(q.to)
                    .fetch_all(&self.$reads)
                    .await?;
                $crate::store::usage::groups_from(&rows, q.group_by.len())
            }

            async fn tenant_day_usage(
                &self,
                tenant: &str,
                day: &str,
            ) -> $crate::store::error::StoreResult<$crate::store::usage::UsageSums> {
                let rows = sqlx::query($crate::store::usage::TENANT_DAY)
                    .bind(tenant)
                    .bind(day)
                    .fetch_all(&self.$writes)
                    .await?;
                let groups = $crate::store::usage::groups_from(&rows, 0)?;
                Ok(groups
                    .into_iter()
                    .next()
                    .map(|g| g.sums)
                    .unwrap_or_default())
            }

            async fn claim_usage_alert(
                &self,
                tenant: &str,
                day: &str,
                budget: &str,
                percent: i64,
            ) -> $crate::store::error::StoreResult<bool> {
                let done = sqlx::query($crate::store::usage::CLAIM_ALERT)
                    .bind(tenant)
                    .bind(day)
                    .bind(budget)
                    .bind(percent)
                    .execute(&self.$writes)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    };
}
