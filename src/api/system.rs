//! The agent's description, health, readiness, metrics, the OpenAPI document and a docs page.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse};

use super::error::{ApiError, Problem};
use super::{AppState, Json};
use crate::gateway::AgentView;

/// The agent behind the gateway, its pool members and the gateway replicas.
///
/// The agent behind the gateway: `initialize` result (agentInfo, protocol version, normalised
/// capabilities, auth methods), this replica's pool members, and the gateway replicas sharing
/// the database (as of this replica's last heartbeat; one unless several serve one PostgreSQL).
#[utoipa::path(get, operation_id = "getAgent", path = "/agent", tag = "system", responses((status = 200, description = "The agent, the pool and the replicas", body = AgentView)))]
pub async fn agent(State(s): State<AppState>) -> Json<AgentView> {
    Json(s.gateway.agent())
}

/// Liveness: the process answers.
#[utoipa::path(get, operation_id = "getHealth", path = "/healthz", tag = "system", responses((status = 200, description = "Alive", body = String)))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the store answers and at least one pool member is ready.
#[utoipa::path(get, operation_id = "getReadiness", path = "/readyz", tag = "system", responses(
    (status = 200, description = "Ready", body = String),
    (status = 503, description = "Not ready, and why", body = Problem, content_type = "application/problem+json"),
))]
pub async fn readyz(State(s): State<AppState>) -> Result<&'static str, ApiError> {
    s.gateway.ready().await?;
    Ok("ready")
}

/// Prometheus metrics.
#[utoipa::path(get, operation_id = "getMetrics", path = "/metrics", tag = "system", responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        super::metrics::render(&s.gateway.stats()),
    )
}

/// This OpenAPI document.
#[utoipa::path(get, operation_id = "getOpenApi", path = "/openapi.json", tag = "system", responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json() -> impl IntoResponse {
    (StatusCode::OK, axum::Json(super::openapi()))
}

/// A self-contained page that renders `/openapi.json` (no assets fetched from elsewhere).
#[utoipa::path(get, operation_id = "getDocs", path = "/docs", tag = "system", responses((status = 200, description = "HTML", body = String, content_type = "text/html")))]
pub async fn docs() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}
