//! What the agent lists, read for a sync: the pages of `session/list`, walked by a task of its
//! own that asks for the next page before it reads this one; each listed session checked and
//! digested, its text kept for when the cache needs more of it; and [`Synced`], what earlier
//! syncs stored, to compare the pages with.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher as _;

use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use crate::gateway::error::Error;
use crate::pool::client::{AgentClient, PendingPage};

/// An agent that hands out more pages than this is not listing a finite set: the sync stops
/// without marking anything vanished.
const MAX_PAGES: usize = 10_000;

/// One `SessionInfo` as listed (the agent's text), checked, and its digest.
pub(in crate::gateway) struct Listed {
    pub(in crate::gateway) session_id: String,
    pub(in crate::gateway) info: Box<RawValue>,
    pub(in crate::gateway) digest: i64,
}

/// A sync failed by what the agent answered: its internal error (-32603).
pub(in crate::gateway) fn agent_error(message: &str) -> Error {
    Error::Agent {
        code: -32603,
        message: message.into(),
    }
}

/// Walks `pages` into `tx` until the last page or an error.
pub(in crate::gateway) async fn list_all(
    mut pages: Pages,
    tx: mpsc::Sender<Result<Vec<Listed>, Error>>,
) {
    while let Some(page) = pages.next().await.transpose() {
        let failed = page.is_err();
        if tx.send(page).await.is_err() || failed {
            return;
        }
    }
}

/// What the cache holds of the listings syncs wrote: the digest of each synced live session,
/// read in one query when a sync starts, by a hash of its id (a million sessions take 20 MB
/// so, not 60 as strings). The hash is seeded per sync: two ids that share one in a sync (one
/// chance in 2^64 a pair) do not in the next.
pub(in crate::gateway) struct Synced {
    /// The agent whose sessions these are.
    agent: String,
    hash: foldhash::fast::RandomState,
    digests: HashMap<u64, Option<i64>, foldhash::fast::RandomState>,
}

impl Synced {
    pub(in crate::gateway) async fn read(
        store: &dyn crate::store::SessionRecords,
        agent: &str,
    ) -> Result<Self, Error> {
        let hash = foldhash::fast::RandomState::default();
        let mut digests = HashMap::default();
        store
            .visit_synced(agent, &mut |id, digest| {
                digests.insert(hash.hash_one(id), digest);
            })
            .await?;
        Ok(Synced {
            agent: agent.to_owned(),
            hash,
            digests,
        })
    }

    /// Whether `l` is listed as a sync last wrote it (a digest of another id as well: one
    /// chance in 2^128). Either way it is listed: not missing.
    pub(in crate::gateway) fn unchanged(&mut self, l: &Listed) -> bool {
        let digest = self.digests.remove(&self.hash.hash_one(&l.session_id));
        digest == Some(Some(l.digest))
    }

    /// The synced sessions not listed (an id of this sync's that shares a hash with one of
    /// them as well: the miss is confirmed before it counts).
    pub(in crate::gateway) async fn missing(
        self,
        store: &dyn crate::store::SessionRecords,
    ) -> Result<Vec<String>, Error> {
        let mut ids = Vec::new();
        if self.digests.is_empty() {
            return Ok(ids);
        }
        store
            .visit_synced(&self.agent, &mut |id, _| {
                if self.digests.contains_key(&self.hash.hash_one(id)) {
                    ids.push(id.to_owned());
                }
            })
            .await?;
        Ok(ids)
    }
}

/// One walk through the pages of `session/list` (of one `cwd`, if given), archived sessions
/// included when the agent archives. The next page is asked for as soon as this one's cursor
/// is read: the agent lists it while the gateway checks this one.
pub(in crate::gateway) struct Pages {
    agent: AgentClient,
    cwd: Option<String>,
    cursor: Option<String>,
    /// The next page, asked for.
    asked: Option<PendingPage>,
    read: usize,
    done: bool,
}

impl Pages {
    pub(in crate::gateway) fn new(agent: AgentClient, cwd: Option<String>) -> Self {
        Pages {
            agent,
            cwd,
            cursor: None,
            asked: None,
            read: 0,
            done: false,
        }
    }

