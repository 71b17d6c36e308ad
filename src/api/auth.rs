//! API keys and the caller they identify. Keys are kept only as SHA-256 digests and compared in
//! constant time; a tenant key sees its own sessions, an admin key sees every session. Without
//! any key configured the gateway is single-tenant and every caller is the admin of tenant
//! `default` (and `--listen` must be loopback, see `validate`).
//!
//! The keys of `--api-keys-file` are read again on SIGHUP and whenever the file's content
//! changes ([`Keys::watch`]): a removed key stops working at once, and what was opened with it
//! (event streams, `/acp` connections) ends, through the key's [`Revoked`] token. A file that
//! does not parse leaves the keys as they were.
//!
//! With `--oidc-issuer`, a bearer token shaped as a JWT is an access token of that provider,
//! checked by [`Oidc`] (`oidc.rs`); what was opened with it ends when it expires.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::oidc::{Oidc, TokenError};
pub use super::revoked::Revoked;
use crate::config::Config;
use crate::gateway::{ADMIN_TENANT, Caller, User};

/// How often the keys file is looked at for a change.
const FILE_POLL: Duration = Duration::from_secs(1);

/// Reads the [`Caller`] that [`authenticate`] identified.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let caller = parts.extensions.get::<Caller>().cloned();
        let caller = caller.ok_or(ApiError::Unauthorized)?;
        // The request's span (the handler runs in it) names whose request it is.
        tracing::Span::current().record("tenant", caller.tenant.as_str());
        Ok(caller)
    }
}

/// One key: its digest, its caller, and what ends when it is removed.
struct KeyEntry {
    digest: [u8; 32],
    caller: Caller,
    revoked: Revoked,
}

/// The configured keys, as digests: those of the flags and the environment, fixed, and those
/// of the keys file, read again on a reload.
pub struct Keys {
    fixed: Vec<String>,
    file: Option<PathBuf>,
    entries: RwLock<Arc<Vec<KeyEntry>>>,
    /// The OpenID provider whose access tokens are taken too.
    oidc: Option<Arc<Oidc>>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality without an early exit, so that timing does not reveal a matching prefix.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `TENANT:KEY` lines of a keys file's text (blank lines and `#` comments left out).
fn file_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// A `TENANT:KEY` line (`*:KEY` for an admin key; `TENANT/USER:KEY` or `*/USER:KEY` for a
/// key of one person), checked: the key's digest and caller.
fn parse_line(line: &str) -> anyhow::Result<([u8; 32], Caller)> {
    let (who, key) = line.split_once(':').context(
        "an API key must be given as TENANT:KEY or TENANT/USER:KEY (or *:KEY for an admin key)",
    )?;
    let (tenant, user) = match who.split_once('/') {
        Some((tenant, user)) => (tenant, Some(user)),
        None => (who, None),
    };
    anyhow::ensure!(
        key.len() >= 16,
        "API keys must be at least 16 characters long (tenant {tenant:?})"
    );
    let mut caller = if tenant == "*" {
        Caller::of_tenant(ADMIN_TENANT, true)
    } else {
        if let Some(why) = Caller::tenant_refused(tenant) {
            anyhow::bail!("an API key's tenant: {why}");
        }
        Caller::of_tenant(tenant, false)
    };
    if let Some(user) = user {
        anyhow::ensure!(
            Caller::valid_user(user),
            "an API key's user {user:?} is not a user name: 1-128 printable ASCII characters, no `:`"
        );
        caller.user = Some(User {
            id: user.to_owned(),
            name: None,
        });
    }
    Ok((digest(key), caller))
}

impl Keys {
    /// The keys from flags, environment and file, and the OpenID provider; `None` when no key
    /// is given and neither a keys file nor a provider is configured (a gateway with a keys
    /// file is keyed even while the file is empty).
    pub fn from_config(config: &Config) -> anyhow::Result<Option<Arc<Keys>>> {
        let mut fixed: Vec<String> = config.api_keys.clone();
        fixed.extend(config.admin_api_keys.iter().map(|k| format!("*:{k}")));
        let oidc = Oidc::from_flags(&config.oidc)?.map(Arc::new);
        if fixed.is_empty() && config.api_keys_file.is_none() && oidc.is_none() {
            return Ok(None);
        }
        let keys = Keys {
            fixed,
            file: config.api_keys_file.clone(),
            entries: RwLock::default(),
            oidc,
        };
        keys.load(keys.read_file()?.as_deref())?;
        Ok(Some(Arc::new(keys)))
    }

