//! New sessions: `POST /sessions` (`session/new`, then the settings the client asked for) and
//! `POST /sessions/{id}/fork` (`session/fork`). Both record the session, announce it and log
//! what the agent's answer says of its state.

use std::path::PathBuf;
use std::sync::Arc;

use agent_client_protocol_schema::v1::AGENT_METHOD_NAMES;
use chrono::SubsecRound;
use serde_json::{Value, json};
use tokio::sync::RwLockReadGuard;

use super::caller::Caller;
use super::clock::now;
use super::controls::Controls;
use super::controls::InitialSettings;
use super::error::Error;
use super::event::{Forked, GatewayEvent, GatewayLifecycleEvent};
use super::input::{SessionId, confine, validate_abs_path};
use super::output::SessionView;
use super::parts::use_case;
use super::parts::workspaces::{Source, made_by_host};
use super::portable::read_only;
use super::sessions::Sessions;
use crate::agent_rpc::CallError;
use crate::config::McpServers;
use crate::config::WhoAnswers;
use crate::pool::client::{AgentClient, SessionSetup};
use crate::store::{Origin, People, SessionRecord, WorkspaceRecord};

/// What `POST /sessions` creates.
#[derive(Debug, Default)]
pub struct NewSession {
    /// Absolute, normalised working directory (none with a scratch workspace, which is it).
    pub cwd: Option<String>,
    /// A workspace the gateway makes for the session.
    pub workspace: Option<NewWorkspace>,
    /// Extra workspace roots (absolute).
    pub additional_directories: Vec<String>,
    /// ACP `McpServer` objects, passed through.
    pub mcp_servers: Vec<Value>,
    /// The client's `_meta` for `session/new`, passed through unchanged.
    pub meta: Option<Value>,
    /// Applied before the answer.
    pub settings: InitialSettings,
    /// The agent to start it in (the default one when `None`).
    pub agent: Option<String>,
    /// Who may answer its requests (the tenant's default when `None`).
    pub who_answers: Option<WhoAnswers>,
}

/// A workspace the gateway makes for a new session, which works in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewWorkspace {
    /// An empty folder of the session's own under `--workspace-dir`.
    Scratch,
    /// A git worktree of the repository `cwd` names, at `reference` (its `HEAD` when `None`),
    /// on a branch of the session's own.
    Worktree { reference: Option<String> },
}

/// What `POST /sessions/{id}/fork` makes: where the fork works (the parent's `cwd` by default).
#[derive(Debug, Default)]
pub struct Fork {
    pub cwd: Option<String>,
    pub additional_directories: Vec<String>,
    pub mcp_servers: Vec<Value>,
    pub meta: Option<Value>,
}

/// A session the agent has started, before the gateway records it.
struct Started {
    /// The member that answered.
    member: usize,
    agent: AgentClient,
    session_id: String,
    /// The agent's answer, whose state is logged.
    answer: Value,
}

/// How the agent starts the session.
#[derive(Clone, Copy)]
enum Start<'a> {
    New,
    /// `session/fork` of this parent, on the member holding it live if one does.
    Fork(&'a str),
}

use_case! {
    /// The use case of new sessions and forks, with the parts it needs.
    pub struct Create {
        parts: [placement, records, views, states, log, workspaces],
        /// A create whose settings fail is deleted.
        sessions: Sessions,
        /// The settings a create asks for.
        controls: Controls,
        /// Canonical directories sessions must work in (empty: anywhere).
        workspace_roots: Arc<[PathBuf]>,
        /// Which `mcpServers` a client may hand the agent.
        mcp_servers: McpServers,
    }
}

