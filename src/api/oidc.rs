//! OpenID Connect access tokens: a JWT signed by the configured provider (`--oidc-issuer`)
//! identifies its caller as an API key does, beside the keys.
//!
//! The provider's signing keys come from the `jwks_uri` of its discovery document and are kept
//! until a token names a key id they lack (a rotation at the provider): then they are fetched
//! again, by one request for all the tokens waiting, at most once per [`REFETCH_MIN`] (a
//! token that comes sooner waits for the next fetch), and once an hour anyway. A token is checked with the algorithm of its key, never with the one its header
//! names alone: `alg: none` does not parse, and no HMAC key is ever taken from the key set, so
//! a token signed with a public key as an HMAC secret fails. `iss`, `aud` and `exp` are
//! required; `exp` and `nbf` are checked with `--oidc-clock-skew`.
//!
//! A checked token is remembered until it expires, with one [`Revoked`] for whatever is opened
//! with it (event streams, `/acp` connections): [`Oidc::expire`] cancels it once the token's
//! time is up, as removing an API key does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::revoked::Revoked;
use crate::config::OidcFlags;
use crate::gateway::{ADMIN_TENANT, Caller, User};
use crate::redact;

/// The shortest time between two fetches of the provider's keys.
const REFETCH_MIN: Duration = Duration::from_secs(1);

/// How long the provider's keys are kept when no token asks for others.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);

/// How long a request to the provider may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a bearer token was not taken.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Not a valid token of the provider (401): the reason, for the caller.
    #[error("{0}")]
    Invalid(String),
    /// Valid, but it names no tenant (403).
    #[error("{0}")]
    NoTenant(String),
    /// The provider's keys cannot be fetched (503).
    #[error("{0}")]
    Unavailable(String),
}

/// The provider's keys as last fetched, and its endpoints.
#[derive(Default)]
struct KeySet {
    keys: Vec<SigningKey>,
    endpoints: Option<Endpoints>,
    /// When they were last fetched, or a fetch last failed.
    fetched: Option<Instant>,
    /// Whether that last fetch failed.
    failed: bool,
}

/// Where a browser signs in with the provider (from its discovery document).
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub authorization: String,
    pub token: String,
}

