//! The service's own error: its variants name kinds of failure, not HTTP statuses (the API
//! layer maps each kind to a status and a problem type, in one place). An agent's JSON-RPC
//! error codes become kinds here, in [`From<CallError>`].

use crate::agent_rpc::CallError;
use crate::store::StoreError;

/// Every failure of a use case.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input cannot be read at all (an id, a cursor, a number out of range).
    #[error("{0}")]
    Malformed(String),
    /// The input is well-formed but not acceptable (a path, a prompt, an answer).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// It was there and is no more (a share link expired or revoked).
    #[error("{0}")]
    Gone(String),
    /// The session is busy, or in a state that does not allow this.
    #[error("{0}")]
    Conflict(String),
    /// Not allowed, whoever asks (a path of a workspace that leads outside it).
    #[error("{0}")]
    Forbidden(String),
    /// The request's precondition does not hold (`If-Match` names another version).
    #[error("{0}")]
    PreconditionFailed(String),
    /// A workspace's file system failed (the cause is logged).
    #[error("{0}")]
    FileSystem(String),
    /// The agent does not offer what this needs.
    #[error("{0}")]
    NotSupported(String),
    /// No pool member can take it now.
    #[error("{0}")]
    NoCapacity(String),
    /// No pool member is ready, and none became ready within the acquire timeout (or none
    /// could: crash-looping, backing off); `retry_after` is the time to the next restart attempt.
    #[error("{reason}")]
    NoMember {
        reason: String,
        retry_after: std::time::Duration,
    },
    /// The caller's tenant has reached one of its limits (`--tenant-*`).
    #[error("{message}")]
    TenantLimit {
        message: String,
        /// The limit's name, quota and window (seconds; `None` for a count of things at once),
        /// for the `RateLimit-Policy` and `RateLimit` headers.
        limit: &'static str,
        quota: u64,
        window_secs: Option<u64>,
        retry_after_secs: u64,
    },
    /// The session's queue holds `--max-queued-prompts` waiting prompts already.
    #[error("{0}")]
    QueueFull(String),
    /// Another replica holds the session (or cannot be reached).
    #[error("{0}")]
    HeldElsewhere(String),
    /// The agent answered `auth_required`: it is not signed in; `methods` are the ids of the
    /// auth methods it offers, when known.
    #[error("{message}")]
    AgentAuthRequired {
        message: String,
        methods: Vec<String>,
    },
    /// The agent registry (`--registry`) cannot be read.
    #[error("{0}")]
    Registry(String),
    /// The agent answered with an error.
    #[error("agent error {code}: {message}")]
    Agent { code: i64, message: String },
    /// The agent broke the protocol in a way the gateway will not pass on (a session id that
    /// names another session).
    #[error("{0}")]
    AgentMisbehaved(String),
    /// The agent's process is gone (or its pipe closed).
    #[error("{0}")]
    AgentGone(String),
    #[error("{0}")]
    AgentTimeout(String),
    /// The database cannot be reached or cannot write now (a lost connection, a restart): it
    /// may work again shortly. The cause is logged, never shown.
    #[error("store unavailable")]
    StoreUnavailable(StoreError),
    /// The database failed otherwise (the cause is logged, never shown).
    #[error("store")]
    Store(StoreError),
}

impl From<StoreError> for Error {
    /// An outage is a kind of its own ([`Error::StoreUnavailable`]): the client may retry.
    fn from(err: StoreError) -> Self {
        if err.is_unavailable() {
            Error::StoreUnavailable(err)
        } else {
            Error::Store(err)
        }
    }
}

impl From<CallError> for Error {
    /// The agent's failures, as the error mapping of docs/behaviour.md says.
    fn from(err: CallError) -> Self {
        match err {
            CallError::Rpc(mut e) => {
                // The agent's `data` says why (a refused mode's details): kept in the detail.
                if let Some(data) = e.data.take().filter(|d| !d.is_null()) {
                    e.message = format!("{} ({data})", e.message);
                }
                Error::from_rpc(e)
            }
            CallError::Closed(reason) | CallError::NotSent(reason) => Error::AgentGone(reason),
            CallError::Timeout(what) => Error::AgentTimeout(what),
            unsupported @ CallError::Unsupported(_) => Error::NotSupported(unsupported.to_string()),
        }
    }
}

impl Error {
    fn from_rpc(e: crate::agent_rpc::RpcError) -> Self {
        match e.code {
            -32002 => Error::NotFound(format!("the agent does not know it: {}", e.message)),
            -32602 => Error::Invalid(format!("the agent rejected the parameters: {}", e.message)),
            -32000 => Error::AgentAuthRequired {
                message: e.message,
                methods: Vec::new(),
            },
            -32601 => {
                Error::NotSupported(format!("the agent does not implement it: {}", e.message))
            }
            code => Error::Agent {
                code,
                message: e.message,
            },
        }
    }
}
