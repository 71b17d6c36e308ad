//! A session out and in: `GET /sessions/{id}/export` (JSON Lines, or Markdown with
//! `Accept: text/markdown`), streamed as it is read, and `POST /sessions/import`.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{AppState, Json, Path, Query, SessionPath, header_lists};
use super::responses::{MalformedParams, UnknownSession};
use crate::gateway::output::SessionView;
use crate::gateway::portable::ExportHeader;
use crate::gateway::{Caller, ExportFormat, SessionId};

/// JSON Lines' media type.
const NDJSON: &str = "application/x-ndjson";

/// An export of a session with one event, as the spec shows an import's body.
const IMPORT_EXAMPLE: &str = concat!(
    r#"{"format":"acp-gateway.session","version":1,"exportedAt":"2026-11-30T10:00:00Z","session":{"sessionId":"sess_f15d4b67bbe3406688b9a02219da3c15","agent":"echo","cwd":"/home/me/project","updatedAt":"2026-11-30T09:59:00Z","createdAt":"2026-11-30T09:58:00Z","archived":false,"origin":"gateway","status":"saved"},"state":{"seq":1,"state":{}}}"#,
    "\n",
    r#"{"seq":1,"event":"agent_message_chunk","data":{"sessionId":"sess_f15d4b67bbe3406688b9a02219da3c15","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}},"createdAt":"2026-11-30T09:59:00Z"}"#,
    "\n",
    r#"{"end":{"events":1,"lastSeq":1}}"#,
    "\n"
);

/// `GET /sessions/{id}/export` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ExportParams {
    /// `ndjson` or `markdown`, for a client that cannot set `Accept` (a download link);
    /// `Accept` decides otherwise.
    pub format: Option<String>,
}

/// Export a session.
///
/// As JSON Lines (`application/x-ndjson`, the default): first the session (as
/// `GET /sessions/{id}` shows it, with its state), then every event of its log with its `seq`,
/// kind, time and data, then `{"end": {"events": N, "lastSeq": S}}`; `POST /sessions/import`
/// takes it back. With `Accept: text/markdown`, a transcript for people: prompts and who sent
/// them, answers, thoughts, tool calls with their diffs and output, the plan, permission
/// requests and who answered. Both are streamed as the log is read, so a long session costs
/// no more memory than a short one; the export ends at the log's end when it began.
#[utoipa::path(get, operation_id = "exportSession", path = "/sessions/{id}/export", tag = "sessions",
    params(SessionPath, ExportParams,
        ("Accept" = Option<String>, Header, description = "`text/markdown` for the transcript")),
    responses(
        (status = 200, description = "The export: JSON Lines whose first line is an ExportHeader, then an ExportedEvent per event, then an ExportEnd; or Markdown", content(
            (ExportHeader = "application/x-ndjson"),
            (String = "text/markdown"),
        )),
        MalformedParams, UnknownSession,
    ))]
pub async fn export_session(
    State(s): State<AppState>,
    caller: Caller,
    Path(id): Path<SessionId>,
    headers: HeaderMap,
    Query(p): Query<ExportParams>,
) -> Result<Response, ApiError> {
    let format = match p.format.as_deref() {
        Some("markdown") => ExportFormat::Markdown,
        Some("ndjson") => ExportFormat::Lines,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "format {other:?} is neither ndjson nor markdown"
            )));
        }
        None if header_lists(&headers, header::ACCEPT, "text/markdown") => ExportFormat::Markdown,
        None => ExportFormat::Lines,
    };
    let pieces = s.gateway.transcripts().export(&caller, &id, format).await?;
    let (media, suffix) = match format {
        ExportFormat::Lines => (NDJSON, "ndjson"),
        ExportFormat::Markdown => ("text/markdown; charset=utf-8", "md"),
    };
    // Lone surrogates written back as the escapes they came as, as every JSON answer does.
    let restored = |piece: String| Bytes::from(crate::surrogates::restore_string(piece));
    let body = Body::from_stream(pieces.map(move |piece| piece.map(restored)));
    let file = format!("attachment; filename=\"{}.{suffix}\"", id.as_str());
    Ok((
        [
            (header::CONTENT_TYPE, media.to_owned()),
            (header::CONTENT_DISPOSITION, file),
        ],
        body,
    )
        .into_response())
}

/// Import a session.
///
/// A JSON Lines export (`GET /sessions/{id}/export`), checked line by line, becomes a session
/// of the caller's tenant with the same events, in order, with their `seq` and times. It
/// keeps its id when no session here has it and its agent runs here and can load or resume
/// sessions: a prompt then makes it live as for any saved session. Otherwise it gets a new id
/// (the events' `sessionId` follow) and is a read-only transcript: readable and followable,
/// and a prompt answers 409 saying why. Its `_meta["acp-gateway/import"]` says where it came
/// from and whether it is read-only. Nothing is written unless the whole export is good.
#[utoipa::path(post, operation_id = "importSession", path = "/sessions/import", tag = "sessions",
    request_body(content((String = "application/x-ndjson", example = json!(IMPORT_EXAMPLE))), description = "An export's lines: an ExportHeader, ExportedEvents, an ExportEnd"),
    responses(
        (status = 201, description = "The session made", body = SessionView),
        (status = 409, description = "The id chosen was taken meanwhile", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than --max-body-bytes", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/x-ndjson", body = crate::gateway::Problem, content_type = "application/problem+json"),
        (status = 422, description = "A line that is not what an export holds there (named in the detail), or an export cut short", body = crate::gateway::Problem, content_type = "application/problem+json"),
    ))]
pub async fn import_session(
    State(s): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    if !matches!(media.as_deref(), Some(NDJSON | "application/jsonl")) {
        return Err(ApiError::UnsupportedMediaType(format!(
            "an import is {NDJSON}: the lines of GET /sessions/{{id}}/export"
        )));
    }
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge("the export is larger than --max-body-bytes allows".into())
        }
        _ => ApiError::BadRequest(format!("the body cannot be read: {e}")),
    })?;
    // Lone surrogates kept as they came, as in every JSON body the gateway reads.
    let text = std::str::from_utf8(&body)
        .map_err(|e| ApiError::Validation(format!("the body is not UTF-8: {e}")))?;
    let text = crate::surrogates::escape(text);
    let view = (s.gateway.transcripts())
        .import(&caller, text.as_bytes())
        .await?;
    let location = format!("/sessions/{}", view.session_id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view),
    )
        .into_response())
}