/// One key of the provider's set: its id, the key, and the algorithms it signs with.
#[derive(Clone)]
struct SigningKey {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// A token checked already, until it expires.
struct Known {
    caller: Caller,
    revoked: Revoked,
    /// When the token expires (its `exp` and the clock skew).
    until: SystemTime,
}

/// The provider's settings, its keys and the tokens taken.
pub struct Oidc {
    issuer: String,
    audience: String,
    /// The console's client id and scopes, when the console signs in with the provider.
    console: Option<(String, String)>,
    validation: Validation,
    tenant_claim: String,
    roles_claim: String,
    admin_role: Option<String>,
    skew: Duration,
    http: reqwest::Client,
    keys: RwLock<Arc<KeySet>>,
    /// Held while one fetch runs, so that the others wait for it instead of fetching too.
    fetching: tokio::sync::Mutex<()>,
    known: Mutex<HashMap<[u8; 32], Known>>,
}

impl Oidc {
    /// The provider of `--oidc-issuer`, if one is set (its keys are fetched when first needed).
    pub fn from_flags(flags: &OidcFlags) -> anyhow::Result<Option<Oidc>> {
        let Some(issuer) = flags.oidc_issuer.clone() else {
            anyhow::ensure!(
                flags.oidc_audience.is_none(),
                "--oidc-audience needs --oidc-issuer"
            );
            return Ok(None);
        };
        reqwest::Url::parse(&issuer).with_context(|| format!("--oidc-issuer {issuer:?}"))?;
        let audience = flags
            .oidc_audience
            .clone()
            .context("--oidc-issuer needs --oidc-audience: the aud its tokens must carry")?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[&issuer]);
        validation.set_audience(&[&audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = flags.oidc_clock_skew;
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .context("the HTTP client for the OpenID provider")?;
        let console = flags
            .oidc_console_client_id
            .clone()
            .map(|id| (id, flags.oidc_console_scope.clone()));
        Ok(Some(Oidc {
            issuer,
            audience,
            console,
            validation,
            tenant_claim: flags.oidc_tenant_claim.clone(),
            roles_claim: flags.oidc_roles_claim.clone(),
            admin_role: flags.oidc_admin_role.clone(),
            skew: Duration::from_secs(flags.oidc_clock_skew),
            http,
            keys: RwLock::default(),
            fetching: tokio::sync::Mutex::new(()),
            known: Mutex::default(),
        }))
    }

    /// Whether `token` has the shape of a JWT (three base64url parts), which no API key needs.
    pub fn is_jwt(token: &str) -> bool {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3
            && parts[..2].iter().all(|p| !p.is_empty())
            && parts.iter().all(|p| {
                p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
    }

    /// The caller `token` identifies, and what ends when it expires.
    pub async fn identify(&self, token: &str) -> Result<(Caller, Revoked), TokenError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(k) = self.known.lock().expect("tokens lock").get(&digest)
            && k.until > SystemTime::now()
        {
            return Ok((k.caller.clone(), k.revoked.clone()));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            TokenError::Invalid(format!("the bearer token is not a signed JWT: {e}"))
        })?;
        let seen = self.keys.read().expect("keys lock").clone();
        let key = match key_for(&seen, header.kid.as_deref(), header.alg) {
            Some(found) => found,
            None => {
                self.refetch(seen.fetched).await;
                let now = self.keys.read().expect("keys lock").clone();
                if now.failed {
                    return Err(TokenError::Unavailable(format!(
                        "the identity provider's signing keys cannot be fetched from {}",
                        redact::url(&self.issuer)
                    )));
                }
                key_for(&now, header.kid.as_deref(), header.alg).ok_or_else(|| {
                    TokenError::Invalid(match &header.kid {
                        Some(kid) => format!("the token's key {kid:?} is not one of the provider's signing keys for {:?}", header.alg),
                        None => format!("no signing key of the provider signs with {:?}", header.alg),
                    })
                })?
            }
        };
        let (decoding, algorithms) = key;
        let mut validation = self.validation.clone();
        validation.algorithms = algorithms;
        let claims =
            jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &decoding, &validation)
                .map_err(|e| TokenError::Invalid(refusal(e.kind(), &self.issuer)))?
                .claims;
        let caller = self.caller(&claims)?;
        let exp = claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
        let until = UNIX_EPOCH + Duration::from_secs(exp) + self.skew;
        // The same second as `exp` passes the check above (whole seconds), but what the token
        // opened ends then: so does the token.
        if until <= SystemTime::now() {
            return Err(TokenError::Invalid(refusal(
                &ErrorKind::ExpiredSignature,
                "",
            )));
        }
        let revoked = Revoked::fresh();
        let mut known = self.known.lock().expect("tokens lock");
        let k = known.entry(digest).or_insert(Known {
            caller,
            revoked,
            until,
        });
        Ok((k.caller.clone(), k.revoked.clone()))
    }

