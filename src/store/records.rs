//! The store's records: a session's row ([`SessionRecord`]) and what lists and syncs them, the
//! lifecycle events, and the webhooks with their deliveries ([`WebhookRecord`],
//! [`DeliveryRecord`], [`Attempt`]); and how a mutation is applied to a session's row.

use chrono::{DateTime, SubsecRound, Utc};
use serde_json::Value;

use super::error::{StoreError, StoreResult};

/// Where a cached session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Created through this gateway.
    Gateway,
    /// Discovered through the agent's `session/list`.
    Upstream,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Gateway => "gateway",
            Origin::Upstream => "upstream",
        }
    }
    pub fn parse(s: &str) -> StoreResult<Self> {
        match s {
            "gateway" => Ok(Origin::Gateway),
            "upstream" => Ok(Origin::Upstream),
            other => Err(StoreError::Corrupt(format!("unknown origin {other:?}"))),
        }
    }
}

/// One row of the session cache. Timestamps are kept with microsecond precision.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub session_id: String,
    pub tenant: String,
    pub cwd: String,
    pub additional_directories: Vec<String>,
    pub title: Option<String>,
    pub updated_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// The session's `_meta` object, if any.
    pub meta: Option<Value>,
    pub archived: bool,
    pub origin: Origin,
    /// Set when the session was deleted: a tombstone that keeps a sync from resurrecting it.
    pub deleted_at: Option<DateTime<Utc>>,
    pub synced_at: Option<DateTime<Utc>>,
    /// The digest of the agent's `SessionInfo` that a sync last made the row from, as long as
    /// nothing else has changed the row since (see
    /// [`SessionRecords::sessions_to_sync`](super::SessionRecords::sessions_to_sync)); `None` then.
    pub listed: Option<i64>,
    /// The name of the agent the session lives in (empty in rows written before agents had names,
    /// until [`SessionRecords::adopt_sessions`](super::SessionRecords::adopt_sessions) gives them
    /// the default one).
    pub agent: String,
    /// Who the session is of within its tenant.
    pub people: People,
}

/// Who a session is of within its tenant: the user who created it, and who may answer its
/// requests. Written when it is created (the owner) and by an update (who answers); a list sync
/// leaves them as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct People {
    /// The user who created it (a key's `USER`, a token's `sub`), when one did.
    pub owner: Option<String>,
    /// How to show the owner (a token's `name` or `email`).
    pub owner_name: Option<String>,
    /// `anyone`, `owner` or `author`; `None`: the tenant's default.
    pub who_answers: Option<String>,
}

/// A session on a page of the agent's list: its id and the digest of its `SessionInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSession {
    pub session_id: String,
    pub digest: i64,
}

/// What [`SessionRecords::visit_synced`](super::SessionRecords::visit_synced) hands each synced
/// session to: its id and its digest.
pub type SyncedVisitor<'v> = dyn FnMut(&str, Option<i64>) + Send + 'v;

/// A listed session a sync has to look at (see
/// [`SessionRecords::sessions_to_sync`](super::SessionRecords::sessions_to_sync)): its id and its
/// row (live, or tombstoned by the list sync), `None` when the cache does not know it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToSync {
    pub session_id: String,
    pub cached: Option<SessionRecord>,
}

/// A page request for [`SessionRecords::list_sessions`](super::SessionRecords::list_sessions);
/// newest `updated_at` first, ties by `session_id` descending.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `None` lists every tenant (admin).
    pub tenant: Option<String>,
    /// Exact match on `cwd`.
    pub cwd: Option<String>,
    /// Only the sessions of this agent.
    pub agent: Option<String>,
    /// Only the sessions this user created.
    pub owner: Option<String>,
    /// `None` = only non-archived, `Some(true)` = only archived, `Some(false)` = only non-archived.
    pub archived: Option<bool>,
    /// The position after which the page starts; `None` for the first page.
    pub after: Option<ListCursor>,
    pub limit: i64,
}

/// Where a page of the session list ends: the list as it was when its first page was read
/// (`snapshot`, the newest recorded move of an `updated_at` then) and the keyset position
/// `(updated_at, session_id)` of the last row in that list. A session whose `updated_at` changes
/// between pages keeps its first-page position, so paging never skips or repeats a session;
/// sessions created since may appear on later pages when they sort after the cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    pub snapshot: i64,
    pub updated_at: DateTime<Utc>,
    pub session_id: String,
}

/// One page of [`SessionRecords::list_sessions`](super::SessionRecords::list_sessions).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionList {
    pub sessions: Vec<SessionRecord>,
    /// Set when more rows follow.
    pub next: Option<ListCursor>,
}

/// How long list cursors stay stable: the age at which recorded moves are pruned.
pub const STABLE_CURSOR_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// A session lifecycle event (created, info updated, status changed, deleted) for `GET /events`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLifecycleEvent {
    pub session_id: String,
    pub tenant: String,
    pub kind: String,
    pub payload: Value,
}

