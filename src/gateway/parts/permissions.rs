//! Permission requests (`session/request_permission`), one kind of request waiting for a
//! client (`pending` keeps them and runs their lifecycle): what a permission request looks like
//! and logs, how a client's choice is checked, and how the configured policy or the timeout
//! picks an option without a client.

use agent_client_protocol_schema::v1::{
    RequestPermissionOutcome, RequestPermissionResponse, SelectedPermissionOutcome,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::pending::{Asked, asked_from_fields};
use crate::gateway::caller::Author;
use crate::gateway::error::Error;
use crate::gateway::event::{GatewayEvent, PermissionRequested, PermissionResolved};

/// Option kinds a permission policy of `allow` picks, in order of preference.
pub(in crate::gateway) const ALLOW: [&str; 2] = ["allow_once", "allow_always"];
/// Option kinds chosen when refusing (policy `reject`, or a timeout), in order of preference.
pub(in crate::gateway) const REJECT: [&str; 2] = ["reject_once", "reject_always"];

/// A permission request as clients see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"requestId": "perm_1", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "request": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "toolCall": {"toolCallId": "call_1", "title": "Edit src/main.rs"}, "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}, {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}, "createdAt": "2026-11-22T12:47:51.068421Z", "deadline": "2026-11-22T12:52:51.068421Z", "outcome": null}))]
pub struct PermissionView {
    /// The gateway's id for this request (use it in the answer URL).
    pub request_id: String,
    pub session_id: String,
    /// The agent's `session/request_permission` params: `toolCall` and `options`.
    #[schema(value_type = Object)]
    pub request: Value,
    pub created_at: DateTime<Utc>,
    /// When it is answered for the client (refused) unless answered before
    /// (`--permission-timeout`); absent without a timeout or under a headless policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// `null` while pending; the ACP outcome once resolved.
    #[schema(value_type = Option<Object>)]
    pub outcome: Option<Value>,
}

impl Asked for PermissionView {
    type Extra = ();
    type Answer = RequestPermissionResponse;
    const NOUN: &'static str = "permission request";

    asked_from_fields!();
    fn is_resolved(&self) -> bool {
        self.outcome.is_some()
    }
    fn mark(&mut self, answer: &RequestPermissionResponse) {
        self.outcome = Some(serde_json::to_value(&answer.outcome).expect("an outcome serialises"));
    }
    fn cancelled() -> RequestPermissionResponse {
        RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)
    }
    fn requested(&self) -> GatewayEvent {
        GatewayEvent::PermissionRequested(PermissionRequested {
            session_id: self.session_id.clone(),
            request_id: self.request_id.clone(),
            request: self.request.clone(),
            deadline: self.deadline,
        })
    }
    fn resolved(&self, reason: &str, by: Option<Author>) -> GatewayEvent {
        GatewayEvent::PermissionResolved(PermissionResolved {
            session_id: self.session_id.clone(),
            request_id: self.request_id.clone(),
            outcome: self.outcome.clone().unwrap_or_default(),
            reason: reason.to_owned(),
            answered_by: by,
        })
    }
}

pub(in crate::gateway) fn selected(option: String) -> RequestPermissionResponse {
    let outcome = RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option));
    RequestPermissionResponse::new(outcome)
}

/// The first offered option whose `kind` comes earliest in `prefer`.
pub(in crate::gateway) fn preferred_option(request: &Value, prefer: &[&str]) -> Option<String> {
    let options = request["options"].as_array()?;
    prefer.iter().find_map(|kind| {
        options
            .iter()
            .find(|o| o["kind"] == *kind)
            .and_then(|o| o["optionId"].as_str())
            .map(str::to_owned)
    })
}

/// The answer a client's choice (`optionId`, or `outcome: "cancelled"`) makes, checked
/// against the request.
pub(in crate::gateway) fn answered(
    view: &PermissionView,
    option_id: Option<String>,
    outcome: Option<&str>,
) -> Result<RequestPermissionResponse, Error> {
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
        (None, Some("cancelled")) => Ok(PermissionView::cancelled()),
        _ => Err(Error::Invalid(
            "give either `optionId` or `outcome: \"cancelled\"`".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
