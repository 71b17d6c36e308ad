//! What an agent can do, read from its `initialize` result: the v1 markers
//! (`agentCapabilities.loadSession`, `agentCapabilities.sessionCapabilities.*`) or the v2
//! baseline (`capabilities.session` present ⇒ load, list, resume and close are all supported).

use agent_client_protocol_schema::ProtocolVersion;
use agent_client_protocol_schema::v1::{
    AuthCapabilities, ClientCapabilities, ElicitationCapabilities, ElicitationFormCapabilities,
    ElicitationUrlCapabilities, FileSystemCapabilities, Implementation, InitializeRequest,
};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

/// Normalised session capabilities: the gateway never calls a method whose flag is false.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub load: bool,
    pub list: bool,
    pub resume: bool,
    pub close: bool,
    pub delete: bool,
    pub status: bool,
    pub set_title: bool,
    pub archive: bool,
    pub fork: bool,
    /// ACP `logout` (`auth.logout`).
    pub logout: bool,
    /// What a prompt may hold besides text and resource links.
    #[serde(skip)]
    pub prompt: PromptCapabilities,
}

/// `promptCapabilities`: the content blocks beyond text and resource links the agent takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptCapabilities {
    pub image: bool,
    pub audio: bool,
    pub embedded_context: bool,
}

impl PromptCapabilities {
    fn read(v: Option<&Value>) -> Self {
        // `true` (v1) or an object (v2's markers); anything else, as the schema reads it, no.
        let yes = |k: &str| {
            matches!(
                v.and_then(|v| v.get(k)),
                Some(Value::Bool(true) | Value::Object(_))
            )
        };
        PromptCapabilities {
            image: yes("image"),
            audio: yes("audio"),
            embedded_context: yes("embeddedContext"),
        }
    }

    /// The capability a content block of `kind` needs that the agent lacks, if one does (ACP:
    /// a client sends only what the agent advertised; text and resource links always).
    pub fn missing_for(self, kind: &str) -> Option<&'static str> {
        match kind {
            "image" if !self.image => Some("image"),
            "audio" if !self.audio => Some("audio"),
            "resource" if !self.embedded_context => Some("embeddedContext"),
            _ => None,
        }
    }
}

/// What the gateway keeps of an agent's `initialize` result.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInit {
    pub protocol_version: Value,
    /// `agentInfo` (v1) or `info` (v2), as sent.
    pub agent_info: Value,
    pub auth_methods: Value,
    pub capabilities: Capabilities,
    /// The raw capability object, for clients that want more detail.
    pub raw_capabilities: Value,
}

/// The `initialize` params: no fs and no terminal capability, so the agent uses its own;
/// elicitation in form and URL mode (clients answer through `/sessions/{id}/elicitations`);
/// terminal logins, which run over `GET /agents/{name}/login`; and prompt suggestions
/// (`session.promptSuggestions`, ACP unstable, streamed and kept in the session's state), which
/// the schema crate the official SDK builds on does not type yet, so it is added to the typed
/// request's JSON.
pub fn initialize_params() -> Value {
    let mut params =
        serde_json::to_value(typed_initialize_params()).expect("an initialize request serializes");
    params["clientCapabilities"]["session"] = json!({"promptSuggestions": {}});
    params
}

fn typed_initialize_params() -> InitializeRequest {
    let elicitation = ElicitationCapabilities::new()
        .form(ElicitationFormCapabilities::new())
        .url(ElicitationUrlCapabilities::new());
    let client = ClientCapabilities::new()
        .fs(FileSystemCapabilities::new())
        .terminal(false)
        .elicitation(elicitation)
        .auth(AuthCapabilities::new().terminal(true));
    InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(client)
        .client_info(Implementation::new(
            "acp-gateway",
            env!("CARGO_PKG_VERSION"),
        ))
}

fn present(v: Option<&Value>) -> bool {
    matches!(v, Some(v) if !v.is_null() && v != &Value::Bool(false))
}

impl AgentInit {
    /// Reads an `initialize` result of either protocol generation.
    pub fn from_result(result: &Value) -> Self {
        let v2_session = result
            .pointer("/capabilities/session")
            .filter(|v| !v.is_null());
        let capabilities = if let Some(session) = v2_session {
            Capabilities {
                load: true,
                list: true,
                resume: true,
                close: true,
                delete: present(session.get("delete")),
                status: present(session.get("status")),
                set_title: present(session.get("title")),
                archive: present(session.get("archive")),
                fork: present(session.get("fork")),
                logout: present(result.pointer("/capabilities/auth/logout")),
                prompt: PromptCapabilities::read(session.get("prompt")),
            }
        } else {
            let agent = result
                .get("agentCapabilities")
                .cloned()
                .unwrap_or(Value::Null);
            let session = agent.get("sessionCapabilities");
            let has = |k: &str| present(session.and_then(|s| s.get(k)));
            Capabilities {
                load: agent
                    .get("loadSession")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                list: has("list"),
                resume: has("resume"),
                close: has("close"),
                delete: has("delete"),
                status: has("status"),
                set_title: has("title"),
                archive: has("archive"),
                fork: has("fork"),
                logout: present(agent.pointer("/auth/logout")),
                prompt: PromptCapabilities::read(agent.get("promptCapabilities")),
            }
        };
        AgentInit {
            protocol_version: result
                .get("protocolVersion")
                .cloned()
                .unwrap_or(Value::Null),
            agent_info: result
                .get("agentInfo")
                .or_else(|| result.get("info"))
                .cloned()
                .unwrap_or(Value::Null),
            auth_methods: result.get("authMethods").cloned().unwrap_or(json!([])),
            capabilities,
            raw_capabilities: result
                .get("agentCapabilities")
                .or_else(|| result.get("capabilities"))
                .cloned()
                .unwrap_or(Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_gateway_says_it_can_do() {
        let params = initialize_params();
        assert_eq!(params["protocolVersion"], 1);
        let caps = &params["clientCapabilities"];
        assert_eq!(
            caps["fs"],
            json!({"readTextFile": false, "writeTextFile": false})
        );
        assert_eq!(caps["terminal"], false);
        assert_eq!(caps["elicitation"], json!({"form": {}, "url": {}}));
        assert_eq!(caps["auth"], json!({"terminal": true}));
        assert_eq!(caps["session"], json!({"promptSuggestions": {}}));
        assert_eq!(params["clientInfo"]["name"], "acp-gateway");
    }

    #[test]
    fn v1_markers() {
        let init = AgentInit::from_result(&json!({
            "protocolVersion": 1,
            "agentInfo": {"name": "a"},
            "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"list": {}, "delete": {}, "close": null}, "auth": {"logout": {}}}
        }));
        assert_eq!(
            init.capabilities,
            Capabilities {
                load: true,
                list: true,
                delete: true,
                logout: true,
                ..Default::default()
            }
        );
        assert_eq!(init.agent_info, json!({"name": "a"}));
    }

    #[test]
    fn v2_baseline_and_optional_features() {
        let init = AgentInit::from_result(&json!({
            "protocolVersion": 2,
            "info": {"name": "b"},
            "capabilities": {"session": {"delete": {}, "status": {}}}
        }));
        let c = init.capabilities;
        assert!(c.load && c.list && c.resume && c.close && c.delete && c.status);
        assert!(!c.set_title && !c.archive);
        assert_eq!(init.agent_info, json!({"name": "b"}));
    }

    #[test]
    fn nothing_advertised() {
        let c = AgentInit::from_result(&json!({"protocolVersion": 1})).capabilities;
        assert_eq!(c, Capabilities::default());
    }
}
