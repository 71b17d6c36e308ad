//! Read-only links to a session: made, listed and revoked by those who see the session
//! (`/sessions/{id}/shares`), and opened without a key by whoever holds one (`/shared/{token}`):
//! the session's title and transcript, and with a `live` link its stream as it goes. A link
//! opens that one session and nothing else; an expired or revoked one answers 410. The token
//! (244 random bits) is shown once, when the link is made; only its SHA-256 is stored.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt as _};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::caller::Caller;
use super::clock::now;
use super::error::Error;
use super::history::{History, HistoryPage};
use super::input::SessionId;
use super::parts::use_case;
use crate::events::Run;
use crate::store::{ShareRecord, Store};

/// How long a link lasts when its maker does not say: a week.
const DEFAULT_EXPIRY_SECS: u64 = 7 * 24 * 3600;
/// The longest a link may last: 90 days.
const MAX_EXPIRY_SECS: u64 = 90 * 24 * 3600;

/// `POST /sessions/{id}/shares`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"expiresIn": 86400, "live": true}))]
pub struct NewShare {
    /// Seconds until the link stops opening (default a week, at most 90 days).
    pub expires_in: Option<u64>,
    /// Whether the link follows the session's stream too (default: the transcript only).
    pub live: Option<bool>,
}

/// A link, as its session's owners see it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "sh_5f0c1e7d2a4c559a430c9f2b61d1a7e1", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "live": true, "createdAt": "2026-11-30T10:00:00Z", "expiresAt": "2026-12-01T10:00:00Z", "state": "active"}))]
pub struct ShareView {
    pub id: String,
    pub session_id: String,
    pub live: bool,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub revoked_at: Option<DateTime<Utc>>,
    /// Who made it, when their key named them.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub created_by: Option<String>,
    /// `active`, `expired` or `revoked`.
    pub state: String,
}

/// A link just made: with its token and path, shown this once.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "sh_5f0c1e7d2a4c559a430c9f2b61d1a7e1", "sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "live": true, "createdAt": "2026-11-30T10:00:00Z", "expiresAt": "2026-12-01T10:00:00Z", "state": "active", "token": "shr_8c1f…", "path": "/shared/shr_8c1f…"}))]
pub struct MadeShare {
    #[serde(flatten)]
    pub share: ShareView,
    /// The link's secret: whoever holds it reads the session.
    pub token: String,
    /// Where the link opens, on this gateway (`/shared/TOKEN`).
    pub path: String,
}

/// What a link shows of its session, besides the transcript.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"sessionId": "sess_f15d4b67bbe3406688b9a02219da3c15", "title": "Echo: hi", "agent": "echo", "createdAt": "2026-11-30T09:58:00Z", "live": true, "expiresAt": "2026-12-01T10:00:00Z"}))]
pub struct SharedSession {
    pub session_id: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub title: Option<String>,
    pub agent: String,
    pub created_at: DateTime<Utc>,
    /// Whether the link follows the stream (`/shared/{token}/events`).
    pub live: bool,
    pub expires_at: DateTime<Utc>,
}

use_case! {
    /// The links.
    pub struct Shares {
        parts: [records],
        store: Arc<dyn Store>,
        history: History,
    }
}

