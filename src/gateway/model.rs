//! Domain types shared by the gateway and the HTTP layer: validated ids and paths, the views
//! returned to clients, list cursors, and the `session_info_update` merge semantics.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::store::SessionRecord;

/// Now, at the store's precision (microseconds).
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

/// A session id from a client: printable ASCII without spaces, 1–256 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionId(String);

impl SessionId {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let ok = (1..=256).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(SessionId(s.to_owned()))
        } else {
            Err(ApiError::BadRequest(
                "invalid session id: expected 1-256 printable ASCII characters without spaces"
                    .into(),
            ))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks that `path` is absolute and normalised (no `.`/`..` segments, no empty segments, no
/// trailing slash, no NUL), as ACP requires for `cwd`.
pub fn validate_abs_path(field: &str, path: &str) -> Result<(), ApiError> {
    let bad = |why: &str| Err(ApiError::Validation(format!("{field} {why}: {path:?}")));
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
pub fn confine(field: &str, path: &str, roots: &[PathBuf]) -> Result<(), ApiError> {
    if roots.is_empty()
        || roots
            .iter()
            .any(|r| resolve(Path::new(path)).starts_with(r))
    {
        return Ok(());
    }
    Err(ApiError::Validation(format!(
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
    AwaitingPermission,
}

/// A session as clients see it: ACP `SessionInfo` plus gateway fields.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub session_id: String,
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
    /// `live` or `saved`.
    pub status: Status,
    /// Set for live sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
}

impl SessionView {
    pub fn new(r: &SessionRecord, status: Status, activity: Option<Activity>) -> Self {
        SessionView {
            session_id: r.session_id.clone(),
            cwd: r.cwd.clone(),
            title: r.title.clone(),
            updated_at: r.updated_at,
            created_at: r.created_at,
            additional_directories: r.additional_directories.clone(),
            archived: r.archived,
            meta: r.meta.clone(),
            status,
            activity,
        }
    }
}

/// One page of sessions.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPage {
    pub sessions: Vec<SessionView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /sessions/{id}/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    pub session_id: String,
    pub status: Status,
    /// `null` unless live.
    pub activity: Option<Activity>,
}

#[derive(Serialize, Deserialize)]
struct CursorData {
    u: i64,
    s: String,
}

/// The opaque list cursor: the keyset position of the last row of a page.
pub fn encode_cursor(updated_at: DateTime<Utc>, session_id: &str) -> String {
    let data = CursorData {
        u: updated_at.timestamp_micros(),
        s: session_id.to_owned(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&data).expect("cursor serialises"))
}

/// Reads a cursor made by [`encode_cursor`]; anything else is a 400.
pub fn decode_cursor(cursor: &str) -> Result<(DateTime<Utc>, String), ApiError> {
    let bad = || {
        ApiError::BadRequest(
            "invalid cursor: pass nextCursor from a previous page unchanged".into(),
        )
    };
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let data: CursorData = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let at = DateTime::<Utc>::from_timestamp_micros(data.u).ok_or_else(bad)?;
    Ok((at, data.s))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Origin;
    use serde_json::json;

    fn record() -> SessionRecord {
        let t = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap();
        SessionRecord {
            session_id: "s".into(),
            tenant: "default".into(),
            cwd: "/w".into(),
            additional_directories: vec![],
            title: Some("old".into()),
            updated_at: t,
            created_at: t,
            meta: Some(json!({"a": 1, "n": {"x": 1, "y": 2}})),
            archived: false,
            origin: Origin::Gateway,
            deleted_at: None,
            synced_at: None,
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
    fn ids_paths_and_cursors() {
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
        let at = now();
        let c = encode_cursor(at, "sess_1");
        assert_eq!(decode_cursor(&c).unwrap(), (at, "sess_1".to_owned()));
        assert!(decode_cursor("garbage!").is_err());
        assert!(decode_cursor(&URL_SAFE_NO_PAD.encode(b"{}")).is_err());
    }
}
