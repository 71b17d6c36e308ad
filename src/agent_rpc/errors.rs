//! JSON-RPC's errors and answers as a connection sees them: an error object as an agent sends
//! it ([`RpcError`]), why a call produced no result ([`CallError`]), and an answer read as a
//! value ([`answer_value`]).

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON-RPC error object as the agent sent it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// JSON-RPC's -32601: the answer to a request for a method the gateway does not serve.
    pub fn method_not_found(method: &str) -> Self {
        RpcError {
            code: -32601,
            message: format!("method not found: {method}"),
            data: None,
        }
    }

    /// JSON-RPC's -32603: a request the gateway serves but cannot take now (a bound is
    /// reached).
    pub fn refused(message: impl Into<String>) -> Self {
        RpcError {
            code: -32603,
            message: message.into(),
            data: None,
        }
    }

    /// ACP's -32800: the answer to a request its sender cancelled (`$/cancel_request`).
    pub fn cancelled() -> Self {
        RpcError {
            code: -32800,
            message: "request cancelled".into(),
            data: None,
        }
    }

    /// JSON-RPC's -32602: a request the gateway serves, with params it cannot take.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        RpcError {
            code: -32602,
            message: message.into(),
            data: None,
        }
    }
}

/// Why a call to the agent did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("agent error {}: {}", .0.code, .0.message)]
    Rpc(RpcError),
    /// The connection ended while the call waited: the request may have reached the agent.
    #[error("agent connection closed: {0}")]
    Closed(String),
    /// The request never reached the agent: its connection was already gone (stdin broken,
    /// stdout ended, or the process exited). Safe to send to another agent process.
    #[error("agent connection closed: {0}")]
    NotSent(String),
    #[error("agent did not answer {0} in time")]
    Timeout(String),
    /// The agent did not advertise the capability the method needs: it was not called.
    #[error("the agent does not support {0}")]
    Unsupported(&'static str),
}

impl CallError {
    /// True for JSON-RPC -32002 (resource not found).
    pub fn is_not_found(&self) -> bool {
        matches!(self, CallError::Rpc(e) if e.code == -32002)
    }
}

/// An answer read as a value: JSON a value cannot hold (nested too deep, a number out of range)
/// fails the call as the agent's internal error.
pub fn answer_value(raw: &RawValue) -> Result<Value, CallError> {
    serde_json::from_str(raw.get()).map_err(|e| {
        CallError::Rpc(RpcError {
            code: -32603,
            message: format!("the agent's answer is no JSON value the gateway can read: {e}"),
            data: None,
        })
    })
}
