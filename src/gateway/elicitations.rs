//! Elicitations (`elicitation/create`, form mode): the agent asks the user for structured
//! input. Each request is checked when it arrives (a session's, form mode, a schema the gateway
//! can check answers against), kept in a pending table (`pending`) until a client answers it
//! through the REST route (`accept` with content valid for the requested schema, `decline`,
//! `cancel`), declined unanswered at `--permission-timeout` or at once under a permission policy
//! other than `ask` (nobody is there to answer: fail closed), cancelled with the turn, dropped
//! when its member exits; and the use cases that list and answer them.

use std::sync::Arc;

use agent_client_protocol_schema::v1::{
    CreateElicitationRequest, CreateElicitationResponse, ElicitationAcceptAction,
    ElicitationAction, ElicitationMode, ElicitationSchema, ElicitationScope,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::form;
use super::model::SessionId;
use super::pending::{Asked, Table};
use super::{Caller, Error, Gateway, Inner};
use crate::acp::RpcError;
use crate::config::PermissionPolicy;
use crate::pool::client::Incoming;

/// An elicitation as clients see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"requestId": "elic_1", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "request": {"mode": "form", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "message": "Who are you?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]}}, "createdAt": "2026-11-22T12:47:51.068421Z", "deadline": "2026-11-22T12:52:51.068421Z", "response": null}))]
pub struct ElicitationView {
    /// The gateway's id for this request (use it in the answer URL).
    pub request_id: String,
    pub session_id: String,
    /// The agent's `elicitation/create` params: `mode`, `message`, `requestedSchema`, and
    /// `toolCallId` when it comes from a tool call.
    #[schema(value_type = Object)]
    pub request: Value,
    pub created_at: DateTime<Utc>,
    /// When it is declined unanswered (`--permission-timeout`); `null`: never.
    pub deadline: Option<DateTime<Utc>>,
    /// `null` while pending; the ACP response (`{action, content?}`) once resolved.
    #[schema(value_type = Option<Object>)]
    pub response: Option<Value>,
}

/// A client's answer to an elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationReply {
    /// Give `content` matching the requested schema.
    Accept,
    /// Refuse to give it.
    Decline,
    /// Dismiss the request without choosing.
    Cancel,
}

/// The table of elicitations, pending and resolved, each with its requested schema.
pub(super) type Elicitations = Table<ElicitationView, ElicitationSchema>;

impl Asked for ElicitationView {
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
        self.response.is_some()
    }
}

fn decline() -> CreateElicitationResponse {
    CreateElicitationResponse::new(ElicitationAction::Decline)
}

fn cancel() -> CreateElicitationResponse {
    CreateElicitationResponse::new(ElicitationAction::Cancel)
}

/// The response a client's answer asks for, its content checked against the schema.
fn answered(
    schema: &ElicitationSchema,
    reply: ElicitationReply,
    content: Option<&Value>,
) -> Result<CreateElicitationResponse, Error> {
    match (reply, content) {
        (ElicitationReply::Accept, Some(Value::Object(content))) => {
            let content = form::validate(schema, content).map_err(Error::Invalid)?;
            let accept = ElicitationAcceptAction::new().content(content);
            Ok(CreateElicitationResponse::new(ElicitationAction::Accept(
                accept,
            )))
        }
        (ElicitationReply::Accept, Some(_)) => {
            Err(Error::Invalid("`content` must be an object".into()))
        }
        (ElicitationReply::Accept, None) => Err(Error::Invalid(
            "accept needs `content`, an object matching the requested schema".into(),
        )),
        (_, Some(_)) => Err(Error::Invalid(
            "only accept carries `content`; decline and cancel must not".into(),
        )),
        (ElicitationReply::Decline, None) => Ok(decline()),
        (ElicitationReply::Cancel, None) => Ok(cancel()),
    }
}

/// Marks a view resolved with `response`, and hands the response on.
fn mark(
    view: &mut ElicitationView,
    response: CreateElicitationResponse,
) -> CreateElicitationResponse {
    view.response = Some(serde_json::to_value(&response).expect("a response serialises"));
    response
}

/// The session and the requested schema of a request the gateway can serve, or why not.
fn accepted(params: &Value) -> Result<(String, ElicitationSchema), String> {
    let request: CreateElicitationRequest = serde_json::from_value(params.clone())
        .map_err(|e| format!("invalid elicitation/create params: {e}"))?;
    let ElicitationMode::Form(form) = request.mode else {
        return Err("only form mode elicitations are supported".into());
    };
    let ElicitationScope::Session(scope) = form.scope else {
        return Err("sessionId is required: the gateway serves session elicitations only".into());
    };
    form::check_schema(&form.requested_schema)?;
    Ok((scope.session_id.0.to_string(), form.requested_schema))
}

