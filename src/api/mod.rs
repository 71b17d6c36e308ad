//! The HTTP surface: one route table that is also the OpenAPI document. Handlers are thin:
//! extract → validate into domain types → one gateway call → response.

pub mod auth;
mod events;
mod sessions;
mod system;
mod turns;

use axum::extract::FromRequest;
use axum::extract::FromRequestParts;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::gateway::Gateway;

/// The one state type handlers receive.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Gateway,
}

/// JSON body extractor whose rejection is a problem+json [`ApiError`].
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

impl<T: serde::Serialize> axum::response::IntoResponse for Json<T> {
    fn into_response(self) -> axum::response::Response {
        axum::Json(self.0).into_response()
    }
}

/// Path extractor whose rejection is a problem+json [`ApiError`].
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// Query extractor whose rejection is a problem+json [`ApiError`].
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

/// Adds the bearer-key security scheme (required on every route but the public probes and
/// this document when the gateway has API keys).
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key (--api-key TENANT:KEY or --admin-api-key KEY). SSE routes also accept ?access_token=KEY."))
                    .build(),
            ),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    info(
        title = "acp-gateway",
        description = "HTTP and Server-Sent Events in front of ACP (Agent Client Protocol) coding agents. Errors are RFC 9457 application/problem+json.",
        license(name = "Apache-2.0")
    ),
    tags(
        (name = "sessions", description = "Session metadata and lifecycle"),
        (name = "turns", description = "Prompts, cancellation and permission requests"),
        (name = "events", description = "Server-Sent Event streams and history"),
        (name = "system", description = "Agent, health, metrics and this document")
    )
)]
struct ApiDoc;

/// Every route, with its OpenAPI operation.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(sessions::list_sessions, sessions::create_session))
        .routes(routes!(
            sessions::get_session,
            sessions::patch_session,
            sessions::delete_session
        ))
        .routes(routes!(sessions::session_status))
        .routes(routes!(sessions::resume_session))
        .routes(routes!(sessions::close_session))
        .routes(routes!(turns::prompt))
        .routes(routes!(turns::cancel))
        .routes(routes!(turns::list_permissions))
        .routes(routes!(turns::answer_permission))
        .routes(routes!(events::session_events))
        .routes(routes!(events::session_history))
        .routes(routes!(events::lifecycle_events))
        .routes(routes!(system::agent))
        .routes(routes!(system::healthz))
        .routes(routes!(system::readyz))
        .routes(routes!(system::metrics))
        .routes(routes!(system::openapi_json))
        .routes(routes!(system::docs))
}

/// The OpenAPI document of [`router`].
pub fn openapi() -> utoipa::openapi::OpenApi {
    router().into_openapi()
}
