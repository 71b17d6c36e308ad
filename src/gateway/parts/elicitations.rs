//! Elicitations (`elicitation/create`): the agent asks the user for structured input (form
//! mode) or to visit a URL (URL mode). One kind of request waiting for a client (`pending`
//! keeps them and runs their lifecycle): each is checked when it arrives (a session's, of a
//! known mode, a form schema the gateway can check answers against; else -32602), answered by a
//! client (`accept` — with content valid for the requested schema, checked by `form`, in form
//! mode, without content in URL mode —, `decline`, `cancel`), declined unanswered at
//! `--permission-timeout` or at once under a permission policy other than `ask` (nobody is there
//! to answer: fail closed), cancelled with the turn or when its member exits. The agent's
//! `elicitation/complete` for a URL elicitation is logged as `elicitation_completed`.

use agent_client_protocol_schema::v1::{
    CreateElicitationRequest, CreateElicitationResponse, ElicitationAcceptAction,
    ElicitationAction, ElicitationMode, ElicitationSchema, ElicitationScope,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::form;
use super::pending::{Asked, asked_from_fields};
use crate::gateway::caller::Author;
use crate::gateway::error::Error;
use crate::gateway::event::{ElicitationRequested, ElicitationResolved, GatewayEvent};

/// An elicitation as clients see it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"requestId": "elic_1", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "request": {"mode": "form", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "message": "Who are you?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]}}, "createdAt": "2026-11-22T12:47:51.068421Z", "deadline": "2026-11-22T12:52:51.068421Z", "response": null}))]
pub struct ElicitationView {
    /// The gateway's id for this request (use it in the answer URL).
    pub request_id: String,
    pub session_id: String,
    /// The agent's `elicitation/create` params: `mode`, `message`, `requestedSchema` (form
    /// mode) or `elicitationId` and `url` (URL mode), and `toolCallId` when it comes from a
    /// tool call.
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
    /// Form mode: give `content` matching the requested schema. URL mode: go to the URL (no
    /// content).
    Accept,
    /// Refuse to give it.
    Decline,
    /// Dismiss the request without choosing.
    Cancel,
}

impl Asked for ElicitationView {
    type Extra = Option<ElicitationSchema>;
    type Answer = CreateElicitationResponse;
    const NOUN: &'static str = "elicitation";

    asked_from_fields!();
    fn is_resolved(&self) -> bool {
        self.response.is_some()
    }
    fn mark(&mut self, answer: &CreateElicitationResponse) {
        self.response = Some(serde_json::to_value(answer).expect("a response serialises"));
    }
    fn cancelled() -> CreateElicitationResponse {
        CreateElicitationResponse::new(ElicitationAction::Cancel)
    }
    fn requested(&self) -> GatewayEvent {
        GatewayEvent::ElicitationRequested(ElicitationRequested {
            session_id: self.session_id.clone(),
            request_id: self.request_id.clone(),
            request: self.request.clone(),
            deadline: self.deadline,
        })
    }
    /// The response's `action` and `content`, as sent to the agent.
    fn resolved(&self, reason: &str, by: Option<Author>) -> GatewayEvent {
        let response = |key| self.response.as_ref().and_then(|r| r.get(key)).cloned();
        GatewayEvent::ElicitationResolved(ElicitationResolved {
            session_id: self.session_id.clone(),
            request_id: self.request_id.clone(),
            action: response("action").unwrap_or_default(),
            content: response("content"),
            reason: reason.to_owned(),
            answered_by: by,
        })
    }
}

pub(in crate::gateway) fn decline() -> CreateElicitationResponse {
    CreateElicitationResponse::new(ElicitationAction::Decline)
}

/// The response a client's answer makes: in form mode (`schema`), `accept` carries content
/// valid for it; in URL mode nothing carries content.
pub(in crate::gateway) fn answered(
    schema: Option<&ElicitationSchema>,
    reply: ElicitationReply,
    content: Option<&Value>,
) -> Result<CreateElicitationResponse, Error> {
    match (reply, content, schema) {
        (ElicitationReply::Accept, Some(Value::Object(content)), Some(schema)) => {
            let content = form::validate(schema, content).map_err(Error::Invalid)?;
            let accept = ElicitationAcceptAction::new().content(content);
            Ok(CreateElicitationResponse::new(ElicitationAction::Accept(
                accept,
            )))
        }
        (ElicitationReply::Accept, Some(_), Some(_)) => {
            Err(Error::Invalid("`content` must be an object".into()))
        }
        (ElicitationReply::Accept, None, Some(_)) => Err(Error::Invalid(
            "accept needs `content`, an object matching the requested schema".into(),
        )),
        (_, Some(_), None) => Err(Error::Invalid(
            "a URL elicitation carries no `content`".into(),
        )),
        (_, Some(_), Some(_)) => Err(Error::Invalid(
            "only accept carries `content`; decline and cancel must not".into(),
        )),
        (ElicitationReply::Accept, None, None) => Ok(CreateElicitationResponse::new(
            ElicitationAction::Accept(ElicitationAcceptAction::new()),
        )),
        (ElicitationReply::Decline, None, _) => Ok(decline()),
        (ElicitationReply::Cancel, None, _) => Ok(ElicitationView::cancelled()),
    }
}

/// The session and the requested schema (none in URL mode) of a request the gateway can
/// serve, or why not.
pub(in crate::gateway) fn accepted(
    params: &Value,
) -> Result<(String, Option<ElicitationSchema>), String> {
    let request: CreateElicitationRequest = serde_json::from_value(params.clone())
        .map_err(|e| format!("invalid elicitation/create params: {e}"))?;
    let (scope, schema) = match request.mode {
        ElicitationMode::Form(form) => {
            form::check_schema(&form.requested_schema)?;
            (form.scope, Some(form.requested_schema))
        }
        ElicitationMode::Url(url) => (url.scope, None),
        _ => return Err("only form and URL mode elicitations are supported".into()),
    };
    let ElicitationScope::Session(scope) = scope else {
        return Err("sessionId is required: the gateway serves session elicitations only".into());
    };
    Ok((scope.session_id.0.to_string(), schema))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn only_session_requests_of_a_known_mode_with_a_checkable_schema_are_served() {
        let (session, schema) = accepted(&params(json!({}))).unwrap();
        assert_eq!(session, "s1");
        assert!(schema.unwrap().properties.contains_key("name"));
        let mut request_scoped = params(json!({"requestId": 7}));
        request_scoped.as_object_mut().unwrap().remove("sessionId");
        assert!(accepted(&request_scoped).unwrap_err().contains("sessionId"));
        let url = json!({"mode": "url", "sessionId": "s1", "message": "m", "elicitationId": "e", "url": "https://x"});
        assert_eq!(accepted(&url).unwrap(), ("s1".to_owned(), None));
        let future = json!({"mode": "_telepathy", "sessionId": "s1", "message": "m"});
        assert!(accepted(&future).unwrap_err().contains("form and URL"));
        let bad = params(
            json!({"requestedSchema": {"properties": {"a": {"type": "string", "pattern": "("}}}}),
        );
        assert!(accepted(&bad).unwrap_err().contains("pattern"));
    }

    #[test]
    fn answers_become_acp_responses() {
        let (_, schema) = accepted(&params(json!({}))).unwrap();
        let form = schema.as_ref();
        let shown = |r: CreateElicitationResponse| serde_json::to_value(r).unwrap();
        let content = json!({"name": "Ada"});
        let accept = answered(form, ElicitationReply::Accept, Some(&content)).unwrap();
        assert_eq!(
            shown(accept),
            json!({"action": "accept", "content": {"name": "Ada"}})
        );
        let decline = answered(form, ElicitationReply::Decline, None).unwrap();
        assert_eq!(shown(decline), json!({"action": "decline"}));
        let url_accept = answered(None, ElicitationReply::Accept, None).unwrap();
        assert_eq!(shown(url_accept), json!({"action": "accept"}));
        for (schema, reply, content) in [
            (form, ElicitationReply::Accept, None),
            (form, ElicitationReply::Accept, Some(json!("Ada"))),
            (form, ElicitationReply::Accept, Some(json!({}))),
            (form, ElicitationReply::Decline, Some(json!({}))),
            (form, ElicitationReply::Cancel, Some(json!({"name": "Ada"}))),
            (None, ElicitationReply::Accept, Some(json!({}))),
        ] {
            let err = answered(schema, reply, content.as_ref()).unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "{reply:?} {content:?}");
        }
    }
}
