//! The use cases that carry a session out of the gateway and into one:
//! `GET /sessions/{id}/export` (JSON Lines, or a Markdown transcript) and
//! `POST /sessions/import`. An export is read from the log a page at a time up to where the
//! session's state was when it began, so a session of any length leaves in constant memory and
//! a turn running meanwhile does not make it endless. An import writes the session whole, in
//! one transaction, or nothing.

use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{Value, json};

use super::caller::Caller;
use super::clock::now;
use super::error::Error;
use super::event::GatewayLifecycleEvent;
use super::input::SessionId;
use super::markdown::Markdown;
use super::output::SessionView;
use super::parts::log::Log;
use super::parts::use_case;
use super::portable::{
    EXPORT_FORMAT, EXPORT_VERSION, ExportEnd, ExportHeader, ExportTotals, ExportedEvent,
    IMPORT_META, Imported,
};
use crate::store::{Origin, People, SessionRecord, Store, StoredEvent};

/// Events read from the log at a time.
const PAGE: i64 = 500;

/// What an export is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// `application/x-ndjson`: the header, every event, the end.
    Lines,
    /// `text/markdown`: a transcript for people.
    Markdown,
}

use_case! {
    /// Exports and imports.
    pub struct Transcripts {
        parts: [records, log, states, views, placement],
        store: Arc<dyn Store>,
    }
}

