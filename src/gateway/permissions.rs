//! Pending `session/request_permission` requests: kept until answered through the REST route,
//! cancelled by `cancel`/`close`/`delete`, dropped when their member exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::acp::Connection;
use crate::error::ApiError;

/// A permission request as clients see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"requestId": "perm_1", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "request": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "toolCall": {"toolCallId": "call_1", "title": "Edit src/main.rs"}, "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}, {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}, "createdAt": "2026-11-22T12:47:51.068421Z", "outcome": null}))]
pub struct PermissionView {
    /// The gateway's id for this request (use it in the answer URL).
    pub request_id: String,
    pub session_id: String,
    /// The agent's `session/request_permission` params: `toolCall` and `options`.
    #[schema(value_type = Object)]
    pub request: Value,
    pub created_at: DateTime<Utc>,
    /// `null` while pending; the ACP outcome once resolved.
    #[schema(value_type = Option<Object>)]
    pub outcome: Option<Value>,
}

/// `POST /sessions/{id}/permissions/{requestId}` body: `{optionId}` or `{outcome: "cancelled"}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"optionId": "allow"}))]
pub struct PermissionAnswer {
    /// One of the request's `options[].optionId`.
    pub option_id: Option<String>,
    /// `"cancelled"` to refuse without choosing an option.
    pub outcome: Option<String>,
}

struct Pending {
    view: PermissionView,
    member: usize,
    conn: Arc<Connection>,
    upstream_id: Value,
}

/// The table of permission requests, pending and resolved.
#[derive(Default)]
pub struct Permissions {
    // One lock; never held across an await (callers answer upstream after releasing it).
    map: Mutex<HashMap<String, Pending>>,
}

type Answered = (PermissionView, Arc<Connection>, Value, Value);

/// A request resolved by the gateway itself (policy or timeout): what to send upstream.
pub struct AutoResolved {
    pub session_id: String,
    pub conn: Arc<Connection>,
    pub upstream_id: Value,
    pub outcome: Value,
}

/// The first offered option whose `kind` comes earliest in `prefer`.
fn preferred_option(request: &Value, prefer: &[&str]) -> Option<String> {
    let options = request["options"].as_array()?;
    prefer.iter().find_map(|kind| {
        options
            .iter()
            .find(|o| o["kind"] == *kind)
            .and_then(|o| o["optionId"].as_str())
            .map(str::to_owned)
    })
}

impl Permissions {
    /// Records a new request and returns its view.
    pub fn add(
        &self,
        session_id: &str,
        member: usize,
        conn: Arc<Connection>,
        upstream_id: Value,
        request: Value,
    ) -> PermissionView {
        let view = PermissionView {
            request_id: format!("perm_{}", uuid::Uuid::new_v4().simple()),
            session_id: session_id.to_owned(),
            request,
            created_at: crate::gateway::model::now(),
            outcome: None,
        };
        let pending = Pending {
            view: view.clone(),
            member,
            conn,
            upstream_id,
        };
        self.map
            .lock()
            .expect("permissions lock")
            .insert(view.request_id.clone(), pending);
        view
    }

    pub fn pending_for(&self, session_id: &str) -> Vec<PermissionView> {
        let map = self.map.lock().expect("permissions lock");
        let mut out: Vec<_> = map
            .values()
            .filter(|p| p.view.session_id == session_id && p.view.outcome.is_none())
            .map(|p| p.view.clone())
            .collect();
        out.sort_by_key(|v| v.created_at);
        out
    }

    pub fn has_pending(&self, session_id: &str) -> bool {
        let map = self.map.lock().expect("permissions lock");
        map.values()
            .any(|p| p.view.session_id == session_id && p.view.outcome.is_none())
    }

    pub fn pending_count(&self) -> usize {
        self.map
            .lock()
            .expect("permissions lock")
            .values()
            .filter(|p| p.view.outcome.is_none())
            .count()
    }

