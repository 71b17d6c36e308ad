//! A session as it leaves one gateway and enters another: the JSON Lines of
//! `GET /sessions/{id}/export` (a [`ExportHeader`], an [`ExportedEvent`] per event, an
//! [`ExportEnd`]) and how `POST /sessions/import` reads them back ([`Imported::parse`]),
//! line by line, refusing the first line that is not what it must be. An imported session
//! its agent cannot load here is a transcript: its `_meta` says so under [`IMPORT_META`]
//! ([`read_only`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::error::Error;
use super::input::validate_abs_path;
use super::output::SessionView;
use super::state::StateAt;
use crate::store::{Payload, SessionRecord, StoredEvent};

/// What an export's first line names its format with.
pub const EXPORT_FORMAT: &str = "acp-gateway.session";
/// The version of that format this gateway writes and reads.
pub const EXPORT_VERSION: u32 = 1;
/// The `_meta` key of an imported session: where it came from, and whether it is a transcript.
pub const IMPORT_META: &str = "acp-gateway/import";

/// An export's first line: the session as `GET /sessions/{id}` shows it, and its state at the
/// last event exported. The lines after it are events (`{"seq", "event", "data",
/// "createdAt"}`, as the history has them), then `{"end": {"events", "lastSeq"}}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "exportedAt": "2026-11-30T10:00:00Z", "session": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "agent": "echo", "cwd": "/home/me/project", "updatedAt": "2026-11-30T09:59:00Z", "createdAt": "2026-11-30T09:58:00Z", "archived": false, "origin": "gateway", "status": "saved"}, "state": {"seq": 1, "state": {}}}))]
pub struct ExportHeader {
    /// `acp-gateway.session`.
    pub format: String,
    /// `1`.
    pub version: u32,
    pub exported_at: DateTime<Utc>,
    pub session: SessionView,
    /// The session's state, and the last event it includes (the export's last event).
    pub state: StateAt,
}

/// An event line of an export: the event as the history and the streams give it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportedEvent {
    /// Its sequence number in the session's log (the SSE `id`).
    pub seq: i64,
    /// Its kind (the SSE `event`).
    pub event: String,
    #[schema(value_type = Object)]
    pub data: Payload,
    pub created_at: DateTime<Utc>,
}

/// An export's last line: how many events it holds, so that a cut export is known as one.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportEnd {
    pub end: ExportTotals,
}

/// What [`ExportEnd`] counts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportTotals {
    /// The event lines.
    pub events: u64,
    /// The last event's `seq` (0: none).
    pub last_seq: i64,
}

impl ExportedEvent {
    pub fn of(e: StoredEvent) -> Self {
        ExportedEvent {
            seq: e.seq,
            event: e.kind,
            data: e.payload,
            created_at: e.created_at,
        }
    }
}

/// An export read back whole.
pub struct Imported {
    pub header: ExportHeader,
    pub events: Vec<StoredEvent>,
}

/// The longest event kind taken (the gateway's and ACP's are far shorter).
const MAX_KIND: usize = 128;

impl Imported {
    /// `body`'s lines (their lone surrogates marked, as the API does to every JSON body), each
    /// checked in turn: the header first, then events with increasing
    /// `seq`, each an object with a kind, then the end, which must count them; nothing after
    /// it. The first line that is wrong is named in the error.
    pub fn parse(body: &[u8]) -> Result<Imported, Error> {
        let text = std::str::from_utf8(body)
            .map_err(|e| Error::Invalid(format!("the body is not UTF-8: {e}")))?;
        let mut lines = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let at = |n: usize, what: String| Error::Invalid(format!("line {}: {what}", n + 1));
        let (n, first) = lines
            .next()
            .ok_or_else(|| Error::Invalid("the body is empty: an export is expected".into()))?;
        let header: ExportHeader = serde_json::from_str(first)
            .map_err(|e| at(n, format!("not an export's first line: {e}")))?;
        if header.format != EXPORT_FORMAT || header.version != EXPORT_VERSION {
            let (format, version) = (&header.format, header.version);
            return Err(at(
                n,
                format!(
                    "format {format:?} version {version} is not {EXPORT_FORMAT:?} version {EXPORT_VERSION}"
                ),
            ));
        }
        let mut events: Vec<StoredEvent> = Vec::new();
        let mut end = None;
        for (n, line) in lines {
            if end.is_some() {
                return Err(at(n, "a line after the export's end".into()));
            }
            let e: ExportedEvent = match serde_json::from_str(line) {
                Ok(e) => e,
                Err(not_event) => match serde_json::from_str::<ExportEnd>(line) {
                    Ok(last) => {
                        end = Some((n, last.end));
                        continue;
                    }
                    Err(_) => return Err(at(n, format!("not an event: {not_event}"))),
                },
            };
            let after = events.last().map_or(0, |last| last.seq);
            if e.seq <= after {
                return Err(at(n, format!("seq {} does not follow {after}", e.seq)));
            }
            if e.event.is_empty()
                || e.event.len() > MAX_KIND
                || e.event.chars().any(char::is_control)
            {
                return Err(at(n, format!("{:?} is not an event kind", e.event)));
            }
            if !e.data.as_str().trim_start().starts_with('{') {
                return Err(at(n, "the event's data is not an object".into()));
            }
            events.push(StoredEvent {
                session_id: String::new(),
                seq: e.seq,
                kind: e.event,
                payload: e.data,
                created_at: e.created_at,
            });
        }
        let Some((n, end)) = end else {
            return Err(Error::Invalid(
                "the export has no end line: it was cut short".into(),
            ));
        };
        let last_seq = events.last().map_or(0, |e| e.seq);
        if end.events != events.len() as u64 || (end.events > 0 && end.last_seq != last_seq) {
            return Err(at(
                n,
                format!(
                    "the end counts {} events up to {}, the export holds {} up to {last_seq}",
                    end.events,
                    end.last_seq,
                    events.len()
                ),
            ));
        }
        check_header(&header.session)?;
        Ok(Imported { header, events })
    }
}

/// The session of an export's first line, checked as a new session's would be: an absolute
/// folder, folders and an agent's name without control characters.
fn check_header(session: &SessionView) -> Result<(), Error> {
    let at = |what: String| Error::Invalid(format!("line 1: {what}"));
    validate_abs_path("cwd", &session.cwd).map_err(|e| at(e.to_string()))?;
    for folder in &session.additional_directories {
        validate_abs_path("additionalDirectories", folder).map_err(|e| at(e.to_string()))?;
    }
    let agent = &session.agent;
    if agent.is_empty() || agent.len() > 128 || agent.chars().any(char::is_control) {
        return Err(at(format!("{agent:?} is not an agent's name")));
    }
    Ok(())
}

/// Why `record`, an imported transcript, cannot be used as a session (`None`: it can).
pub fn read_only(record: &SessionRecord) -> Option<String> {
    let import = record.meta.as_ref()?.get(IMPORT_META)?;
    if import.get("readOnly") != Some(&Value::Bool(true)) {
        return None;
    }
    let from = import["from"].as_str().unwrap_or("another session");
    let why = import["why"]
        .as_str()
        .unwrap_or("its agent cannot load it here");
    Some(format!(
        "this session is a read-only transcript imported from {from}: {why}"
    ))
}
