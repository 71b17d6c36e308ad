//! The web console: a page at `/` and its assets, embedded in the binary (`include_str!`), so that
//! the gateway alone serves it: no Node at build time, nothing fetched from another origin. The
//! page is plain HTML, CSS and JavaScript modules (`console/`); it calls the REST API and the SSE
//! streams of this same origin, and asks for an API key only when the API answers 401, or, with
//! `--oidc-console-client-id`, signs in with the OpenID provider (`/console/sign-in` says how).

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::error::{ApiError, Problem};
use super::extract::{AppState, Path};

/// What the console's pages may load and do: only this origin's scripts, styles and API; no
/// inline script or style (agent text that slipped into the DOM as HTML still could not run).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The assets under `/console/`: name, content type, text.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("console/console.css"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("console/console.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("console/api.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("console/markdown.js"),
    ),
    (
        "session.js",
        "text/javascript; charset=utf-8",
        include_str!("console/session.js"),
    ),
    (
        "elicitation.js",
        "text/javascript; charset=utf-8",
        include_str!("console/elicitation.js"),
    ),
    (
        "oidc.js",
        "text/javascript; charset=utf-8",
        include_str!("console/oidc.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_str!("console/dom.js"),
    ),
    (
        "files.js",
        "text/javascript; charset=utf-8",
        include_str!("console/files.js"),
    ),
    (
        "people.js",
        "text/javascript; charset=utf-8",
        include_str!("console/people.js"),
    ),
    (
        "sessions.js",
        "text/javascript; charset=utf-8",
        include_str!("console/sessions.js"),
    ),
    (
        "usage.js",
        "text/javascript; charset=utf-8",
        include_str!("console/usage.js"),
    ),
    (
        "agents-page.js",
        "text/javascript; charset=utf-8",
        include_str!("console/agents-page.js"),
    ),
    (
        "usage-page.js",
        "text/javascript; charset=utf-8",
        include_str!("console/usage-page.js"),
    ),
    (
        "shared.js",
        "text/javascript; charset=utf-8",
        include_str!("console/shared.js"),
    ),
];

/// The page of a share link (`/shared/{token}`).
pub(super) const SHARED_PAGE: &str = include_str!("console/shared.html");

pub(super) fn embedded(content_type: &'static str, body: &'static str) -> Response {
    embedded_allowing(content_type, body, None)
}

/// [`embedded`], the page allowed to call `token_origin` too (the provider's token endpoint).
fn embedded_allowing(
    content_type: &'static str,
    body: &'static str,
    token_origin: Option<&str>,
) -> Response {
    let mut res = (
        [
            (header::CONTENT_TYPE, content_type),
            // The assets change only with the binary; revalidating keeps an upgrade visible.
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response();
    let policy = match token_origin {
        Some(origin) => CONTENT_SECURITY_POLICY.replace(
            "connect-src 'self'",
            &format!("connect-src 'self' {origin}"),
        ),
        None => CONTENT_SECURITY_POLICY.to_owned(),
    };
    if let Ok(policy) = HeaderValue::from_str(&policy) {
        res.headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    res
}

/// The web console: sessions, transcripts, prompts, permissions (no API key needed to load it).
///
/// An HTML page whose scripts and styles come from `/console/…` on this origin, served with a
/// strict `Content-Security-Policy`. It calls this API with the key it asks for when the API
/// answers 401 (kept in the tab's sessionStorage).
#[utoipa::path(get, operation_id = "getConsole", path = "/", tag = "system", responses((status = 200, description = "HTML", body = String, content_type = "text/html")))]
pub async fn index(State(state): State<AppState>) -> Response {
    let token_origin = match &state.sign_in {
        Some(oidc) => {
            // The provider's endpoints, fetched now if they are not yet.
            oidc.console_sign_in().await;
            oidc.token_origin()
        }
        None => None,
    };
    embedded_allowing(
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
        token_origin.as_deref(),
    )
}

/// How the console signs in.
///
/// `{"oidc": null}`: with an API key, when the API asks for one. Otherwise the OpenID
/// provider's issuer, the console's client id, scopes and resource, and the provider's
/// authorization and token endpoints (authorization code with PKCE).
#[utoipa::path(get, operation_id = "getConsoleSignIn", path = "/console/sign-in", tag = "system",
    responses((status = 200, description = "How the console signs in", body = Object,
        example = json!({"oidc": {"issuer": "https://idp.example.com/realms/team", "clientId": "acp-console", "scope": "openid", "resource": "acp-gateway", "authorizationEndpoint": "https://idp.example.com/realms/team/protocol/openid-connect/auth", "tokenEndpoint": "https://idp.example.com/realms/team/protocol/openid-connect/token"}}))))]
pub async fn sign_in(State(state): State<AppState>) -> axum::Json<Value> {
    let oidc = match &state.sign_in {
        Some(oidc) => oidc.console_sign_in().await,
        None => None,
    };
    axum::Json(json!({ "oidc": oidc }))
}

/// One of the console's embedded assets (CSS, JavaScript modules).
#[utoipa::path(get, operation_id = "getConsoleAsset", path = "/console/{file}", tag = "system",
    params(("file" = String, Path, description = "The asset's name, e.g. `console.js`")),
    responses(
        (status = 200, description = "The asset", content((String = "text/css"), (String = "text/javascript"))),
        (status = 404, description = "No such asset", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    let (_, content_type, body) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file)
        .ok_or_else(|| ApiError::NotFound(format!("no console asset {file:?}")))?;
    Ok(embedded(content_type, body))
}

/// Whether a request path is the console's (public: the page asks for a key itself).
pub(crate) fn is_console(path: &str) -> bool {
    path == "/" || path.starts_with("/console/")
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// Every `/console/…` the page links and every `./….js` a module imports is embedded, and
    /// the page has no inline script or style (the CSP would refuse them).
    #[test]
    fn every_asset_the_page_loads_is_embedded() {
        let html = include_str!("console/index.html");
        assert!(!html.contains("<style") && !html.contains(" style="));
        let mut wanted = Vec::new();
        for part in html.split("\"/console/").skip(1) {
            wanted.push(part.split('"').next().unwrap());
        }
        for (_, _, body) in ASSETS {
            for part in body.split("from \"./").skip(1) {
                wanted.push(part.split('"').next().unwrap());
            }
        }
        assert!(wanted.len() > 6, "{wanted:?}");
        for name in wanted {
            assert!(
                ASSETS.iter().any(|(n, _, _)| *n == name),
                "{name} is not embedded"
            );
        }
        assert!(super::is_console("/console/console.js") && super::is_console("/"));
        assert!(!super::is_console("/sessions"));
    }
}
