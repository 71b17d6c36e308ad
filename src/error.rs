//! `ApiError`: every failure a client can see, rendered as RFC 9457 `application/problem+json`.
//!
//! Variants name kinds, not causes. Internal causes are logged once here and never serialised.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::acp::CallError;
use crate::store::StoreError;

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
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Validation(String),
    #[error("a valid API key is required: Authorization: Bearer KEY")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("this method is not allowed on this route")]
    MethodNotAllowed,
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    NotSupported(String),
    #[error("{0}")]
    AgentAuthRequired(String),
    #[error("agent error {code}: {message}")]
    Agent { code: i64, message: String },
    #[error("{0}")]
    AgentUnavailable(String),
    #[error("{0}")]
    AgentTimeout(String),
    #[error("{0}")]
    PoolExhausted(String),
    #[error("{0}")]
    ReplicaUnavailable(String),
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after_secs: u64,
    },
    #[error("the request took longer than the gateway allows")]
    RequestTimeout,
    #[error("internal error: {0:#}")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation-failed",
                "Validation failed",
            ),
            Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            Conflict(_) => (StatusCode::CONFLICT, "conflict", "Conflict"),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            PayloadTooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
            ),
            UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            NotSupported(_) => (
                StatusCode::NOT_IMPLEMENTED,
                "not-supported-by-agent",
                "The agent does not support this",
            ),
            AgentAuthRequired(_) => (
                StatusCode::BAD_GATEWAY,
                "agent-auth-required",
                "The agent requires authentication",
            ),
            Agent { .. } => (StatusCode::BAD_GATEWAY, "agent-error", "The agent failed"),
            AgentUnavailable(_) => (
                StatusCode::BAD_GATEWAY,
                "agent-unavailable",
                "The agent is unavailable",
            ),
            AgentTimeout(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                "agent-timeout",
                "The agent did not answer in time",
            ),
            PoolExhausted(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "pool-exhausted",
                "No agent capacity",
            ),
            ReplicaUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "replica-unavailable",
                "The gateway replica holding the session is unavailable",
            ),
            TooManyRequests { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-requests",
                "Too many requests",
            ),
            RequestTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "request-timeout",
                "Request timeout",
            ),
            Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal server error",
            ),
        }
    }

    /// The problem document for this error.
    pub fn problem(&self) -> Problem {
        let (status, kind, title) = self.parts();
        let detail = match self {
            ApiError::Internal(_) => "an internal error occurred; it has been logged".to_owned(),
            other => other.to_string(),
        };
        Problem {
            kind: format!("urn:acp-gateway:problem:{kind}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            agent_code: match self {
                ApiError::Agent { code, .. } => Some(*code),
                _ => None,
            },
        }
    }

    /// Maps an upstream call failure, as DESIGN.md's error table says.
    pub fn from_call(err: CallError) -> Self {
        match err {
            CallError::Rpc(e) => match e.code {
                -32002 => ApiError::NotFound(format!("the agent does not know it: {}", e.message)),
                -32602 => ApiError::Validation(format!(
                    "the agent rejected the parameters: {}",
                    e.message
                )),
                -32000 => ApiError::AgentAuthRequired(e.message),
                -32601 => ApiError::NotSupported(format!(
                    "the agent does not implement it: {}",
                    e.message
                )),
                code => ApiError::Agent {
                    code,
                    message: e.message,
                },
            },
            CallError::Closed(reason) => ApiError::AgentUnavailable(reason),
            CallError::Timeout(what) => ApiError::AgentTimeout(what),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(anyhow::Error::new(e).context("store"))
    }
}

impl From<CallError> for ApiError {
    fn from(e: CallError) -> Self {
        ApiError::from_call(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(e) = &self {
            tracing::error!(error = format!("{e:#}"), "internal error");
        }
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut res = (status, axum::Json(problem)).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        match &self {
            ApiError::PoolExhausted(_) | ApiError::ReplicaUnavailable(_) => {
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            }
            ApiError::TooManyRequests {
                retry_after_secs, ..
            } => {
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            }
            _ => {}
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
