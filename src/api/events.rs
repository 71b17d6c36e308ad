//! Server-Sent Event streams (per session, and lifecycle across sessions) and JSON history.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use futures::StreamExt;
use serde::Deserialize;

use super::error::{ApiError, Problem};
use super::extract::{AppState, Json, Path, Query, SessionPath};
use super::responses::{MalformedParams, UnknownOrDeletedSession};
use super::sse::{lifecycle_frames, session_frames, sse_response};
use crate::gateway::input::SessionId;
use crate::gateway::output::WatcherView;
use crate::gateway::{Caller, HistoryPage, LifecycleEvent, SessionEvent};

/// Where a stream starts.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamParams {
    /// Resume after this event id (same as `Last-Event-ID`; `0` replays everything retained).
    pub after: Option<i64>,
}

/// History page parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// Only events with a greater sequence number (default 0).
    pub after: Option<i64>,
    /// Page size, 1–1000 (default 100).
    pub limit: Option<i64>,
}

/// `GET /sessions/{id}/events` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionStreamParams {
    /// Resume after this event id (same as `Last-Event-ID`; `0` replays everything retained).
    pub after: Option<i64>,
    /// `true`, without a cursor: start with one `state` event, the session's state at the end
    /// of its log (its `id` is that position), then continue from there; a reconnect with
    /// `Last-Event-ID` continues from its cursor as usual.
    pub snapshot: Option<bool>,
}

/// The cursor from `Last-Event-ID` or `?after`; `None` = live tail.
pub(super) fn cursor(headers: &HeaderMap, after: Option<i64>) -> Result<Option<i64>, ApiError> {
    let header = headers.get("last-event-id").map(|v| {
        v.to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::BadRequest("Last-Event-ID must be a non-negative integer".into())
            })
    });
    match (header.transpose()?, after) {
        (_, Some(a)) if a < 0 => Err(ApiError::BadRequest("after must be >= 0".into())),
        (Some(h), _) => Ok(Some(h)),
        (None, a) => Ok(a),
    }
}

pub(super) fn with_stream_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}

/// Stream a session's events (SSE).
///
/// The session's events as SSE: `id` is the sequence number in the durable log, `event` the ACP
/// `sessionUpdate` tag or a gateway event (`turn_started`, `turn_ended`, `permission_requested`,
/// `permission_resolved`, `elicitation_requested`, `elicitation_resolved`,
/// `elicitation_completed`, `session_deleted`, `agent_exited`, `state_changed`, `forked`), `data`
/// the JSON payload. Resume with `Last-Event-ID` or `?after=N`; with neither, the stream starts
/// at the live tail, or, with `snapshot=true`, at a `state` event holding the session's state
/// (`GET /sessions/{id}`'s `state`) at that point of the log.
#[utoipa::path(get, operation_id = "streamSessionEvents", path = "/sessions/{id}/events", tag = "events",
    params(SessionPath, SessionStreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses(
        (status = 200, description = "An endless text/event-stream; each event is a SessionEvent: SSE `id` its `seq`, `event` its `event` (which selects the variant), `data` its `data`", content_type = "text/event-stream", body = SessionEvent),
        (status = 400, description = "Malformed cursor or id", body = Problem, content_type = "application/problem+json"),
        UnknownOrDeletedSession,
    ))]
pub async fn session_events(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    Query(p): Query<SessionStreamParams>,
) -> Result<Response, ApiError> {
    let after = cursor(&headers, p.after)?;
    let snapshot = p.snapshot == Some(true);
    let stream = s
        .gateway
        .history()
        .session_events(&caller, &id, after, snapshot)
        .await?;
    let frames = stream.flat_map(session_frames);
    Ok(with_stream_headers(sse_response(frames)))
}

/// The session's stored events as JSON pages, for scripts.
#[utoipa::path(get, operation_id = "getSessionHistory", path = "/sessions/{id}/history", tag = "events",
    params(SessionPath, HistoryParams),
    responses(
        (status = 200, description = "One page of events", body = HistoryPage),
        MalformedParams, UnknownOrDeletedSession,
    ))]
pub async fn session_history(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    Query(p): Query<HistoryParams>,
) -> Result<Json<HistoryPage>, ApiError> {
    Ok(Json(
        s.gateway
            .history()
            .history(&caller, &id, p.after.unwrap_or(0), p.limit.unwrap_or(100))
            .await?,
    ))
}

/// Who is watching the session.
///
/// The people with a stream of the session open (`GET /sessions/{id}/events`, `/acp` clients
/// following it), on any replica, each with how many; `watchers_changed` on `GET /events` says
/// when someone starts or stops watching.
#[utoipa::path(get, operation_id = "listWatchers", path = "/sessions/{id}/watchers", tag = "events",
    params(SessionPath),
    responses(
        (status = 200, description = "The watchers, first to arrive first", body = Vec<WatcherView>),
        UnknownOrDeletedSession,
    ))]
pub async fn watchers(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
) -> Result<Json<Vec<WatcherView>>, ApiError> {
    Ok(Json(s.gateway.history().watchers(&caller, &id).await?))
}

/// Stream the lifecycle of every session (SSE).
///
/// Session lifecycle across sessions as SSE, for session browsers: `session_created`,
/// `session_updated`, `session_status`, `session_deleted`, `watchers_changed`. Resumable like the session stream.
#[utoipa::path(get, operation_id = "streamLifecycleEvents", path = "/events", tag = "events",
    params(StreamParams, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses(
        (status = 200, description = "An endless text/event-stream; each event is a LifecycleEvent: SSE `id` its `seq`, `event` its `event` (which selects the variant), `data` its `data`", content_type = "text/event-stream", body = LifecycleEvent),
        (status = 400, description = "Malformed cursor", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn lifecycle_events(
    State(s): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(p): Query<StreamParams>,
) -> Result<Response, ApiError> {
    let after = cursor(&headers, p.after)?;
    let stream = s.gateway.history().lifecycle_events(&caller, after).await?;
    let frames = stream.map(|batch| lifecycle_frames(&batch));
    Ok(with_stream_headers(sse_response(frames)))
}