impl Create {
    /// `POST /sessions`: the session, with its state once the settings are applied. A setting
    /// the agent refuses deletes the new session again (closes it when the agent cannot
    /// delete), so that the client's error leaves nothing behind.
    pub async fn create_session(
        &self,
        caller: &Caller,
        new: NewSession,
    ) -> Result<SessionView, Error> {
        let agent = self.placement.requested_agent(new.agent.as_deref())?;
        let (agent, remote) = (agent.name().to_owned(), agent.is_remote());
        // A workspace the agent's host (another gateway) is asked to make, in `_meta`.
        let mut hosted = None;
        let (cwd, made) = match (new.workspace, new.cwd) {
            (None, Some(cwd)) => {
                self.check_dirs(Some(&cwd), &new.additional_directories, remote)
                    .await?;
                (cwd, None)
            }
            (None, None) => {
                return Err(Error::Invalid(
                    "cwd is required, unless the gateway makes the session a workspace (\"workspace\": {\"kind\": \"scratch\"})".into(),
                ));
            }
            (Some(NewWorkspace::Scratch), Some(_)) => {
                return Err(Error::Invalid(
                    "a scratch workspace is the session's cwd: leave cwd out".into(),
                ));
            }
            (Some(NewWorkspace::Worktree { .. }), None) => {
                return Err(Error::Invalid(
                    "a worktree is made of the repository cwd names: cwd is required".into(),
                ));
            }
            (Some(workspace), cwd) if remote => {
                self.check_dirs(cwd.as_deref(), &new.additional_directories, remote)
                    .await?;
                hosted = Some(workspace);
                // ACP asks for a cwd; the host's answer says where the workspace is.
                (cwd.unwrap_or_else(|| "/".to_owned()), None)
            }
            (Some(NewWorkspace::Scratch), None) => {
                self.check_dirs(None, &new.additional_directories, remote)
                    .await?;
                let made = self.workspaces.make(Source::Empty).await?;
                (made.path.clone(), Some(made))
            }
            (Some(NewWorkspace::Worktree { reference }), Some(repository)) => {
                self.check_dirs(Some(&repository), &new.additional_directories, remote)
                    .await?;
                let source = Source::Repository(&repository, reference.as_deref());
                let made = self.workspaces.make(source).await?;
                (made.path.clone(), Some(made))
            }
        };
        check_meta(new.meta.as_ref())?;
        self.check_mcp_servers(&new.mcp_servers)?;
        let meta = asking_host(new.meta, hosted.as_ref());
        let setup = SessionSetup {
            cwd: &cwd,
            additional_directories: &new.additional_directories,
            mcp_servers: &new.mcp_servers,
            meta: meta.as_ref(),
        };
        let people = owned_by(caller, new.who_answers);
        let started = (self.start_session(caller, &agent, Start::New, setup, people)).await;
        let record = (self.in_workspace(caller, started, made, hosted.is_some())).await?;
        let id = SessionId::known(record.session_id.clone());
        if let Err(e) = self
            .controls
            .apply_settings(id.as_str(), &agent, &new.settings)
            .await
        {
            self.discard_new(caller, id.as_str()).await;
            return Err(e);
        }
        self.views.view_with_state(&record).await
    }

    /// A started session (`started`), recorded as working in the workspace the gateway `made`
    /// for it, or the agent's host did, if one; a session that did not start leaves no
    /// workspace, and one whose workspace cannot be recorded, or whose host made none when it
    /// was `asked` to (it is no gateway), is deleted.
    async fn in_workspace(
        &self,
        caller: &Caller,
        started: Result<(SessionRecord, Option<WorkspaceRecord>), Error>,
        made: Option<WorkspaceRecord>,
        asked: bool,
    ) -> Result<SessionRecord, Error> {
        match (started, made) {
            (Ok((record, hosted)), made) => {
                let id = &record.session_id;
                let recorded = match (made, hosted) {
                    (Some(made), _) => self.workspaces.record(id, made).await.map(drop),
                    (None, Some(hosted)) => self.workspaces.record_hosted(id, hosted).await,
                    (None, None) if asked => Err(Error::NotSupported(
                        "the agent's host made no workspace: it is no acp-gateway, and the session would work where cwd says; the session was discarded".into(),
                    )),
                    (None, None) => return Ok(record),
                };
                if let Err(e) = recorded {
                    self.discard_new(caller, id).await;
                    return Err(e);
                }
                Ok(record)
            }
            (Err(e), made) => {
                if let Some(made) = made {
                    self.workspaces.discard(&made).await;
                }
                Err(e)
            }
        }
    }

    /// Deletes a session this create made and then failed to finish (its settings, its
    /// workspace's record), so that the client's error leaves nothing behind.
    async fn discard_new(&self, caller: &Caller, id: &str) {
        let known = SessionId::known(id.to_owned());
        if let Err(undo) = self.sessions.delete_session(caller, &known).await {
            tracing::warn!(session = id, error = %undo, "a session whose create failed could not be deleted");
        }
    }