    /// The caller of a valid token's claims: an admin by role, else the tenant its claim names.
    fn caller(&self, claims: &serde_json::Map<String, Value>) -> Result<Caller, TokenError> {
        let admin =
            self.admin_role
                .as_ref()
                .is_some_and(|role| match claim(claims, &self.roles_claim) {
                    Some(Value::Array(roles)) => roles.iter().any(|r| r.as_str() == Some(role)),
                    Some(Value::String(roles)) => roles.split(' ').any(|r| r == role),
                    _ => false,
                });
        // The person: `sub`, shown by `name` or `email`.
        let text = |key: &str| claims.get(key).and_then(Value::as_str).map(str::to_owned);
        let user = text("sub").map(|id| User {
            id,
            name: text("name").or_else(|| text("email")),
        });
        let unprintable = |t: &String| t.chars().any(char::is_control);
        if user.as_ref().is_some_and(|u| {
            unprintable(&u.id) || u.id.len() > 255 || u.name.as_ref().is_some_and(unprintable)
        }) {
            return Err(TokenError::Invalid(
                "the token's sub, name or email holds control characters, or its sub is over 255 bytes".into(),
            ));
        }
        if admin {
            return Ok(Caller {
                user,
                ..Caller::of_tenant(ADMIN_TENANT, true)
            });
        }
        let tenant = match claim(claims, &self.tenant_claim) {
            Some(Value::String(t)) => match Caller::tenant_refused(t) {
                None => t.clone(),
                Some(why) => {
                    return Err(TokenError::NoTenant(format!(
                        "the token's {:?} claim names no tenant of its own: {why}",
                        self.tenant_claim
                    )));
                }
            },
            Some(other) => {
                return Err(TokenError::NoTenant(format!(
                    "the token's {:?} claim is not a tenant name (1-64 of A-Z a-z 0-9 - _ .): {other}",
                    self.tenant_claim
                )));
            }
            None => {
                return Err(TokenError::NoTenant(format!(
                    "the token names no tenant: it has no {:?} claim",
                    self.tenant_claim
                )));
            }
        };
        Ok(Caller {
            user,
            ..Caller::of_tenant(&tenant, false)
        })
    }

    /// Fetches the provider's keys again, unless that was done since they were `seen`
    /// fetched; no sooner than [`REFETCH_MIN`] after the last fetch.
    async fn refetch(&self, seen: Option<Instant>) {
        let _fetching = self.fetching.lock().await;
        let last = self.keys.read().expect("keys lock").fetched;
        if last != seen {
            return;
        }
        if let Some(at) = last {
            tokio::time::sleep(REFETCH_MIN.saturating_sub(at.elapsed())).await;
        }
        let fetched = self.fetch().await;
        let mut keys = self.keys.write().expect("keys lock");
        let set = match fetched {
            Ok(fetched) => {
                metrics::counter!("acp_gateway_oidc_key_fetches_total").increment(1);
                tracing::info!(keys = fetched.0.len(), issuer = %redact::url(&self.issuer), "the OpenID provider's keys fetched");
                KeySet {
                    keys: fetched.0,
                    endpoints: Some(fetched.1),
                    fetched: Some(Instant::now()),
                    failed: false,
                }
            }
            Err(e) => {
                metrics::counter!("acp_gateway_oidc_key_fetch_failures_total").increment(1);
                tracing::warn!(error = %redact::text(&format!("{e:#}")), issuer = %redact::url(&self.issuer), "the OpenID provider's keys could not be fetched");
                KeySet {
                    keys: keys.keys.clone(),
                    endpoints: keys.endpoints.clone(),
                    fetched: Some(Instant::now()),
                    failed: true,
                }
            }
        };
        *keys = Arc::new(set);
    }

