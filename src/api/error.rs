//! `ApiError`: every failure a client can see, rendered as RFC 9457 `application/problem+json`.
//! The one place where a kind of failure becomes an HTTP status, a problem type and a
//! `Retry-After`: the service's own [`gateway::Error`] kinds and the HTTP layer's (keys, limits,
//! extractor rejections).
//!
//! Variants name kinds, not causes. Internal causes are logged once here and never serialised.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::gateway;

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"type": "urn:acp-gateway:problem:not-found", "title": "Not found", "status": 404, "detail": "no session sess_nope"}))]
pub struct Problem {
    /// Stable identifier of the kind of problem.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short, human-readable summary of the kind.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong in this occurrence.
    pub detail: String,
    /// The ACP error code, when the agent answered with an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_code: Option<i64>,
}

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
    },
    #[error("the request took longer than the gateway allows")]
    RequestTimeout,
}

impl ApiError {
    /// The one table: each kind's status, problem type and title.
    fn parts(&self) -> Parts {
        use ApiError as A;
        use gateway::Error as E;
        match self {
            A::BadRequest(_) | A::Service(E::Malformed(_)) => {
                (StatusCode::BAD_REQUEST, "bad-request", "Bad request")
            }
            A::Validation(_) | A::Service(E::Invalid(_)) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation-failed",
                "Validation failed",
            ),
            A::NotFound(_) | A::Service(E::NotFound(_)) => {
                (StatusCode::NOT_FOUND, "not-found", "Not found")
            }
            A::Service(E::Conflict(_)) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            A::Service(E::NotSupported(_)) => (
                StatusCode::NOT_IMPLEMENTED,
                "not-supported-by-agent",
                "The agent does not support this",
            ),
            A::Service(E::NoCapacity(_) | E::NoMember { .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "pool-exhausted",
                "No agent capacity",
            ),
            A::Service(E::HeldElsewhere(_)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "replica-unavailable",
                "The gateway replica holding the session is unavailable",
            ),
            A::Service(E::AgentAuthRequired(_)) => (
                StatusCode::BAD_GATEWAY,
                "agent-auth-required",
                "The agent requires authentication",
            ),
            A::Service(E::Agent { .. }) => {
                (StatusCode::BAD_GATEWAY, "agent-error", "The agent failed")
            }
            A::Service(E::AgentMisbehaved(_)) => (
                StatusCode::BAD_GATEWAY,
                "agent-protocol-error",
                "The agent broke the protocol",
            ),
            A::Service(E::AgentGone(_)) => (
                StatusCode::BAD_GATEWAY,
                "agent-unavailable",
                "The agent is unavailable",
            ),
            A::Service(E::AgentTimeout(_)) => (
                StatusCode::GATEWAY_TIMEOUT,
                "agent-timeout",
                "The agent did not answer in time",
            ),
            A::Service(E::StoreUnavailable(_)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "The gateway's database is unavailable",
            ),
            A::Service(E::Store(_)) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal server error",
            ),
            A::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            A::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            A::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            A::PayloadTooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
            ),
            A::UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            A::TooManyRequests { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            A::RequestTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "request-timeout",
                "Request timeout",
            ),
        }
    }

    /// Seconds a client should wait before retrying, for the kinds that pass.
    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Service(
                gateway::Error::NoCapacity(_)
                | gateway::Error::HeldElsewhere(_)
                | gateway::Error::StoreUnavailable(_),
            ) => Some(5),
            // The time to the pool's next restart attempt.
            ApiError::Service(gateway::Error::NoMember { retry_after, .. }) => {
                Some(retry_after.as_secs().max(1))
            }
            ApiError::TooManyRequests {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        }
    }

    /// The problem document for this error.
    pub fn problem(&self) -> Problem {
        let (status, kind, title) = self.parts();
        let detail = match self {
            // The cause is in the log, never in an answer.
            ApiError::Service(gateway::Error::Store(_)) => {
                "an internal error occurred; it has been logged".to_owned()
            }
            ApiError::Service(gateway::Error::StoreUnavailable(_)) => {
                "the gateway's database cannot be reached now; retry later".to_owned()
            }
            other => other.to_string(),
        };
        Problem {
            kind: format!("urn:acp-gateway:problem:{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            agent_code: match self {
                ApiError::Service(gateway::Error::Agent { code, .. }) => Some(*code),
                _ => None,
            },
        }
    }

    /// The problem document of a service error, as JSON: what a failed turn's `turn_ended`
    /// event carries, so that a stream reader sees what the prompt's caller saw.
    pub fn problem_json(error: gateway::Error) -> serde_json::Value {
        serde_json::to_value(ApiError::Service(error).problem()).expect("a problem serialises")
    }
}

/// A status, the problem type's last segment and its title.
type Parts = (StatusCode, &'static str, &'static str);

/// An error and its causes, as one line for the log.
fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
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
