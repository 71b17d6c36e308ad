//! The configuration read and checked once, at start: the agents, the API keys (the keys file
//! is read here), the listen address against the keys, the CORS layer, the workspace roots
//! (resolved on disk) and the database URL. [`Settings::load`] is the only place that reads
//! the files the flags name; [`run`](crate::run) takes the result and reads no flag again.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::http::{Method, header};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::api::auth::Keys;
use crate::config::{AgentSpec, Config};
use crate::store::DatabaseUrl;

/// The configuration, checked, with what its flags name read.
pub struct Settings {
    /// The flags as given (their plain values are used as they are).
    pub config: Config,
    /// Every configured agent, the default first.
    pub agents: Vec<AgentSpec>,
    /// The default agent's name.
    pub default_agent: String,
    /// The API keys; `None` without any (single tenant).
    pub keys: Option<Arc<Keys>>,
    /// CORS for `--cors-origin`, if any is given.
    pub cors: Option<CorsLayer>,
    /// `--workspace-root`, canonicalised.
    pub workspace_roots: Vec<PathBuf>,
    /// `--database-url`, read.
    pub database: DatabaseUrl,
}

impl Settings {
    /// Checks every setting and reads the files they name (the keys file; the workspace roots
    /// are resolved).
    pub fn load(config: Config) -> anyhow::Result<Settings> {
        let (agents, default_agent) = config.agents()?;
        let keys = Keys::from_config(&config)?;
        if keys.is_none() && !config.listen.ip().is_loopback() && !config.allow_unauthenticated {
            anyhow::bail!(
                "refusing to listen on {} without API keys: anyone who can reach it could make the agent run tools on this host. Configure --api-key/--admin-api-key, listen on 127.0.0.1, or pass --allow-unauthenticated if something in front of the gateway authenticates clients",
                config.listen
            );
        }
        let cors = cors(&config.cors_origins)?;
        let workspace_roots = workspace_roots(&config)?;
        let database = DatabaseUrl::parse(&config.database_url).with_context(|| {
            format!(
                "--database-url {}",
                crate::redact::url(&config.database_url)
            )
        })?;
        Ok(Settings {
            config,
            agents,
            default_agent,
            keys,
            cors,
            workspace_roots,
            database,
        })
    }
}

/// The request headers the API reads, which a page on a `--cors-origin` may send: the key,
/// the body's type, the stream's resume point, `Prefer`, `Idempotency-Key`, the request id,
/// W3C trace context, and `/acp`'s connection and session.
const CORS_REQUEST_HEADERS: [&str; 12] = [
    "authorization",
    "content-type",
    "accept",
    "last-event-id",
    "prefer",
    "idempotency-key",
    "x-request-id",
    "traceparent",
    "tracestate",
    "baggage",
    "acp-connection-id",
    "acp-session-id",
];

/// The response headers the API defines, which such a page may read: where a new resource is,
/// when to retry and the limit reached (`RateLimit`, `RateLimit-Policy`), a replayed
/// idempotent answer, the preference applied, the request id, `/acp`'s connection and session,
/// and the bearer challenge.
const CORS_RESPONSE_HEADERS: [&str; 11] = [
    "location",
    "content-location",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "idempotent-replayed",
    "preference-applied",
    "x-request-id",
    "acp-connection-id",
    "acp-session-id",
    "www-authenticate",
];

/// CORS for the configured origins: credentials, and the headers of
/// [`CORS_REQUEST_HEADERS`] and [`CORS_RESPONSE_HEADERS`].
fn cors(origins: &[String]) -> anyhow::Result<Option<CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    let origins = origins
        .iter()
        .map(|o| {
            o.parse::<axum::http::HeaderValue>()
                .with_context(|| format!("invalid --cors-origin {o:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_credentials(true)
            .allow_methods([
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers(CORS_REQUEST_HEADERS.map(header::HeaderName::from_static))
            .expose_headers(CORS_RESPONSE_HEADERS.map(header::HeaderName::from_static))
            .max_age(std::time::Duration::from_secs(600)),
    ))
}

/// The workspace roots, canonicalised; each must be an existing directory.
fn workspace_roots(config: &Config) -> anyhow::Result<Vec<std::path::PathBuf>> {
    config
        .workspace_roots
        .iter()
        .map(|r| {
            let real = r
                .canonicalize()
                .with_context(|| format!("--workspace-root {}", r.display()))?;
            anyhow::ensure!(
                real.is_dir(),
                "--workspace-root {} is not a directory",
                r.display()
            );
            Ok(real)
        })
        .collect()
}
