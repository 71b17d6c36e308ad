//! A session call for a session that another live replica must serve (it holds the session, or
//! runs its agent where this one does not), carried out there: the ACP method is sent as the
//! REST request it stands for, marked forwarded, with the key the connection was opened with.
//! The connection goes on following the session's events from the shared log, so the client
//! sees the turn's updates as from a session held here.

use axum::http::{HeaderMap, HeaderValue, Method, header};
use serde_json::{Value, json};

use agent_client_protocol::Error as RpcError;

use crate::api::proof::{FORWARDED, Proof};
use crate::gateway::input::SessionId;
use crate::gateway::{EventKind, Gateway};

/// How a connection reaches the other replicas.
#[derive(Clone)]
pub(super) struct Remote {
    client: reqwest::Client,
    /// The `Authorization` the connection's requests carry (the same key on every replica).
    authorization: Option<HeaderValue>,
    /// What marks a request as forwarded by this replica.
    proof: Proof,
}

impl Remote {
    pub(super) fn new(authorization: Option<HeaderValue>, gateway: &Gateway) -> Self {
        Remote {
            client: reqwest::Client::new(),
            authorization,
            proof: Proof::new(gateway),
        }
    }

    /// Carries out `method` for session `id` on the replica at `address`; its answer as ACP's.
    /// `None`: not a method a replica serves for another.
    pub(super) async fn call(
        &self,
        address: &str,
        method: &str,
        id: &SessionId,
        params: &Value,
    ) -> Option<Result<Value, RpcError>> {
        let (verb, path, body) = route(method, id.as_str(), params)?;
        let answer = match self.send(address, verb, &path, body).await {
            Ok(answer) => answer,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(match method {
            "session/prompt" => answer["result"].clone(),
            "session/set_config_option" => {
                json!({"configOptions": answer.pointer("/state/configOptions").cloned().unwrap_or_else(|| json!([]))})
            }
            _ => json!({}),
        }))
    }

    /// Creates a session (`POST /sessions` with `body`) on the replica at `address`; the
    /// session as REST shows it.
    pub(super) async fn create(&self, address: &str, body: Value) -> Result<Value, RpcError> {
        self.send(address, Method::POST, &["sessions"], Some(body))
            .await
    }

    /// Sends a client's answer to a permission request (`permission`) or an elicitation of
    /// the turn that session `id` runs on the replica at `address`.
    pub(super) async fn answer(
        &self,
        address: &str,
        id: &SessionId,
        permission: bool,
        request_id: &str,
        body: Value,
    ) -> Result<(), RpcError> {
        let kind = if permission {
            "permissions"
        } else {
            "elicitations"
        };
        let path = ["sessions", id.as_str(), kind, request_id];
        self.send(address, Method::POST, &path, Some(body))
            .await
            .map(drop)
    }

    /// The permission requests and elicitations pending for session `id` on the replica at
    /// `address` (its event kind, request id and request); none when they cannot be read.
    pub(super) async fn pending(
        &self,
        address: &str,
        id: &SessionId,
    ) -> Vec<(EventKind, String, Value)> {
        let mut pending = Vec::new();
        for (kind, list) in [
            (EventKind::PermissionRequested, "permissions"),
            (EventKind::ElicitationRequested, "elicitations"),
        ] {
            let path = ["sessions", id.as_str(), list];
            let Ok(Value::Array(items)) = self.send(address, Method::GET, &path, None).await else {
                continue;
            };
            for item in items {
                if let Some(request_id) = item["requestId"].as_str() {
                    pending.push((kind, request_id.to_owned(), item["request"].clone()));
                }
            }
        }
        pending
    }

    /// The URL of `path` (its segments, each encoded) on the replica at `address`.
    fn url(address: &str, path: &[&str]) -> Result<reqwest::Url, RpcError> {
        let mut url = reqwest::Url::parse(address)
            .map_err(|e| internal(&format!("the replica's address {address:?}: {e}")))?;
        url.path_segments_mut()
            .map_err(|()| internal(&format!("the replica's address {address:?} has no path")))?
            .pop_if_empty()
            .extend(path);
        Ok(url)
    }

    async fn send(
        &self,
        address: &str,
        verb: Method,
        path: &[&str],
        body: Option<Value>,
    ) -> Result<Value, RpcError> {
        let url = Self::url(address, path)?;
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(FORWARDED, self.proof.mark(&verb, &target));
        if let Some(auth) = &self.authorization {
            headers.insert(header::AUTHORIZATION, auth.clone());
        }
        let mut request = self.client.request(verb, url).headers(headers);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let unreachable = |e: reqwest::Error| {
            tracing::warn!(address = %crate::redact::url(address), error = %crate::redact::text(&e.to_string()), "the replica serving the session cannot be reached");
            internal("the gateway replica serving this session cannot be reached; retry shortly")
        };
        let answer = request.send().await.map_err(unreachable)?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(refused(status.as_u16(), &body));
        }
        Ok(body)
    }
}

/// The REST request an ACP session method stands for: its method, path segments and body.
fn route<'a>(
    method: &str,
    id: &'a str,
    params: &'a Value,
) -> Option<(Method, Vec<&'a str>, Option<Value>)> {
    let on = |tail: &'a str| vec!["sessions", id, tail];
    Some(match method {
        "session/prompt" => (
            Method::POST,
            on("prompt"),
            Some(json!({"prompt": params["prompt"]})),
        ),
        "session/cancel" => (Method::POST, on("cancel"), None),
        "session/close" => (Method::POST, on("close"), None),
        "session/delete" => (Method::DELETE, vec!["sessions", id], None),
        "session/set_mode" => (
            Method::PUT,
            on("mode"),
            Some(json!({"modeId": params["modeId"]})),
        ),
        "session/set_model" => (
            Method::PUT,
            on("model"),
            Some(json!({"modelId": params["modelId"]})),
        ),
        "session/set_config_option" => (
            Method::PUT,
            vec!["sessions", id, "config", params["configId"].as_str()?],
            Some(json!({"value": params["value"]})),
        ),
        _ => return None,
    })
}

/// A problem answered by the other replica as the JSON-RPC error ACP uses for it.
fn refused(status: u16, problem: &Value) -> RpcError {
    let detail = problem["detail"]
        .as_str()
        .or(problem["title"].as_str())
        .unwrap_or("the replica serving the session refused the call");
    let mut error = match status {
        404 => RpcError::new(-32002, ""),
        400 | 422 => RpcError::invalid_params(),
        501 => RpcError::method_not_found(),
        _ => RpcError::internal_error(),
    };
    error.message = detail.to_owned();
    error
}

fn internal(message: &str) -> RpcError {
    let mut error = RpcError::internal_error();
    error.message = message.to_owned();
    error
}