    /// The keys file's text, read now (`None` without a keys file).
    fn read_file(&self) -> anyhow::Result<Option<String>> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
        };
        self.file.as_ref().map(read).transpose()
    }

    /// Sets the keys: the fixed ones and those of `file_text`. A removed key's token is
    /// cancelled, a kept key keeps its own. Returns how many keys there are and how many were
    /// removed.
    fn load(&self, file_text: Option<&str>) -> anyhow::Result<(usize, usize)> {
        let parsed = self
            .fixed
            .iter()
            .map(String::as_str)
            .chain(file_text.into_iter().flat_map(file_lines))
            .map(parse_line)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut entries = self.entries.write().expect("keys lock");
        let old = entries.clone();
        let kept = |d: &[u8; 32], c: &Caller| {
            old.iter()
                .find(|e| e.digest == *d && e.caller == *c)
                .map(|e| e.revoked.clone())
        };
        let new: Vec<KeyEntry> = parsed
            .into_iter()
            .map(|(digest, caller)| {
                let revoked = kept(&digest, &caller).unwrap_or_else(Revoked::fresh);
                KeyEntry {
                    digest,
                    caller,
                    revoked,
                }
            })
            .collect();
        let removed: Vec<&KeyEntry> = old
            .iter()
            .filter(|e| !new.iter().any(|n| n.revoked.id == e.revoked.id))
            .collect();
        for e in &removed {
            e.revoked.token.cancel();
        }
        let counts = (new.len(), removed.len());
        *entries = Arc::new(new);
        Ok(counts)
    }

    /// Sets the keys from the keys file as just `read`, counted in `/metrics`; a failure (to
    /// read or to parse) keeps the keys as they were.
    pub fn reload(&self, read: anyhow::Result<Option<String>>) {
        match read.and_then(|text| self.load(text.as_deref())) {
            Ok((keys, removed)) => {
                metrics::counter!("acp_gateway_api_key_reloads_total", "result" => "ok")
                    .increment(1);
                tracing::info!(keys, removed, "API keys reloaded");
            }
            Err(e) => {
                metrics::counter!("acp_gateway_api_key_reloads_total", "result" => "failed")
                    .increment(1);
                tracing::warn!(
                    error = format!("{e:#}"),
                    "API keys not reloaded; the keys stay as they were"
                );
            }
        }
    }

    /// Reloads on SIGHUP and when the keys file's content changes, and ends what expired
    /// tokens opened, until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(signal) => Some(signal),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; API keys reload only when their file changes");
                None
            }
        };
        // Each look reads the file once; a change is loaded from what was read.
        let mut seen = self.read_file().ok().flatten();
        let mut poll = tokio::time::interval(FILE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let hung_up = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                _ = hung_up => {
                    let read = self.read_file();
                    seen = read.as_ref().ok().cloned().flatten();
                    self.reload(read);
                }
                _ = poll.tick() => {
                    if let Some(oidc) = &self.oidc {
                        oidc.expire().await;
                    }
                    if self.file.is_none() {
                        continue;
                    }
                    let read = self.read_file();
                    let now = read.as_ref().ok().and_then(Option::as_deref);
                    if now != seen.as_deref() {
                        seen = now.map(str::to_owned);
                        self.reload(read);
                    }
                }
            }
        }
    }

    /// The caller a key belongs to, and its revocation. Every entry is compared, whatever
    /// matches.
    pub fn check(&self, key: &str) -> Option<(Caller, Revoked)> {
        let d = digest(key);
        let entries = self.entries.read().expect("keys lock").clone();
        let mut found = None;
        for e in entries.iter() {
            if constant_time_eq(&e.digest, &d) && found.is_none() {
                found = Some((e.caller.clone(), e.revoked.clone()));
            }
        }
        found
    }

    /// The OpenID provider whose tokens are taken, if any.
    pub fn oidc(&self) -> Option<Arc<Oidc>> {
        self.oidc.clone()
    }

    /// The caller a bearer token identifies (an API key, or a provider's access token), and
    /// what ends when the key is removed or the token expires.
    async fn identify(&self, token: &str) -> Result<(Caller, Revoked), ApiError> {
        if let Some(oidc) = self.oidc.as_ref().filter(|_| Oidc::is_jwt(token)) {
            return oidc.identify(token).await.map_err(|e| match e {
                TokenError::Invalid(why) => ApiError::InvalidToken(why),
                TokenError::NoTenant(why) => ApiError::Forbidden(why),
                TokenError::Unavailable(why) => ApiError::ProviderUnavailable(why),
            });
        }
        self.check(token).ok_or(ApiError::Unauthorized)
    }
}

