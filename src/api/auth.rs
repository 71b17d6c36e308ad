//! API keys and the caller they identify. Keys are kept only as SHA-256 digests and compared in
//! constant time; a tenant key sees its own sessions, an admin key sees every session. Without
//! any key configured the gateway is single-tenant and every caller is the admin of tenant
//! `default` (and `--listen` must be loopback, see `validate`).

use std::sync::Arc;

use anyhow::Context;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::ApiError;
use crate::config::Config;
use crate::gateway::{ADMIN_TENANT, Caller};

/// Reads the [`Caller`] that [`authenticate`] identified.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(ApiError::Unauthorized)
    }
}

/// The configured keys, as digests.
pub struct Keys {
    entries: Vec<([u8; 32], Caller)>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality without an early exit, so that timing does not reveal a matching prefix.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn valid_tenant(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

impl Keys {
    /// The keys from flags, environment and file; `None` when there are none.
    pub fn from_config(config: &Config) -> anyhow::Result<Option<Arc<Keys>>> {
        let mut lines: Vec<String> = config.api_keys.clone();
        lines.extend(config.admin_api_keys.iter().map(|k| format!("*:{k}")));
        if let Some(path) = &config.api_keys_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            lines.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
        }
        let mut entries = Vec::new();
        for line in lines {
            let (tenant, key) = line
                .split_once(':')
                .context("an API key must be given as TENANT:KEY (or *:KEY for an admin key)")?;
            anyhow::ensure!(
                key.len() >= 16,
                "API keys must be at least 16 characters long (tenant {tenant:?})"
            );
            let caller = if tenant == "*" {
                Caller {
                    tenant: ADMIN_TENANT.into(),
                    admin: true,
                }
            } else {
                anyhow::ensure!(
                    valid_tenant(tenant),
                    "invalid tenant name {tenant:?}: 1-64 of A-Z a-z 0-9 - _ ."
                );
                Caller {
                    tenant: tenant.to_owned(),
                    admin: false,
                }
            };
            entries.push((digest(key), caller));
        }
        Ok((!entries.is_empty()).then(|| Arc::new(Keys { entries })))
    }

    /// The caller a key belongs to. Every entry is compared, whatever matches.
    pub fn check(&self, key: &str) -> Option<Caller> {
        let d = digest(key);
        let mut found = None;
        for (k, caller) in &self.entries {
            if constant_time_eq(k, &d) && found.is_none() {
                found = Some(caller.clone());
            }
        }
        found
    }
}

/// Routes anyone may call: probes, the API description and the console's page and assets (the
/// page asks for a key when the API answers 401).
pub(crate) fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/docs" | "/openapi.json")
        || super::console::is_console(path)
}

/// SSE routes, which browsers' EventSource opens without custom headers.
fn is_stream(method: &Method, path: &str) -> bool {
    method == Method::GET
        && (path == "/events" || path.ends_with("/events") || path == super::acp::PATH)
}

fn query_token(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "access_token").then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some(hex(*bytes.get(i + 1)?)? * 16 + hex(*bytes.get(i + 2)?)?))
            .flatten();
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Identifies the caller of every request (401 problem when a key is required and missing or
/// wrong).
pub async fn authenticate(
    State(keys): State<Option<Arc<Keys>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(keys) = keys else {
        req.extensions_mut().insert(Caller::single_tenant());
        return next.run(req).await;
    };
    let path = req.uri().path();
    if is_public(path) {
        return next.run(req).await;
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let token = bearer.or_else(|| {
        is_stream(req.method(), path)
            .then(|| req.uri().query().and_then(query_token))
            .flatten()
    });
    match token.and_then(|t| keys.check(&t)) {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => {
            let mut res = ApiError::Unauthorized.into_response();
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens() {
        let keys = Keys {
            entries: vec![
                (
                    digest("alice-key-0123456789"),
                    Caller {
                        tenant: "alice".into(),
                        admin: false,
                    },
                ),
                (
                    digest("admin-key-0123456789"),
                    Caller {
                        tenant: ADMIN_TENANT.into(),
                        admin: true,
                    },
                ),
            ],
        };
        assert_eq!(keys.check("alice-key-0123456789").unwrap().tenant, "alice");
        assert!(keys.check("admin-key-0123456789").unwrap().admin);
        assert!(keys.check("alice-key-012345678").is_none());
        assert!(keys.check("").is_none());
        assert_eq!(
            query_token("after=3&access_token=a%2Bb%3D").as_deref(),
            Some("a+b=")
        );
        assert_eq!(query_token("after=3"), None);
        assert!(is_stream(&Method::GET, "/sessions/x/events"));
        assert!(is_stream(&Method::GET, "/events"));
        assert!(!is_stream(&Method::POST, "/sessions/x/events"));
        assert!(!is_stream(&Method::GET, "/sessions/x/history"));
    }
}
