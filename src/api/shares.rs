//! Read-only links to a session: `/sessions/{id}/shares` for those who see the session, and
//! `/shared/{token}` for anyone holding a link, without a key: its page (in the console's
//! style), its JSON, its transcript and, for a live link, its stream. What `/shared/…` answers
//! is limited per client address (`share_limit.rs`), so that no one can try tokens at speed.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::error::{ApiError, Problem};
use super::events::{HistoryParams, StreamParams, cursor, with_stream_headers};
use super::extract::{AppState, Json, Path, Query, SessionPath, header_lists};
use super::responses::{MalformedParams, UnknownSession};
use super::sse::{session_frames, sse_response};
use crate::gateway::{
    Caller, HistoryPage, MadeShare, NewShare, SessionEvent, SessionId, ShareView, SharedSession,
};

/// The client's address, when the server noted it (`serve.rs`).
pub struct Peer(Option<IpAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let info = parts.extensions.get::<ConnectInfo<SocketAddr>>();
        Ok(Peer(info.map(|ConnectInfo(addr)| addr.ip())))
    }
}

/// Share a session.
///
/// A link that opens the session read-only without a key (`/shared/{token}`): its page, its
/// transcript and, with `live`, its stream as it goes. The token is in the answer this once;
/// only its hash is kept. It opens nothing else: no other session, no prompt, no file.
#[utoipa::path(post, operation_id = "createShare", path = "/sessions/{id}/shares", tag = "sessions",
    params(SessionPath),
    request_body = NewShare,
    responses(
        (status = 201, description = "The link, with its token", body = MadeShare),
        (status = 422, description = "`expiresIn` out of range", body = Problem, content_type = "application/problem+json"),
        UnknownSession,
    ))]
pub async fn create_share(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Json(new): Json<NewShare>,
) -> Result<Response, ApiError> {
    let made = s.gateway.shares().create(&caller, &id, new).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

/// The session's links.
#[utoipa::path(get, operation_id = "listShares", path = "/sessions/{id}/shares", tag = "sessions",
    params(SessionPath),
    responses((status = 200, description = "Its links, newest first (without their tokens)", body = Vec<ShareView>), UnknownSession))]
pub async fn list_shares(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<Vec<ShareView>>, ApiError> {
    Ok(Json(s.gateway.shares().list(&caller, &id).await?))
}

/// Revoke a link.
///
/// It answers 410 from now on.
#[utoipa::path(delete, operation_id = "revokeShare", path = "/sessions/{id}/shares/{shareId}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), ("shareId" = String, Path, description = "The link's id")),
    responses((status = 204, description = "Revoked"), (status = 404, description = "No such session or link", body = Problem, content_type = "application/problem+json")))]
pub async fn revoke_share(
    State(s): State<AppState>,
    caller: Caller,
    Path((id, share)): Path<(SessionId, String)>,
) -> Result<StatusCode, ApiError> {
    s.gateway.shares().revoke(&caller, &id, &share).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Open a share link.
///
/// Without a key. A browser (`Accept: text/html`) gets the page that shows the session
/// read-only (or why the link does not open); anyone else what the link shows of the session.
/// 410 once it expired or was revoked.
#[utoipa::path(get, operation_id = "openShare", path = "/shared/{token}", tag = "shared",
    responses(
        (status = 200, description = "The session as the link shows it, or its page", content(
            (SharedSession = "application/json"),
            (String = "text/html"),
        )),
        (status = 404, description = "No link has this token", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired or was revoked", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests from this address", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn open_share(
    State(s): State<AppState>,
    Peer(peer): Peer,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    s.shares_limit.admit(peer)?;
    // The page is the same for every link: what it shows, or why not, it reads from here.
    if header_lists(&headers, header::ACCEPT, "text/html") {
        return Ok(super::console::embedded(
            "text/html; charset=utf-8",
            super::console::SHARED_PAGE,
        ));
    }
    Ok(Json(s.gateway.shares().shared(&token).await?).into_response())
}

/// A shared session's transcript.
#[utoipa::path(get, operation_id = "sharedHistory", path = "/shared/{token}/history", tag = "shared",
    params(HistoryParams),
    responses(
        (status = 200, description = "One page of events", body = HistoryPage),
        MalformedParams,
        (status = 404, description = "No link has this token", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired or was revoked", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests from this address", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn shared_history(
    State(s): State<AppState>,
    Peer(peer): Peer,
    Path(token): Path<String>,
    Query(p): Query<HistoryParams>,
) -> Result<Json<HistoryPage>, ApiError> {
    s.shares_limit.admit(peer)?;
    let (after, limit) = (p.after.unwrap_or(0), p.limit.unwrap_or(100));
    Ok(Json(
        s.gateway
            .shares()
            .shared_history(&token, after, limit)
            .await?,
    ))
}

/// A shared session's stream.
///
/// For a `live` link (403 otherwise): the session's events as SSE, as
/// `GET /sessions/{id}/events` gives them; resume with `Last-Event-ID` or `?after=N`.
#[utoipa::path(get, operation_id = "sharedEvents", path = "/shared/{token}/events", tag = "shared",
    params(StreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses(
        (status = 200, description = "An endless text/event-stream of SessionEvents", content_type = "text/event-stream", body = SessionEvent),
        MalformedParams,
        (status = 403, description = "The link shows the transcript only", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No link has this token", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The link expired or was revoked", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests from this address", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn shared_events(
    State(s): State<AppState>,
    Peer(peer): Peer,
    Path(token): Path<String>,
    headers: HeaderMap,
    Query(p): Query<StreamParams>,
) -> Result<Response, ApiError> {
    s.shares_limit.admit(peer)?;
    let after = cursor(&headers, p.after)?;
    let stream = s.gateway.shares().shared_events(&token, after).await?;
    let frames = stream.flat_map(session_frames);
    Ok(with_stream_headers(sse_response(frames)))
}
