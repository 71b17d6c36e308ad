//! An agent's terminal login over a WebSocket (`GET /agents/{name}/login`): the agent's login
//! program runs in a pseudo-terminal of its own on the gateway's host, and the client is its
//! screen and keyboard, so that a device-code or browser login works on a headless server.
//!
//! Frames: the server sends what the program writes as binary frames, then one text frame
//! `{"exit": CODE}` (`null`: killed) and closes. The client sends keys as binary frames, or
//! text frames of JSON: `{"keys": "text"}`, `{"resize": {"rows": R, "cols": C}}`. A client that
//! goes away ends the program. Exit 0 restarts the agent's members, signed in.

use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::response::Response;
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::IntoParams;

use super::error::{ApiError, Problem};
use super::extract::{AppState, Path, Query};
use crate::agent_rpc::terminal::{LoginTerminal, TerminalInput};
use crate::gateway::{Caller, Gateway};

/// The longest a terminal login runs.
const LOGIN_LIMIT: Duration = Duration::from_secs(15 * 60);

/// `GET /agents/{name}/login`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LoginParams {
    /// The agent's `terminal` auth method (`GET /agents/{name}`'s `authMethods`).
    #[serde(rename = "methodId")]
    #[param(rename = "methodId")]
    pub method_id: String,
}

/// A client's text frame.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum TerminalControl {
    Keys(String),
    Resize { rows: u16, cols: u16 },
}

/// Sign an agent in through its terminal login, over a WebSocket (admin only).
///
/// Runs the agent's own program with the `terminal` auth method's arguments and environment
/// in a pseudo-terminal on the gateway's host; the WebSocket is its screen and keyboard (see
/// the frames below). Exit status 0 means signed in: the agent's members start again, each
/// signed in by what the login left (on this host: another replica's agent is signed in
/// there). Frames: binary from the server is the terminal's output, then a text frame
/// `{"exit": CODE}`; from the client, binary frames are keys, text frames JSON
/// `{"keys": "…"}` or `{"resize": {"rows": 24, "cols": 80}}`. At most 15 minutes.
#[utoipa::path(get, operation_id = "loginAgent", path = "/agents/{name}/login", tag = "system",
    params(("name" = String, Path, description = "The agent's name"), LoginParams),
    responses(
        (status = 101, description = "The terminal, over a WebSocket"),
        (status = 400, description = "Not a WebSocket request", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "This replica runs no agent of that name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The agent offers no terminal login of that id", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "The agent runs on another host, or the login cannot start", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn login_agent(
    State(s): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(p): Query<LoginParams>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade
        .map_err(|e| ApiError::BadRequest(format!("a terminal login is a WebSocket: {e}")))?;
    let terminal = (s.gateway.installs()).terminal_login(&caller, &name, &p.method_id)?;
    let gateway = s.gateway.clone();
    Ok(upgrade.on_upgrade(move |socket| drive(socket, terminal, gateway, name)))
}

/// Carries the terminal to the client and back until the program exits.
async fn drive(mut socket: WebSocket, terminal: LoginTerminal, gateway: Gateway, name: String) {
    let (keys, typed) = mpsc::channel(64);
    let (screen, mut shown) = mpsc::channel::<Vec<u8>>(64);
    let login = tokio::spawn(terminal.run(typed, screen, LOGIN_LIMIT));
    let mut keys = Some(keys);
    loop {
        tokio::select! {
            out = shown.recv() => match out {
                Some(bytes) => {
                    if socket.send(Message::Binary(bytes.into())).await.is_err() {
                        keys = None;
                    }
                }
                // The login ended (its output sender dropped with it).
                None => break,
            },
            msg = socket.recv(), if keys.is_some() => {
                let input = match msg {
                    Some(Ok(Message::Binary(bytes))) => Some(TerminalInput::Keys(bytes.to_vec())),
                    Some(Ok(Message::Text(text))) => match serde_json::from_str(&text) {
                        Ok(TerminalControl::Keys(text)) => Some(TerminalInput::Keys(text.into_bytes())),
                        Ok(TerminalControl::Resize { rows, cols }) => Some(TerminalInput::Resize { rows, cols }),
                        Err(_) => None,
                    },
                    Some(Ok(_)) => None,
                    // The client went away: the login ends.
                    Some(Err(_)) | None => {
                        keys = None;
                        None
                    }
                };
                if let (Some(input), Some(k)) = (input, &keys) {
                    let _ = k.send(input).await;
                }
            }
        }
    }
    let code = match login.await {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            tracing::warn!(agent = %name, error = %e, "the terminal login failed");
            None
        }
        Err(_) => None,
    };
    tracing::info!(agent = %name, ?code, "terminal login ended");
    if code == Some(0) {
        gateway.installs().logged_in(&name);
    }
    let end = serde_json::json!({ "exit": code }).to_string();
    let _ = socket.send(Message::Text(end.into())).await;
    let _ = socket.send(Message::Close(None)).await;
}
