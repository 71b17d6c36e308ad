//! The HTTP surface: one route table that is also the OpenAPI document. Handlers are thin:
//! extract → validate into domain types → one gateway call → response. What a handler
//! receives (the state and the extractors) is `extract.rs`'s.

pub mod acp_server;
pub mod auth;
mod changes;
mod console;
mod controls;
mod elicitations;
pub mod error;
mod events;
mod extract;
mod files;
pub mod forward;
pub mod guard;
pub mod hosted;
pub mod idempotency;
mod installs;
pub mod limits;
mod login;
mod metrics;
mod oidc;
pub mod proof;
mod responses;
mod revoked;
pub mod serve;
mod sessions;
mod share_limit;
mod shares;
mod sse;
mod system;
mod transcripts;
mod turns;
mod usage;
mod webhooks;

use std::borrow::Cow;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use extract::{AppState, Json, Path, Query};

/// The layer under which every JSON response body (`application/json`, `…+json`) writes lone
/// surrogates as the escapes they came as ([`crate::surrogates::restore`]). Only a body holding
/// an escape mark is copied; other bodies are passed on as they are (a JSON body is in one piece
/// already), and event streams are not touched (their frames are restored as they are encoded).
/// Responses of other replicas, forwarded, were restored there: this layer runs inside
/// `forward`.
pub async fn restore_surrogates(req: Request, next: axum::middleware::Next) -> Response {
    let res = next.run(req).await;
    let json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            let v = v.trim();
            v.eq_ignore_ascii_case("application/json") || v.ends_with("+json")
        });
    if !json || res.extensions().get::<files::Verbatim>().is_some() {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::error!(error = %e, "a JSON response body failed");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    let body = match crate::surrogates::restore(&bytes) {
        Cow::Borrowed(_) => Body::from(bytes),
        Cow::Owned(restored) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            Body::from(restored)
        }
    };
    Response::from_parts(parts, body)
}

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
                    .description(Some("An API key (--api-key TENANT:KEY or --admin-api-key KEY) or, with --oidc-issuer, a JWT access token of that OpenID Connect provider. SSE and WebSocket routes (the event streams, /acp, an agent's terminal login) also accept ?access_token=KEY."))
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
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    servers((url = "http://127.0.0.1:8080", description = "The default address (--listen); a deployment's own address otherwise")),
    tags(
        (name = "sessions", description = "Session metadata and lifecycle"),
        (name = "turns", description = "Prompts, cancellation, permission requests and elicitations"),
        (name = "events", description = "Server-Sent Event streams and history"),
        (name = "files", description = "The files of a session's workspace"),
        (name = "usage", description = "What turns spent: tokens and cost, per session and summed"),
        (name = "webhooks", description = "Subscriptions that POST events to a URL, and their deliveries"),
        (name = "system", description = "Agent, health, metrics and this document")
    )
)]
struct ApiDoc;

/// Every route, with its OpenAPI operation.
#[allow(deprecated)] // `GET /agent` is served still, and marked deprecated in the document
pub fn router() -> OpenApiRouter<AppState> {
    let router = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(sessions::list_sessions, sessions::create_session))
        .routes(routes!(
            sessions::get_session,
            sessions::patch_session,
            sessions::delete_session
        ))
        .routes(routes!(sessions::session_status))
        .routes(routes!(sessions::resume_session))
        .routes(routes!(sessions::close_session))
        .routes(routes!(sessions::archive_session))
        .routes(routes!(sessions::unarchive_session))
        .routes(routes!(controls::set_mode))
        .routes(routes!(controls::set_model))
        .routes(routes!(controls::set_config))
        .routes(routes!(controls::fork_session))
        .routes(routes!(turns::prompt))
        .routes(routes!(turns::cancel))
        .routes(routes!(turns::list_permissions))
        .routes(routes!(turns::answer_permission))
        .routes(routes!(turns::queue))
        .routes(routes!(turns::withdraw))
        .routes(routes!(elicitations::list_elicitations))
        .routes(routes!(elicitations::answer_elicitation))
        .routes(routes!(files::list_files, files::upload_files))
        .routes(routes!(changes::diff))
        .routes(routes!(changes::checkpoints))
        .routes(routes!(changes::revert))
        .routes(routes!(usage::session_usage))
        .routes(routes!(usage::usage))
        .routes(routes!(events::session_events))
        .routes(routes!(events::session_history))
        .routes(routes!(transcripts::export_session))
        .routes(routes!(transcripts::import_session))
        .routes(routes!(shares::create_share, shares::list_shares))
        .routes(routes!(shares::revoke_share))
        .routes(routes!(shares::open_share))
        .routes(routes!(shares::shared_history))
        .routes(routes!(shares::shared_events))
        .routes(routes!(events::watchers))
        .routes(routes!(events::lifecycle_events))
        .routes(routes!(webhooks::create_webhook, webhooks::list_webhooks))
        .routes(routes!(
            webhooks::get_webhook,
            webhooks::patch_webhook,
            webhooks::delete_webhook
        ))
        .routes(routes!(webhooks::rotate_secret))
        .routes(routes!(webhooks::list_deliveries))
        .routes(routes!(webhooks::retry_delivery))
        .routes(routes!(system::agent))
        .routes(routes!(system::agents, installs::install_agent))
        .routes(routes!(system::named_agent, installs::remove_agent))
        .routes(routes!(installs::upgrade_agent))
        .routes(routes!(installs::authenticate_agent))
        .routes(routes!(installs::logout_agent))
        .routes(routes!(login::login_agent))
        .routes(routes!(installs::registry))
        .routes(routes!(system::healthz))
        .routes(routes!(system::readyz))
        .routes(routes!(system::metrics))
        .routes(routes!(system::openapi_json))
        .routes(routes!(system::docs))
        .routes(routes!(console::index))
        .routes(routes!(console::asset))
        .routes(routes!(console::sign_in));
    let files = routes!(files::get_file, files::put_file, files::delete_file);
    catch_all(router, files, "path")
}

