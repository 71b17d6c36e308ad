//! `ApiError`: every failure a client can see, rendered as RFC 9457 `application/problem+json`.
//! The one place where a kind of failure becomes an HTTP status, a problem type and a
//! `Retry-After`: the service's own [`gateway::Error`] kinds and the HTTP layer's (keys, limits,
//! extractor rejections).
//!
//! Variants name kinds, not causes. Internal causes are logged once here and never serialised.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::gateway;

pub use crate::gateway::Problem;

/// Every error a handler can return.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// What a use case of the service failed with.
    #[error(transparent)]
    Service(#[from] gateway::Error),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Validation(String),
    #[error("a valid API key is required: Authorization: Bearer KEY")]
    Unauthorized,
    /// A bearer token of the OpenID provider that is not valid here: why.
    #[error("{0}")]
    InvalidToken(String),
    /// The OpenID provider's keys cannot be fetched, so its tokens cannot be checked.
    #[error("{0}")]
    ProviderUnavailable(String),
    #[error("{0}")]
    NotFound(String),
    /// Known, but not allowed here (a WebSocket from a browser origin not configured).
    #[error("{0}")]
    Forbidden(String),
    #[error("this method is not allowed on this route")]
    MethodNotAllowed,
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after_secs: u64,
        /// The limit reached, for the `RateLimit-Policy` and `RateLimit` headers.
        policy: Policy,
    },
    #[error("the request took longer than the gateway allows")]
    RequestTimeout,
    /// A `Range` wholly outside a file of `size` bytes.
    #[error("the range is outside the file's {size} bytes")]
    RangeNotSatisfiable { size: u64 },
}

/// A limit a 429 names in the IETF `RateLimit-Policy` and `RateLimit` headers
/// (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy: "name";q=QUOTA;w=WINDOW` for a
/// rate, `"name";q=QUOTA;qu="concurrent-requests"` for what may run at once; `RateLimit:
/// "name";r=0`, with `t=` the seconds until the quota returns for a rate.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub name: &'static str,
    pub quota: u64,
    /// The window in seconds of a rate; `None`: a count of things at once.
    pub window_secs: Option<u64>,
}

impl Policy {
    /// The two header values, for a request refused now, `retry_after_secs` before the quota
    /// returns.
    fn headers(&self, retry_after_secs: u64) -> (String, String) {
        let (name, quota) = (self.name, self.quota);
        match self.window_secs {
            Some(w) => (
                format!("\"{name}\";q={quota};w={w}"),
                format!("\"{name}\";r=0;t={retry_after_secs}"),
            ),
            None => (
                format!("\"{name}\";q={quota};qu=\"concurrent-requests\""),
                format!("\"{name}\";r=0"),
            ),
        }
    }
}

impl ApiError {
    /// The HTTP layer's own kinds: each one's status, problem type and title (the service's
    /// are [`gateway::Error::kind`]).
    fn kind(&self) -> gateway::problem::ProblemKind {
        match self {
            ApiError::Service(e) => e.kind(),
            ApiError::BadRequest(_) => (400, "bad-request", "Bad request"),
            ApiError::Validation(_) => (422, "validation-failed", "Validation failed"),
            ApiError::NotFound(_) => (404, "not-found", "Not found"),
            ApiError::Unauthorized | ApiError::InvalidToken(_) => {
                (401, "unauthorized", "Unauthorized")
            }
            ApiError::ProviderUnavailable(_) => (
                503,
                "identity-provider-unavailable",
                "Identity provider unavailable",
            ),
            ApiError::Forbidden(_) => (403, "forbidden", "Forbidden"),
            ApiError::MethodNotAllowed => (405, "method-not-allowed", "Method not allowed"),
            ApiError::PayloadTooLarge(_) => (413, "payload-too-large", "Payload too large"),
            ApiError::UnsupportedMediaType(_) => {
                (415, "unsupported-media-type", "Unsupported media type")
            }
            ApiError::TooManyRequests { .. } => (429, "too-many-requests", "Too many requests"),
            ApiError::RequestTimeout => (504, "request-timeout", "Request timeout"),
            ApiError::RangeNotSatisfiable { .. } => {
                (416, "range-not-satisfiable", "Range not satisfiable")
            }
        }
    }

    /// Seconds a client should wait before retrying, for the kinds that pass.
    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Service(
                gateway::Error::NoCapacity(_)
                | gateway::Error::HeldElsewhere(_)
                | gateway::Error::StoreUnavailable(_),
            )
            | ApiError::ProviderUnavailable(_) => Some(5),
            // The time to the pool's next restart attempt.
            ApiError::Service(gateway::Error::NoMember { retry_after, .. }) => {
                Some(retry_after.as_secs().max(1))
            }
            ApiError::TooManyRequests {
                retry_after_secs, ..
            }
            | ApiError::Service(gateway::Error::TenantLimit {
                retry_after_secs, ..
            }) => Some(*retry_after_secs),
            _ => None,
        }
    }

    /// The problem document for this error.
    pub fn problem(&self) -> Problem {
        match self {
            ApiError::Service(e) => e.problem(),
            other => Problem::new(other.kind(), other.to_string(), None),
        }
    }
}

/// An error and its causes, as one line for the log.
fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    crate::redact::text(&line).into_owned()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Service(gateway::Error::Store(e)) => {
                tracing::error!(error = chain(e), "internal error");
            }
            ApiError::Service(gateway::Error::StoreUnavailable(e)) => {
                tracing::warn!(error = chain(e), "the database is unavailable");
            }
            _ => {}
        }
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut res = (status, axum::Json(problem)).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after() {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let ApiError::RangeNotSatisfiable { size } = &self
            && let Ok(range) = HeaderValue::from_str(&format!("bytes */{size}"))
        {
            res.headers_mut().insert(header::CONTENT_RANGE, range);
        }
        let limited = match &self {
            ApiError::TooManyRequests {
                retry_after_secs,
                policy,
                ..
            } => Some((*policy, *retry_after_secs)),
            ApiError::Service(gateway::Error::TenantLimit {
                limit,
                quota,
                window_secs,
                retry_after_secs,
                ..
            }) => Some((
                Policy {
                    name: limit,
                    quota: *quota,
                    window_secs: *window_secs,
                },
                *retry_after_secs,
            )),
            _ => None,
        };
        if let Some((policy, retry_after_secs)) = limited {
            let (policy, state) = policy.headers(retry_after_secs);
            for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    res.headers_mut().insert(name, value);
                }
            }
        }
        res
    }
}

/// Maps extractor rejections (bad JSON, bad query, bad path, too large) to problems.
macro_rules! rejection {
    ($t:ty) => {
        impl From<$t> for ApiError {
            fn from(r: $t) -> Self {
                let status = r.status();
                let text = r.body_text();
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::PayloadTooLarge(text)
                } else if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
                    ApiError::UnsupportedMediaType(text)
                } else if status == StatusCode::UNPROCESSABLE_ENTITY {
                    ApiError::Validation(text)
                } else {
                    ApiError::BadRequest(text)
                }
            }
        }
    };
}
rejection!(axum::extract::rejection::JsonRejection);
rejection!(axum::extract::rejection::QueryRejection);
rejection!(axum::extract::rejection::PathRejection);