impl Shares {
    /// `POST /sessions/{id}/shares`.
    pub async fn create(
        &self,
        caller: &Caller,
        id: &SessionId,
        new: NewShare,
    ) -> Result<MadeShare, Error> {
        let record = self.records.get(caller, id).await?;
        let secs = new.expires_in.unwrap_or(DEFAULT_EXPIRY_SECS);
        if !(1..=MAX_EXPIRY_SECS).contains(&secs) {
            return Err(Error::Invalid(format!(
                "expiresIn must be between 1 and {MAX_EXPIRY_SECS} seconds"
            )));
        }
        let token = format!(
            "shr_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let at = now().timestamp_micros();
        let share = ShareRecord {
            id: format!("sh_{}", uuid::Uuid::new_v4().simple()),
            token_hash: hash(&token),
            session_id: record.session_id,
            tenant: record.tenant,
            live: new.live.unwrap_or(false),
            created_at: at,
            expires_at: at + i64::try_from(secs).unwrap_or(i64::MAX / 2) * 1_000_000,
            revoked_at: None,
            created_by: caller.user.as_ref().map(|u| u.id.clone()),
        };
        self.store.add_share(&share).await?;
        Ok(MadeShare {
            share: view(&share),
            path: format!("/shared/{token}"),
            token,
        })
    }

    /// `GET /sessions/{id}/shares`: its links, newest first.
    pub async fn list(&self, caller: &Caller, id: &SessionId) -> Result<Vec<ShareView>, Error> {
        self.records.get(caller, id).await?;
        let shares = self.store.shares_of(id.as_str()).await?;
        Ok(shares.iter().map(view).collect())
    }

    /// `DELETE /sessions/{id}/shares/{shareId}`: the link stops opening at once.
    pub async fn revoke(&self, caller: &Caller, id: &SessionId, share: &str) -> Result<(), Error> {
        self.records.get(caller, id).await?;
        let at = now().timestamp_micros();
        match self.store.revoke_share(id.as_str(), share, at).await? {
            true => Ok(()),
            false => Err(Error::NotFound(format!("no share {share} of this session"))),
        }
    }

    /// `GET /shared/{token}`: what the link shows of its session.
    pub async fn shared(&self, token: &str) -> Result<SharedSession, Error> {
        let (share, caller) = self.open(token).await?;
        let id = SessionId::parse(&share.session_id)?;
        let record = self.records.get(&caller, &id).await?;
        Ok(SharedSession {
            session_id: record.session_id,
            title: record.title,
            agent: record.agent,
            created_at: record.created_at,
            live: share.live,
            expires_at: time(share.expires_at),
        })
    }

    /// `GET /shared/{token}/history`: a page of the transcript.
    pub async fn shared_history(
        &self,
        token: &str,
        after: i64,
        limit: i64,
    ) -> Result<HistoryPage, Error> {
        let (share, caller) = self.open(token).await?;
        let id = SessionId::parse(&share.session_id)?;
        self.history.history(&caller, &id, after, limit).await
    }

    /// `GET /shared/{token}/events`: the session's stream, for a `live` link.
    pub async fn shared_events(
        &self,
        token: &str,
        after: Option<i64>,
    ) -> Result<impl Stream<Item = Vec<Arc<Run>>> + Send + use<>, Error> {
        let (share, caller) = self.open(token).await?;
        if !share.live {
            return Err(Error::Forbidden(
                "this link shows the transcript only, not the live stream".into(),
            ));
        }
        let id = SessionId::parse(&share.session_id)?;
        let events = self
            .history
            .session_events(&caller, &id, after, false)
            .await?;
        Ok(events.take_until(Box::pin(closed(self.store.clone(), share))))
    }

    /// The link `token` opens, and a caller that sees only its session's tenant; 404 for a
    /// token no link has, 410 for one expired or revoked.
    async fn open(&self, token: &str) -> Result<(ShareRecord, Caller), Error> {
        let unknown = || Error::NotFound("no such link".into());
        if !token.starts_with("shr_") || token.len() > 100 {
            return Err(unknown());
        }
        let share = self
            .store
            .share_by_hash(&hash(token))
            .await?
            .ok_or_else(unknown)?;
        match state(&share) {
            "active" => {}
            state => return Err(Error::Gone(format!("this link is {state}"))),
        }
        let caller = Caller::of_tenant(&share.tenant, false);
        Ok((share, caller))
    }
}

/// How often an open live stream looks whether its link was revoked.
const REVOKED_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Resolves when `share` stops opening: at its expiry, or within [`REVOKED_EVERY`] of its
/// revocation; what it opened ends with it.
async fn closed(store: Arc<dyn Store>, share: ShareRecord) {
    loop {
        let left = share.expires_at - now().timestamp_micros();
        if left <= 0 {
            return;
        }
        let left = std::time::Duration::from_micros(u64::try_from(left).unwrap_or(0));
        tokio::time::sleep(left.min(REVOKED_EVERY)).await;
        match store.share_by_hash(&share.token_hash).await {
            Ok(Some(now)) if now.revoked_at.is_none() => {}
            // The store cannot be read now: the stream goes on until it can say.
            Err(_) => {}
            Ok(_) => return,
        }
    }
}

fn hash(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

fn time(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

fn state(share: &ShareRecord) -> &'static str {
    match share.revoked_at {
        Some(_) => "revoked",
        None if share.expires_at <= now().timestamp_micros() => "expired",
        None => "active",
    }
}

fn view(share: &ShareRecord) -> ShareView {
    ShareView {
        id: share.id.clone(),
        session_id: share.session_id.clone(),
        live: share.live,
        created_at: time(share.created_at),
        expires_at: time(share.expires_at),
        revoked_at: share.revoked_at.map(time),
        created_by: share.created_by.clone(),
        state: state(share).into(),
    }
}
