//! Prompt turns: the directives, streaming the reply, permission requests and elicitations,
//! cancellation.

use super::*;

impl EchoAgent {
    /// Starts a turn in a spawned task, which answers the request when the
    /// turn ends, so that the dispatch loop stays free for `session/cancel`
    /// and the permission answer.
    pub(super) fn prompt(
        self: &Arc<Self>,
        cx: &Cx,
        req: PromptRequest,
        responder: Responder<PromptResponse>,
    ) -> Result<(), Error> {
        let id = req.session_id.clone();
        self.enter("session/prompt", Some(&id), None)?;
        self.require_auth()?;
        let mut turn = self.begin_turn(&id, responder.cancellation())?;
        // With controls, the result counts a token per word, in and echoed out.
        let words: u64 = req
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(t) => Some(t.text.split_whitespace().count() as u64),
                _ => None,
            })
            .sum();
        let usage = (self.cfg.controls.any() || self.cfg.cost.is_some())
            .then(|| Usage::new(2 * words, words, words));
        let (agent, task_cx) = (Arc::clone(self), cx.clone());
        cx.spawn(async move {
            let result = agent.run_turn(&task_cx, req, &mut turn).await;
            if result.is_ok() {
                agent.report_cost(&task_cx, &id, words)?;
            }
            agent.end_turn(&id.0, turn.id);
            let answer = result.map(|stop| prompt_response(stop).usage(usage));
            if let Err(err) = responder.respond_with_result(answer) {
                eprintln!("echo-agent: cannot answer session/prompt: {err}");
            }
            Ok(())
        })
    }

    /// With `ECHO_AGENT_COST`: the session's cumulative cost after a turn of `words`, as a
    /// `usage_update`.
    fn report_cost(&self, cx: &Cx, id: &SessionId, words: u64) -> Result<(), Error> {
        let Some((per_word, currency)) = &self.cfg.cost else {
            return Ok(());
        };
        let total = {
            let mut spent = lock(&self.spent);
            let total = spent.entry(id.0.to_string()).or_insert(0.0);
            *total += per_word * words as f64;
            *total
        };
        let update = json!({"sessionUpdate": "usage_update", "used": 2 * words, "size": 200000,
                            "cost": {"amount": total, "currency": currency}});
        let params = json!({ "sessionId": id, "update": update });
        cx.send_notification(UntypedMessage::new("session/update", params)?)
    }

    pub(super) fn cancel(&self, notif: CancelNotification) {
        self.log_call("session/cancel", Some(&notif.session_id));
        if let Some(Some(turn)) = lock(&self.open).get(&*notif.session_id.0) {
            turn.cancel.send_replace(true);
        }
    }

    // ---- prompt turns --------------------------------------------------

    /// Streams an agent chunk and keeps it for the history (saved when the turn ends).
    pub(super) fn chunk(
        &self,
        cx: &Cx,
        id: &SessionId,
        text: impl Into<String>,
    ) -> Result<(), Error> {
        let text: String = text.into();
        let update = SessionUpdate::AgentMessageChunk(ContentChunk::new(text.into()));
        lock(&self.unsaved)
            .entry(id.0.to_string())
            .or_default()
            .push(to_json(&update));
        cx.send_notification(SessionNotification::new(id.clone(), update))
    }

    /// Runs one prompt turn (see the module documentation) and returns its
    /// stop reason.
    pub(super) async fn run_turn(
        &self,
        cx: &Cx,
        req: PromptRequest,
        turn: &mut Turn,
    ) -> Result<StopReason, Error> {
        let id = req.session_id;
        let text: String = req
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect();
        let user = SessionUpdate::UserMessageChunk(ContentChunk::new(text.clone().into()));
        self.update(&id.0, |r| r.updated_at = Utc::now())?;
        self.append_history(&id.0, [to_json(&user)])?;
        let (directives, rest) = self.cfg.defaults.parse(&text);
        if directives.meta {
            let meta = serde_json::to_string(&req.meta).unwrap_or_default();
            self.chunk(cx, &id, format!("meta: {meta}"))?;
        }
        let stop = self.stream(cx, &id, &directives, rest, turn).await?;
        self.finish(cx, &id, &text)?;
        Ok(stop)
    }

    /// The streaming part of a turn, as the directives `d` ask.
    pub(super) async fn stream(
        &self,
        cx: &Cx,
        id: &SessionId,
        d: &Directives,
        rest: &str,
        turn: &mut Turn,
    ) -> Result<StopReason, Error> {
        if d.garbage {
            // Nothing of this turn has been sent yet, and the transport
            // writes every SDK line whole under the stdout lock (see
            // `stdio_transport`), so holding that lock for the four lines
            // keeps them apart from any message, of this session or another.
            let bytes = self.cfg.long_line_bytes;
            tokio::task::spawn_blocking(move || write_stdout(garbage(bytes).as_bytes()))
                .await
                .map_err(internal)?
                .map_err(internal)?;
        }

        if d.overflow {
            let line = overflow(&id.0);
            tokio::task::spawn_blocking(move || write_stdout(line.as_bytes()))
                .await
                .map_err(internal)?
                .map_err(internal)?;
        }

        if d.state {
            let c = self.cfg.controls;
            let settings = self.read(&id.0).map(|r| r.settings).unwrap_or_default();
            for update in controls::state_updates(c, &settings) {
                let params = json!({ "sessionId": id, "update": update });
                cx.send_notification(UntypedMessage::new("session/update", params)?)?;
            }
            if c.options {
                self.update(&id.0, |r| r.settings.verbose = true)?;
            }
            let status = json!({ "sessionId": id, "stated": true });
            cx.send_notification(UntypedMessage::new("_echo/status", status)?)?;
        }

        if d.surrogate {
            self.chunk(cx, id, format!("ab{LONE_D83D}"))?;
            let title = format!("cut {LONE_D83D}");
            self.update(&id.0, |r| r.title = Some(title.clone()))?;
            let update = SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title));
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }

        if d.unknown {
            // A kind no client knows, then one under a gateway event's name.
            for update in [
                json!({ "sessionUpdate": "future_variant_x", "payload": { "n": 1 } }),
                json!({ "sessionUpdate": "turn_ended", "stopReason": "refusal" }),
            ] {
                let params = json!({ "sessionId": id, "update": update });
                cx.send_notification(UntypedMessage::new("session/update", params)?)?;
            }
        }

        if !d.suggest.is_empty() {
            // Not a type of the schema crate the SDK builds on yet: written as the wire has it.
            let suggestions: Vec<Value> = (d.suggest.iter())
                .filter(|text| *text != "-")
                .map(|text| json!({"prompt": [{"type": "text", "text": text}]}))
                .collect();
            let update =
                json!({"sessionUpdate": "prompt_suggestions_update", "suggestions": suggestions});
            let params = json!({ "sessionId": id, "update": update });
            cx.send_notification(UntypedMessage::new("session/update", params)?)?;
        }

        for (i, name) in (1..).zip(&d.tool) {
            let cwd = self
                .read(&id.0)
                .map(|r| r.cwd)
                .ok_or_else(|| not_found(id))?;
            let path = cwd.join(name).display().to_string();
            let call = format!("tool_{i}");
            let diff = json!({"type": "diff", "path": path, "oldText": null, "newText": format!("echo wrote {name}")});
            let output = json!({"type": "content", "content": {"type": "text", "text": format!("wrote {name}")}});
            for update in [
                json!({"sessionUpdate": "tool_call", "toolCallId": call, "title": format!("Edit {name}"), "kind": "edit", "status": "in_progress", "content": [diff]}),
                json!({"sessionUpdate": "tool_call_update", "toolCallId": call, "status": "completed", "content": [output]}),
            ] {
                let params = json!({ "sessionId": id, "update": update });
                cx.send_notification(UntypedMessage::new("session/update", params)?)?;
            }
        }

        if d.fs {
            let params = json!({ "sessionId": id, "path": "/etc/hostname" });
            let request = UntypedMessage::new("fs/read_text_file", params)?;
            let outcome = match cx.send_request(request).block_task().await {
                Ok(_) => "fs: ok ".to_string(),
                Err(e) => format!("fs: error {} ", i32::from(e.code)),
            };
            self.chunk(cx, id, outcome)?;
        }

        if d.provider {
            let text = match &*lock(&self.provider) {
                Some(p) => {
                    let headers = p["headers"].as_object().cloned().unwrap_or_default();
                    let mut shown: Vec<String> = (headers.iter())
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect();
                    shown.sort();
                    let (id, url) = (&p["providerId"], &p["baseUrl"]);
                    let (id, url) = (id.as_str().unwrap_or(""), url.as_str().unwrap_or(""));
                    format!("provider {id} {url} {}", shown.join(" "))
                }
                None => "provider none".to_string(),
            };
            self.chunk(cx, id, text)?;
        }

        for name in &d.env {
            let text = match std::env::var_os(name) {
                Some(value) => format!("{name}={}", value.to_string_lossy()),
                None => format!("{name} unset"),
            };
            self.chunk(cx, id, text)?;
        }

        for other in &d.spoof {
            let other = SessionId::new(other.as_str());
            self.chunk(cx, &other, "spoofed".to_string())?;
            let fields = ToolCallUpdateFields::new().title("spoofed".to_string());
            let options = vec![PermissionOption::new(
                "allow",
                "Allow",
                PermissionOptionKind::AllowOnce,
            )];
            let tool_call = ToolCallUpdate::new("call_spoof", fields);
            let request = RequestPermissionRequest::new(other.clone(), tool_call, options);
            let outcome = match cx.send_request(request).block_task().await {
                Ok(_) => "spoof: asked".to_string(),
                Err(e) => format!("spoof: refused {}", i32::from(e.code)),
            };
            self.chunk(cx, id, outcome)?;
            let params = json!({"mode": "form", "sessionId": other, "message": "spoofed",
                "requestedSchema": {"type": "object", "properties": {}}});
            let request = UntypedMessage::new("elicitation/create", params)?;
            let outcome = match cx.send_request(request).block_task().await {
                Ok(_) => "spoof: elicited".to_string(),
                Err(e) => format!("spoof: elicitation refused {}", i32::from(e.code)),
            };
            self.chunk(cx, id, outcome)?;
        }

        if d.pwd {
            let text = match std::env::current_dir() {
                Ok(dir) => dir.display().to_string(),
                Err(e) => format!("pwd: error {e}"),
            };
            self.chunk(cx, id, text)?;
        }

        if !(d.link.is_empty() && d.write.is_empty() && d.read.is_empty()) {
            let cwd = self
                .read(&id.0)
                .map(|r| r.cwd)
                .ok_or_else(|| not_found(id))?;
            for (name, target) in &d.link {
                let text = match std::os::unix::fs::symlink(target, cwd.join(name)) {
                    Ok(()) => format!("linked {name}"),
                    Err(e) => format!("link {name}: error {e}"),
                };
                self.chunk(cx, id, text)?;
            }
            for name in &d.write {
                let path = cwd.join(name);
                let written = path
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::write(&path, format!("echo wrote {name}")));
                let text = match written {
                    Ok(()) => format!("wrote {name}"),
                    Err(e) => format!("write {name}: error {e}"),
                };
                self.chunk(cx, id, text)?;
            }
            for name in &d.read {
                let text = match std::fs::read_to_string(cwd.join(name)) {
                    Ok(text) => format!("read {name}: {text}"),
                    Err(e) => format!("read {name}: error {e}"),
                };
                self.chunk(cx, id, text)?;
            }
        }

        if d.permission || d.permission_for.is_some() {
            let fields = ToolCallUpdateFields::new()
                .title("echo wants to write a file".to_string())
                .kind(ToolKind::Edit)
                .status(ToolCallStatus::Pending);
            let options = vec![
                PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
                PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
            ];
            let tool_call = ToolCallUpdate::new("call_1", fields);
            let request = RequestPermissionRequest::new(id.clone(), tool_call, options);
            // On cancel, or past `/permission-for`, the pending request is dropped, which makes
            // the SDK send `$/cancel_request` for it.
            let wait = Duration::from_millis(d.permission_for.unwrap_or(0));
            let answer = tokio::select! {
                answer = cx.send_request(request).block_task() => answer?,
                () = turn.cancelled() => return Ok(StopReason::Cancelled),
                () = tokio::time::sleep(wait), if d.permission_for.is_some() => {
                    self.chunk(cx, id, "permission: withdrawn")?;
                    return Ok(StopReason::EndTurn);
                }
            };
            let RequestPermissionOutcome::Selected(selected) = answer.outcome else {
                return Ok(StopReason::Cancelled);
            };
            self.chunk(cx, id, format!("permission: {}", selected.option_id))?;
        }

        if let Some(n) = d.permissions {
            let mut asked: futures::stream::FuturesUnordered<_> = (1..=n)
                .map(|i| {
                    let call = format!("call_{i}");
                    let fields = ToolCallUpdateFields::new()
                        .title(format!("echo wants to write file {i}"))
                        .kind(ToolKind::Edit)
                        .status(ToolCallStatus::Pending);
                    let options = vec![
                        PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
                        PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
                    ];
                    let tool_call = ToolCallUpdate::new(call.clone(), fields);
                    let request = RequestPermissionRequest::new(id.clone(), tool_call, options);
                    let answer = cx.send_request(request).block_task();
                    async move { (call, answer.await) }
                })
                .collect();
            loop {
                let (call, answer) = tokio::select! {
                    next = futures::StreamExt::next(&mut asked) => match next {
                        Some(answered) => answered,
                        None => break,
                    },
                    () = turn.cancelled() => return Ok(StopReason::Cancelled),
                };
                let outcome = match answer {
                    Ok(answer) => match answer.outcome {
                        RequestPermissionOutcome::Selected(s) => s.option_id.to_string(),
                        _ => "cancelled".to_string(),
                    },
                    Err(e) => format!("error {}", i32::from(e.code)),
                };
                self.chunk(cx, id, format!("permission {call}: {outcome}"))?;
            }
        }

        if d.elicit || d.elicit_url {
            return self.elicit(cx, id, turn, d.elicit_url).await;
        }

        if d.crash {
            self.chunk(cx, id, "crashing")?;
            eprintln!("echo-agent: crashing mid-turn");
            // Give the SDK's writer a moment to put the chunk on stdout.
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::process::exit(3);
        }

        if d.deaf {
            // Holds the responder forever and never looks at `turn`: neither
            // `session/cancel`, `$/cancel_request` nor closing the session
            // (which drops the turn's cancel sender) can end this.
            return std::future::pending().await;
        }

        if d.hang {
            turn.cancelled().await;
            return Ok(StopReason::Cancelled);
        }

        let mut parts: Vec<String> = match (d.bytes, d.chunks) {
            (Some(n), _) => vec!["x".repeat(n)],
            (None, Some(n)) => (1..=n).map(|i| format!("c{i}")).collect(),
            (None, None) => rest.split_whitespace().map(str::to_string).collect(),
        };
        if parts.is_empty() && d.chunks.is_none() {
            parts.push("(empty)".into());
        }
        let last = parts.len().saturating_sub(1);
        for (i, part) in parts.into_iter().enumerate() {
            if d.delay_ms > 0 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(d.delay_ms)) => {}
                    () = turn.cancelled() => return Ok(StopReason::Cancelled),
                }
            }
            if turn.is_cancelled() {
                return Ok(StopReason::Cancelled);
            }
            self.chunk(cx, id, if i < last { part + " " } else { part })?;
        }
        Ok(StopReason::EndTurn)
    }

    /// `/elicit` (a form) or `/elicit-url` (`url`): asks the client, when it declared that
    /// mode of elicitation, streams what it answered and ends the turn.
    pub(super) async fn elicit(
        &self,
        cx: &Cx,
        id: &SessionId,
        turn: &mut Turn,
        url: bool,
    ) -> Result<StopReason, Error> {
        let declared = if url {
            &self.elicitation_url
        } else {
            &self.elicitation_form
        };
        if !declared.load(Ordering::SeqCst) {
            self.chunk(cx, id, "elicitation: unsupported")?;
            return Ok(StopReason::EndTurn);
        }
        let params = if url {
            json!({
                "mode": "url",
                "sessionId": id,
                "message": "Sign in to echo",
                "elicitationId": ECHO_ELICITATION_ID,
                "url": "https://example.org/echo-login",
            })
        } else {
            json!({
                "mode": "form",
                "sessionId": id,
                "message": "Tell echo about yourself",
                "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "title": "Name", "minLength": 2},
                        "age": {"type": "integer", "minimum": 0, "maximum": 150},
                        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                        "subscribe": {"type": "boolean"},
                        "color": {"type": "string", "enum": ["red", "green", "blue"]},
                    },
                    "required": ["name", "age"],
                },
            })
        };
        let request = UntypedMessage::new("elicitation/create", params)?;
        // On cancel the pending request is dropped, which makes the SDK
        // send `$/cancel_request` for it.
        let answer = tokio::select! {
            answer = cx.send_request(request).block_task() => answer,
            () = turn.cancelled() => return Ok(StopReason::Cancelled),
        };
        let (text, stop) = match answer {
            Ok(answer) => match (answer["action"].as_str(), &answer["content"]) {
                (Some("accept"), Value::Null) => {
                    ("elicitation: accept".into(), StopReason::EndTurn)
                }
                (Some("accept"), content) => (
                    format!("elicitation: accept {content}"),
                    StopReason::EndTurn,
                ),
                (Some("cancel"), _) => ("elicitation: cancel".into(), StopReason::Cancelled),
                (Some(action), _) => (format!("elicitation: {action}"), StopReason::EndTurn),
                (None, _) => (format!("elicitation: {answer}"), StopReason::EndTurn),
            },
            Err(e) => (
                format!("elicitation: error {}", i32::from(e.code)),
                StopReason::EndTurn,
            ),
        };
        if url && text == "elicitation: accept" {
            // The user went to the URL: the interaction there is over at once.
            let done = json!({ "elicitationId": ECHO_ELICITATION_ID });
            cx.send_notification(UntypedMessage::new("elicitation/complete", done)?)?;
        }
        self.chunk(cx, id, text)?;
        Ok(stop)
    }

    /// Ends a turn: bumps `updatedAt` and gives an untitled session its title.
    pub(super) fn finish(&self, cx: &Cx, id: &SessionId, text: &str) -> Result<(), Error> {
        let now = Utc::now();
        let mut new_title = None;
        let chunks = lock(&self.unsaved).remove(&*id.0).unwrap_or_default();
        self.append_history(&id.0, chunks)?;
        self.update(&id.0, |r| {
            r.updated_at = now;
            if r.title.is_none() {
                let head: String = text.trim().chars().take(40).collect();
                let title = format!("Echo: {}", head.trim_end());
                r.title = Some(title.clone());
                new_title = Some(title);
            }
        })?;
        if let Some(title) = new_title
            && self.is_open(&id.0)
        {
            let update = SessionInfoUpdate::new()
                .title(title)
                .updated_at(timestamp(now));
            let update = SessionUpdate::SessionInfoUpdate(update);
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }
        Ok(())
    }
}