    /// `POST /sessions/{id}/fork` (501 unless the agent advertises `fork`). The fork's log
    /// starts with a `forked` event naming the parent and the parent's log position: its
    /// history is the parent's up to there, read from the parent's log.
    pub async fn fork_session(
        &self,
        caller: &Caller,
        parent: &SessionId,
        fork: Fork,
    ) -> Result<SessionView, Error> {
        let from = self.records.get(caller, parent).await?;
        if let Some(why) = read_only(&from) {
            return Err(Error::Conflict(why));
        }
        let remote = self.placement.agent_named(&from.agent)?.is_remote();
        if !self.placement.caps(&from.agent).fork {
            let method = AGENT_METHOD_NAMES.session_fork;
            return Err(CallError::Unsupported(method).into());
        }
        // A fork of a session with a workspace, working where its parent does, starts from a
        // copy of the parent's files in a workspace of its own (on a remote agent's host, the
        // host's business).
        let parent_workspace = match &fork.cwd {
            None if !remote => self.workspaces.of(parent.as_str()).await?,
            _ => None,
        };
        let made = match &parent_workspace {
            Some(w) => Some(self.workspaces.make(Source::Copy(w)).await?),
            None => None,
        };
        let cwd = match (&made, fork.cwd) {
            (Some(made), _) => made.path.clone(),
            (None, cwd) => cwd.unwrap_or_else(|| from.cwd.clone()),
        };
        let checked = made.is_none().then_some(cwd.as_str());
        if let Err(e) = self
            .check_dirs(checked, &fork.additional_directories, remote)
            .await
            .and_then(|()| check_meta(fork.meta.as_ref()))
            .and_then(|()| self.check_mcp_servers(&fork.mcp_servers))
        {
            if let Some(made) = &made {
                self.workspaces.discard(made).await;
            }
            return Err(e);
        }
        self.log.flush().await;
        let at = self.log.events().last_event_seq(parent.as_str()).await?;
        let setup = SessionSetup {
            cwd: &cwd,
            additional_directories: &fork.additional_directories,
            mcp_servers: &fork.mcp_servers,
            meta: fork.meta.as_ref(),
        };
        let how = Start::Fork(parent.as_str());
        let people = owned_by(
            caller,
            from.people
                .who_answers
                .as_deref()
                .and_then(WhoAnswers::parse),
        );
        let started = (self.start_session(caller, &from.agent, how, setup, people)).await;
        let record = self.in_workspace(caller, started, made, false).await?;
        let forked = Forked {
            session_id: record.session_id.clone(),
            parent_session_id: parent.as_str().to_owned(),
            parent_seq: at,
        };
        let forked = GatewayEvent::Forked(forked);
        self.log.append(&record.session_id, forked).await;
        self.views.view_with_state(&record).await
    }

    /// The directories a session works in: absolute, inside the workspace roots, and `cwd` an
    /// existing directory (the agent would start its tools there: a path that is not one
    /// would fail them later, or, created by the agent, silently be a different project).
    /// For a `remote` agent the directory is on its host, which checks it. No `cwd`: the
    /// session works in a workspace the gateway makes.
    async fn check_dirs(
        &self,
        cwd: Option<&str>,
        additional: &[String],
        remote: bool,
    ) -> Result<(), Error> {
        let roots = &self.workspace_roots;
        if let Some(cwd) = cwd {
            validate_abs_path("cwd", cwd)?;
            confine("cwd", cwd, roots)?;
            if !remote && !tokio::fs::metadata(cwd).await.is_ok_and(|m| m.is_dir()) {
                return Err(Error::Invalid(format!(
                    "cwd is not an existing directory: {cwd:?}"
                )));
            }
        }
        for d in additional {
            validate_abs_path("additionalDirectories[]", d)?;
            confine("additionalDirectories[]", d, roots)?;
        }
        Ok(())
    }

    /// `mcpServers` as `--mcp-servers` allows them: with `http`, only servers reached over the
    /// network (`type` `http` or `sse`); a `stdio` server is a command the agent would run on
    /// its host for whoever asked.
    fn check_mcp_servers(&self, servers: &[Value]) -> Result<(), Error> {
        if self.mcp_servers == McpServers::Any {
            return Ok(());
        }
        for server in servers {
            let kind = server.get("type").and_then(Value::as_str);
            if !matches!(kind, Some("http" | "sse")) || server.get("command").is_some() {
                let name = server.get("name").and_then(Value::as_str).unwrap_or("?");
                return Err(Error::Invalid(format!(
                    "mcpServers[{name:?}]: only `http` and `sse` MCP servers are allowed here (a `stdio` server is a command run on the gateway's host); --mcp-servers any allows every kind"
                )));
            }
        }
        Ok(())
    }

