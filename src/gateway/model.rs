//! Domain types shared by the gateway and the HTTP layer: validated ids and paths, the views
//! returned to clients (list cursors are `cursor.rs`'s), and the `session_info_update` merge
//! semantics.

use std::path::{Path, PathBuf};

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::Error;
pub use super::clock::now;
pub use super::cursor::{decode_cursor, encode_cursor};
use crate::acp::caps::AgentInit;
use crate::cluster::ReplicaView;
use crate::pool::MemberView;
use crate::store::SessionRecord;

/// A session id from a client: printable ASCII without spaces, 1–256 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionId(String);

/// Read from a path or a body, an id is checked as [`SessionId::parse`] checks it.
impl<'de> serde::Deserialize<'de> for SessionId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        SessionId::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl SessionId {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let ok = (1..=256).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(SessionId(s.to_owned()))
        } else {
            Err(Error::Malformed(
                "invalid session id: expected 1-256 printable ASCII characters without spaces"
                    .into(),
            ))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// An id the agent gave, whatever its form.
    pub(super) fn known(id: String) -> Self {
        SessionId(id)
    }
}

/// A prompt's ACP content blocks: at least one, each with a string `type`.
#[derive(Debug, Clone)]
pub struct Prompt(Vec<Value>);

impl Prompt {
    /// From a request's `prompt` blocks or its `text` shorthand: exactly one of them.
    pub fn new(blocks: Option<Vec<Value>>, text: Option<String>) -> Result<Self, Error> {
        let blocks = match (blocks, text) {
            (Some(p), None) if !p.is_empty() => p,
            (None, Some(t)) => vec![json!({"type": "text", "text": t})],
            _ => {
                return Err(Error::Invalid(
                    "give exactly one of `prompt` (non-empty ContentBlock[]) or `text`".into(),
                ));
            }
        };
        if blocks
            .iter()
            .any(|b| b.get("type").and_then(Value::as_str).is_none())
        {
            return Err(Error::Invalid(
                "every prompt block needs a string `type`".into(),
            ));
        }
        Ok(Prompt(blocks))
    }

    pub fn into_blocks(self) -> Vec<Value> {
        self.0
    }
}

/// How a turn ended.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"stopReason": "end_turn", "result": {"stopReason": "end_turn"}}))]
pub struct TurnResult {
    /// `end_turn`, `max_tokens`, `max_turn_requests`, `refusal` or `cancelled`.
    pub stop_reason: String,
    /// The agent's whole `session/prompt` result.
    #[schema(value_type = Object)]
    pub result: Value,
}

/// What `/agent` shows.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"initialize": {"protocolVersion": 1, "agentInfo": {"name": "echo-agent", "version": "0.1.0"}, "authMethods": [], "capabilities": {"load": true, "list": true, "resume": true, "close": true, "delete": true, "status": false, "setTitle": false, "archive": false}, "rawCapabilities": {"loadSession": true, "sessionCapabilities": {"list": {}, "delete": {}, "resume": {}, "close": {}}}}, "members": [{"index": 0, "pid": 9830, "state": "ready", "sessions": 1, "restarts": 0, "lastExit": null, "lastError": null}], "replicas": [{"id": "5b0c1f0e-7d2a-4c55-9a43-0c9f2b61d1a7", "address": "http://127.0.0.1:8080", "startedAt": "2025-01-01T12:00:00Z", "heartbeatAt": "2025-01-01T12:05:00Z", "sessionsLive": 1, "live": true, "this": true}]}))]
pub struct AgentView {
    /// `null` until a member has answered `initialize`.
    pub initialize: Option<AgentInit>,
    pub members: Vec<MemberView>,
    /// The gateway replicas sharing the database, this one included (`this`), oldest first, as
    /// of this replica's last heartbeat.
    pub replicas: Vec<ReplicaView>,
}

