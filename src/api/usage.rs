//! What turns spent: `GET /sessions/{id}/usage` and `GET /usage` (JSON, or CSV with
//! `Accept: text/csv`).

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{AppState, Json, Path, Query, SessionPath, header_lists};
use super::responses::{MalformedParams, UnknownSession};
use crate::gateway::{Caller, SessionId, SessionUsageView, UsageAsk, UsageReport, UsageRow};

/// `GET /usage` parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UsageParams {
    /// Turns that ended at or after this time (RFC 3339), or this day's start (`YYYY-MM-DD`,
    /// UTC); default: the first.
    pub from: Option<String>,
    /// Turns that ended before this time (RFC 3339), or this day's end (`YYYY-MM-DD`, UTC);
    /// default: the last.
    pub to: Option<String>,
    /// What to sum by: `tenant`, `user`, `agent`, `model`, `session`, `day`, comma-separated
    /// (default `tenant`).
    pub group_by: Option<String>,
    /// Only this tenant's turns (an admin key's filter; a tenant's key reads its own).
    pub tenant: Option<String>,
}

/// What a session's turns spent.
///
/// Each turn whose agent reported tokens (the prompt result's `usage`) or cost (its
/// `usage_update`s, whose cumulative figure the gateway turns into each turn's), and their
/// totals. Kept when the session is deleted. A figure the agent did not report is `null`.
#[utoipa::path(get, operation_id = "getSessionUsage", path = "/sessions/{id}/usage", tag = "usage",
    params(SessionPath),
    responses(
        (status = 200, description = "The session's turns, oldest first, and their totals", body = SessionUsageView),
        UnknownSession,
    ))]
pub async fn session_usage(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<SessionUsageView>, ApiError> {
    Ok(Json(s.gateway.usage().of_session(&caller, &id).await?))
}

/// What turns spent, summed.
///
/// By tenant, user, agent, model, session or day (UTC), or several of them, over the turns
/// that ended between `from` and `to`: a tenant's key reads its own tenant's, an admin's every
/// tenant's. A figure no turn of a group reported is `null`. With `Accept: text/csv`, the rows
/// as CSV: the group's keys, `turns`, the token columns, `costAmount` and `costCurrency` (when
/// the group's cost is in one currency) and `costs` (every currency, `USD=1.5;credits=3`).
#[utoipa::path(get, operation_id = "getUsage", path = "/usage", tag = "usage",
    params(UsageParams,
        ("Accept" = Option<String>, Header, description = "`text/csv`: the rows as CSV instead of JSON")),
    responses(
        (status = 200, description = "A row per group, in key order", content(
            (UsageReport = "application/json"),
            (String = "text/csv"),
        )),
        MalformedParams,
        (status = 403, description = "A tenant's key asked for another tenant's usage", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 422, description = "An unknown `groupBy` key, or `from` after `to`", body = crate::gateway::Problem, content_type = "application/problem+json"),
    ))]
pub async fn usage(
    State(s): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(p): Query<UsageParams>,
) -> Result<Response, ApiError> {
    let ask = UsageAsk {
        tenant: p.tenant,
        from: p
            .from
            .as_deref()
            .map(|t| time(t, "from", false))
            .transpose()?,
        to: p.to.as_deref().map(|t| time(t, "to", true)).transpose()?,
        group_by: p.group_by,
    };
    let report = s.gateway.usage().report(&caller, ask).await?;
    if header_lists(&headers, header::ACCEPT, "text/csv") {
        let csv = csv_of(&report);
        return Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], csv).into_response());
    }
    Ok(Json(report).into_response())
}

/// An RFC 3339 time, or a UTC day's start (`end`: its end).
fn time(text: &str, name: &str, end: bool) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.to_utc());
    }
    let day = NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| {
        ApiError::BadRequest(format!(
            "{name}: {text:?} is neither an RFC 3339 time nor a YYYY-MM-DD day"
        ))
    })?;
    let day = if end {
        day.succ_opt().unwrap_or(day)
    } else {
        day
    };
    Ok(day.and_hms_opt(0, 0, 0).expect("midnight").and_utc())
}

/// The report's rows as CSV, with a header row.
fn csv_of(report: &UsageReport) -> String {
    let written = write_csv(report).expect("CSV written to memory");
    String::from_utf8(written).expect("CSV of UTF-8 text")
}

fn write_csv(report: &UsageReport) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut out = csv::Writer::from_writer(Vec::new());
    let mut head: Vec<&str> = report.group_by.iter().map(String::as_str).collect();
    head.extend([
        "turns",
        "inputTokens",
        "outputTokens",
        "thoughtTokens",
        "cacheReadTokens",
        "cacheWriteTokens",
        "totalTokens",
        "costAmount",
        "costCurrency",
        "costs",
    ]);
    out.write_record(&head)?;
    for row in &report.rows {
        out.write_record(csv_row(&report.group_by, row))?;
    }
    Ok(out.into_inner()?)
}

fn csv_row(group_by: &[String], row: &UsageRow) -> Vec<String> {
    let k = &row.key;
    let mut cells: Vec<String> = group_by
        .iter()
        .map(|name| {
            let value = match name.as_str() {
                "tenant" => &k.tenant,
                "user" => &k.user,
                "agent" => &k.agent,
                "model" => &k.model,
                "session" => &k.session,
                _ => &k.day,
            };
            value.clone().flatten().unwrap_or_default()
        })
        .collect();
    let t = &row.totals;
    let n = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    cells.push(t.turns.to_string());
    let s = &t.spend;
    for v in [
        s.input_tokens,
        s.output_tokens,
        s.thought_tokens,
        s.cache_read_tokens,
        s.cache_write_tokens,
        s.total_tokens,
    ] {
        cells.push(n(v));
    }
    cells.push(
        s.cost
            .as_ref()
            .map(|c| c.amount.to_string())
            .unwrap_or_default(),
    );
    cells.push(
        s.cost
            .as_ref()
            .map(|c| c.currency.clone())
            .unwrap_or_default(),
    );
    let costs: Vec<String> = t
        .costs
        .iter()
        .map(|c| format!("{}={}", c.currency, c.amount))
        .collect();
    cells.push(costs.join(";"));
    cells
}
