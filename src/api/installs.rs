//! Agents from an ACP registry: the registry (`GET /registry`), an agent installed
//! (`POST /agents`), upgraded (`POST /agents/{name}/upgrade`) and removed
//! (`DELETE /agents/{name}`). Changing the agents takes an admin key.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Deserialize;
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::{AppState, Json, Path};
use crate::gateway::{Caller, InstallView, RegistryView, SignInView};

/// `POST /agents`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"registry": "claude-acp", "version": "0.85.1", "name": "claude"}))]
pub struct InstallAgent {
    /// The registry entry's id (`GET /registry`).
    pub registry: String,
    /// The version to install (default: the registry's). Another version is possible for an
    /// npm or Python package; a binary archive comes only in the registry's.
    pub version: Option<String>,
    /// What sessions name it by (default: its id).
    pub name: Option<String>,
}

/// `POST /agents/{name}/upgrade`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"version": "0.86.0"}))]
pub struct UpgradeAgent {
    /// The version to move to (default: the registry's now).
    pub version: Option<String>,
}

/// The ACP agent registry, with what this gateway installed of it.
///
/// The agents of `--registry` (the official `registry.json` by default, or a file or mirror):
/// each one's id, name, version, description, links, the distributions it offers that run on
/// this machine (`binary` for this platform, `npx`, `uvx`; the first is what an install takes)
/// and the names it is installed as here.
#[utoipa::path(get, operation_id = "getRegistry", path = "/registry", tag = "system", responses(
    (status = 200, description = "The registry's agents", body = RegistryView),
    (status = 502, description = "The registry cannot be fetched or read", body = Problem, content_type = "application/problem+json"),
))]
pub async fn registry(State(s): State<AppState>) -> Result<Json<RegistryView>, ApiError> {
    Ok(Json(s.gateway.installs().registry().await?))
}

/// Install an agent from the registry (admin only).
///
/// Answers 202 at once and installs in the background: a binary archive downloaded (its
/// sha256 recorded; every replica's later download must match it), unpacked under
/// `--agents-dir` refusing any entry that would leave its folder; an npm or Python package
/// installed there, pinned. `GET /agents/{name}` (the `Location`) shows the progress, then
/// the running agent, or why the install failed (leaving nothing behind). Every replica on
/// the database installs it too, and keeps it across restarts.
#[utoipa::path(post, operation_id = "installAgent", path = "/agents", tag = "system",
    request_body = InstallAgent,
    responses(
        (status = 202, description = "Being installed; `Location` is the agent", body = InstallView,
            headers(("Location" = String, description = "`/agents/{name}`"))),
        (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The registry has no such agent", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An agent of that name exists, or is being installed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad name, a version the distribution cannot give, or nothing that runs on this machine", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The registry cannot be fetched or read", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn install_agent(
    State(s): State<AppState>,
    caller: Caller,
    Json(body): Json<InstallAgent>,
) -> Result<impl IntoResponse, ApiError> {
    let installs = s.gateway.installs();
    let (name, view) = installs
        .install(
            &caller,
            &body.registry,
            body.version.as_deref(),
            body.name.as_deref(),
        )
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/agents/{name}"))],
        Json(view),
    ))
}

/// Move an installed agent to another version (admin only).
///
/// Installs the version (default: the registry's now) in the background beside the one
/// running, which goes on until the new one is in; then every replica moves to it.
#[utoipa::path(post, operation_id = "upgradeAgent", path = "/agents/{name}/upgrade", tag = "system",
    params(("name" = String, Path, description = "The installed agent's name")),
    request_body = UpgradeAgent,
    responses(
        (status = 202, description = "Being installed", body = InstallView),
        (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No installed agent of that name", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "At that version already, being installed, or an agent configured with flags", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A version the distribution cannot give", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The registry cannot be fetched or read", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn upgrade_agent(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Json(body): Json<UpgradeAgent>,
) -> Result<impl IntoResponse, ApiError> {
    let view = (s.gateway.installs())
        .upgrade(&caller, &name, body.version.as_deref())
        .await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// `POST /agents/{name}/authenticate`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schema(example = json!({"methodId": "openai-api-key"}))]
pub struct AuthenticateAgent {
    /// One of the agent's `authMethods` (`GET /agents/{name}`).
    pub method_id: String,
}

/// Sign an agent in (admin only).
///
/// Runs ACP `authenticate` with the method on every member of the agent (its tenants' pools
/// too), and on every member that starts later; an agent installed from the registry is
/// signed in on every replica. A method that reads a key from the environment (`env_var`)
/// finds it in the agent's: the gateway's environment, the agent's `env`, or a tenant's
/// `[tenants.NAME.env]` for that tenant's pool. A `terminal` method is run over the WebSocket
/// `GET /agents/{name}/login` instead (409 here).
#[utoipa::path(post, operation_id = "authenticateAgent", path = "/agents/{name}/authenticate", tag = "system",
    params(("name" = String, Path, description = "The agent's name")),
    request_body = AuthenticateAgent,
    responses(
        (status = 200, description = "Signed in", body = SignInView),
        (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "This replica runs no agent of that name", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A terminal method: use the login WebSocket", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The agent offers no such method", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The agent refused the sign-in (`agent-auth-required`, with its `authMethods`), or has not started yet", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn authenticate_agent(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Json(body): Json<AuthenticateAgent>,
) -> Result<Json<SignInView>, ApiError> {
    let installs = s.gateway.installs();
    Ok(Json(
        installs
            .authenticate(&caller, &name, &body.method_id)
            .await?,
    ))
}

/// Log an agent out (admin only).
///
/// Runs ACP `logout` on every member of the agent (its tenants' pools too); members that
/// start later do not authenticate. An agent installed from the registry is logged out on
/// every replica. 501 for an agent that does not advertise `auth.logout`.
#[utoipa::path(post, operation_id = "logoutAgent", path = "/agents/{name}/logout", tag = "system",
    params(("name" = String, Path, description = "The agent's name")),
    responses(
        (status = 204, description = "Logged out"),
        (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "This replica runs no agent of that name", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The agent does not support logout", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The agent refused the logout", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "No member of the agent has started yet", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn logout_agent(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.gateway.installs().logout(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove an installed agent (admin only).
///
/// Stops its processes and removes its files on every replica. 409 while it has live
/// sessions on any replica, and for an agent configured with the gateway's flags or file.
#[utoipa::path(delete, operation_id = "removeAgent", path = "/agents/{name}", tag = "system",
    params(("name" = String, Path, description = "The installed agent's name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No installed agent of that name", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "It has live sessions, or it is configured with flags", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn remove_agent(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    s.gateway.installs().remove(&caller, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
