//! The echo agent's sessions on disk and in this process: files, histories, open sessions,
//! running turns, the call log and the capability and login checks every method makes.

use super::*;

impl EchoAgent {
    /// Appends `<method> <sessionId or ->` to `ECHO_AGENT_CALL_LOG`.
    pub(super) fn log_call(&self, method: &str, session: Option<&SessionId>) {
        let Some(path) = &self.cfg.call_log else {
            return;
        };
        let line = format!(
            "{method} {}\n",
            session.map_or("-".into(), ToString::to_string)
        );
        if let Err(e) = append_line(path, &line) {
            eprintln!("echo-agent: cannot write call log {}: {e}", path.display());
        }
    }

    pub(super) fn capabilities(&self) -> AgentCapabilities {
        let on = |cap: &str| self.cfg.caps.contains(cap);
        let session = SessionCapabilities::new()
            .list(on("list").then(SessionListCapabilities::new))
            .delete(on("delete").then(SessionDeleteCapabilities::new))
            .resume(on("resume").then(SessionResumeCapabilities::new))
            .close(on("close").then(SessionCloseCapabilities::new))
            .status(on("status").then(SessionStatusCapabilities::new))
            .title(on("title").then(SessionTitleCapabilities::new))
            .archive(on("archive").then(SessionArchiveCapabilities::new))
            .fork(on("fork").then(SessionForkCapabilities::new));
        let prompt = PromptCapabilities::new()
            .image(on("image"))
            .audio(on("audio"))
            .embedded_context(on("embeddedContext"));
        AgentCapabilities::new()
            .load_session(on("load"))
            .prompt_capabilities(prompt)
            .session_capabilities(session)
            .providers(on("providers").then(ProvidersCapabilities::new))
            .auth(AgentAuthCapabilities::new().logout(on("logout").then(LogoutCapabilities::new)))
    }

    /// A new session's id: random, or the next of this process (`ECHO_AGENT_IDS`).
    pub(super) fn new_id(&self) -> SessionId {
        if self.cfg.per_process_ids {
            let n = self.next_session.fetch_add(1, Ordering::SeqCst);
            return SessionId::new(format!("m{n}"));
        }
        SessionId::new(format!("sess_{}", uuid::Uuid::new_v4().simple()))
    }

    // ---- session files -------------------------------------------------

    /// The file of session `id`, or `None` for ids that cannot be ours.
    pub(super) fn path(&self, id: &str) -> Option<PathBuf> {
        let safe = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        safe.then(|| self.cfg.sessions_dir.join(format!("{id}.json")))
    }

    /// The history file of session `id` (appended to, one update per line).
    pub(super) fn history_path(&self, id: &str) -> Option<PathBuf> {
        self.path(id).map(|p| p.with_extension("history.jsonl"))
    }