impl Transcripts {
    /// `GET /sessions/{id}/export`: the session's export, a piece at a time (an error ends
    /// it early, which the missing end line of JSON Lines shows).
    pub async fn export(
        &self,
        caller: &Caller,
        id: &SessionId,
        format: ExportFormat,
    ) -> Result<BoxStream<'static, Result<String, Error>>, Error> {
        let record = self.records.get(caller, id).await?;
        // Events queued before this request (a turn just answered) are exported too.
        self.log.flush().await;
        let state = self.states.state_of(id.as_str()).await?;
        let upto = state.seq;
        let session = self.views.view(&record);
        let pages = pages(self.log.clone(), id.as_str().to_owned(), upto);
        Ok(match format {
            ExportFormat::Lines => {
                let header = ExportHeader {
                    format: EXPORT_FORMAT.into(),
                    version: EXPORT_VERSION,
                    exported_at: now(),
                    session,
                    state,
                };
                let (mut count, mut last_seq) = (0u64, 0);
                let events = pages.map(move |page| {
                    let (page, last) = page?;
                    count += page.len() as u64;
                    last_seq = page.last().map_or(last_seq, |e| e.seq);
                    let mut out = String::new();
                    for e in page {
                        out.push_str(&line(&ExportedEvent::of(e)));
                    }
                    if last {
                        let end = ExportEnd {
                            end: ExportTotals {
                                events: count,
                                last_seq,
                            },
                        };
                        out.push_str(&line(&end));
                    }
                    Ok(out)
                });
                stream::once(async move { Ok(line(&header)) })
                    .chain(events)
                    .boxed()
            }
            ExportFormat::Markdown => {
                let (mut markdown, title) = Markdown::start(&session);
                let events = pages.map(move |page| {
                    let (page, last) = page?;
                    let mut out: String = page.iter().map(|e| markdown.event(e)).collect();
                    if last {
                        out.push_str(&markdown.close());
                    }
                    Ok(out)
                });
                stream::once(async move { Ok(title) }).chain(events).boxed()
            }
        })
    }

    /// `POST /sessions/import`: a new session of the caller's tenant from an export. An
    /// admin's import keeps the session's id when its agent runs here and can load or resume
    /// sessions, and no session here has the id but one found in the agent's list with an
    /// empty log (which the import fills): a prompt then makes it live as for any saved
    /// session. Any other import gets a new id and is a read-only transcript, which says why (a
    /// tenant's import cannot keep an id: the agent would load whatever session of another
    /// tenant's it names).
    pub async fn import(&self, caller: &Caller, body: &[u8]) -> Result<SessionView, Error> {
        let Imported { header, mut events } = Imported::parse(body)?;
        let from = header.session.session_id.clone();
        let agent = header.session.agent.clone();
        let (why, tenant) = match SessionId::parse(&from) {
            Ok(_) => self.cannot_load(caller, &from, &agent).await?,
            Err(_) => (Some(format!("{from:?} is not a session id")), None),
        };
        let id = match why {
            None => from.clone(),
            Some(_) => format!("sess_{}", uuid::Uuid::new_v4().simple()),
        };
        if id != from {
            for e in &mut events {
                e.payload = with_session_id(e, &id);
            }
        }
        let mut meta = match header.session.meta {
            Some(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        meta.insert(
            IMPORT_META.into(),
            json!({"from": from, "at": now(), "readOnly": why.is_some(), "why": why}),
        );
        let at = now();
        let record = SessionRecord {
            session_id: id.clone(),
            tenant: tenant.unwrap_or_else(|| caller.tenant.clone()),
            cwd: header.session.cwd,
            additional_directories: header.session.additional_directories,
            title: header.session.title,
            updated_at: at,
            created_at: at,
            meta: Some(Value::Object(meta)),
            archived: false,
            origin: Origin::Gateway,
            deleted_at: None,
            synced_at: None,
            listed: None,
            agent,
            people: People {
                owner: caller.user.as_ref().map(|u| u.id.clone()),
                owner_name: caller.user.as_ref().and_then(|u| u.name.clone()),
                who_answers: None,
            },
        };
        let state = serde_json::to_value(&header.state.state).expect("a state serialises");
        // A log retention emptied may hold no event up to the state's position: the counter
        // goes on from the later of the two.
        let state = (header.state.seq > 0).then_some((header.state.seq, &state));
        let adopt = why.is_none();
        if !(self.store)
            .import_session(&record, &events, state, adopt)
            .await?
        {
            return Err(Error::Conflict(format!(
                "a session {id} was made here meanwhile; import the export again"
            )));
        }
        self.records.sessions_changed();
        let view = self.views.view_with_state(&record).await?;
        let created = GatewayLifecycleEvent::created(&record, view.clone());
        self.log.lifecycle(&record, created).await;
        Ok(view)
    }

    /// Why the session `id` of `agent` cannot go on here (`None`: it can, as far as the
    /// gateway can tell before the agent loads it), and the tenant of the row found in the
    /// agent's list that the import would fill.
    async fn cannot_load(
        &self,
        caller: &Caller,
        id: &str,
        agent: &str,
    ) -> Result<(Option<String>, Option<String>), Error> {
        let no = |why: String| Ok((Some(why), None));
        if !caller.admin {
            return no("only an admin's import keeps a session's id for its agent to load".into());
        }
        let tenant = match self.store.get_session(id).await? {
            None => None,
            Some(r) if r.origin == Origin::Upstream && r.deleted_at.is_none() => {
                if self.store.last_event_seq(id).await? > 0 {
                    return no(format!(
                        "the session {id} is here already, with its own events"
                    ));
                }
                Some(r.tenant)
            }
            Some(_) => return no(format!("a session {id} exists here already")),
        };
        if self.placement.agent_named(agent).is_err() {
            return no(format!("no agent {agent:?} runs here"));
        }
        let caps = self.placement.caps(agent);
        if !(caps.load || caps.resume) {
            return no(format!(
                "the agent {agent:?} can neither load nor resume sessions"
            ));
        }
        Ok((None, tenant))
    }
}

/// The log of `session_id` up to `upto`, a page at a time, each with whether it is the last
/// (an empty log is one empty page, so that an export always has its end).
fn pages(
    log: Log,
    session_id: String,
    upto: i64,
) -> impl futures::Stream<Item = Result<(Vec<StoredEvent>, bool), Error>> + Send + 'static {
    stream::try_unfold(Some(0i64), move |after| {
        let (log, id) = (log.clone(), session_id.clone());
        async move {
            let Some(after) = after else {
                return Ok(None);
            };
            let mut page = log.events().read_events(&id, after, PAGE).await?;
            page.retain(|e| e.seq <= upto);
            let next = match page.last() {
                Some(last) if last.seq < upto => Some(last.seq),
                _ => None,
            };
            Ok(Some(((page, next.is_none()), next)))
        }
    })
}

/// One JSON Lines line.
fn line(value: &impl serde::Serialize) -> String {
    let mut text = serde_json::to_string(value).expect("an export line serialises");
    text.push('\n');
    text
}

/// `e`'s payload naming the session `id` (an event's `sessionId`, when it has one).
fn with_session_id(e: &StoredEvent, id: &str) -> crate::store::Payload {
    let mut value = e.payload.to_value();
    match value.get_mut("sessionId") {
        Some(named) if named.is_string() => *named = Value::String(id.to_owned()),
        _ => return e.payload.clone(),
    }
    value.into()
}