    /// The next page's usable sessions; `None` after the last page.
    pub(in crate::gateway) async fn next(&mut self) -> Result<Option<Vec<Listed>>, Error> {
        if self.done {
            return Ok(None);
        }
        let asked = match self.asked.take() {
            Some(asked) => asked,
            None => self.ask().await?,
        };
        let page = asked.page().await?;
        self.read += 1;
        // A result that is no page fails the sync, which then tombstones nothing; a session
        // in it that the cache cannot hold is skipped.
        let page: PageText<'_> = serde_json::from_str(page.get())
            .map_err(|e| agent_error(&format!("session/list answered no page: {e}")))?;
        match page.next_cursor {
            Some(next) if self.cursor.as_deref() != Some(next.as_ref()) => {
                if self.read == MAX_PAGES {
                    return Err(agent_error("session/list did not end within 10,000 pages"));
                }
                self.cursor = Some(next.into_owned());
                self.asked = Some(self.ask().await?);
            }
            Some(_) => return Err(agent_error("session/list repeated its cursor")),
            None => self.done = true,
        }
        Ok(Some(
            page.sessions.into_iter().filter_map(checked).collect(),
        ))
    }

    /// Asks for the page at the current cursor.
    async fn ask(&self) -> Result<PendingPage, Error> {
        let cursor = self.cursor.as_deref();
        Ok(self
            .agent
            .list_sessions(self.cwd.as_deref(), cursor)
            .await?)
    }
}

/// A `session/list` result, borrowed from its text: each listed session stays text until a
/// sync needs more of it than its id, its cwd and its digest.
#[derive(Deserialize)]
struct PageText<'a> {
    #[serde(borrow)]
    sessions: Vec<&'a RawValue>,
    #[serde(rename = "nextCursor", borrow, default)]
    next_cursor: Option<Cow<'a, str>>,
}

/// What a listed `SessionInfo` must hold to be cached.
#[derive(Deserialize)]
struct Usable<'a> {
    #[serde(rename = "sessionId", borrow)]
    session_id: Cow<'a, str>,
    #[serde(borrow)]
    cwd: Cow<'a, str>,
}

/// A listed `SessionInfo` the cache can hold: a valid id and an absolute cwd.
fn checked(info: &RawValue) -> Option<Listed> {
    let usable = |info: &RawValue| {
        // A struct would also read from an array.
        if !info.get().starts_with('{') {
            return None;
        }
        let usable: Usable<'_> = serde_json::from_str(info.get()).ok()?;
        crate::gateway::input::SessionId::parse(&usable.session_id).ok()?;
        crate::gateway::input::validate_abs_path("cwd", &usable.cwd).ok()?;
        Some(usable.session_id.into_owned())
    };
    match usable(info) {
        Some(session_id) => Some(Listed {
            session_id,
            digest: digest(info),
            info: info.to_owned(),
        }),
        None => {
            tracing::warn!(
                info = info.get(),
                "session/list returned an unusable session"
            );
            None
        }
    }
}

/// The digest of a listed `SessionInfo`: the first 8 bytes of the SHA-256 of its text as the
/// agent wrote it, after a version of what a sync makes of it, so that a gateway
/// that applies listings otherwise does not take the digests of an older one for its own.
fn digest(info: &RawValue) -> i64 {
    let mut hash = Sha256::new();
    hash.update(b"apply_listed v2\n");
    hash.update(info.get().as_bytes());
    let digest = hash.finalize();
    i64::from_be_bytes(digest[..8].try_into().expect("8 of 32 bytes"))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn unusable_listings_are_skipped() {
        let check = |info: Value| checked(&RawValue::from_string(info.to_string()).unwrap());
        assert!(check(json!({"sessionId": "ok", "cwd": "/w", "title": {"x": [1]}})).is_some());
        assert!(check(json!({"sessionId": "has space", "cwd": "/w"})).is_none());
        assert!(check(json!({"sessionId": "ok", "cwd": "relative"})).is_none());
        assert!(check(json!({"sessionId": "ok"})).is_none());
        assert!(check(json!({"cwd": "/w"})).is_none());
        assert!(check(json!({"sessionId": 7, "cwd": "/w"})).is_none());
        assert!(check(json!(["ok", "/w"])).is_none());
    }
}
