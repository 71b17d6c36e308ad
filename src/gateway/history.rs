//! The use cases that read the logs: the event streams of a session and of the lifecycle log,
//! and `GET /sessions/{id}/history`.

use std::sync::Arc;

use futures::Stream;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::caller::Caller;
use super::clock::now;
use super::error::Error;
use super::event::{GatewayEvent, StateSnapshot};
use super::event_schema::SessionEvent;
use super::input::SessionId;
use super::output::WatcherView;
use super::parts::use_case;
use crate::events::Run;
use crate::store::{EventKind, Payload, StoredEvent, StoredLifecycleEvent};

/// One stored event as `GET /sessions/{id}/history` returns it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEvent {
    /// The event's sequence number (the SSE `id`).
    pub seq: i64,
    /// The SSE `event` name.
    pub event: String,
    /// The SSE `data`.
    pub data: Payload,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A page of `GET /sessions/{id}/history`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"events": [{"seq": 1, "event": EventKind::TurnStarted.name(), "data": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "prompt": [{"type": "text", "text": "hi"}], "author": {"tenant": "acme", "user": "ann"}}, "createdAt": "2026-11-22T12:47:51.068421Z"}, {"seq": 2, "event": EventKind::AgentMessageChunk.name(), "data": {"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "update": {"sessionUpdate": EventKind::AgentMessageChunk.name(), "content": {"type": "text", "text": "hi"}}}, "createdAt": "2026-11-22T12:47:51.073427Z"}], "nextAfter": 2}))]
pub struct HistoryPage {
    #[schema(value_type = Vec<SessionEvent>)]
    pub events: Vec<HistoryEvent>,
    /// Pass as `after` for the next page; absent when this page reached the end of the log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<i64>,
}

use_case! {
    /// The use case of the streams and the history clients read, with the parts it needs.
    pub struct History {
        parts: [records, log, states, watchers],
    }
}

impl History {
    /// `GET /sessions/{id}/events` (and what `/acp` follows): the session's events from
    /// `after` (`None`: live tail), in batches as the hub delivers them. With `snapshot` and no
    /// `after`, the first batch is one `state` event, the session's state at the log's end (its
    /// id is that position), and the stream continues from there.
    pub async fn session_events(
        &self,
        caller: &Caller,
        id: &SessionId,
        mut after: Option<i64>,
        snapshot: bool,
    ) -> Result<impl Stream<Item = Vec<Arc<Run>>> + Send + use<>, Error> {
        use futures::StreamExt;
        let record = self.records.get(caller, id).await?;
        let mut first = None;
        if snapshot && after.is_none() {
            let at = self.states.state_of(id.as_str()).await?;
            let state = GatewayEvent::State(StateSnapshot {
                session_id: id.as_str().to_owned(),
                seq: at.seq,
                state: Box::new(at.state),
            });
            let event = StoredEvent {
                session_id: id.as_str().to_owned(),
                seq: at.seq,
                kind: state.kind().name().into(),
                payload: Payload::from(&state),
                created_at: now(),
            };
            first = Some(vec![Arc::new(Run::one(event))]);
            after = Some(at.seq);
        }
        let rest = self.log.hub().session_stream(id.as_str(), after).await?;
        // Counted among the session's watchers while the stream is open.
        let watching = self.watchers.watch(&record, caller.author()).await;
        let rest = rest.map(move |batch| {
            let _watching = &watching;
            batch
        });
        Ok(futures::stream::iter(first).chain(rest))
    }

    /// `GET /sessions/{id}/watchers`: the people with a stream of the session open, on any
    /// replica.
    pub async fn watchers(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<Vec<WatcherView>, Error> {
        self.records.get(caller, id).await?;
        Ok(self.watchers.list(id.as_str()).await?)
    }

    /// `GET /events`: lifecycle events from `after` (`None`: live tail), in batches as the hub
    /// delivers them.
    pub async fn lifecycle_events(
        &self,
        caller: &Caller,
        after: Option<i64>,
    ) -> Result<impl Stream<Item = Vec<Arc<StoredLifecycleEvent>>> + Send + use<>, Error> {
        Ok(self
            .log
            .hub()
            .lifecycle_stream(caller.scope().map(str::to_owned), after)
            .await?)
    }

    /// `GET /sessions/{id}/history`.
    pub async fn history(
        &self,
        caller: &Caller,
        id: &SessionId,
        after: i64,
        limit: i64,
    ) -> Result<HistoryPage, Error> {
        if !(1..=1000).contains(&limit) {
            return Err(Error::Malformed("limit must be between 1 and 1000".into()));
        }
        if after < 0 {
            return Err(Error::Malformed("after must be >= 0".into()));
        }
        self.records.get(caller, id).await?;
        // Events queued before this request (a turn just answered) are read too.
        self.log.flush().await;
        let rows = self
            .log
            .events()
            .read_events(id.as_str(), after, limit + 1)
            .await?;
        let more = rows.len() as i64 > limit;
        let events: Vec<HistoryEvent> = rows
            .into_iter()
            .take(limit as usize)
            .map(|e| HistoryEvent {
                seq: e.seq,
                event: e.kind,
                data: e.payload,
                created_at: e.created_at,
            })
            .collect();
        let next_after = if more {
            events.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(HistoryPage { events, next_after })
    }
}
