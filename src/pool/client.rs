//! The typed agent client: one method per ACP method the gateway calls, with the official
//! schema crate's request types where they fit. Each method checks the capability it needs
//! (an agent that did not advertise it is not called: [`CallError::Unsupported`]) and bounds the
//! call by the control timeout. Raw JSON stays only where the gateway passes through what it
//! does not interpret: MCP server objects, prompt content blocks, and the results it forwards or
//! reads leniently (`session/list`).

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol_schema::v1::{
    AGENT_METHOD_NAMES, ArchiveSessionRequest, CancelNotification, CloseSessionRequest,
    DeleteSessionRequest, ListSessionsRequest, LoadSessionRequest, ResumeSessionRequest,
    SessionArchiveFilter, SessionStatusRequest, SetSessionTitleRequest, UnarchiveSessionRequest,
};
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::agent_rpc::caps::Capabilities;
use crate::agent_rpc::{CallError, Connection, PendingCall, RpcError};

/// `session/set_model`, which the schema crate names only with an unstable feature.
pub const SESSION_SET_MODEL: &str = "session/set_model";

/// `session/new` params. Not the schema crate's type: `mcpServers` are passed through as the
/// client sent them, shapes the gateway does not know included.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewSessionParams<'a> {
    /// For `session/fork`: the session forked.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    cwd: &'a str,
    mcp_servers: &'a [Value],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    additional_directories: &'a [String],
    /// The client's `_meta`, passed through unchanged.
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<&'a Value>,
}

/// Where a new session starts: its directories, MCP servers and `_meta`, as the client sent them.
#[derive(Debug, Clone, Copy)]
pub struct SessionSetup<'a> {
    pub cwd: &'a str,
    pub additional_directories: &'a [String],
    pub mcp_servers: &'a [Value],
    pub meta: Option<&'a Value>,
}

/// A setter's params (`session/set_mode`, `session/set_model`, `session/set_config_option`).
#[serde_with::skip_serializing_none]
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SetterParams<'a> {
    session_id: &'a str,
    mode_id: Option<&'a str>,
    model_id: Option<&'a str>,
    config_id: Option<&'a str>,
    value: Option<&'a Value>,
}

/// `session/prompt` params. Not the schema crate's type: content blocks are passed through, and
/// borrowed rather than copied (the hot path).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PromptParams<'a> {
    session_id: &'a str,
    prompt: &'a [Value],
}

impl<'a> SetterParams<'a> {
    fn of(session_id: &'a str) -> Self {
        SetterParams {
            session_id,
            mode_id: None,
            model_id: None,
            config_id: None,
            value: None,
        }
    }
}

/// One agent connection through the ACP methods the gateway calls.
#[derive(Clone)]
pub struct AgentClient {
    conn: Arc<Connection>,
    caps: Capabilities,
    timeout: Duration,
}

impl AgentClient {
    /// `caps` are the agent's, as its `initialize` result said; `timeout` bounds every control
    /// call (not prompts).
    pub fn new(conn: Arc<Connection>, caps: Capabilities, timeout: Duration) -> Self {
        AgentClient {
            conn,
            caps,
            timeout,
        }
    }

    /// What the agent advertised.
    pub fn caps(&self) -> Capabilities {
        self.caps
    }

    /// True once this member's process can no longer answer (see `Connection::is_gone`).
    pub fn is_gone(&self) -> bool {
        self.conn.is_gone()
    }

    async fn control<P: Serialize>(&self, method: &str, params: &P) -> Result<Value, CallError> {
        self.conn.call(method, params, Some(self.timeout)).await
    }

    /// Fails without calling the agent when it did not advertise `method`'s capability.
    fn needs(&self, advertised: bool, method: &'static str) -> Result<(), CallError> {
        if advertised {
            Ok(())
        } else {
            Err(CallError::Unsupported(method))
        }
    }

    /// `session/new`; returns the new session's id and the agent's whole result (its modes,
    /// models and config options).
    pub async fn new_session(&self, setup: SessionSetup<'_>) -> Result<(String, Value), CallError> {
        let method = AGENT_METHOD_NAMES.session_new;
        self.start_session(method, None, setup).await
    }