/// Checks that `path` is absolute and normalised (no `.`/`..` segments, no empty segments, no
/// trailing slash, no NUL), as ACP requires for `cwd`.
pub fn validate_abs_path(field: &str, path: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::Invalid(format!("{field} {why}: {path:?}")));
    if !path.starts_with('/') {
        return bad("must be an absolute path");
    }
    if path.contains('\0') {
        return bad("must not contain NUL");
    }
    if path != "/"
        && path[1..]
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return bad("must be normalised (no empty, '.' or '..' segments, no trailing slash)");
    }
    Ok(())
}

/// With workspace roots configured, `path` (already absolute and normalised), with symlinks
/// resolved as far as it exists, must lie inside one of them.
pub fn confine(field: &str, path: &str, roots: &[PathBuf]) -> Result<(), Error> {
    if roots.is_empty()
        || roots
            .iter()
            .any(|r| resolve(Path::new(path)).starts_with(r))
    {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{field} is outside the workspace roots this gateway allows: {path:?}"
    )))
}

/// The path with its deepest existing ancestor canonicalised (symlinks resolved) and the rest,
/// which does not exist yet, appended.
fn resolve(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        if let Ok(mut real) = existing.canonicalize() {
            real.extend(missing.iter().rev());
            return real;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Whether a session is loaded in a pool member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Loaded in a pool member: prompts work now.
    Live,
    /// Known but not loaded: a prompt will resume it.
    Saved,
    /// Unknown (or deleted).
    NotFound,
}

/// What a live session is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Activity {
    Idle,
    Running,
    /// A permission request waits for a client's answer.
    AwaitingPermission,
    /// An elicitation waits for a client's answer.
    AwaitingInput,
}

/// A session as clients see it: ACP `SessionInfo` plus gateway fields.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "cwd": "/home/me/project", "title": "Echo: hi", "updatedAt": "2026-11-22T12:47:51.072210Z", "createdAt": "2026-11-22T12:47:50.904272Z", "archived": false, "origin": "gateway", "status": "live", "activity": "idle"}))]
pub struct SessionView {
    pub session_id: String,
    /// The agent it lives in.
    pub agent: String,
    pub cwd: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// ISO 8601.
    pub updated_at: DateTime<Utc>,
    /// ISO 8601; when this gateway first saw the session.
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub additional_directories: Vec<String>,
    pub archived: bool,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub meta: Option<Value>,
    /// `gateway`: created through this gateway; `upstream`: found in the agent's
    /// `session/list` (created by another client of the agent).
    #[schema(example = "gateway")]
    pub origin: String,
    /// `live` or `saved`.
    pub status: Status,
    /// Set for live sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    /// Modes, models, config options, commands, usage, plan (`GET /sessions/{id}` and the
    /// answers that create a session; not in lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<Box<super::state::SessionState>>,
}

impl SessionView {
    pub fn new(r: &SessionRecord, status: Status, activity: Option<Activity>) -> Self {
        SessionView {
            session_id: r.session_id.clone(),
            agent: r.agent.clone(),
            cwd: r.cwd.clone(),
            title: r.title.clone(),
            updated_at: r.updated_at,
            created_at: r.created_at,
            additional_directories: r.additional_directories.clone(),
            archived: r.archived,
            meta: r.meta.clone(),
            origin: r.origin.as_str().to_owned(),
            status,
            activity,
            state: None,
        }
    }
}

/// One page of sessions.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"sessions": [{"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "cwd": "/home/me/project", "title": "Echo: hi", "updatedAt": "2026-11-22T12:47:51.072210Z", "createdAt": "2026-11-22T12:47:50.904272Z", "archived": false, "origin": "gateway", "status": "live", "activity": "idle"}], "nextCursor": "eyJuIjozLCJ1IjoxNzYzODAwMDAwMDAwMDAwLCJzIjoic2Vzc18xIiwicSI6IlQtc1l0OXpEbDhxeSJ9"}))]
pub struct SessionPage {
    pub sessions: Vec<SessionView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A list page ready to send: each session's JSON up to its `status`, which changes without a
/// store write and is added per request by [`PageJson::render`]. The bytes are exactly those of
/// the page's [`SessionPage`] (status and activity are the view's last fields).
#[derive(Debug)]
pub struct PageJson {
    ids: Vec<String>,
    prefixes: Vec<String>,
    next_cursor: Option<String>,
}

impl PageJson {
    const SAVED_SUFFIX: &'static str = ",\"status\":\"saved\"}";

