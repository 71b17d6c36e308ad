//! The web console: a page at `/` and its assets, embedded in the binary (`include_str!`), so that
//! the gateway alone serves it: no Node at build time, nothing fetched from another origin. The
//! page is plain HTML, CSS and JavaScript modules (`console/`); it calls the REST API and the SSE
//! streams of this same origin, and asks for an API key only when the API answers 401.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::Path;
use super::error::{ApiError, Problem};

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
        "sessions.js",
        "text/javascript; charset=utf-8",
        include_str!("console/sessions.js"),
    ),
];

fn embedded(content_type: &'static str, body: &'static str) -> Response {
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
    res.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    res
}

/// The web console: sessions, transcripts, prompts, permissions (no API key needed to load it).
///
/// An HTML page whose scripts and styles come from `/console/…` on this origin, served with a
/// strict `Content-Security-Policy`. It calls this API with the key it asks for when the API
/// answers 401 (kept in the tab's sessionStorage).
#[utoipa::path(get, operation_id = "getConsole", path = "/", tag = "system", responses((status = 200, description = "HTML", body = String, content_type = "text/html")))]
pub async fn index() -> Response {
    embedded(
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
    )
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