    /// `session/fork` (capability `fork`): a new session with `parent`'s history.
    pub async fn fork_session(
        &self,
        parent: &str,
        setup: SessionSetup<'_>,
    ) -> Result<(String, Value), CallError> {
        let method = AGENT_METHOD_NAMES.session_fork;
        self.needs(self.caps.fork, method)?;
        self.start_session(method, Some(parent), setup).await
    }

    async fn start_session(
        &self,
        method: &str,
        parent: Option<&str>,
        setup: SessionSetup<'_>,
    ) -> Result<(String, Value), CallError> {
        let params = NewSessionParams {
            session_id: parent,
            cwd: setup.cwd,
            mcp_servers: setup.mcp_servers,
            additional_directories: setup.additional_directories,
            meta: setup.meta,
        };
        let result = self.control(method, &params).await?;
        match result.get("sessionId").and_then(Value::as_str) {
            Some(id) => Ok((id.to_owned(), result.clone())),
            None => Err(CallError::Rpc(RpcError {
                code: -32603,
                message: format!("{method} returned no sessionId"),
                data: None,
            })),
        }
    }

    /// `session/set_mode`.
    pub async fn set_mode(&self, session_id: &str, mode_id: &str) -> Result<Value, CallError> {
        let params = SetterParams {
            mode_id: Some(mode_id),
            ..SetterParams::of(session_id)
        };
        self.control(AGENT_METHOD_NAMES.session_set_mode, &params)
            .await
    }

    /// [`SESSION_SET_MODEL`] (an older, unstable method some agents still answer).
    pub async fn set_model(&self, session_id: &str, model_id: &str) -> Result<Value, CallError> {
        let params = SetterParams {
            model_id: Some(model_id),
            ..SetterParams::of(session_id)
        };
        self.control(SESSION_SET_MODEL, &params).await
    }

    /// `session/set_config_option`; the agent answers the whole option list.
    pub async fn set_config_option(
        &self,
        session_id: &str,
        config_id: &str,
        value: &Value,
    ) -> Result<Value, CallError> {
        let params = SetterParams {
            config_id: Some(config_id),
            value: Some(value),
            ..SetterParams::of(session_id)
        };
        let method = AGENT_METHOD_NAMES.session_set_config_option;
        self.control(method, &params).await
    }

    /// `session/resume` (capability `resume`); the agent's result (modes, config options).
    pub async fn resume_session(&self, session_id: &str, cwd: &str) -> Result<Value, CallError> {
        let method = AGENT_METHOD_NAMES.session_resume;
        self.needs(self.caps.resume, method)?;
        let params = ResumeSessionRequest::new(session_id.to_owned(), cwd);
        self.control(method, &params).await
    }

    /// `session/load` (capability `load`): the agent replays the session's updates before it
    /// answers; its result (modes, config options).
    pub async fn load_session(&self, session_id: &str, cwd: &str) -> Result<Value, CallError> {
        let method = AGENT_METHOD_NAMES.session_load;
        self.needs(self.caps.load, method)?;
        let params = LoadSessionRequest::new(session_id.to_owned(), cwd);
        self.control(method, &params).await
    }

    /// `session/close` (capability `close`).
    pub async fn close_session(&self, session_id: &str) -> Result<(), CallError> {
        let method = AGENT_METHOD_NAMES.session_close;
        self.needs(self.caps.close, method)?;
        let params = CloseSessionRequest::new(session_id.to_owned());
        self.control(method, &params).await.map(drop)
    }

    /// `session/delete` (capability `delete`).
    pub async fn delete_session(&self, session_id: &str) -> Result<(), CallError> {
        let method = AGENT_METHOD_NAMES.session_delete;
        self.needs(self.caps.delete, method)?;
        let params = DeleteSessionRequest::new(session_id.to_owned());
        self.control(method, &params).await.map(drop)
    }

    /// `session/set_title` (capability `setTitle`); returns the title the agent stored, when it
    /// says.
    pub async fn set_title(
        &self,
        session_id: &str,
        title: &str,
    ) -> Result<Option<String>, CallError> {
        let method = AGENT_METHOD_NAMES.session_set_title;
        self.needs(self.caps.set_title, method)?;
        let params = SetSessionTitleRequest::new(session_id.to_owned(), title);
        let result = self.control(method, &params).await?;
        Ok(result
            .get("title")
            .and_then(Value::as_str)
            .map(str::to_owned))
    }