    pub fn new(records: &[SessionRecord], next_cursor: Option<String>) -> Self {
        let prefixes = records
            .iter()
            .map(|r| {
                let view = SessionView::new(r, Status::Saved, None);
                let json = serde_json::to_string(&view).expect("a view serialises");
                json.strip_suffix(Self::SAVED_SUFFIX)
                    .expect("status is the view's last field")
                    .to_owned()
            })
            .collect();
        PageJson {
            ids: records.iter().map(|r| r.session_id.clone()).collect(),
            prefixes,
            next_cursor,
        }
    }

    /// The page's JSON, with each session's current status from `status_of`.
    pub fn render(&self, status_of: impl Fn(&str) -> (Status, Option<Activity>)) -> Vec<u8> {
        let len: usize = self.prefixes.iter().map(|p| p.len() + 48).sum();
        let mut out = Vec::with_capacity(len + 64);
        out.extend_from_slice(b"{\"sessions\":[");
        for (i, (id, prefix)) in self.ids.iter().zip(&self.prefixes).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(prefix.as_bytes());
            let (status, activity) = status_of(id);
            out.extend_from_slice(b",\"status\":");
            serde_json::to_writer(&mut out, &status).expect("a status serialises");
            if let Some(activity) = activity {
                out.extend_from_slice(b",\"activity\":");
                serde_json::to_writer(&mut out, &activity).expect("an activity serialises");
            }
            out.push(b'}');
        }
        out.push(b']');
        if let Some(cursor) = &self.next_cursor {
            out.extend_from_slice(b",\"nextCursor\":");
            serde_json::to_writer(&mut out, cursor).expect("a cursor serialises");
        }
        out.push(b'}');
        out
    }
}

/// `GET /sessions/{id}/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "status": "live", "activity": "idle"}))]
pub struct StatusView {
    pub session_id: String,
    pub status: Status,
    /// `null` unless live.
    pub activity: Option<Activity>,
}

/// Applies a `session_info_update` to a cached row: an absent field is unchanged, `null`
/// clears it, `_meta` merges recursively with `null` deleting a key. `updatedAt` is taken from
/// the update when valid, else set to `now` (the update itself is activity).
pub fn apply_info_update(record: &mut SessionRecord, update: &Value, now: DateTime<Utc>) {
    if let Some(title) = update.get("title") {
        record.title = title.as_str().map(str::to_owned);
    }
    record.updated_at = update
        .get("updatedAt")
        .and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc).trunc_subsecs(6))
        .unwrap_or(now);
    match update.get("_meta") {
        None => {}
        Some(Value::Null) => record.meta = None,
        Some(patch) => {
            let mut base = record.meta.take().unwrap_or(Value::Object(Map::new()));
            merge(&mut base, patch);
            record.meta = Some(base);
        }
    }
}