    /// The session's updates, in order (none when it has no history yet).
    pub(super) fn history(&self, id: &str) -> Vec<Value> {
        let text = self
            .history_path(id)
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Appends `updates` to the history of session `id`, in one write, if it still exists.
    pub(super) fn append_history(
        &self,
        id: &str,
        updates: impl IntoIterator<Item = Value>,
    ) -> Result<(), Error> {
        let (Some(record), Some(path)) = (self.path(id), self.history_path(id)) else {
            return Err(internal("bad session id"));
        };
        let _guard = lock(&self.files);
        if !record.exists() {
            return Ok(());
        }
        let mut lines = String::new();
        for update in updates {
            lines.push_str(&update.to_string());
            lines.push('\n');
        }
        if lines.is_empty() {
            return Ok(());
        }
        append_line(&path, &lines)
            .map_err(|e| internal(format!("cannot write {}: {e}", path.display())))
    }

    pub(super) fn read(&self, id: &str) -> Option<Record> {
        let text = std::fs::read_to_string(self.path(id)?).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes `record` atomically: a temporary file in the same directory,
    /// then a rename over the real one.
    pub(super) fn write(&self, record: &Record) -> Result<(), Error> {
        let path = self
            .path(&record.session_id)
            .ok_or_else(|| internal("bad session id"))?;
        let tmp = self.cfg.sessions_dir.join(format!(
            ".{}.{}.{}.tmp",
            record.session_id,
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let body = serde_json::to_vec_pretty(record).map_err(internal)?;
        std::fs::write(&tmp, body)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                internal(format!("cannot write {}: {e}", path.display()))
            })
    }

    /// Applies `change` to the stored session; `None` if it does not exist.
    pub(super) fn update(
        &self,
        id: &str,
        change: impl FnOnce(&mut Record),
    ) -> Result<Option<Record>, Error> {
        let _guard = lock(&self.files);
        let Some(mut record) = self.read(id) else {
            return Ok(None);
        };
        change(&mut record);
        self.write(&record)?;
        Ok(Some(record))
    }

    /// Every readable session file.
    /// How many synthetic sessions to list: the number in `<dir>/synthetic-sessions`, read at
    /// every call so that it can change while the agent runs; 0 without the file.
    pub(super) fn synthetic_sessions(&self) -> usize {
        let Some(dir) = self.cfg.sessions_dir.parent() else {
            return 0;
        };
        std::fs::read_to_string(dir.join("synthetic-sessions"))
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    pub(super) fn all(&self) -> Vec<Record> {
        let Ok(entries) = std::fs::read_dir(&self.cfg.sessions_dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name
                    .strip_suffix(".json")
                    .filter(|_| !name.starts_with('.'))?;
                self.read(id)
            })
            .collect()
    }

    // ---- open sessions and turns ---------------------------------------

    pub(super) fn open_session(&self, id: &SessionId) {
        lock(&self.open).entry(id.to_string()).or_insert(None);
    }

    pub(super) fn is_open(&self, id: &str) -> bool {
        lock(&self.open).contains_key(id)
    }

    /// Forgets an open session; dropping its turn slot cancels the turn.
    pub(super) fn close_session(&self, id: &str) {
        if let Some(Some(turn)) = lock(&self.open).remove(id) {
            turn.cancel.send_replace(true);
        }
    }

    /// Registers a new turn for an open session that has none running.
    pub(super) fn begin_turn(
        &self,
        id: &SessionId,
        request: RequestCancellation,
    ) -> Result<Turn, Error> {
        let mut open = lock(&self.open);
        let slot = open.get_mut(&*id.0).ok_or_else(|| not_found(id))?;
        if slot.is_some() {
            return Err(invalid("turn already running"));
        }
        let turn_id = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let (cancel, rx) = watch::channel(false);
        *slot = Some(TurnSlot {
            id: turn_id,
            cancel,
        });
        Ok(Turn {
            id: turn_id,
            cancel: rx,
            request,
        })
    }

    pub(super) fn end_turn(&self, id: &str, turn_id: u64) {
        if let Some(slot) = lock(&self.open).get_mut(id)
            && slot.as_ref().is_some_and(|t| t.id == turn_id)
        {
            *slot = None;
        }
    }

    // ---- methods -------------------------------------------------------
    //
    // Each starts with `self.enter`, which logs the call and, for optional
    // methods, answers -32601 when the capability is off.

    /// Logs a call to `method`, then checks capability `cap` if any.
    pub(super) fn enter(
        &self,
        method: &str,
        id: Option<&SessionId>,
        cap: Option<&str>,
    ) -> Result<(), Error> {
        self.log_call(method, id);
        match cap {
            Some(cap) if !self.cfg.caps.contains(cap) => {
                Err(Error::method_not_found()
                    .data(format!("{method}: capability {cap:?} is disabled")))
            }
            _ => Ok(()),
        }
    }

    /// -32000 "Authentication required" while `ECHO_AGENT_AUTH` is set and
    /// `authenticate` has not succeeded yet, or `ECHO_AGENT_TERMINAL_AUTH` is set and its
    /// login has not written the credentials.
    pub(super) fn require_auth(&self) -> Result<(), Error> {
        if self.cfg.auth_method.is_some() && !self.authenticated.load(Ordering::SeqCst) {
            return Err(Error::auth_required());
        }
        if self.cfg.terminal_auth.is_some() && !self.cfg.credentials.exists() {
            return Err(Error::auth_required());
        }
        Ok(())
    }
}
