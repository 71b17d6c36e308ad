//! Session metadata and lifecycle: list, create, read, rename, delete, status, resume, close,
//! archive.

use serde_json::json;

use super::caller::{Caller, owner_of};
use super::clock::now;
use super::cursor::decode_cursor;
use super::error::Error;
use super::event::{GatewayEvent, GatewayLifecycleEvent, SessionDeleted};
use super::input::{SessionId, validate_abs_path};
use super::output::{Activity, SessionView, Status, StatusView};
use super::parts::info_update::apply_info_update;
use super::parts::live::Busy;
use super::parts::use_case;
use super::portable::read_only;
use super::sync::ListSync;
use crate::agent_rpc::CallError;
use crate::agent_rpc::caps::Capabilities;
use crate::cluster::Holder;
use crate::config::WhoAnswers;
use crate::store::ListQuery;

/// Which sessions `GET /sessions` lists.
#[derive(Debug, Default)]
pub struct SessionFilter {
    /// Only sessions with exactly this working directory.
    pub cwd: Option<String>,
    /// `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1–200 (default 50).
    pub limit: Option<i64>,
    /// `true`: only archived sessions; default: only non-archived.
    pub archived: Option<bool>,
    /// `true`: sync the cache with the agent's `session/list` first.
    pub refresh: bool,
    /// Only the sessions of this agent.
    pub agent: Option<String>,
    /// Only the sessions this user created (`me`: the caller).
    pub owner: Option<String>,
}

use_case! {
    /// The use case of a session's metadata and lifecycle, with the parts it needs.
    pub struct Sessions {
        parts: [placement, records, views, requests, log, workspaces],
        /// `GET /sessions?refresh=true` syncs first.
        sync: ListSync,
    }
}

impl Sessions {
    /// `GET /sessions`: the page's JSON (a `SessionPage`).
    pub async fn list_sessions(
        &self,
        caller: &Caller,
        filter: SessionFilter,
        fresh: bool,
    ) -> Result<Vec<u8>, Error> {
        let tenant = caller.scope().map(str::to_owned);
        let limit = filter.limit.unwrap_or(50);
        if !(1..=200).contains(&limit) {
            return Err(Error::Malformed("limit must be between 1 and 200".into()));
        }
        if let Some(cwd) = &filter.cwd {
            validate_abs_path("cwd", cwd)?;
        }
        if filter.refresh {
            self.sync.sync(filter.agent.as_deref()).await?;
        }
        let owner = match filter.owner.as_deref() {
            Some("me") => Some(caller.user.as_ref().map(|u| u.id.clone()).ok_or_else(|| {
                Error::Malformed(
                    "owner=me: the key or token of this request names no user (TENANT/USER:KEY, or a token with a sub)".into(),
                )
            })?),
            _ => filter.owner,
        };
        let mut query = ListQuery {
            agent: filter.agent,
            owner,
            tenant,
            cwd: filter.cwd,
            archived: filter.archived,
            after: None,
            limit,
        };
        query.after = filter
            .cursor
            .as_deref()
            .map(|c| decode_cursor(&query, c))
            .transpose()?;
        let page = self.records.list_page(&query, fresh).await?;
        // Sessions live on other replicas are live too (their activity is theirs to tell).
        let not_here: Vec<&str> = page
            .ids()
            .iter()
            .map(String::as_str)
            .filter(|id| !self.placement.live().here(id))
            .collect();
        let elsewhere = self
            .placement
            .cluster()
            .held_elsewhere_among(&not_here)
            .await?;
        Ok(page.render(|id| match self.views.status_of(id) {
            (Status::Saved, _) if elsewhere.contains(id) => (Status::Live, None),
            here => here,
        }))
    }

    /// `GET /sessions/{id}`.
    pub async fn get_session(&self, caller: &Caller, id: &SessionId) -> Result<SessionView, Error> {
        self.views
            .view_with_state(&self.records.get(caller, id).await?)
            .await
    }

