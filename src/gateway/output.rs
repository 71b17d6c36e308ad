//! What the service answers with: a session's view and status, pages of them (list cursors are
//! `cursor.rs`'s), a turn's result, the agent's view.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::caller::{Author, owner_of};
use crate::agent_rpc::caps::AgentInit;
use crate::cluster::ReplicaView;
use crate::config::WhoAnswers;
use crate::pool::MemberView;
use crate::store::{QueuedPrompt, SessionRecord, WorkspaceRecord};

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
#[schema(example = json!({"initialize": {"protocolVersion": 1, "agentInfo": {"name": "echo-agent", "version": "0.1.0"}, "authMethods": [], "capabilities": {"load": true, "list": true, "resume": true, "close": true, "delete": true, "status": false, "setTitle": false, "archive": false, "fork": false, "logout": false}, "rawCapabilities": {"loadSession": true, "sessionCapabilities": {"list": {}, "delete": {}, "resume": {}, "close": {}}}}, "members": [{"index": 0, "pid": 9830, "state": "ready", "sessions": 1, "restarts": 0, "lastExit": null, "lastError": null}], "replicas": [{"id": "5b0c1f0e-7d2a-4c55-9a43-0c9f2b61d1a7", "address": "http://127.0.0.1:8080", "startedAt": "2025-01-01T12:00:00Z", "heartbeatAt": "2025-01-01T12:05:00Z", "sessionsLive": 1, "agents": ["echo"], "live": true, "this": true}]}))]
pub struct AgentView {
    /// `null` until a member has answered `initialize`.
    pub initialize: Option<AgentInit>,
    pub members: Vec<MemberView>,
    /// The gateway replicas sharing the database, this one included (`this`), oldest first, as
    /// of this replica's last heartbeat.
    pub replicas: Vec<ReplicaView>,
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
#[schema(example = json!({"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "agent": "echo", "cwd": "/home/me/project", "title": "Echo: hi", "updatedAt": "2026-11-22T12:47:51.072210Z", "createdAt": "2026-11-22T12:47:50.904272Z", "archived": false, "origin": "gateway", "status": "live", "activity": "idle"}))]
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
    /// The user who created it, when the key or token named one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub owner: Option<Author>,
    /// Who may answer its permission requests and elicitations, when the session says (else
    /// the tenant's default: `anyone` unless the config file's `[tenants.NAME]` says).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub who_answers: Option<WhoAnswers>,
    /// `live` or `saved`.
    pub status: Status,
    /// Set for live sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    /// Modes, models, config options, commands, usage, plan (`GET /sessions/{id}` and the
    /// answers that create a session; not in lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<Box<super::state::SessionState>>,
    /// The workspace the gateway made for it, where `cwd` is (`GET /sessions/{id}` and the
    /// answers that create a session; not in lists).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub workspace: Option<WorkspaceView>,
}

/// A session's workspace of the gateway's own: its files are served under
/// `/sessions/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"kind": "scratch", "path": "/var/lib/acp-gateway/workspaces/9b2f0c1e4d6a4f0f8e7d2c3b1a096857"}))]
pub struct WorkspaceView {
    /// `scratch`: an empty folder of the session's own under `--workspace-dir`; `worktree`: a
    /// git worktree of `repository` there.
    pub kind: String,
    /// The folder, on the gateway's host (the session's `cwd`).
    pub path: String,
    /// The commit it started from, which `/diff` compares with (none when the gateway had no
    /// git).
    pub base: Option<String>,
    /// A worktree's branch (`acp/<session id>`).
    pub branch: Option<String>,
    /// A worktree's repository.
    pub repository: Option<String>,
}

impl From<WorkspaceRecord> for WorkspaceView {
    fn from(w: WorkspaceRecord) -> Self {
        WorkspaceView {
            kind: w.kind,
            path: w.path,
            base: w.base,
            branch: w.branch,
            repository: w.repository,
        }
    }
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
            owner: r.people.owner.is_some().then(|| owner_of(r)),
            who_answers: r.people.who_answers.as_deref().and_then(WhoAnswers::parse),
            status,
            activity,
            state: None,
            workspace: None,
        }
    }
}

/// One page of sessions.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"sessions": [{"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "agent": "echo", "cwd": "/home/me/project", "title": "Echo: hi", "updatedAt": "2026-11-22T12:47:51.072210Z", "createdAt": "2026-11-22T12:47:50.904272Z", "archived": false, "origin": "gateway", "status": "live", "activity": "idle"}], "nextCursor": "eyJuIjozLCJ1IjoxNzYzODAwMDAwMDAwMDAwLCJzIjoic2Vzc18xIiwicSI6IlQtc1l0OXpEbDhxeSJ9"}))]
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

    /// The page's sessions.
    pub fn ids(&self) -> &[String] {
        &self.ids
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

/// A queued prompt, as clients see it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"queueId": "q_4f0c1e4d6a4f0f8e7d2c3b1a09685791", "position": 2, "author": {"tenant": "acme", "user": "ann"}, "prompt": [{"type": "text", "text": "and the tests too"}], "interrupt": false, "createdAt": "2026-11-22T12:47:51.072210Z", "started": false}))]
pub struct QueuedView {
    pub queue_id: String,
    /// Its place among the waiting prompts (1: next); 0 once its turn has started.
    pub position: i64,
    pub author: Author,
    /// The ACP `ContentBlock[]` it sends.
    #[schema(value_type = Vec<Object>)]
    pub prompt: Vec<Value>,
    /// Queued with `Prefer: interrupt`: ahead of the others.
    pub interrupt: bool,
    pub created_at: DateTime<Utc>,
    /// Whether its turn has started.
    pub started: bool,
}

impl QueuedView {
    pub(in crate::gateway) fn of(q: &QueuedPrompt, position: i64) -> Self {
        QueuedView {
            queue_id: q.queue_id.clone(),
            position,
            author: serde_json::from_str(&q.author).unwrap_or(Author {
                tenant: String::new(),
                user: None,
                name: None,
            }),
            prompt: serde_json::from_str(&q.prompt).unwrap_or_default(),
            interrupt: q.interrupt,
            created_at: DateTime::from_timestamp_micros(q.created_at).unwrap_or_default(),
            started: q.started_by.is_some(),
        }
    }
}

/// Someone watching a session: their streams open on it (`GET /sessions/{id}/events`, `/acp`
/// clients following it), on any replica.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"tenant": "acme", "user": "ann", "streams": 2, "since": "2026-11-22T12:47:51.072210Z"}))]
pub struct WatcherView {
    #[serde(flatten)]
    pub who: Author,
    /// How many streams they have open.
    pub streams: usize,
    /// When the first of them opened.
    pub since: DateTime<Utc>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            people: crate::store::People {
                owner: Some("ann \"a\"".into()),
                owner_name: None,
                who_answers: Some("author".into()),
            },
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
}