    /// `session/archive` or `session/unarchive` (capability `archive`).
    pub async fn set_archived(&self, session_id: &str, archived: bool) -> Result<(), CallError> {
        let id = session_id.to_owned();
        if archived {
            let method = AGENT_METHOD_NAMES.session_archive;
            self.needs(self.caps.archive, method)?;
            self.control(method, &ArchiveSessionRequest::new(id)).await
        } else {
            let method = AGENT_METHOD_NAMES.session_unarchive;
            self.needs(self.caps.archive, method)?;
            self.control(method, &UnarchiveSessionRequest::new(id))
                .await
        }
        .map(drop)
    }

    /// `session/status` (capability `status`): whether the agent has the session open.
    pub async fn session_open(&self, session_id: &str) -> Result<bool, CallError> {
        let method = AGENT_METHOD_NAMES.session_status;
        self.needs(self.caps.status, method)?;
        let params = SessionStatusRequest::new(session_id.to_owned());
        let result = self.control(method, &params).await?;
        Ok(result.get("status").and_then(Value::as_str) == Some("open"))
    }

    /// Asks for one page of `session/list` (capability `list`), of one `cwd` if given, archived
    /// sessions included when the agent archives; the page comes with [`PendingPage::page`], so
    /// that a sync can ask for the next page before it reads this one.
    pub async fn list_sessions(
        &self,
        cwd: Option<&str>,
        cursor: Option<&str>,
    ) -> Result<PendingPage, CallError> {
        let method = AGENT_METHOD_NAMES.session_list;
        self.needs(self.caps.list, method)?;
        let params = ListSessionsRequest::new()
            .cwd(cwd.map(std::path::PathBuf::from))
            .cursor(cursor.map(str::to_owned))
            .archived(self.caps.archive.then_some(SessionArchiveFilter::Include));
        Ok(PendingPage {
            call: self.conn.send_request(method, &params).await?,
            timeout: self.timeout,
        })
    }

    /// Sends `session/prompt` and returns its pending answer (awaited without a bound: a turn
    /// takes as long as it takes). Once this returns, the prompt is queued ahead of anything
    /// sent later, a cancel included.
    pub async fn prompt(
        &self,
        session_id: &str,
        prompt: &[Value],
    ) -> Result<PendingCall, CallError> {
        let params = PromptParams { session_id, prompt };
        self.conn
            .send_request(AGENT_METHOD_NAMES.session_prompt, &params)
            .await
    }

    /// The `session/cancel` notification.
    pub async fn cancel(&self, session_id: &str) -> Result<(), CallError> {
        let params = CancelNotification::new(session_id.to_owned());
        self.conn
            .notify(AGENT_METHOD_NAMES.session_cancel, &params)
            .await
    }
}

/// A request the agent sent the gateway, to be answered once.
#[derive(Debug, Clone)]
pub struct Incoming {
    conn: Arc<Connection>,
    id: Value,
}

impl Incoming {
    pub fn new(conn: Arc<Connection>, id: Value) -> Self {
        Incoming { conn, id }
    }

    /// The request's JSON-RPC id, as the agent wrote it.
    pub fn id(&self) -> &Value {
        &self.id
    }

    /// Answers the request with `response` (a `RequestPermissionResponse`, a
    /// `CreateElicitationResponse`).
    pub async fn answer<R: Serialize>(&self, response: &R) -> Result<(), CallError> {
        self.conn.respond(&self.id, Ok(response)).await
    }

    /// Answers with a JSON-RPC error.
    pub async fn refuse(&self, error: RpcError) -> Result<(), CallError> {
        self.conn.respond::<Value>(&self.id, Err(&error)).await
    }
}

/// A `session/list` page asked for and not answered yet.
#[derive(Debug)]
pub struct PendingPage {
    call: PendingCall,
    timeout: Duration,
}

impl PendingPage {
    /// The page as the agent's text (a sync reads leniently, and only what it compares), within
    /// the control timeout.
    pub async fn page(self) -> Result<Box<RawValue>, CallError> {
        self.call.wait_raw(Some(self.timeout)).await
    }
}