/// A lifecycle event as stored, with its global sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredLifecycleEvent {
    pub seq: i64,
    pub session_id: String,
    pub tenant: String,
    pub kind: String,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
}

impl NewLifecycleEvent {
    /// This event as stored with number `seq` at `created_at`.
    fn stored(&self, seq: i64, created_at: DateTime<Utc>) -> StoredLifecycleEvent {
        StoredLifecycleEvent {
            seq,
            session_id: self.session_id.clone(),
            tenant: self.tenant.clone(),
            kind: self.kind.clone(),
            payload: self.payload.clone(),
            created_at,
        }
    }

    /// `events` as stored at `created_at` by one insert that answered `seqs`: the numbers the
    /// database handed out in the order the rows were inserted, ascending, which a backend's
    /// `RETURNING` need not answer in that order.
    pub(super) fn stored_all(
        events: &[Self],
        mut seqs: Vec<i64>,
        created_at: DateTime<Utc>,
    ) -> StoreResult<Vec<StoredLifecycleEvent>> {
        if seqs.len() != events.len() {
            return Err(StoreError::Corrupt(format!(
                "{} lifecycle events inserted, {} numbers returned",
                events.len(),
                seqs.len()
            )));
        }
        seqs.sort_unstable();
        Ok(events
            .iter()
            .zip(seqs)
            .map(|(e, seq)| e.stored(seq, created_at))
            .collect())
    }
}

/// A mutation applied to one session row inside a transaction (see
/// [`SessionRecords::update_session`](super::SessionRecords::update_session)).
pub type SessionMutation<'a> = &'a (dyn Fn(&mut SessionRecord) + Send + Sync);

/// Truncates every timestamp of `record` to the microsecond, the precision both backends store.
fn truncate_timestamps(record: &mut SessionRecord) {
    record.updated_at = record.updated_at.trunc_subsecs(6);
    record.created_at = record.created_at.trunc_subsecs(6);
    record.deleted_at = record.deleted_at.map(|at| at.trunc_subsecs(6));
    record.synced_at = record.synced_at.map(|at| at.trunc_subsecs(6));
}

/// What [`SessionRecords::update_session`](super::SessionRecords::update_session) writes back over
/// `current`, the row read for `session_id`: `current` changed by `mutate`; `None` when there is no
/// live row.
pub(super) fn apply_mutation(
    current: Option<SessionRecord>,
    session_id: &str,
    mutate: SessionMutation<'_>,
) -> Option<SessionRecord> {
    let mut record = current.filter(|record| record.deleted_at.is_none())?;
    mutate(&mut record);
    // The id is the row's key: a mutation cannot move the row to another id.
    record.session_id = session_id.to_owned();
    record.listed = None;
    truncate_timestamps(&mut record);
    Some(record)
}

/// A webhook subscription. Timestamps are kept with microsecond precision.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookRecord {
    /// `"wh_"` and a UUID.
    pub id: String,
    /// The creating caller's tenant.
    pub tenant: String,
    /// Created with an admin key: hears every tenant's events.
    pub admin: bool,
    pub url: String,
    /// The event kinds it hears, or `["*"]` for all.
    pub events: Vec<String>,
    /// Only this session's events when set.
    pub session_id: Option<String>,
    pub description: Option<String>,
    /// The signing secret (`"whsec_"` and base64); never logged.
    pub secret: String,
    pub enabled: bool,
    /// Why it was disabled, when the gateway disabled it.
    pub disabled_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One event to send to one webhook, and how sending it went.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// In log order among a session's deliveries to a webhook.
    pub id: i64,
    pub webhook_id: String,
    /// Stable across attempts: `"<sessionId>.<seq>"`, or `"lifecycle:<seq>"` (without a `.`:
    /// never a session's) for a lifecycle event.
    pub message_id: String,
    pub session_id: String,
    pub tenant: String,
    /// The event's sequence number in its log.
    pub seq: i64,
    pub kind: String,
    pub payload: Value,
    /// When the event was stored.
    pub event_at: DateTime<Utc>,
    /// `pending`, `delivered` or `failed`.
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    /// Retries give up some time after this (a manual retry resets it).
    pub retry_from: DateTime<Utc>,
    pub last_status: Option<i32>,
    /// The start of the last response's body.
    pub last_body: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Attempt {
    Delivered {
        status: i32,
        body: String,
    },
    /// Failed; try again at `next` (None: give up, status 'failed').
    Failed {
        status: Option<i32>,
        body: Option<String>,
        error: String,
        next: Option<DateTime<Utc>>,
    },
}

impl Attempt {
    /// The delivery's status after this attempt.
    pub(crate) fn status(&self) -> &'static str {
        match self {
            Attempt::Delivered { .. } => "delivered",
            Attempt::Failed { next: Some(_), .. } => "pending",
            Attempt::Failed { next: None, .. } => "failed",
        }
    }
}