impl Gateway {
    /// `GET /sessions/{id}/elicitations`.
    pub async fn elicitations(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<ElicitationView>, Error> {
        self.record(caller, id).await?;
        Ok(self.inner.elicitations.pending_for(id.as_str()))
    }

    /// `POST /sessions/{id}/elicitations/{requestId}`: `accept` with `content`, `decline` or
    /// `cancel`.
    pub async fn answer_elicitation(
        &self,
        caller: &Caller,
        id: &SessionId,
        request_id: &str,
        reply: ElicitationReply,
        content: Option<&Value>,
    ) -> Result<ElicitationView, Error> {
        self.record(caller, id).await?;
        let (view, request, response) =
            self.inner
                .elicitations
                .resolve(Some(id.as_str()), request_id, |view, schema| {
                    let response = answered(schema, reply, content)?;
                    Ok(mark(view, response))
                })?;
        self.inner
            .elicitation_resolved(&view, &request, &response, "answered")
            .await;
        Ok(view)
    }

    /// Resolves the session's pending elicitations as cancelled.
    pub(super) async fn resolve_elicitations_cancelled(&self, session_id: &str) {
        let cancelled = self.inner.elicitations.resolve_all(session_id, |view| {
            mark(view, cancel());
        });
        for (view, request) in cancelled {
            self.inner
                .elicitation_resolved(&view, &request, &cancel(), "cancelled")
                .await;
        }
    }
}

impl Inner {
    /// An elicitation from the agent: refused when the gateway cannot serve it, else pending
    /// until answered, or declined now by the policy, or later by the timeout.
    pub(super) async fn elicitation_requested(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        params: Value,
    ) {
        let (session_id, schema) = match accepted(&params) {
            Ok(accepted) => accepted,
            Err(why) => {
                tracing::warn!(member, why, "elicitation/create refused");
                let _ = request.refuse(RpcError::invalid_params(why)).await;
                return;
            }
        };
        let view = ElicitationView {
            request_id: format!("elic_{}", uuid::Uuid::new_v4().simple()),
            session_id: session_id.clone(),
            request: params,
            created_at: super::model::now(),
            deadline: match self.config.permission_policy {
                PermissionPolicy::Ask => self.deadline(),
                _ => None,
            },
            response: None,
        };
        let mut payload =
            json!({"sessionId": session_id, "requestId": view.request_id, "request": view.request});
        if let Some(deadline) = view.deadline {
            payload["deadline"] = json!(deadline);
        }
        let request_id = view.request_id.clone();
        self.elicitations.insert(view, member, request, schema);
        self.append(&session_id, "elicitation_requested", payload)
            .await;
        match self.config.permission_policy {
            PermissionPolicy::Ask => self.on_timeout(move |inner| async move {
                inner.decline_unanswered(&request_id, "timeout").await;
            }),
            PermissionPolicy::Allow | PermissionPolicy::Reject => {
                self.decline_unanswered(&request_id, "policy").await;
            }
        }
    }

    /// Declines an elicitation still pending (fail closed): nobody answered, or nobody will.
    async fn decline_unanswered(&self, request_id: &str, reason: &str) {
        let resolved = self
            .elicitations
            .resolve(None, request_id, |view, _| Ok(mark(view, decline())));
        if let Ok((view, request, response)) = resolved {
            self.elicitation_resolved(&view, &request, &response, reason)
                .await;
        }
    }

    /// Answers the agent and logs `elicitation_resolved`.
    async fn elicitation_resolved(
        &self,
        view: &ElicitationView,
        request: &Incoming,
        response: &CreateElicitationResponse,
        reason: &str,
    ) {
        let _ = request.answer_elicitation(response).await;
        self.log_elicitation_resolved(view, reason).await;
    }

    /// `elicitation_resolved` {sessionId, requestId, action, content?, reason}.
    async fn log_elicitation_resolved(&self, view: &ElicitationView, reason: &str) {
        let mut payload = json!({"sessionId": view.session_id, "requestId": view.request_id});
        if let Some(Value::Object(response)) = &view.response {
            for key in ["action", "content"] {
                if let Some(value) = response.get(key) {
                    payload[key] = value.clone();
                }
            }
        }
        payload["reason"] = json!(reason);
        self.enqueue(&view.session_id, "elicitation_resolved", payload)
            .await;
    }

    /// A member exited: its elicitations are gone, the pending ones logged as cancelled.
    pub(super) async fn drop_member_elicitations(&self, member: usize) {
        let dropped = self.elicitations.drop_member(member, |view| {
            mark(view, cancel());
        });
        for view in dropped {
            self.log_elicitation_resolved(&view, "cancelled").await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(extra: Value) -> Value {
        let mut p = json!({
            "mode": "form", "sessionId": "s1", "message": "Who?",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        });
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    }

    #[test]
    fn only_session_form_requests_with_a_checkable_schema_are_served() {
        let (session, schema) = accepted(&params(json!({}))).unwrap();
        assert_eq!(session, "s1");
        assert!(schema.properties.contains_key("name"));
        let mut request_scoped = params(json!({"requestId": 7}));
        request_scoped.as_object_mut().unwrap().remove("sessionId");
        assert!(accepted(&request_scoped).unwrap_err().contains("sessionId"));
        let url = json!({"mode": "url", "sessionId": "s1", "message": "m", "elicitationId": "e", "url": "https://x"});
        assert!(accepted(&url).unwrap_err().contains("form mode"));
        let bad = params(
            json!({"requestedSchema": {"properties": {"a": {"type": "string", "pattern": "("}}}}),
        );
        assert!(accepted(&bad).unwrap_err().contains("pattern"));
    }

    #[test]
    fn answers_become_acp_responses() {
        let (_, schema) = accepted(&params(json!({}))).unwrap();
        let content = json!({"name": "Ada"});
        let accept = answered(&schema, ElicitationReply::Accept, Some(&content)).unwrap();
        assert_eq!(
            serde_json::to_value(accept).unwrap(),
            json!({"action": "accept", "content": {"name": "Ada"}})
        );
        let decline = answered(&schema, ElicitationReply::Decline, None).unwrap();
        assert_eq!(
            serde_json::to_value(decline).unwrap(),
            json!({"action": "decline"})
        );
        for (reply, content) in [
            (ElicitationReply::Accept, None),
            (ElicitationReply::Accept, Some(json!("Ada"))),
            (ElicitationReply::Accept, Some(json!({}))),
            (ElicitationReply::Decline, Some(json!({}))),
            (ElicitationReply::Cancel, Some(json!({"name": "Ada"}))),
        ] {
            let err = answered(&schema, reply, content.as_ref()).unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "{reply:?} {content:?}");
        }
    }
}