/// Recursive JSON merge: objects merge key by key, `null` deletes, anything else replaces.
fn merge(base: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *base = patch.clone();
        return;
    };
    if !base.is_object() {
        // A patch object never stores its nulls: it merges into an empty object.
        *base = Value::Object(Map::new());
    }
    let Value::Object(b) = base else {
        unreachable!()
    };
    for (k, v) in p {
        if v.is_null() {
            b.remove(k);
        } else {
            merge(b.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A session of the gateway's, recorded at `at` (for tests).
#[cfg(test)]
pub(super) fn recorded(tenant: &str, cwd: &str, at: DateTime<Utc>) -> SessionRecord {
    let (id, agent) = ("s".into(), "default".into());
    let origin = crate::store::Origin::Gateway;
    SessionRecord::new(id, tenant.into(), cwd.into(), agent, origin, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record() -> SessionRecord {
        let t = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap();
        SessionRecord {
            title: Some("old".into()),
            meta: Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ..recorded("default", "/w", t)
        }
    }

    #[test]
    fn info_update_semantics() {
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let cases: Vec<(Value, Option<&str>, Option<Value>)> = vec![
            (
                json!({}),
                Some("old"),
                Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"title": "new"}),
                Some("new"),
                Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"title": null}),
                None,
                Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            ),
            (json!({"_meta": null}), Some("old"), None),
            (
                json!({"_meta": {"b": 2}}),
                Some("old"),
                Some(json!({"a": 1, "b": 2, "n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"_meta": {"a": null}}),
                Some("old"),
                Some(json!({"n": {"x": 1, "y": 2}})),
            ),
            (
                json!({"_meta": {"n": {"y": null, "z": 3}}}),
                Some("old"),
                Some(json!({"a": 1, "n": {"x": 1, "z": 3}})),
            ),
            (
                json!({"_meta": {"n": 5}}),
                Some("old"),
                Some(json!({"a": 1, "n": 5})),
            ),
        ];
        for (update, title, meta) in cases {
            let mut r = record();
            apply_info_update(&mut r, &update, now);
            assert_eq!(r.title.as_deref(), title, "{update}");
            assert_eq!(r.meta, meta, "{update}");
            assert_eq!(r.updated_at, now, "{update}");
        }
        let mut r = record();
        apply_info_update(&mut r, &json!({"updatedAt": "2025-10-29T14:22:15Z"}), now);
        assert_eq!(r.updated_at.to_rfc3339(), "2025-10-29T14:22:15+00:00");
        let mut r = record();
        r.meta = None;
        apply_info_update(&mut r, &json!({"_meta": {"k": {"d": null, "e": 1}}}), now);
        assert_eq!(r.meta, Some(json!({"k": {"e": 1}})));
    }

    #[test]
    fn page_json_is_the_serialised_page() {
        let at = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let record = |id: &str, title: Option<&str>, meta: Option<Value>| SessionRecord {
            session_id: id.into(),
            tenant: "t".into(),
            cwd: "/w \"quoted\"".into(),
            additional_directories: vec!["/x".into()],
            title: title.map(str::to_owned),
            updated_at: at,
            created_at: at,
            meta,
            archived: false,
            origin: crate::store::Origin::Upstream,
            deleted_at: None,
            synced_at: None,
            listed: None,
            agent: "default".into(),
        };
        let records = vec![
            record("a", Some("ünïcode \n title"), Some(json!({"k": [1, null]}))),
            record("b", None, None),
            record("c", Some(""), None),
        ];
        let statuses = |id: &str| match id {
            "a" => (Status::Live, Some(Activity::AwaitingPermission)),
            "b" => (Status::Saved, None),
            _ => (Status::Live, Some(Activity::Running)),
        };
        for cursor in [None, Some("next\"cursor".to_owned())] {
            let expected = SessionPage {
                sessions: records
                    .iter()
                    .map(|r| {
                        let (s, a) = statuses(&r.session_id);
                        SessionView::new(r, s, a)
                    })
                    .collect(),
                next_cursor: cursor.clone(),
            };
            let fast = PageJson::new(&records, cursor).render(statuses);
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                serde_json::to_string(&expected).unwrap()
            );
        }
        let empty = PageJson::new(&[], None).render(statuses);
        assert_eq!(empty, br#"{"sessions":[]}"#);
    }

    #[test]
    fn ids_and_paths() {
        assert!(SessionId::parse("sess_abc-123").is_ok());
        assert!(SessionId::parse("").is_err());
        assert!(SessionId::parse("has space").is_err());
        assert!(SessionId::parse(&"x".repeat(257)).is_err());
        assert!(SessionId::parse("é").is_err());
        assert!(validate_abs_path("cwd", "/home/u/p").is_ok());
        assert!(validate_abs_path("cwd", "/").is_ok());
        for bad in ["rel/p", "/a/../b", "/a/./b", "/a//b", "/a/", "/a\0b", ""] {
            assert!(validate_abs_path("cwd", bad).is_err(), "{bad:?}");
        }
    }
}