    /// The provider's signing keys and endpoints, through its discovery document.
    async fn fetch(&self) -> anyhow::Result<(Vec<SigningKey>, Endpoints)> {
        let discovery = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let document: Value = self.get_json(&discovery).await?;
        anyhow::ensure!(
            document.get("issuer").and_then(Value::as_str) == Some(self.issuer.as_str()),
            "{discovery} names another issuer: {}",
            document.get("issuer").unwrap_or(&Value::Null)
        );
        let jwks_uri = document
            .get("jwks_uri")
            .and_then(Value::as_str)
            .with_context(|| format!("{discovery} has no jwks_uri"))?;
        let set: Value = self.get_json(jwks_uri).await?;
        let keys = set
            .get("keys")
            .and_then(Value::as_array)
            .with_context(|| format!("{jwks_uri} is not a JWK set"))?;
        let endpoint = |name: &str| {
            document
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let endpoints = Endpoints {
            authorization: endpoint("authorization_endpoint"),
            token: endpoint("token_endpoint"),
        };
        // One key at a time: a key of a kind this build cannot read is left out, not the set.
        Ok((keys.iter().filter_map(signing_key).collect(), endpoints))
    }

    /// How the console signs in with the provider (`None` without `--oidc-console-client-id`,
    /// or while the provider's discovery document cannot be fetched).
    pub async fn console_sign_in(&self) -> Option<Value> {
        let (client_id, scope) = self.console.as_ref()?;
        let mut endpoints = self.keys.read().expect("keys lock").endpoints.clone();
        if endpoints.is_none() {
            self.refetch(None).await;
            endpoints = self.keys.read().expect("keys lock").endpoints.clone();
        }
        let endpoints = endpoints?;
        Some(serde_json::json!({
            "issuer": self.issuer,
            "clientId": client_id,
            "scope": scope,
            "resource": self.audience,
            "authorizationEndpoint": endpoints.authorization,
            "tokenEndpoint": endpoints.token,
        }))
    }

    /// The origin of the provider's token endpoint, which the console's page must be allowed
    /// to call (its `connect-src`), once known.
    pub fn token_origin(&self) -> Option<String> {
        self.console.as_ref()?;
        let endpoints = self.keys.read().expect("keys lock").endpoints.clone()?;
        let url = reqwest::Url::parse(&endpoints.token).ok()?;
        Some(url.origin().ascii_serialization())
    }

    async fn get_json(&self, url: &str) -> anyhow::Result<Value> {
        let res = self.http.get(url).send().await?.error_for_status()?;
        let body = res.bytes().await?;
        serde_json::from_slice(&body).with_context(|| format!("{url} is not JSON"))
    }

    /// Ends what was opened with tokens that have expired, and forgets them; fetches the keys
    /// again once they are [`KEYS_MAX_AGE`] old. Called every second by the keys' watcher.
    pub async fn expire(&self) {
        let now = SystemTime::now();
        self.known.lock().expect("tokens lock").retain(|_, k| {
            let live = k.until > now;
            if !live {
                k.revoked.token.cancel();
            }
            live
        });
        let fetched = self.keys.read().expect("keys lock").fetched;
        if fetched.is_some_and(|at| at.elapsed() > KEYS_MAX_AGE) {
            self.refetch(fetched).await;
        }
    }
}

/// The key of `keys` that checks a token of `kid` and `alg`, with the algorithms it signs with.
fn key_for(
    keys: &KeySet,
    kid: Option<&str>,
    alg: Algorithm,
) -> Option<(DecodingKey, Vec<Algorithm>)> {
    keys.keys
        .iter()
        .find(|k| match kid {
            Some(kid) => k.kid.as_deref() == Some(kid),
            None => k.algorithms.contains(&alg),
        })
        .map(|k| (k.key.clone(), k.algorithms.clone()))
}

/// A claim by dotted path (`realm_access.roles`); a name with dots of its own is tried whole
/// first.
fn claim<'a>(claims: &'a serde_json::Map<String, Value>, path: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    let mut parts = path.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.get(part)?;
    }
    Some(value)
}

/// A JWK set entry as a key that checks signatures, with the algorithms it may check: those of
/// its `alg`, else those of its kind and curve. Symmetric (`oct`) keys and encryption keys are
/// left out.
fn signing_key(jwk: &Value) -> Option<SigningKey> {
    if jwk
        .get("use")
        .and_then(Value::as_str)
        .is_some_and(|u| u != "sig")
    {
        return None;
    }
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwk.clone()).ok()?;
    let algorithms = match (&jwk.algorithm, jwk.common.key_algorithm) {
        (AlgorithmParameters::OctetKey(_), _) | (AlgorithmParameters::Other(_), _) => return None,
        (_, Some(alg)) => vec![Algorithm::try_from(alg).ok()?],
        (AlgorithmParameters::RSA(_), None) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        (AlgorithmParameters::EllipticCurve(ec), None) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        (AlgorithmParameters::OctetKeyPair(_), None) => vec![Algorithm::EdDSA],
        _ => return None,
    };
    if algorithms
        .iter()
        .any(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512))
    {
        return None;
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(SigningKey {
        kid: jwk.common.key_id,
        key,
        algorithms,
    })
}