/// Routes anyone may call: probes, the API description and the console's page and assets (the
/// page asks for a key when the API answers 401).
pub(crate) fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/docs" | "/openapi.json")
        // A share link's token is its key: the routes check it themselves.
        || path.starts_with("/shared/")
        || super::console::is_console(path)
}

/// SSE and WebSocket routes, which browsers' EventSource and WebSocket open without custom
/// headers: the event streams, `/acp`, and an agent's terminal login.
fn is_stream(method: &Method, path: &str) -> bool {
    let login = path.starts_with("/agents/") && path.ends_with("/login");
    method == Method::GET
        && (path == "/events"
            || path.ends_with("/events")
            || path == super::acp_server::PATH
            || login)
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

/// The token of an `Authorization: Bearer TOKEN` header (the scheme in any case, RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Identifies the caller of every request (401 problem when a key is required and missing or
/// wrong). An event stream opened with a key ends when the key is removed.
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
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .map(str::to_owned)
        .or_else(|| {
            is_stream(req.method(), path)
                .then(|| req.uri().query().and_then(query_token))
                .flatten()
        });
    let identified = match token {
        Some(token) => keys.identify(&token).await,
        None => Err(ApiError::Unauthorized),
    };
    let (caller, revoked) = match identified {
        Ok(identified) => identified,
        Err(e) => {
            let challenge = match &e {
                ApiError::InvalidToken(_) => "Bearer error=\"invalid_token\"",
                _ => "Bearer",
            };
            let mut res = e.into_response();
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
            return res;
        }
    };
    req.extensions_mut().insert(caller);
    req.extensions_mut().insert(revoked.clone());
    let res = next.run(req).await;
    let streaming = super::sse::is_event_stream(&res);
    if !streaming {
        return res;
    }
    let (parts, body) = res.into_parts();
    let body = body
        .into_data_stream()
        .take_until(revoked.token.cancelled_owned());
    Response::from_parts(parts, Body::from_stream(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens() {
        let keys = Keys {
            fixed: vec![
                "alice:alice-key-0123456789".into(),
                "*:admin-key-0123456789".into(),
            ],
            file: None,
            entries: RwLock::default(),
            oidc: None,
        };
        keys.load(None).unwrap();
        assert_eq!(
            keys.check("alice-key-0123456789").unwrap().0.tenant,
            "alice"
        );
        assert!(keys.check("admin-key-0123456789").unwrap().0.admin);
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
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn a_reload_revokes_only_the_removed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(
            &file,
            "alice:alice-key-0123456789\nbob:bob-key-0123456789ab\n",
        )
        .unwrap();
        let keys = Keys {
            fixed: vec!["*:admin-key-0123456789".into()],
            file: Some(file.clone()),
            entries: RwLock::default(),
            oidc: None,
        };
        keys.load(keys.read_file().unwrap().as_deref()).unwrap();
        let (_, alice) = keys.check("alice-key-0123456789").unwrap();
        let (_, bob) = keys.check("bob-key-0123456789ab").unwrap();
        std::fs::write(&file, "alice:alice-key-0123456789\n").unwrap();
        assert_eq!(
            keys.load(keys.read_file().unwrap().as_deref()).unwrap(),
            (2, 1)
        );
        assert!(bob.token.is_cancelled());
        assert!(!alice.token.is_cancelled());
        assert!(keys.check("bob-key-0123456789ab").is_none());
        assert_eq!(keys.check("alice-key-0123456789").unwrap().1.id, alice.id);
        std::fs::write(&file, "alice short\n").unwrap();
        keys.reload(keys.read_file());
        assert!(
            keys.check("alice-key-0123456789").is_some(),
            "a bad file keeps the keys"
        );
        assert!(keys.check("admin-key-0123456789").is_some());
    }
}
