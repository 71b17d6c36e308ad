//! `/acp`: the gateway as an ACP agent, for editors and ACP clients, over the official HTTP/SSE
//! and WebSocket transport (`agent-client-protocol-http`). Each caller (an API key's tenant, or
//! the one caller of a gateway without keys) gets a transport of its own, so a connection id
//! opened with one key is unknown under another; when the key is removed its connections end.
//! What a connection can do is `agent.rs`; how it follows a session's log, `follow.rs`; how it
//! has another replica carry out a call for a session that replica serves, `remote.rs`.

mod agent;
mod follow;
mod remote;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol_http::{AcpHttpServer, ServerOptions};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::auth::Revoked;
use super::error::ApiError;
use super::forward::{Forwarder, proxy};
use crate::gateway::{Caller, Gateway};

/// The path the endpoint is served at.
pub const PATH: &str = "/acp";

/// The HTTP transport's connection id. The gateway hands it out as `REPLICA.ID`: the replica
/// whose transport holds connection `ID`, so that any replica can send the connection's later
/// requests (its POSTs, its event stream) there, whatever the balancer in front did.
const CONNECTION_ID: HeaderName = HeaderName::from_static("acp-connection-id");

/// A key's transport: its router, and what ends its connections when the key is removed.
type Transport = (Router, CancellationToken);

/// Every caller's transport, made when the caller first connects.
pub struct Endpoint {
    gateway: Gateway,
    /// Each key's transport (by the key's [`Revoked::id`]; `None` without keys).
    servers: Mutex<HashMap<(Caller, Option<u64>), Transport>>,
    /// The gateway's shutdown: the connections' event streams end with it.
    stop: CancellationToken,
    /// Reaches the replica holding a connection.
    forwarder: Forwarder,
}

impl Endpoint {
    pub fn new(gateway: Gateway, stop: CancellationToken) -> Arc<Self> {
        Arc::new(Endpoint {
            forwarder: Forwarder::new(gateway.clone()),
            gateway,
            servers: Mutex::default(),
            stop,
        })
    }

    /// The transport of `caller`'s key: its connections, and an agent per connection acting
    /// for it, which ends when the key is removed.
    /// `authorization`: what the request carried, with which the connections' calls for a
    /// session another replica serves are made there.
    fn server(
        &self,
        caller: &Caller,
        revoked: Option<&Revoked>,
        authorization: Option<&HeaderValue>,
    ) -> Router {
        let mut servers = self.servers.lock().expect("acp servers lock");
        // The transports of removed keys go (their connections have ended).
        servers.retain(|_, (_, revoked)| !revoked.is_cancelled());
        servers
            .entry((caller.clone(), revoked.map(|r| r.id)))
            .or_insert_with(|| {
                let (gateway, caller) = (self.gateway.clone(), caller.clone());
                let remote = remote::Remote::new(authorization.cloned(), &self.gateway);
                let token = revoked.map(|r| r.token.clone()).unwrap_or_default();
                let revoked = token.clone();
                let factory = move || agent::Revocable {
                    agent: agent::connection(gateway.clone(), caller.clone(), remote.clone()),
                    revoked: revoked.clone(),
                };
                let router = AcpHttpServer::new(factory)
                    .with_options(
                        ServerOptions::default()
                            .with_path(PATH)
                            .with_health_endpoint(false),
                    )
                    .into_router();
                (router, token)
            })
            .0
            .clone()
    }
}

/// Every method on `/acp`: the caller's transport answers.
pub async fn serve(
    State(endpoint): State<Arc<Endpoint>>,
    caller: Caller,
    mut req: Request,
) -> Response {
    let websocket = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if websocket {
        // Checked by the guard (`api::guard`): the transport itself would refuse every browser
        // origin.
        req.headers_mut().remove(header::ORIGIN);
    }
    // A connection another replica holds is served there.
    let tagged = req
        .headers()
        .get(&CONNECTION_ID)
        .and_then(|v| v.to_str().ok());
    if let Some((replica, id)) = tagged.and_then(|t| t.split_once('.')) {
        if replica == endpoint.gateway.replica_id() {
            let id = HeaderValue::from_str(id).expect("part of a valid header value");
            req.headers_mut().insert(CONNECTION_ID, id);
        } else {
            match endpoint.gateway.replica_address(replica).await {
                Ok(Some(address)) => {
                    return proxy(&endpoint.forwarder, &address, req)
                        .await
                        .unwrap_or_else(IntoResponse::into_response);
                }
                // No live replica of that id: the transport answers that it knows no such
                // connection.
                Ok(None) => {}
                Err(e) => return ApiError::from(e).into_response(),
            }
        }
    }
    let revoked = req.extensions().get::<Revoked>().cloned();
    let authorization = req.headers().get(header::AUTHORIZATION);
    let server = endpoint.server(&caller, revoked.as_ref(), authorization);
    let Ok(res) = server.oneshot(req).await;
    let (mut parts, body) = res.into_parts();
    if let Some(id) = parts
        .headers
        .get(&CONNECTION_ID)
        .and_then(|v| v.to_str().ok())
    {
        let tagged = format!("{}.{id}", endpoint.gateway.replica_id());
        let tagged = HeaderValue::from_str(&tagged).expect("an id and a replica id");
        parts.headers.insert(CONNECTION_ID, tagged);
    }
    // An event stream ends at shutdown, as the REST streams do, so that the server can stop.
    let body = body
        .into_data_stream()
        .take_until(endpoint.stop.clone().cancelled_owned());
    Response::from_parts(parts, Body::from_stream(body))
}
