//! What the agent sends the gateway, as the pool hands it over: `session/update` into the log
//! (and `session_info_update` into the cache), permission requests and elicitations into their
//! pending tables (and out of them when the agent withdraws one with `$/cancel_request`), member
//! exits into `agent_exited` events. A session's agent may send at most
//! `--max-updates-per-turn` updates per turn: the rest are dropped and counted as garbage.

use std::sync::Arc;

use agent_client_protocol_schema::v1::{CLIENT_METHOD_NAMES, PROTOCOL_LEVEL_METHOD_NAMES};
use async_trait::async_trait;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::counters::Counters;
use super::info_update::apply_info_update;
use super::live::{LiveTable, Updates};
use super::log::Log;
use super::meter::Meter;
use super::records::Records;
use super::requests::Requests;
use super::snapshots::States;
use super::views::Views;
use crate::agent_rpc::{ExitInfo, NotificationHead, RpcError};
use crate::cluster::Cluster;
use crate::gateway::clock::now;
use crate::gateway::event::{AgentExited, GatewayEvent};
use crate::pool::client::Incoming;
use crate::pool::{AgentCallbacks, MemberAgents};
use crate::store::{EventKind, Payload};

/// Why a request naming a session another member holds is refused.
const ANOTHERS: &str = "this session is another agent process's";

/// What the pool calls back into. Built from what it holds, in this order (`Callbacks::new`).
#[derive(derive_more::Constructor)]
#[allow(clippy::too_many_arguments)]
pub(in crate::gateway) struct Callbacks {
    live: Arc<LiveTable>,
    log: Log,
    views: Arc<Views>,
    states: Arc<States>,
    meter: Arc<Meter>,
    requests: Arc<Requests>,
    cluster: Arc<Cluster>,
    counters: Arc<Counters>,
    /// Each member's agent, by member index.
    member_agents: Arc<MemberAgents>,
    /// The sessions' records, for whose a session is.
    records: Arc<Records>,
    /// `session/update`s one session's agent may send per turn (0: no limit).
    max_updates_per_turn: u64,
}

impl Callbacks {
    /// Whether `member` may speak about the session: not one another member holds, nor, when
    /// none holds it here, one another replica holds (by the store's leases: a process this
    /// replica let go of the session may still speak of it) or one of another agent (an agent,
    /// local or remote, never touches another's sessions). Otherwise it is counted as garbage,
    /// logged and ignored.
    async fn its_own(&self, member: usize, session_id: &str, what: &str) -> bool {
        let whose = match self.live.member(session_id) {
            Some(holder) if holder == member => return true,
            Some(holder) => format!("member {holder}"),
            None => {
                let agent = self.member_agents.get(member);
                // Unknown yet (a session being created) or this agent's: its own.
                match self.records.rows().get_session(session_id).await {
                    Ok(Some(r)) if Some(&r.agent) != agent.as_ref() => format!("agent {}", r.agent),
                    // Being loaded here (its replay): this replica holds it, no need to ask.
                    _ if self.live.replaying(session_id).is_some() => return true,
                    _ => match self.cluster.owner_elsewhere(session_id).await {
                        Ok(Some(replica)) => format!("the replica at {replica}"),
                        _ => return true,
                    },
                }
            }
        };
        crate::agent_rpc::count_garbage();
        tracing::warn!(
            member,
            session = session_id,
            whose,
            what,
            "an agent named a session that is not its own; ignored"
        );
        false
    }