    /// Starts the session at the agent and records it: live on the member that started it,
    /// announced with `session_created`, its state logged. Counted among the tenant's live
    /// sessions from the start, by a slot of its own until this replica holds it. With the
    /// workspace a remote agent's host made for it, if one.
    async fn start_session(
        &self,
        caller: &Caller,
        agent_name: &str,
        how: Start<'_>,
        setup: SessionSetup<'_>,
        people: People,
    ) -> Result<(SessionRecord, Option<WorkspaceRecord>), Error> {
        let start = async {
            let (started, creating) =
                (self.start_at_agent(&caller.tenant, agent_name, how, setup)).await?;
            let at = now();
            // A workspace the agent's host made is where the session works.
            let hosted = (self.placement.is_remote(agent_name))
                .then(|| made_by_host(&started.answer))
                .flatten();
            let cwd = hosted.as_ref().map_or(setup.cwd, |w| w.path.as_str());
            let record = SessionRecord {
                additional_directories: setup.additional_directories.to_vec(),
                people,
                ..SessionRecord::new(
                    started.session_id.clone(),
                    caller.tenant.clone(),
                    cwd.to_owned(),
                    agent_name.to_owned(),
                    Origin::Gateway,
                    at,
                )
            };
            self.insert_started(&record, &started.agent).await?;
            drop(creating);
            self.announce_started(&record, how, &started).await?;
            Ok((record, hosted))
        };
        let name = format!("new:{}", uuid::Uuid::new_v4());
        let quotas = self.placement.quotas();
        quotas.making_live(&caller.tenant, &name, start).await
    }

    /// `session/new` (or `session/fork`) on a member of the agent: again on another process
    /// when its member died before answering (`retry_elsewhere`). A fork goes to the member
    /// holding its parent live, if one does. The guard held from the call until the row is
    /// stored comes with the answer. A new session of `tenant` goes to its own pool of the
    /// agent, if it has one.
    async fn start_at_agent(
        &self,
        tenant: &str,
        agent_name: &str,
        how: Start<'_>,
        setup: SessionSetup<'_>,
    ) -> Result<(Started, RwLockReadGuard<'_, ()>), Error> {
        let mut retries = 0;
        loop {
            let live_parent = match how {
                Start::Fork(parent) => self.placement.live().member(parent),
                Start::New => None,
            };
            let (member, agent) = match live_parent {
                Some(m) => {
                    let client = self.placement.client(m);
                    (m, client.ok_or_else(|| self.placement.no_member_at(m))?)
                }
                None => self.placement.place(agent_name, tenant).await?,
            };
            let creating = self.records.creating().await;
            let answered = match how {
                Start::New => agent.new_session(setup).await,
                Start::Fork(parent) => agent.fork_session(parent, setup).await,
            };
            match answered {
                Err(e) if self.placement.retry_elsewhere(agent_name, &e, &mut retries) => {
                    tracing::warn!(
                        member,
                        error = %e,
                        "the member died before the session was started; trying another member"
                    );
                }
                answered => {
                    let (session_id, answer) =
                        answered.map_err(|e| self.placement.auth_hint(agent_name, e.into()))?;
                    let started = Started {
                        member,
                        agent,
                        session_id,
                        answer,
                    };
                    return Ok((started, creating));
                }
            }
        }
    }

    /// Stores the new session's row. One the gateway cannot store is undone at the agent.
    async fn insert_started(
        &self,
        record: &SessionRecord,
        agent: &AgentClient,
    ) -> Result<(), Error> {
        match self.records.rows().insert_session(record).await {
            Ok(true) => Ok(()),
            // Another replica's list sync, on an agent that shares this one's state, listed the
            // new session before its row was stored here (a sync holds back only this replica's
            // own creates): the session listed first is this one, and becomes the caller's.
            Ok(false) if self.take_over_listed(record).await? => Ok(()),
            // The agent handed out an id the gateway has given another session already (of
            // another member or agent, another tenant, a deleted one): ACP makes an id unique
            // only within one agent process. That session stays whose it is; this one is
            // undone at the agent, and the create fails.
            Ok(false) => {
                let why = format!(
                    "the agent answered with session id {:?}, which already names another session here; the new session was discarded, retry the request",
                    record.session_id
                );
                undo(agent, &record.session_id, &why).await;
                Err(Error::AgentMisbehaved(why))
            }
            Err(e) => {
                // Not recorded, so not created: the agent's session is undone as far as the
                // agent allows (deleted, else closed), and the client retries the whole create,
                // instead of a session the gateway does not know turning up at the next sync.
                undo(agent, &record.session_id, &e).await;
                Err(e.into())
            }
        }
    }

