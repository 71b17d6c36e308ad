//! The agent's description, health, readiness, metrics, the OpenAPI document and a docs page.

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use super::error::{ApiError, Problem};
use super::extract::{AppState, Json, Path};
use crate::gateway::{AgentView, Caller, NamedAgentView};

/// The default agent, its pool members and the gateway replicas (see `GET /agents`).
///
/// The default agent: `initialize` result (agentInfo, protocol version, normalised
/// capabilities, auth methods), this replica's members of it, and the gateway replicas sharing
/// the database (as of this replica's last heartbeat; one unless several serve one PostgreSQL).
/// Kept for clients written before the gateway ran several agents: `GET /agents` describes
/// every agent.
#[utoipa::path(get, operation_id = "getAgent", path = "/agent", tag = "system", responses((status = 200, description = "The default agent, its pool and the replicas", body = AgentView)))]
#[deprecated(note = "GET /agents and GET /agents/{name} describe every configured agent")]
pub async fn agent(State(s): State<AppState>) -> Json<AgentView> {
    Json(s.gateway.system().agent())
}

/// Every agent this replica runs, the default first, then those only other live replicas run.
///
/// Name, whether it is the default (used when `POST /sessions` names none), whether a member
/// is ready (and why not), its `agentInfo`, normalised capabilities and `authMethods`, this
/// replica's members of it, and the ids of the live replicas that run it (as of this replica's
/// last heartbeat). An agent only other replicas run has no members here and is not `ready`
/// here; creates and the requests about its sessions are forwarded to a replica that runs it.
#[utoipa::path(get, operation_id = "listAgents", path = "/agents", tag = "system", responses((status = 200, description = "The agents", body = Vec<NamedAgentView>)))]
pub async fn agents(State(s): State<AppState>) -> Json<Vec<NamedAgentView>> {
    Json(s.gateway.system().agents())
}

/// One agent, as `GET /agents` shows it.
#[utoipa::path(get, operation_id = "getNamedAgent", path = "/agents/{name}", tag = "system",
    params(("name" = String, Path, description = "The agent's name")),
    responses(
        (status = 200, description = "The agent", body = NamedAgentView),
        (status = 404, description = "No live replica runs an agent of that name (the detail names those that run)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn named_agent(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<NamedAgentView>, ApiError> {
    Ok(Json(s.gateway.system().named_agent(&name)?))
}

/// Liveness: the process answers.
#[utoipa::path(get, operation_id = "getHealth", path = "/healthz", tag = "system", responses((status = 200, description = "Alive", body = String)))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the store answers and at least one agent has a ready member; says which agents are.
#[utoipa::path(get, operation_id = "getReadiness", path = "/readyz", tag = "system", responses(
    (status = 200, description = "Ready", body = String),
    (status = 503, description = "Not ready, and why", body = Problem, content_type = "application/problem+json"),
))]
pub async fn readyz(State(s): State<AppState>) -> Result<String, ApiError> {
    Ok(s.gateway.system().ready().await?)
}

/// Prometheus metrics (admin keys only).
///
/// Every tenant's numbers, so only for an admin key (or anyone on a gateway without keys).
#[utoipa::path(get, operation_id = "getMetrics", path = "/metrics", tag = "system", responses(
    (status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"),
    (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
))]
pub async fn metrics(State(s): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    if !caller.admin {
        return Err(ApiError::Forbidden(
            "/metrics shows every tenant's numbers: it needs an admin key".into(),
        ));
    }
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        super::metrics::render(&s.gateway.system().stats()),
    )
        .into_response())
}

/// This OpenAPI document.
#[utoipa::path(get, operation_id = "getOpenApi", path = "/openapi.json", tag = "system", responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json(State(s): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], s.openapi)
}

/// A self-contained page that renders `/openapi.json` (no assets fetched from elsewhere).
#[utoipa::path(get, operation_id = "getDocs", path = "/docs", tag = "system", responses((status = 200, description = "HTML", body = String, content_type = "text/html")))]
pub async fn docs() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}