    /// `PATCH /sessions/{id}`: the title (`Some(None)` clears it), through `session/set_title`
    /// when advertised; who answers, which only the owner or an admin may change.
    pub async fn patch_session(
        &self,
        caller: &Caller,
        id: &SessionId,
        title: Option<Option<String>>,
        who_answers: Option<WhoAnswers>,
    ) -> Result<SessionView, Error> {
        let record = self.records.get(caller, id).await?;
        if who_answers.is_some() && !caller.admin && !caller.is(&owner_of(&record)) {
            return Err(Error::Forbidden(
                "only the session's owner (or an admin) may change who answers".into(),
            ));
        }
        let record = match who_answers {
            Some(who) => {
                let value = Some(who.as_str().to_owned());
                self.views
                    .update_cached(id.as_str(), &|r| r.people.who_answers = value.clone())
                    .await?
                    .ok_or_else(|| Error::NotFound(format!("no session {}", id.as_str())))?
            }
            None => record,
        };
        let Some(mut title) = title else {
            self.views.updated(&record).await;
            return Ok(self.views.view(&record));
        };
        // An agent this replica does not run: 503, not a change the agent never sees.
        self.placement.agent_named(&record.agent)?;
        let set_title = self.placement.caps(&record.agent).set_title;
        if set_title && title.is_none() {
            // session/set_title takes a string, and the agent's list would bring the old
            // title back at the next sync: clearing it only here would be a lie.
            return Err(Error::Invalid(
                "this agent keeps session titles itself and cannot clear one: set another title"
                    .into(),
            ));
        }
        if let (true, Some(t)) = (set_title, &title) {
            let agent = self.placement.client_for(&record).await?;
            if let Some(stored) = agent.set_title(id.as_str(), t).await? {
                title = Some(stored);
            }
        }
        let update = json!({ "title": title });
        let at = now();
        let record = self
            .views
            .update_cached(id.as_str(), &|r| apply_info_update(r, &update, at))
            .await?
            .ok_or_else(|| Error::NotFound(format!("no session {}", id.as_str())))?;
        self.views.updated(&record).await;
        Ok(self.views.view(&record))
    }