    /// The stored session made live on its member, announced, and its state logged. Its
    /// member may have exited since it answered: the session is then saved, not live (made at
    /// the agent and recorded, it is resumed where the next prompt lands). Held in the
    /// registry before it is live here, as every session is (see `let_go_of_taken`).
    async fn announce_started(
        &self,
        record: &SessionRecord,
        how: Start<'_>,
        started: &Started,
    ) -> Result<(), Error> {
        self.records.sessions_changed();
        self.placement.hold(&record.session_id).await;
        if !self
            .placement
            .attach_if_alive(record, started.member, &started.agent)
        {
            self.placement.release(&record.session_id).await;
        }
        let view = self.views.view(record);
        let created = GatewayLifecycleEvent::created(record, view);
        self.log.lifecycle(record, created).await;
        let source = match how {
            Start::New => AGENT_METHOD_NAMES.session_new,
            Start::Fork(_) => AGENT_METHOD_NAMES.session_fork,
        };
        self.states
            .note_state(&record.session_id, source, &started.answer)
            .await?;
        Ok(())
    }
}

impl Create {
    /// Replaces the row another replica's list sync wrote for the session `record` was made
    /// as, when it is one: listed (`upstream`), of the same agent, not deleted. `true` when the
    /// row is now `record`. The `session_created` that replica announced for the listed row
    /// (heard only by callers who see every tenant) is followed by this create's own.
    async fn take_over_listed(&self, record: &SessionRecord) -> Result<bool, Error> {
        let listed_first = |r: &SessionRecord| {
            r.origin == Origin::Upstream && r.agent == record.agent && r.deleted_at.is_none()
        };
        let take = |row: &mut SessionRecord| {
            if listed_first(row) {
                *row = record.clone();
            }
        };
        let id = record.session_id.as_str();
        let row = self.records.update_cached(id, &take).await?;
        let ours = row.is_some_and(|r| {
            r.origin == Origin::Gateway
                && r.tenant == record.tenant
                && r.created_at == record.created_at.trunc_subsecs(6)
        });
        if ours {
            tracing::info!(
                session = id,
                "another replica listed the new session before it was recorded; it is the creator's"
            );
        }
        Ok(ours)
    }
}

/// The `_meta` of `session/new`: the client's, with the `workspace` the agent's host (another
/// gateway) is asked to make.
fn asking_host(meta: Option<Value>, workspace: Option<&NewWorkspace>) -> Option<Value> {
    let Some(workspace) = workspace else {
        return meta;
    };
    let asked = match workspace {
        NewWorkspace::Scratch => json!({"kind": "scratch"}),
        NewWorkspace::Worktree { reference } => json!({"kind": "worktree", "ref": reference}),
    };
    let mut meta = meta.filter(Value::is_object).unwrap_or_else(|| json!({}));
    meta["workspace"] = asked;
    Some(meta)
}

/// ACP's `_meta` is an object.
fn check_meta(meta: Option<&Value>) -> Result<(), Error> {
    match meta {
        Some(m) if !m.is_object() && !m.is_null() => {
            Err(Error::Invalid("_meta must be a JSON object".into()))
        }
        _ => Ok(()),
    }
}

/// Deletes (else closes) a session the agent started and the gateway could not record.
async fn undo(agent: &AgentClient, id: &str, e: &(dyn std::fmt::Display + Sync)) {
    let undone = match agent.delete_session(id).await {
        Err(CallError::Unsupported(_)) => agent.close_session(id).await,
        deleted => deleted,
    };
    tracing::warn!(session = id, error = %e, undone = ?undone, "the new session could not be recorded; undone at the agent");
}

/// Who a new session is of: `caller`'s user, if it names one, and `who_answers`.
fn owned_by(caller: &Caller, who_answers: Option<WhoAnswers>) -> People {
    let user = caller.user.as_ref();
    People {
        owner: user.map(|u| u.id.clone()),
        owner_name: user.and_then(|u| u.name.clone()),
        who_answers: who_answers.map(|w| w.as_str().to_owned()),
    }
}
