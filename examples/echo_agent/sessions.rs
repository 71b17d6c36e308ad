//! The session methods besides new and fork: load, resume, close, list, status, title,
//! archive and delete.

use super::*;

impl EchoAgent {
    /// Replays the history as `session/update`s (before the response, which
    /// the caller sends), then opens the session.
    pub(super) fn load(
        &self,
        cx: &Cx,
        req: LoadSessionRequest,
    ) -> Result<LoadSessionResponse, Error> {
        let id = &req.session_id;
        self.enter("session/load", Some(id), Some("load"))?;
        self.require_auth()?;
        self.read(&id.0).ok_or_else(|| not_found(id))?;
        for update in self.history(&id.0) {
            let params = json!({ "sessionId": id, "update": update });
            cx.send_notification(UntypedMessage::new("session/update", params)?)?;
        }
        self.open_session(id);
        Ok(LoadSessionResponse::new())
    }

    pub(super) async fn resume(
        &self,
        req: ResumeSessionRequest,
    ) -> Result<ResumeSessionResponse, Error> {
        let id = &req.session_id;
        self.enter("session/resume", Some(id), Some("resume"))?;
        tokio::time::sleep(Duration::from_millis(self.cfg.resume_delay_ms)).await;
        self.require_auth()?;
        self.read(&id.0).ok_or_else(|| not_found(id))?;
        self.open_session(id);
        Ok(ResumeSessionResponse::new())
    }

    pub(super) fn close(&self, req: CloseSessionRequest) -> Result<CloseSessionResponse, Error> {
        self.enter("session/close", Some(&req.session_id), Some("close"))?;
        self.close_session(&req.session_id.0);
        Ok(CloseSessionResponse::new())
    }

    pub(super) fn list(&self, req: ListSessionsRequest) -> Result<ListSessionsResponse, Error> {
        self.enter("session/list", None, Some("list"))?;
        self.require_auth()?;
        let offset = match &req.cursor {
            None => 0,
            Some(cursor) => URL_SAFE_NO_PAD
                .decode(cursor)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok()?.parse::<usize>().ok())
                .ok_or_else(|| invalid("invalid cursor"))?,
        };
        let mut records = self.all();
        records.retain(|r| req.cwd.as_ref().is_none_or(|cwd| &r.cwd == cwd));
        let archive = self.cfg.caps.contains("archive");
        match (archive, req.archived.as_ref()) {
            (true, Some(SessionArchiveFilter::Include)) => {}
            (true, Some(SessionArchiveFilter::Only)) => records.retain(|r| r.archived),
            (true, Some(SessionArchiveFilter::Other(other))) => {
                return Err(invalid(&format!("unknown archived filter {other:?}")));
            }
            _ => records.retain(|r| !r.archived),
        }
        records.sort_by(|a, b| (b.updated_at, &b.session_id).cmp(&(a.updated_at, &a.session_id)));
        // Synthetic sessions are older than any real one: they come after them.
        let only_archived = archive && matches!(req.archived, Some(SessionArchiveFilter::Only));
        let synthetic = match &req.cwd {
            _ if only_archived => 0,
            Some(cwd) if cwd != Path::new(SYNTHETIC_CWD) => 0,
            _ => self.synthetic_sessions(),
        };
        let total = records.len() + synthetic;
        let end = offset.saturating_add(self.cfg.page_size).min(total);
        let page = (offset.min(end)..end).map(|i| match records.get(i) {
            Some(r) => SessionInfo::new(r.session_id.clone(), r.cwd.clone())
                .additional_directories(r.additional_directories.clone())
                .title(r.title.clone())
                .updated_at(timestamp(r.updated_at))
                .archived(archive.then_some(r.archived))
                .meta(r.meta.clone()),
            None => synthetic_session(i - records.len()).archived(archive.then_some(false)),
        });
        let next = (end < total).then(|| URL_SAFE_NO_PAD.encode(end.to_string()));
        Ok(ListSessionsResponse::new(page.collect()).next_cursor(next))
    }

    pub(super) fn status(&self, req: SessionStatusRequest) -> Result<SessionStatusResponse, Error> {
        let id = &req.session_id;
        self.enter("session/status", Some(id), Some("status"))?;
        let status = if self.is_open(&id.0) {
            SessionStatus::Open
        } else if self.path(&id.0).is_some_and(|p| p.exists()) {
            SessionStatus::Saved
        } else {
            return Err(not_found(id));
        };
        Ok(SessionStatusResponse::new(status))
    }

    pub(super) fn set_title(
        &self,
        cx: &Cx,
        req: SetSessionTitleRequest,
    ) -> Result<SetSessionTitleResponse, Error> {
        let id = req.session_id;
        self.enter("session/set_title", Some(&id), Some("title"))?;
        let title = req.title.trim().to_string();
        if title.is_empty() {
            return Err(invalid("title must not be empty"));
        }
        self.update(&id.0, |r| r.title = Some(title.clone()))?
            .ok_or_else(|| not_found(&id))?;
        let update =
            SessionUpdate::SessionInfoUpdate(SessionInfoUpdate::new().title(title.clone()));
        cx.send_notification(SessionNotification::new(id, update))?;
        Ok(SetSessionTitleResponse::new(title))
    }

    /// Closes the session here and removes its file; unknown ids are fine.
    pub(super) fn set_archived(
        &self,
        id: &SessionId,
        method: &str,
        archived: bool,
    ) -> Result<(), Error> {
        self.enter(method, Some(id), Some("archive"))?;
        if archived {
            self.close_session(&id.0);
        }
        self.update(&id.0, |r| r.archived = archived)?
            .ok_or_else(|| not_found(id))?;
        Ok(())
    }

    pub(super) fn delete(&self, req: DeleteSessionRequest) -> Result<DeleteSessionResponse, Error> {
        let id = &req.session_id;
        self.enter("session/delete", Some(id), Some("delete"))?;
        self.close_session(&id.0);
        let _guard = lock(&self.files);
        let files = [self.path(&id.0), self.history_path(&id.0)];
        for path in files.into_iter().flatten() {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(internal(e)),
                _ => {}
            }
        }
        Ok(DeleteSessionResponse::new())
    }
}
