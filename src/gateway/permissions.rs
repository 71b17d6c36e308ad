//! Permission requests (`session/request_permission`): kept in a pending table (`pending`)
//! until answered through the REST route, resolved by the configured policy or a timeout,
//! cancelled by `cancel`/`close`/`delete`, dropped when their member exits; and the use cases
//! that list and answer them.

use std::sync::Arc;

use agent_client_protocol_schema::v1::{RequestPermissionOutcome, SelectedPermissionOutcome};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::model::SessionId;
use super::pending::{Asked, Table};
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

/// The table of permission requests, pending and resolved.
pub(super) type Permissions = Table<PermissionView>;

impl Asked for PermissionView {
    fn request_id(&self) -> &str {
        &self.request_id
    }
    fn session_id(&self) -> &str {
        &self.session_id
    }
    fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }
    fn is_resolved(&self) -> bool {
        self.outcome.is_some()
    }
}

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

/// The outcome a client's answer (`optionId`, or `outcome: "cancelled"`) asks for, checked
/// against the request.
fn answered(
    view: &PermissionView,
    option_id: Option<String>,
    outcome: Option<&str>,
) -> Result<RequestPermissionOutcome, Error> {
    match (option_id, outcome) {
        (Some(option), None) => {
            let offered = view.request["options"]
                .as_array()
                .is_some_and(|opts| opts.iter().any(|o| o["optionId"] == option.as_str()));
            if !offered {
                return Err(Error::Invalid(format!(
                    "optionId {option:?} is not one of the request's options"
                )));
            }
            Ok(selected(option))
        }
        (None, Some("cancelled")) => Ok(RequestPermissionOutcome::Cancelled),
        _ => Err(Error::Invalid(
            "give either `optionId` or `outcome: \"cancelled\"`".into(),
        )),
    }
}

/// Marks a view resolved with `outcome`, and hands the outcome on.
fn mark(view: &mut PermissionView, outcome: RequestPermissionOutcome) -> RequestPermissionOutcome {
    view.outcome = Some(shown(&outcome));
    outcome
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
                .resolve(Some(id.as_str()), request_id, |view, ()| {
                    let outcome = answered(view, option_id, outcome)?;
                    Ok(mark(view, outcome))
                })?;
        self.inner
            .resolved(&view, &request, outcome, "answered")
            .await;
        Ok(view)
    }

    /// Resolves the session's pending requests as cancelled.
    pub(super) async fn resolve_permissions_cancelled(&self, session_id: &str) {
        let cancelled = self.inner.permissions.resolve_all(session_id, |view| {
            mark(view, RequestPermissionOutcome::Cancelled);
        });
        for (view, request) in cancelled {
            let outcome = RequestPermissionOutcome::Cancelled;
            self.inner
                .resolved(&view, &request, outcome, "cancelled")
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
        let view = PermissionView {
            request_id: format!("perm_{}", uuid::Uuid::new_v4().simple()),
            session_id: session_id.to_owned(),
            request: params,
            created_at: super::model::now(),
            outcome: None,
        };
        let payload =
            json!({"sessionId": session_id, "requestId": view.request_id, "request": view.request});
        let request_id = view.request_id.clone();
        self.permissions.insert(view, member, request, ());
        self.append(session_id, "permission_requested", payload)
            .await;
        match self.config.permission_policy {
            PermissionPolicy::Allow => {
                self.resolve_auto(&request_id, &ALLOW, "policy").await;
            }
            PermissionPolicy::Reject => {
                self.resolve_auto(&request_id, &REJECT, "policy").await;
            }
            PermissionPolicy::Ask => self.on_timeout(move |inner| async move {
                inner.resolve_auto(&request_id, &REJECT, "timeout").await;
            }),
        }
    }

    /// Resolves a still-pending permission request without a client: the first offered option
    /// of the preferred kinds, else `cancelled`.
    async fn resolve_auto(&self, request_id: &str, prefer: &[&str], reason: &str) {
        let resolved = self.permissions.resolve(None, request_id, |view, ()| {
            let outcome = match preferred_option(&view.request, prefer) {
                Some(option) => selected(option),
                None => RequestPermissionOutcome::Cancelled,
            };
            Ok(mark(view, outcome))
        });
        if let Ok((view, request, outcome)) = resolved {
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
        let _ = request.answer_permission(outcome).await;
        self.log_permission_resolved(view, reason).await;
    }

    async fn log_permission_resolved(&self, view: &PermissionView, reason: &str) {
        let payload = json!({"sessionId": view.session_id, "requestId": view.request_id, "outcome": view.outcome, "reason": reason});
        self.enqueue(&view.session_id, "permission_resolved", payload)
            .await;
    }

    /// A member exited: its permission requests are gone, the pending ones logged as cancelled.
    pub(super) async fn drop_member_permissions(&self, member: usize) {
        let dropped = self.permissions.drop_member(member, |view| {
            mark(view, RequestPermissionOutcome::Cancelled);
        });
        for view in dropped {
            self.log_permission_resolved(&view, "cancelled").await;
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
