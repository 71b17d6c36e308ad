//! Permission requests (`session/request_permission`): the table of them, kept until answered
//! through the REST route, resolved by the configured policy or a timeout, cancelled by
//! `cancel`/`close`/`delete`, dropped when their member exits; and the use cases that list and
//! answer them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol_schema::v1::{RequestPermissionOutcome, SelectedPermissionOutcome};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::model::SessionId;
use super::{Caller, Error, Gateway, Inner};
use crate::config::PermissionPolicy;
use crate::pool::client::Incoming;

/// Option kinds a permission policy of `allow` picks, in order of preference.
const ALLOW: [&str; 2] = ["allow_once", "allow_always"];
/// Option kinds chosen when refusing (policy `reject`, or a timeout), in order of preference.
const REJECT: [&str; 2] = ["reject_once", "reject_always"];

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

struct Pending {
    view: PermissionView,
    member: usize,
    /// The agent's request, to be answered once.
    request: Incoming,
}

/// The table of permission requests, pending and resolved.
#[derive(Default)]
pub struct Permissions {
    // One lock; never held across an await (callers answer upstream after releasing it).
    map: Mutex<HashMap<String, Pending>>,
}

/// A resolved request: its view, the agent's request to answer, and the outcome to answer with.
type Resolved = (PermissionView, Incoming, RequestPermissionOutcome);

/// `outcome` as it is shown in views and events.
fn shown(outcome: &RequestPermissionOutcome) -> Value {
    serde_json::to_value(outcome).expect("an outcome serialises")
}

