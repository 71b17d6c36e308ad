//! What a handler receives: the state ([`AppState`]), the `Json`, `Path` and `Query`
//! extractors whose rejections are problem+json [`ApiError`]s, and [`header_lists`] to read
//! list-valued headers.

use std::borrow::Cow;

use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::HeaderMap;
use axum::http::header::AsHeaderName;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::gateway::Gateway;

/// The one state type handlers receive.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Gateway,
    /// The OpenAPI document served at `/openapi.json`, made once at start.
    pub openapi: Bytes,
    /// The OpenID provider the console signs in with (`--oidc-console-client-id`), if any.
    pub sign_in: Option<std::sync::Arc<super::oidc::Oidc>>,
    /// What `/shared/…` lets each client address ask.
    pub shares_limit: std::sync::Arc<super::share_limit::ShareLimit>,
}

/// The `{id}` every `/sessions/{id}…` route takes, as the spec documents it (the handlers read
/// it with `Path<SessionId>`).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // documented here, read as `Path<SessionId>`
pub struct SessionPath {
    /// Session id
    id: String,
}

/// JSON body extractor whose rejection is a problem+json [`ApiError`]. A lone UTF-16 surrogate
/// in the body's strings (`"\ud83d"`, which JSON's grammar lets through but which is not text)
/// is refused (422), so that what a client sends never makes a response strict parsers refuse;
/// a U+10FFFF is kept ([`crate::surrogates::escape`]), as it would otherwise be read as a mark.
pub struct Json<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        // Read as axum's `Json` would (the body limit applies), and handed to it escaped.
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(JsonRejection::from)?;
        let escaped = match std::str::from_utf8(&bytes).map(crate::surrogates::escape) {
            Ok(Cow::Owned(text)) => {
                if let Some(unit) = crate::surrogates::first_lone(&text) {
                    return Err(ApiError::Validation(format!(
                        "the body holds a lone UTF-16 surrogate (\\u{unit:04x}), which is not text: send whole characters"
                    )));
                }
                Some(Bytes::from(text))
            }
            _ => None, // unchanged, or not UTF-8 (which the parser refuses)
        };
        let body = Body::from(escaped.unwrap_or(bytes));
        let axum::Json(value) =
            axum::Json::from_request(Request::from_parts(parts, body), state).await?;
        Ok(Json(value))
    }
}

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
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

/// Whether a comma-separated header (`Cache-Control`, `Prefer`), on any of its lines, lists
/// `item` (compared without case).
pub fn header_lists(headers: &HeaderMap, name: impl AsHeaderName, item: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case(item))
}
