//! How a service error is shown to a client: an RFC 9457 problem document. A failed request's
//! answer and a failed turn's `turn_ended` event carry the same document, so that a stream
//! reader sees what the prompt's caller saw; `api/error.rs` adds the HTTP layer's own kinds and
//! the headers.

use serde::Serialize;
use utoipa::ToSchema;

use super::error::Error;

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
    /// For `agent-auth-required`: the ids of the auth methods the agent offers.
    #[serde(rename = "authMethods", skip_serializing_if = "Option::is_none")]
    pub auth_methods: Option<Vec<String>>,
}

/// A kind of problem: its status, the problem type's last segment and its title.
pub type ProblemKind = (u16, &'static str, &'static str);

impl Problem {
    pub fn new(kind: ProblemKind, detail: String, agent_code: Option<i64>) -> Self {
        let (status, kind, title) = kind;
        Problem {
            kind: format!("urn:acp-gateway:problem:{kind}"),
            title: title.to_owned(),
            status,
            detail,
            agent_code,
            auth_methods: None,
        }
    }
}

impl Error {
    /// The one table of the service's kinds: each one's status, problem type and title.
    pub fn kind(&self) -> ProblemKind {
        match self {
            Error::Malformed(_) => (400, "bad-request", "Bad request"),
            Error::Invalid(_) => (422, "validation-failed", "Validation failed"),
            Error::NotFound(_) => (404, "not-found", "Not found"),
            Error::Gone(_) => (410, "gone", "Gone"),
            Error::Conflict(_) => (409, "conflict", "Conflict"),
            Error::Forbidden(_) => (403, "forbidden", "Forbidden"),
            Error::PreconditionFailed(_) => (412, "precondition-failed", "Precondition failed"),
            Error::FileSystem(_) => (500, "file-system", "The workspace's file system failed"),
            Error::NotSupported(_) => (
                501,
                "not-supported-by-agent",
                "The agent does not support this",
            ),
            Error::NoCapacity(_) | Error::NoMember { .. } => {
                (503, "pool-exhausted", "No agent capacity")
            }
            Error::TenantLimit { .. } => (429, "too-many-requests", "Too many requests"),
            Error::QueueFull(_) => (429, "queue-full", "The session's queue is full"),
            Error::HeldElsewhere(_) => (
                503,
                "replica-unavailable",
                "The gateway replica holding the session is unavailable",
            ),
            Error::AgentAuthRequired { .. } => {
                (503, "agent-auth-required", "The agent is not signed in")
            }
            Error::Registry(_) => (
                502,
                "registry-unavailable",
                "The agent registry cannot be read",
            ),
            Error::Agent { .. } => (502, "agent-error", "The agent failed"),
            Error::AgentMisbehaved(_) => {
                (502, "agent-protocol-error", "The agent broke the protocol")
            }
            Error::AgentGone(_) => (502, "agent-unavailable", "The agent is unavailable"),
            Error::AgentTimeout(_) => (504, "agent-timeout", "The agent did not answer in time"),
            Error::StoreUnavailable(_) => (
                503,
                "store-unavailable",
                "The gateway's database is unavailable",
            ),
            Error::Store(_) => (500, "internal", "Internal server error"),
        }
    }

    /// The problem document of this error (a store's failure is described, never shown: its
    /// cause is for the log).
    pub fn problem(&self) -> Problem {
        let detail = match self {
            Error::Store(_) => "an internal error occurred; it has been logged".to_owned(),
            Error::StoreUnavailable(_) => {
                "the gateway's database cannot be reached now; retry later".to_owned()
            }
            other => other.to_string(),
        };
        let agent_code = match self {
            Error::Agent { code, .. } => Some(*code),
            _ => None,
        };
        let mut problem = Problem::new(self.kind(), detail, agent_code);
        if let Error::AgentAuthRequired { methods, .. } = self {
            problem.auth_methods = Some(methods.clone());
        }
        problem
    }
}