    async fn on_session_update(
        &self,
        member: usize,
        params: Box<RawValue>,
        head: NotificationHead,
    ) {
        // The session and the kind were read while the line was checked; the update itself is
        // not built.
        let Some(session_id) = head.session_id else {
            crate::agent_rpc::count_garbage();
            tracing::warn!("session/update without a sessionId; ignored");
            return;
        };
        if !self.its_own(member, &session_id, "session/update").await {
            return;
        }
        let kind = head.kind.unwrap_or_else(|| "unknown".to_owned());
        let known = EventKind::parse(&kind);
        if known.is_some_and(EventKind::is_gateway) {
            // Clients would take it for the gateway's own event (a turn's end, a permission).
            crate::agent_rpc::count_garbage();
            tracing::warn!(
                member,
                session = session_id,
                kind,
                "session/update under a gateway event's name; ignored"
            );
            return;
        }
        let replay = self.live.replaying(&session_id);
        if replay.is_none()
            && let Updates::Beyond { first } = self
                .live
                .count_update(&session_id, self.max_updates_per_turn)
        {
            crate::agent_rpc::count_garbage();
            if first {
                tracing::warn!(
                    member,
                    session = session_id,
                    bound = self.max_updates_per_turn,
                    "the agent sent more updates in this turn than --max-updates-per-turn; the rest of the turn's are dropped"
                );
            }
            return;
        }
        match replay {
            Some(false) => return, // already in the log: a load replays what we stored live
            Some(true) => {
                let mut payload: Value = serde_json::from_str(params.get()).unwrap_or_default();
                payload["replay"] = json!(true);
                self.log
                    .enqueue_agents(&session_id, &kind, payload.into())
                    .await;
                return;
            }
            None => {}
        }
        // Only an info or usage update is read whole; the others are passed on as they came.
        let update = || {
            serde_json::from_str::<Value>(params.get())
                .ok()
                .and_then(|mut v| v.get_mut("update").map(Value::take))
                .unwrap_or(Value::Null)
        };
        if known == Some(EventKind::UsageUpdate) {
            self.meter.note_update(&session_id, &update());
        }
        let info = (known == Some(EventKind::SessionInfoUpdate)).then(update);
        self.log
            .enqueue_agents(&session_id, &kind, Payload::from_raw(params))
            .await;
        if known.is_some_and(EventKind::changes_state) {
            self.states.state_changed_in_turn(&session_id);
        }
        if let Some(update) = info {
            let at = now();
            match self
                .views
                .update_cached(&session_id, &|r| apply_info_update(r, &update, at))
                .await
            {
                Ok(Some(r)) => {
                    self.views.updated(&r).await;
                }
                Ok(None) => tracing::debug!(
                    session = session_id,
                    "session_info_update for a session not in the cache"
                ),
                Err(e) => tracing::error!(error = %e, "cannot apply session_info_update"),
            }
        }
    }
}

#[async_trait]
impl AgentCallbacks for Callbacks {
    async fn on_notification(
        &self,
        member: usize,
        method: &str,
        params: Box<RawValue>,
        head: NotificationHead,
    ) {
        if method == CLIENT_METHOD_NAMES.session_update {
            self.on_session_update(member, params, head).await;
        } else if method == PROTOCOL_LEVEL_METHOD_NAMES.cancel_request {
            self.requests.withdrawn(member, params.get()).await;
        } else if method == CLIENT_METHOD_NAMES.elicitation_complete {
            self.requests
                .elicitation_completed(member, params.get())
                .await;
        } else if let Some(session_id) = head
            .session_id
            .filter(|id| method.starts_with('_') && self.live.member(id) == Some(member))
        {
            // An extension notification (`_…`) about a session this member holds: logged and
            // streamed as it came, under its method's name.
            self.log
                .enqueue_agents(&session_id, method, Payload::from_raw(params))
                .await;
        } else {
            tracing::debug!(member, method, "notification from the agent ignored");
        }
    }

    async fn on_permission_request(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        params: Value,
    ) {
        let Some(session_id) = params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            let _ = request
                .refuse(RpcError::invalid_params("sessionId is required"))
                .await;
            return;
        };
        if !self
            .its_own(member, &session_id, "session/request_permission")
            .await
        {
            let _ = request.refuse(RpcError::invalid_params(ANOTHERS)).await;
            return;
        }
        self.requests
            .clone()
            .permission_requested(member, request, &session_id, params)
            .await;
    }

    async fn on_elicitation_request(
        self: Arc<Self>,
        member: usize,
        request: Incoming,
        params: Value,
    ) {
        if let Some(id) = params.get("sessionId").and_then(Value::as_str)
            && !self.its_own(member, id, "elicitation/create").await
        {
            let _ = request.refuse(RpcError::invalid_params(ANOTHERS)).await;
            return;
        }
        self.requests
            .clone()
            .elicitation_requested(member, request, params)
            .await;
    }

    async fn on_member_exit(&self, member: usize, exit: &ExitInfo) {
        self.counters.member_exited();
        let affected = self.live.drop_member(member);
        self.requests.drop_member(member).await;
        for id in affected {
            let exited = AgentExited {
                session_id: id.clone(),
                member: u32::try_from(member).ok(),
                code: exit.code,
                signal: exit.signal,
            };
            // Queued, not awaited: the member's calls fail and it restarts right after this
            // returns, store outage or not; the queue keeps this before their `turn_ended`.
            self.log
                .enqueue(&id, GatewayEvent::AgentExited(exited))
                .await;
            // A turn running on it keeps the hold until its end is stored
            // ([`Placement::release_after_turn`]): another replica taking the session now could
            // log its next turn before this one's `turn_ended`.
            if self.live.turn_done(&id).is_none() {
                super::replicas::release(&self.cluster, &id).await;
            }
        }
    }
}