    /// `DELETE /sessions/{id}`: idempotent.
    pub async fn delete_session(&self, caller: &Caller, id: &SessionId) -> Result<(), Error> {
        // Another tenant's session, or (for a tenant) an id the cache does not know: exactly
        // as for an unknown id, 204 and no effect.
        let existing = self.records.rows().get_session(id.as_str()).await?;
        match &existing {
            Some(r) if !caller.sees(&r.tenant) => return Ok(()),
            None if !caller.admin => return Ok(()),
            _ => {}
        }
        // An id only an admin can delete without a row (or whose bare tombstone names no
        // agent): the default agent's, if anyone's. A live session's agent must be one this
        // replica runs (503 otherwise, not a delete its agent never hears of).
        let agent_name = match &existing {
            Some(r) if !r.agent.is_empty() => r.agent.clone(),
            _ => self.placement.agents().default_agent().name().to_owned(),
        };
        // An imported transcript's agent never heard of it: it is only the gateway's to delete.
        let transcript = existing.as_ref().is_some_and(|r| read_only(r).is_some());
        if existing.as_ref().is_some_and(|r| r.deleted_at.is_none()) && !transcript {
            self.placement.agent_named(&agent_name)?;
        }
        // A session another live replica holds is deleted there, which closes it first (a
        // request forwarded here as that replica took the session over comes back 503).
        if let Some(Holder::Other(_)) = self.placement.cluster().holder(id.as_str()).await? {
            return Err(Error::HeldElsewhere(
                "another gateway replica holds this session now; retry shortly".into(),
            ));
        }
        let caps = match transcript {
            true => Capabilities::default(),
            false => self.placement.caps(&agent_name),
        };
        self.requests.cancel_session(id.as_str()).await;
        let live = self
            .placement
            .detach(id.as_str())
            .await
            .and_then(|m| self.placement.client(m));
        if let Some(agent) = live {
            if caps.close {
                if let Err(e) = agent.close_session(id.as_str()).await {
                    tracing::warn!(session = id.as_str(), error = %e, "session/close before delete failed");
                }
            } else {
                let _ = agent.cancel(id.as_str()).await;
            }
        }
        let tenant = existing
            .as_ref()
            .map_or(caller.tenant.as_str(), |r| r.tenant.as_str());
        let tombstoned = self
            .records
            .rows()
            .tombstone_session(id.as_str(), tenant, now())
            .await?;
        self.records.sessions_changed();
        if tombstoned {
            let deleted = SessionDeleted {
                session_id: id.as_str().to_owned(),
                agent: None,
                reason: None,
            };
            let deleted = GatewayEvent::SessionDeleted(deleted);
            self.log.append(id.as_str(), deleted).await;
            if let Some(r) = &existing {
                let deleted = GatewayLifecycleEvent::deleted(r, None);
                self.log.lifecycle(r, deleted).await;
            }
        }
        if caps.delete {
            let agent = self.placement.any_client(&agent_name).await?;
            match agent.delete_session(id.as_str()).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let here = !self.placement.is_remote(&agent_name);
        self.workspaces.remove(id.as_str(), here).await;
        Ok(())
    }

    /// `GET /sessions/{id}/status`: never loads, resumes or creates anything.
    pub async fn status(&self, caller: &Caller, id: &SessionId) -> Result<StatusView, Error> {
        let view = |status, activity| StatusView {
            session_id: id.as_str().to_owned(),
            status,
            activity,
        };
        // A live session's owner is in memory: no store read (the common, hot case).
        let (status, activity) = self.views.status_if_owner(id.as_str(), |t| caller.sees(t));
        if status == Status::Live {
            return Ok(view(status, activity));
        }
        let record = self.records.rows().get_session(id.as_str()).await?;
        // Another tenant's session is not_found; so is, for a tenant, an id the cache does not
        // know (sessions only the agent knows belong to the admin).
        let visible = match &record {
            Some(r) => caller.sees(&r.tenant),
            None => caller.admin,
        };
        if !visible || record.as_ref().is_some_and(|r| r.deleted_at.is_some()) {
            return Ok(view(Status::NotFound, None));
        }
        let (status, activity) = self.views.status_of(id.as_str());
        if status == Status::Live {
            return Ok(view(status, activity));
        }
        let agent_name = record.as_ref().map_or_else(
            || self.placement.agents().default_agent().name().to_owned(),
            |r| r.agent.clone(),
        );
        let probe = (self.placement.caps(&agent_name).status)
            .then(|| self.placement.ready_client(&agent_name))
            .flatten();
        if let Some(agent) = probe {
            match agent.session_open(id.as_str()).await {
                Ok(open) => {
                    let status = if open { Status::Live } else { Status::Saved };
                    let activity = (status == Status::Live).then_some(Activity::Idle);
                    return Ok(view(status, activity));
                }
                Err(e) if e.is_not_found() => return Ok(view(Status::NotFound, None)),
                Err(e) => {
                    tracing::warn!(error = %e, "session/status failed; answering from the cache")
                }
            }
        }
        Ok(match record {
            Some(_) => view(Status::Saved, None),
            None => view(Status::NotFound, None),
        })
    }

    /// `POST /sessions/{id}/resume`.
    pub async fn resume(&self, caller: &Caller, id: &SessionId) -> Result<SessionView, Error> {
        let (record, vanished) = self.records.get_to_use(caller, id).await?;
        if self.views.status_of(id.as_str()).0 != Status::Live {
            let _claim = self
                .placement
                .claim_waiting(id.as_str(), Busy::Attaching)
                .await?;
            self.placement.ensure_live(&record).await?;
        }
        if vanished {
            self.views.revive(&record, "resumed").await?;
        }
        Ok(self.views.view(&record))
    }

    /// `POST /sessions/{id}/close`.
    pub async fn close(&self, caller: &Caller, id: &SessionId) -> Result<(), Error> {
        let record = self.records.get(caller, id).await?;
        let Some(member) = self.placement.live().member(id.as_str()) else {
            return Ok(());
        };
        if !self.placement.caps(&record.agent).close {
            let method = agent_client_protocol_schema::v1::AGENT_METHOD_NAMES.session_close;
            return Err(CallError::Unsupported(method).into());
        }
        // Pending permission requests and elicitations are answered first, so that their
        // `*_resolved` comes before the `turn_ended` that closing causes.
        self.requests.cancel_session(id.as_str()).await;
        if let Some(agent) = self.placement.client(member) {
            agent.close_session(id.as_str()).await?;
        }
        self.placement.detach(id.as_str()).await;
        let saved = GatewayLifecycleEvent::status(&record, Status::Saved, None);
        self.log.lifecycle(&record, saved).await;
        Ok(())
    }

    /// `POST /sessions/{id}/archive` and `/unarchive`. Archived sessions are listed only with
    /// `archived=true` and must be unarchived before they are prompted or resumed. Through
    /// `session/archive`/`session/unarchive` when the agent advertises them (archiving frees
    /// the session on the agent, as a close); else in the cache only, a live session being
    /// closed when the agent can close. A running turn must end first (409).
    pub async fn set_archived(
        &self,
        caller: &Caller,
        id: &SessionId,
        archived: bool,
    ) -> Result<SessionView, Error> {
        let record = self.records.get(caller, id).await?;
        self.placement.agent_named(&record.agent)?;
        let _claim = self
            .placement
            .claim_waiting(id.as_str(), Busy::Attaching)
            .await?;
        let caps = self.placement.caps(&record.agent);
        let live = self.placement.client_if_live(id.as_str());
        if archived && live.is_some() {
            self.requests.cancel_session(id.as_str()).await;
        }
        if caps.archive {
            let agent = self.placement.client_for(&record).await?;
            agent.set_archived(id.as_str(), archived).await?;
        } else if let (true, Some(agent), true) = (archived, &live, caps.close) {
            agent.close_session(id.as_str()).await?;
        }
        let freed = archived
            && (caps.archive || caps.close)
            && self.placement.detach(id.as_str()).await.is_some();
        let record = self
            .views
            .update_cached(id.as_str(), &|r| r.archived = archived)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no session {}", id.as_str())))?;
        if freed {
            let saved = GatewayLifecycleEvent::status(&record, Status::Saved, None);
            self.log.lifecycle(&record, saved).await;
        }
        self.views.updated(&record).await;
        Ok(self.views.view(&record))
    }
}