fn selected(option: String) -> RequestPermissionOutcome {
    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option))
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
    fn add(
        &self,
        session_id: &str,
        member: usize,
        incoming: Incoming,
        request: Value,
    ) -> PermissionView {
        let view = PermissionView {
            request_id: format!("perm_{}", uuid::Uuid::new_v4().simple()),
            session_id: session_id.to_owned(),
            request,
            created_at: super::model::now(),
            outcome: None,
        };
        let pending = Pending {
            view: view.clone(),
            member,
            request: incoming,
        };
        self.map
            .lock()
            .expect("permissions lock")
            .insert(view.request_id.clone(), pending);
        view
    }

    fn pending_for(&self, session_id: &str) -> Vec<PermissionView> {
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

    /// Validates and records an answer (`optionId`, or `outcome: "cancelled"`); returns what to
    /// send upstream.
    fn answer(
        &self,
        session_id: &str,
        request_id: &str,
        option_id: Option<String>,
        outcome: Option<&str>,
    ) -> Result<Resolved, Error> {
        let mut map = self.map.lock().expect("permissions lock");
        let p = map
            .get_mut(request_id)
            .filter(|p| p.view.session_id == session_id)
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "no permission request {request_id} on this session"
                ))
            })?;
        if p.view.outcome.is_some() {
            return Err(Error::Conflict(
                "this permission request is already resolved".into(),
            ));
        }
        let outcome = match (option_id, outcome) {
            (Some(option), None) => {
                let offered = p.view.request["options"]
                    .as_array()
                    .is_some_and(|opts| opts.iter().any(|o| o["optionId"] == option.as_str()));
                if !offered {
                    return Err(Error::Invalid(format!(
                        "optionId {option:?} is not one of the request's options"
                    )));
                }
                selected(option)
            }
            (None, Some("cancelled")) => RequestPermissionOutcome::Cancelled,
            _ => {
                return Err(Error::Invalid(
                    "give either `optionId` or `outcome: \"cancelled\"`".into(),
                ));
            }
        };
        p.view.outcome = Some(shown(&outcome));
        Ok((p.view.clone(), p.request.clone(), outcome))
    }

    /// Resolves a request that is still pending with the first offered option of the preferred
    /// kinds, else as cancelled. `None` when it is unknown or already resolved.
    fn resolve_auto(&self, request_id: &str, prefer: &[&str]) -> Option<Resolved> {
        let mut map = self.map.lock().expect("permissions lock");
        let p = map
            .get_mut(request_id)
            .filter(|p| p.view.outcome.is_none())?;
        let outcome = match preferred_option(&p.view.request, prefer) {
            Some(option) => selected(option),
            None => RequestPermissionOutcome::Cancelled,
        };
        p.view.outcome = Some(shown(&outcome));
        Some((p.view.clone(), p.request.clone(), outcome))
    }

    /// Resolves every pending request of a session as cancelled; returns what to answer upstream.
    fn cancel_all(&self, session_id: &str) -> Vec<(String, Incoming)> {
        let mut map = self.map.lock().expect("permissions lock");
        map.values_mut()
            .filter(|p| p.view.session_id == session_id && p.view.outcome.is_none())
            .map(|p| {
                p.view.outcome = Some(shown(&RequestPermissionOutcome::Cancelled));
                (p.view.request_id.clone(), p.request.clone())
            })
            .collect()
    }

    /// Forgets the requests of an exited member; returns the (session, request) pairs that were pending.
    fn drop_member(&self, member: usize) -> Vec<(String, String)> {
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

impl Gateway {
    /// `GET /sessions/{id}/permissions`.
    pub async fn permissions(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<PermissionView>, Error> {
        self.record(caller, id).await?;
        Ok(self.inner.permissions.pending_for(id.as_str()))
    }

    /// `POST /sessions/{id}/permissions/{requestId}`: `option_id`, or `outcome` `"cancelled"`.
    pub async fn answer_permission(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        option_id: Option<String>,
        outcome: Option<&str>,
    ) -> Result<PermissionView, Error> {
        self.record(caller, id).await?;
        let (view, request, outcome) =
            self.inner
                .permissions
                .answer(id.as_str(), request_id, option_id, outcome)?;
        self.inner
            .resolved(&view, &request, outcome, "answered")
            .await;
        Ok(view)
    }

    /// Resolves the session's pending requests as cancelled (before a cancel, close or delete).
    pub(super) async fn resolve_permissions_cancelled(&self, session_id: &str) {
        for (request_id, request) in self.inner.permissions.cancel_all(session_id) {
            let outcome = RequestPermissionOutcome::Cancelled;
            let _ = request.answer_permission(outcome.clone()).await;
            let payload = json!({"sessionId": session_id, "requestId": request_id, "outcome": shown(&outcome), "reason": "cancelled"});
            self.inner
                .enqueue(session_id, "permission_resolved", payload)
                .await;
        }
    }
}

impl Inner {
    /// A permission request from the agent: pending until answered, or resolved now by the
    /// policy, or later by the timeout.
    pub(super) async fn permission_requested(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        session_id: &str,
        params: Value,
    ) {
        let view = self.permissions.add(session_id, member, request, params);
        let payload =
            json!({"sessionId": session_id, "requestId": view.request_id, "request": view.request});
        self.append(session_id, "permission_requested", payload)
            .await;
        let request_id = view.request_id;
        match self.config.permission_policy {
            PermissionPolicy::Allow => {
                self.resolve_auto(&request_id, &ALLOW, "policy").await;
            }
            PermissionPolicy::Reject => {
                self.resolve_auto(&request_id, &REJECT, "policy").await;
            }
            PermissionPolicy::Ask => {
                if let Some(after) = self.config.permission_timeout {
                    let inner = self.clone();
                    self.tasks.spawn(async move {
                        tokio::select! {
                            _ = tokio::time::sleep(after) => {
                                inner.resolve_auto(&request_id, &REJECT, "timeout").await;
                            }
                            _ = inner.stop.cancelled() => {}
                        }
                    });
                }
            }
        }
    }

    /// Resolves a still-pending permission request without a client: the first offered option
    /// of the preferred kinds, else `cancelled`.
    async fn resolve_auto(&self, request_id: &str, prefer: &[&str], reason: &str) {
        if let Some((view, request, outcome)) = self.permissions.resolve_auto(request_id, prefer) {
            self.resolved(&view, &request, outcome, reason).await;
        }
    }

    /// Answers the agent and logs `permission_resolved`.
    async fn resolved(
        &self,
        view: &PermissionView,
        request: &Incoming,
        outcome: RequestPermissionOutcome,
        reason: &str,
    ) {
        let shown = shown(&outcome);
        let _ = request.answer_permission(outcome).await;
        let payload = json!({"sessionId": view.session_id, "requestId": view.request_id, "outcome": shown, "reason": reason});
        self.enqueue(&view.session_id, "permission_resolved", payload)
            .await;
    }

    /// A member exited: its requests are gone, the pending ones logged as cancelled.
    pub(super) async fn drop_member_permissions(&self, member: usize) {
        for (session_id, request_id) in self.permissions.drop_member(member) {
            let payload = json!({"sessionId": session_id, "requestId": request_id, "outcome": {"outcome": "cancelled"}, "reason": "cancelled"});
            self.enqueue(&session_id, "permission_resolved", payload)
                .await;
        }
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