    /// Validates and records an answer; returns what to send upstream.
    pub fn answer(
        &self,
        session_id: &str,
        request_id: &str,
        answer: PermissionAnswer,
    ) -> Result<Answered, ApiError> {
        let mut map = self.map.lock().expect("permissions lock");
        let p = map
            .get_mut(request_id)
            .filter(|p| p.view.session_id == session_id)
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no permission request {request_id} on this session"
                ))
            })?;
        if p.view.outcome.is_some() {
            return Err(ApiError::Conflict(
                "this permission request is already resolved".into(),
            ));
        }
        let outcome = match (answer.option_id, answer.outcome.as_deref()) {
            (Some(option), None) => {
                let offered = p.view.request["options"]
                    .as_array()
                    .is_some_and(|opts| opts.iter().any(|o| o["optionId"] == option.as_str()));
                if !offered {
                    return Err(ApiError::Validation(format!(
                        "optionId {option:?} is not one of the request's options"
                    )));
                }
                json!({"outcome": "selected", "optionId": option})
            }
            (None, Some("cancelled")) => json!({"outcome": "cancelled"}),
            _ => {
                return Err(ApiError::Validation(
                    "give either `optionId` or `outcome: \"cancelled\"`".into(),
                ));
            }
        };
        p.view.outcome = Some(outcome.clone());
        Ok((
            p.view.clone(),
            p.conn.clone(),
            p.upstream_id.clone(),
            outcome,
        ))
    }

    /// Resolves a request that is still pending with the first offered option of the preferred
    /// kinds, else as cancelled. `None` when it is unknown or already resolved.
    pub fn resolve_auto(&self, request_id: &str, prefer: &[&str]) -> Option<AutoResolved> {
        let mut map = self.map.lock().expect("permissions lock");
        let p = map
            .get_mut(request_id)
            .filter(|p| p.view.outcome.is_none())?;
        let outcome = match preferred_option(&p.view.request, prefer) {
            Some(option) => json!({"outcome": "selected", "optionId": option}),
            None => json!({"outcome": "cancelled"}),
        };
        p.view.outcome = Some(outcome.clone());
        Some(AutoResolved {
            session_id: p.view.session_id.clone(),
            conn: p.conn.clone(),
            upstream_id: p.upstream_id.clone(),
            outcome,
        })
    }

    /// Resolves every pending request of a session as cancelled; returns what to answer upstream.
    pub fn cancel_all(&self, session_id: &str) -> Vec<(String, Arc<Connection>, Value)> {
        let mut map = self.map.lock().expect("permissions lock");
        map.values_mut()
            .filter(|p| p.view.session_id == session_id && p.view.outcome.is_none())
            .map(|p| {
                p.view.outcome = Some(json!({"outcome": "cancelled"}));
                (
                    p.view.request_id.clone(),
                    p.conn.clone(),
                    p.upstream_id.clone(),
                )
            })
            .collect()
    }

    /// Forgets the requests of an exited member; returns the (session, request) pairs that were pending.
    pub fn drop_member(&self, member: usize) -> Vec<(String, String)> {
        let mut map = self.map.lock().expect("permissions lock");
        let gone: Vec<_> = map
            .iter()
            .filter(|(_, p)| p.member == member)
            .map(|(k, p)| {
                (
                    k.clone(),
                    p.view.session_id.clone(),
                    p.view.outcome.is_none(),
                )
            })
            .collect();
        gone.into_iter()
            .filter_map(|(k, session, pending)| {
                map.remove(&k);
                pending.then_some((session, k))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_option_follows_kind_order() {
        let req = json!({"options": [
            {"optionId": "a1", "kind": "allow_always"},
            {"optionId": "a0", "kind": "allow_once"},
            {"optionId": "r1", "kind": "reject_always"},
        ]});
        assert_eq!(
            preferred_option(&req, &["allow_once", "allow_always"]).as_deref(),
            Some("a0")
        );
        assert_eq!(
            preferred_option(&req, &["reject_once", "reject_always"]).as_deref(),
            Some("r1")
        );
        assert_eq!(
            preferred_option(&json!({"options": []}), &["reject_once"]),
            None
        );
        assert_eq!(preferred_option(&json!({}), &["reject_once"]), None);
    }
}