/// What a caller is told of a token refused.
fn refusal(kind: &ErrorKind, issuer: &str) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "the token was not issued for this gateway (aud)".into(),
        ErrorKind::InvalidIssuer => {
            format!("the token was not issued by {} (iss)", redact::url(issuer))
        }
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim:?} claim"),
        ErrorKind::InvalidAlgorithm => "the token's alg is not its key's".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        other => format!("the bearer token is not valid: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_of_a_jwt() {
        assert!(Oidc::is_jwt("eyJh.eyJz.c2ln"));
        assert!(Oidc::is_jwt("eyJh.eyJz."), "unsigned: refused later");
        assert!(!Oidc::is_jwt("alice-key-0123456789"));
        assert!(!Oidc::is_jwt("a.b"));
        assert!(!Oidc::is_jwt("a.b.c.d"));
        assert!(!Oidc::is_jwt("a+b.c.d"));
    }

    #[test]
    fn claims_by_path() {
        let claims = serde_json::json!({
            "tenant": "acme",
            "realm_access": {"roles": ["admin"]},
            "https://example.com/org": "globex",
        });
        let claims = claims.as_object().unwrap();
        assert_eq!(claim(claims, "tenant"), Some(&Value::from("acme")));
        assert_eq!(
            claim(claims, "realm_access.roles"),
            Some(&serde_json::json!(["admin"]))
        );
        assert_eq!(
            claim(claims, "https://example.com/org"),
            Some(&Value::from("globex"))
        );
        assert_eq!(claim(claims, "realm_access.groups"), None);
    }

    #[test]
    fn a_claim_naming_the_gateways_own_tenant_is_refused() {
        let flags = OidcFlags {
            oidc_issuer: Some("http://127.0.0.1:1".into()),
            oidc_audience: Some("urn:gw".into()),
            oidc_tenant_claim: "tenant".into(),
            oidc_roles_claim: "roles".into(),
            oidc_admin_role: Some("admin".into()),
            oidc_console_client_id: None,
            oidc_console_scope: "openid".into(),
            oidc_clock_skew: 0,
        };
        let oidc = Oidc::from_flags(&flags).unwrap().unwrap();
        let caller = |claims: Value| oidc.caller(claims.as_object().unwrap());
        for tenant in ["admin", "default", "Admin"] {
            match caller(serde_json::json!({ "tenant": tenant })) {
                Err(TokenError::NoTenant(why)) => assert!(why.contains("reserved"), "{why}"),
                other => panic!("{tenant}: {:?}", other.map(|c| c.tenant)),
            }
        }
        let acme = caller(serde_json::json!({"tenant": "acme"})).unwrap();
        assert_eq!((acme.tenant.as_str(), acme.admin), ("acme", false));
        let ops = caller(serde_json::json!({"tenant": "admin", "roles": ["admin"]})).unwrap();
        assert!(
            ops.admin,
            "the admin role makes an admin, whatever the tenant claim"
        );
    }

    #[test]
    fn symmetric_keys_are_never_taken() {
        let oct = serde_json::json!({"kty": "oct", "k": "c2VjcmV0", "alg": "HS256", "kid": "h"});
        assert!(signing_key(&oct).is_none());
        let enc = serde_json::json!({"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"});
        assert!(signing_key(&enc).is_none());
    }
}