/// Adds `routes` (of one path whose parameter `{name}` may hold `/`) to `router`: served by
/// axum's catch-all `{*name}`, documented with the `{name}` parameter it is in OpenAPI.
fn catch_all(
    router: OpenApiRouter<AppState>,
    (schemas, paths, method_router): utoipa_axum::router::UtoipaMethodRouter<AppState>,
    name: &str,
) -> OpenApiRouter<AppState> {
    let (param, rest) = (format!("{{{name}}}"), format!("{{*{name}}}"));
    let mut router = paths.paths.keys().fold(router, |router, path| {
        router.route(&path.replace(&param, &rest), method_router.clone())
    });
    let doc = router.get_openapi_mut();
    for (path, item) in paths.paths {
        match doc.paths.paths.get_mut(&path) {
            Some(it) => it.merge_operations(item),
            None => {
                doc.paths.paths.insert(path, item);
            }
        }
    }
    let components = doc.components.get_or_insert_with(Default::default);
    components.schemas.extend(schemas);
    router
}

/// The OpenAPI document of [`router`].
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = router().into_openapi();
    add_common_responses(&mut doc);
    idempotency::document(&mut doc);
    doc
}

/// Documents the errors every operation of a kind can answer, where its own annotation does not:
/// 401 and 429 (keys and per-key limits) on every non-public route, 400 for a malformed session
/// id, 413/415/422 for a JSON body, 504 for the request timeout (not on streams), the guard's
/// 403 and 400 on every route, and 500.
/// Public routes get no security requirement.
fn add_common_responses(doc: &mut utoipa::openapi::OpenApi) {
    use responses::problem;
    for (path, item) in doc.paths.paths.iter_mut() {
        let public = auth::is_public(path);
        let streams = path.ends_with("/events");
        let ops = [
            (&mut item.get, true),
            (&mut item.post, false),
            (&mut item.put, false),
            (&mut item.patch, false),
            (&mut item.delete, false),
        ];
        for (op, safe) in ops
            .into_iter()
            .filter_map(|(op, safe)| Some((op.as_mut()?, safe)))
        {
            let mut common = vec![("500", "Internal error (details are only in the log)")];
            if public {
                // No security at all (an empty requirement object would mean "optional").
                op.security = Some(Vec::new());
            } else {
                // Stated on each operation too: some generators ignore the document's default.
                op.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new::<
                    _,
                    _,
                    String,
                >("bearer", [])]);
                common.push(("401", "Missing or unknown API key"));
                common.push((
                    "429",
                    "Too many requests for this API key (see Retry-After)",
                ));
            }
            if path.starts_with("/sessions/{id}") {
                common.push(("400", "Invalid session id"));
            }
            let body = op.request_body.as_ref();
            if body.is_some() {
                common.push(("413", "Body larger than --max-body-bytes"));
            }
            if body.is_some_and(|b| b.content.contains_key("application/json")) {
                common.push(("400", "Malformed JSON body"));
                common.push(("415", "Body is not application/json"));
                common.push(("422", "Body does not match the schema"));
            }
            // Every authenticated route but these two reads or writes the store, as the share
            // links' do.
            let reads_store = !public || path.starts_with("/shared/");
            if reads_store && !matches!(path.as_str(), "/agent" | "/metrics") {
                common.push((
                    "503",
                    "The gateway's database cannot be reached now (see Retry-After)",
                ));
            }
            if !public && !streams && !path.ends_with("/prompt") {
                common.push(("504", "The request took longer than --request-timeout"));
            }
            // The guard's, in front of every route; it checks the Origin of changes only.
            common.push((
                "403",
                if safe {
                    "The Host is not one this gateway serves (--allowed-host)"
                } else {
                    "The Host is not one this gateway serves (--allowed-host), or the request \
                     comes from a page whose Origin may not make changes (--cors-origin)"
                },
            ));
            common.push(("400", "A NUL byte (%00) in the URL"));
            for (status, description) in common {
                let responses = &mut op.responses.responses;
                match responses.get_mut(status) {
                    // Declared already, for another cause: this one is added to its description.
                    Some(utoipa::openapi::RefOr::T(response)) => {
                        let (first, rest) = description.split_at(1);
                        let cause = first.to_lowercase() + rest;
                        if !response.description.contains(&cause) {
                            response.description = format!("{}; or {cause}", response.description);
                        }
                    }
                    Some(utoipa::openapi::RefOr::Ref(_)) => {}
                    None => {
                        let mut response = problem(description);
                        if status == "429" {
                            limits::document_headers(&mut response);
                        }
                        responses.insert(status.to_owned(), response.into());
                    }
                }
            }
        }
    }
}
