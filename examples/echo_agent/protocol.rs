//! `initialize`, `authenticate`, `session/new`, `session/fork` and the session controls.

use super::*;

impl EchoAgent {
    pub(super) async fn initialize(
        &self,
        req: &InitializeRequest,
    ) -> Result<InitializeResponse, Error> {
        self.enter("initialize", None, None)?;
        let elicitation = req.client_capabilities.elicitation.as_ref();
        let form = elicitation.is_some_and(|e| e.form.is_some());
        self.elicitation_form.store(form, Ordering::SeqCst);
        let url = elicitation.is_some_and(|e| e.url.is_some());
        self.elicitation_url.store(url, Ordering::SeqCst);
        if self.cfg.crash_at_start {
            eprintln!("echo-agent: crashing at start");
            std::process::exit(3);
        }
        if self.cfg.init_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.cfg.init_delay_ms)).await;
        }
        let info = Implementation::new("echo-agent", env!("CARGO_PKG_VERSION"));
        let auth_methods = self.cfg.auth_method.iter().map(|id| {
            let method = AuthMethodAgent::new(id.clone(), "Echo login")
                .description("Accepts any client that asks".to_string());
            AuthMethod::Agent(method)
        });
        // Only to a client that can run a terminal login.
        let terminal = (self.cfg.terminal_auth.iter())
            .filter(|_| req.client_capabilities.auth.terminal)
            .map(|id| {
                let method = AuthMethodTerminal::new(id.clone(), "Log in in a terminal")
                    .args(vec!["--login".to_string()]);
                AuthMethod::Terminal(method)
            });
        Ok(InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(self.capabilities())
            .auth_methods(auth_methods.chain(terminal).collect())
            .agent_info(info))
    }

    /// Accepts the advertised method (any method when none is advertised), with the key of
    /// `ECHO_AGENT_AUTH_KEY` in `_meta` when that is set.
    pub(super) fn authenticate(
        &self,
        req: AuthenticateRequest,
    ) -> Result<AuthenticateResponse, Error> {
        self.enter("authenticate", None, None)?;
        if let Some(method) = &self.cfg.auth_method {
            if *req.method_id.0 != **method {
                return Err(invalid("unknown authentication method"));
            }
            if let Some(key) = &self.cfg.auth_key {
                // Gemini's shape, {"api-key": KEY}, or Codex's, {"api-key": {"apiKey": KEY}}.
                let given = req.meta.as_ref().and_then(|m| m.get("api-key"));
                let given = given.and_then(|v| v.as_str().or_else(|| v["apiKey"].as_str()));
                if given != Some(key.as_str()) {
                    let why = if given.is_some() {
                        "Authentication failed: wrong API key in _meta"
                    } else {
                        "Authentication failed: no API key in _meta (expected {\"api-key\": KEY} or {\"api-key\": {\"apiKey\": KEY}})"
                    };
                    return Err(Error::new(ErrorCode::AUTH_REQUIRED, why));
                }
            }
            self.authenticated.store(true, Ordering::SeqCst);
        }
        Ok(AuthenticateResponse::new())
    }

    /// `logout`: signed out until the next `authenticate`.
    pub(super) fn logout(&self) -> Result<LogoutResponse, Error> {
        self.enter("logout", None, Some("logout"))?;
        self.authenticated.store(false, Ordering::SeqCst);
        Ok(LogoutResponse::new())
    }

    pub(super) async fn new_session(
        &self,
        req: NewSessionRequest,
        cancel: RequestCancellation,
    ) -> Result<NewSessionResponse, Error> {
        self.enter("session/new", None, None)?;
        // A client that stops waiting (`$/cancel_request`) gets no session made for nobody.
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(self.cfg.new_delay_ms)) => {}
            () = cancel.cancelled() => {
                self.log_call("$/cancel_request", None);
                return Err(Error::request_cancelled());
            }
        }
        self.require_auth()?;
        if !req.cwd.is_absolute() {
            return Err(invalid("cwd must be an absolute path"));
        }
        std::fs::create_dir_all(&self.cfg.sessions_dir).map_err(internal)?;
        let id = self.new_id();
        self.write(&Record {
            session_id: id.to_string(),
            cwd: req.cwd,
            additional_directories: req.additional_directories,
            title: None,
            updated_at: Utc::now(),
            archived: false,
            settings: controls::Settings::default(),
            meta: req.meta,
        })?;
        self.open_session(&id);
        Ok(NewSessionResponse::new(id))
    }

    /// `session/fork`: a new session with the parent's settings and history, in `cwd`.
    pub(super) fn fork(&self, req: &Value) -> Result<Value, Error> {
        let parent = SessionId::new(req["sessionId"].as_str().unwrap_or_default());
        self.enter("session/fork", Some(&parent), Some("fork"))?;
        self.require_auth()?;
        let from = self.read(&parent.0).ok_or_else(|| not_found(&parent))?;
        let cwd = req["cwd"].as_str().map_or(from.cwd.clone(), PathBuf::from);
        if !cwd.is_absolute() {
            return Err(invalid("cwd must be an absolute path"));
        }
        let id = self.new_id();
        self.write(&Record {
            session_id: id.to_string(),
            cwd,
            title: from.title.as_ref().map(|t| format!("Fork of {t}")),
            updated_at: Utc::now(),
            archived: false,
            ..from
        })?;
        self.append_history(&id.0, self.history(&parent.0))?;
        self.open_session(&id);
        Ok(json!({ "sessionId": id }))
    }

    /// The session methods that carry or change controls, answered as JSON (the schema
    /// crate's types have no `models`): `None` for another method, which the typed handlers
    /// answer.
    pub(super) async fn controlled(
        &self,
        cx: &Cx,
        msg: &UntypedMessage,
        cancel: RequestCancellation,
    ) -> Option<Result<Value, Error>> {
        let c = self.cfg.controls;
        let params = &msg.params;
        let id = params["sessionId"].as_str().unwrap_or_default().to_owned();
        let typed = |e: serde_json::Error| invalid(&e.to_string());
        let answer = match msg.method.as_str() {
            "session/new" if c.any() => match serde_json::from_value(params.clone()) {
                Ok(req) => self.new_session(req, cancel).await.map(|r| to_json(&r)),
                Err(e) => Err(typed(e)),
            },
            "session/load" if c.any() => match serde_json::from_value(params.clone()) {
                Ok(req) => self.load(cx, req).map(|r| to_json(&r)),
                Err(e) => Err(typed(e)),
            },
            "session/resume" if c.any() => match serde_json::from_value(params.clone()) {
                Ok(req) => self.resume(req).await.map(|r| to_json(&r)),
                Err(e) => Err(typed(e)),
            },
            "session/fork" => self.fork(params),
            "providers/set" if self.cfg.caps.contains("providers") => {
                *lock(&self.provider) = Some(params.clone());
                Ok(json!({}))
            }
            "session/set_mode" | "session/set_model" | "session/set_config_option" => {
                self.log_call(&msg.method, Some(&SessionId::new(id.clone())));
                let answer = self.set_control(&id, &msg.method, params);
                if answer.is_ok() && params["configId"] == "mode" {
                    let update = json!({"sessionUpdate": "current_mode_update",
                                        "currentModeId": params["value"]});
                    let note = json!({ "sessionId": id, "update": update });
                    if let Err(e) = UntypedMessage::new("session/update", note)
                        .and_then(|n| cx.send_notification(n))
                    {
                        return Some(Err(e));
                    }
                }
                return Some(answer.map(|list| {
                    list.map_or_else(|| json!({}), |l| json!({ "configOptions": l }))
                }));
            }
            _ => return None,
        };
        Some(answer.map(|mut result| {
            let sid = result["sessionId"].as_str().map_or(id, str::to_owned);
            let settings = self.read(&sid).map(|r| r.settings).unwrap_or_default();
            if let Value::Object(fields) = &mut result {
                fields.extend(c.result(&settings));
            }
            result
        }))
    }

    /// A setter; the whole option list for `session/set_config_option`.
    pub(super) fn set_control(
        &self,
        id: &str,
        method: &str,
        params: &Value,
    ) -> Result<Option<Value>, Error> {
        let c = self.cfg.controls;
        let mut settings = self
            .read(id)
            .ok_or_else(|| not_found(&SessionId::new(id)))?
            .settings;
        let text = |key: &str| params[key].as_str().unwrap_or_default().to_owned();
        let list = match method {
            "session/set_mode" => c.set_mode(&mut settings, &text("modeId")).map(|()| None),
            "session/set_model" => c.set_model(&mut settings, &text("modelId")).map(|()| None),
            _ => c
                .set_option(&mut settings, &text("configId"), &params["value"])
                .map(Some),
        }?;
        self.update(id, |r| r.settings = settings)?;
        Ok(list)
    }
}
