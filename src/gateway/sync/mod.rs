//! Keeping the session cache true to the agent: paging through `session/list` at start, every
//! `--sync-interval` and on `GET /sessions?refresh=true`.
//!
//! What the agent lists is upserted (new ids with origin `upstream`, owned by the admin tenant);
//! a session the agent listed before and lists no more may have been deleted by another client:
//! `missing.rs` decides, asking the agent about it, and tombstones it only when the agent no
//! longer knows it and no one uses it. A session deleted through the gateway is never brought
//! back; one the sync tombstoned comes back when it is listed again. Agents without
//! `session/list` have nothing to sync: the cache of the gateway's own sessions is the list.
//!
//! Each page is compared with the cache as it comes, by the digest of each listed
//! `SessionInfo` (its text as the agent wrote it) against the digest a sync last stored with
//! the row (which any other write to the row clears). Those digests are read in one query as a
//! sync starts; a page's sessions that are new or may have changed are read in one query, with
//! their rows, and those that did change written in one statement. An unchanged list costs one
//! query in all. A task of its own lists and checks the pages, asking for the next page before
//! it reads this one, while the previous page is compared.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use super::clock::now;
use super::error::Error;
use super::event::GatewayLifecycleEvent;
mod listed;
mod missing;

use super::parts::use_case;
use crate::store::{ListedSession, Origin, SessionRecord};
use listed::{Listed, Pages, Synced, agent_error, list_all};
use missing::{Misses, Missing, SyncStart};

/// Pages listed and checked, waiting to be compared (a page of a thousand sessions holds about
/// 250 KB).
const PAGES_AHEAD: usize = 32;

/// What one sync did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// Sessions the agent listed.
    pub listed: usize,
    /// Listed sessions new to the cache.
    pub added: usize,
    /// Cached sessions whose metadata changed.
    pub updated: usize,
    /// Cached sessions the agent listed before and no longer knows, now tombstoned.
    pub vanished: usize,
    /// Sessions a sync had tombstoned, listed again and back.
    pub revived: usize,
}

/// What writing a listed session's row means for the cache.
#[derive(Clone, Copy)]
enum Change {
    /// A session new to the cache.
    Added,
    /// A cached session whose metadata changed.
    Updated,
    /// A session the list sync had tombstoned, listed again.
    Revived,
    /// A cached session of the gateway's own, listed for the first time: only `synced_at`.
    Sighted,
    /// Nothing the cache shows: the row records the listing's digest.
    Digest,
}

use_case! {
    /// The use case of the agent's own session list, synced into the cache, with the parts it
    /// needs (`stop` ends the periodic sync).
    pub struct ListSync {
        parts: [placement, records, views, log, counters, stop],
        /// The tenant that owns sessions discovered through `session/list` (the admin's).
        upstream_tenant: String,
        /// What the last syncs missed and could not ask the agent about.
        misses: Arc<Misses>,
    }
}

impl ListSync {
    /// Syncs the cache with every agent's `session/list` now (or only `only`'s), one sync at a
    /// time, each agent's sessions with its own list. An agent that fails is logged and the
    /// others are synced still; the error is the answer only when every agent failed.
    pub async fn sync(&self, only: Option<&str>) -> Result<SyncReport, Error> {
        let mut total = SyncReport::default();
        let mut failed = None;
        let mut synced = 0;
        for agent in self.placement.agents().names() {
            if only.is_some_and(|o| o != agent) {
                continue;
            }
            match self.sync_agent(&agent).await {
                Ok(report) => {
                    synced += 1;
                    total.listed += report.listed;
                    total.added += report.added;
                    total.updated += report.updated;
                    total.vanished += report.vanished;
                    total.revived += report.revived;
                }
                Err(e) => {
                    tracing::warn!(agent, error = %e, "session list sync failed");
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if synced == 0 => Err(e),
            _ => Ok(total),
        }
    }

    /// Syncs the sessions of `agent` with its `session/list`. Without the capability, nothing
    /// to do; an agent still starting is waited for (up to `--acquire-timeout`) to say whether
    /// it lists.
    async fn sync_agent(&self, agent: &str) -> Result<SyncReport, Error> {
        if self.placement.agent_named(agent)?.pool().init().is_none() {
            self.placement.any_client(agent).await?;
        }
        if !self.placement.caps(agent).list {
            return Ok(SyncReport::default());
        }
        let _one_at_a_time = self.records.one_sync().await;
        let started = now();
        // The gateway's own changes from now on are newer than anything this listing says.
        let since = self.records.touches();
        let start = SyncStart {
            touches: since,
            began: started,
        };
        let mut report = SyncReport::default();
        // The listing is read and checked by a task of its own, up to PAGES_AHEAD pages ahead
        // of the one compared here (while the digests are read, at first): parsing and
        // comparing keep two cores busy.
        let (tx, mut pages) = mpsc::channel(PAGES_AHEAD);
        let lister = AbortOnDropHandle::new(tokio::spawn(list_all(
            Pages::new(self.placement.any_client(agent).await?, None),
            tx,
        )));
        // Read while the agent lists the first pages.
        let mut synced = Synced::read(self.records.rows(), agent).await?;
        let mut looked_at = HashSet::new();
        while let Some(page) = pages.recv().await {
            let page = page?;
            // Creates that were under way while the agent listed the page have stored their
            // rows now.
            self.records.creates_stored().await;
            report.listed += page.len();
            // What is listed as a sync last wrote it needs nothing; an id listed twice (pages
            // shift while sessions change) is looked at once.
            let page = page
                .into_iter()
                .filter(|l| !synced.unchanged(l) && looked_at.insert(l.session_id.clone()))
                .collect();
            self.sync_page(agent, page, since, started, &mut report)
                .await?;
        }
        lister
            .await
            .map_err(|e| agent_error(&format!("listing: {e}")))?;
        // Sessions listed before and missing now: a miss is no evidence on its own.
        let missing = synced.missing(self.records.rows()).await?;
        let settle = Missing {
            placement: &self.placement,
            records: &self.records,
            log: &self.log,
            counters: &self.counters,
            misses: &self.misses,
        };
        report.vanished += settle.settle(agent, missing, start).await?;
        self.records.forget_touches_up_to(since);
        if report.added + report.updated + report.vanished + report.revived > 0 {
            tracing::info!(agent, ?report, "synced the session list with the agent");
        }
        Ok(report)
    }

    /// Brings one listed page into the cache: the sessions that are new or may have changed
    /// found in one query, those that did written in one statement, then announced.
    async fn sync_page(
        &self,
        agent: &str,
        page: Vec<Listed>,
        since: u64,
        at: DateTime<Utc>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let page = self.records.untouched(page, |l| &l.session_id, since);
        let listed: Vec<ListedSession> = page
            .iter()
            .map(|l| ListedSession {
                session_id: l.session_id.clone(),
                digest: l.digest,
            })
            .collect();
        let to_sync = self.records.rows().sessions_to_sync(&listed).await?;
        if to_sync.is_empty() {
            return Ok(());
        }
        let mut page: HashMap<String, Listed> = page
            .into_iter()
            .map(|l| (l.session_id.clone(), l))
            .collect();
        let mut writes = Vec::with_capacity(to_sync.len());
        for t in to_sync {
            let Some(l) = page.remove(&t.session_id) else {
                continue;
            };
            let info = match serde_json::from_str::<Value>(l.info.get()) {
                Ok(info) => info,
                Err(e) => {
                    tracing::warn!(info = l.info.get(), error = %e, "session/list returned an unreadable session");
                    continue;
                }
            };
            let Some(existing) = t.cached else {
                writes.push((self.discovered(agent, &l, &info, at), Change::Added));
                continue;
            };
            // Another agent's session (two agents sharing one store): that agent's to sync.
            if existing.agent != agent {
                continue;
            }
            let mut record = existing.clone();
            apply_listed(&mut record, &info);
            let change = if existing.deleted_at.is_some() {
                // Tombstoned by a sync, listed again: back, with its log.
                if !self.views.revive(&existing, "listed").await? {
                    continue;
                }
                record.deleted_at = None;
                Change::Revived
            } else if record != existing {
                Change::Updated
            } else if existing.synced_at.is_none() {
                Change::Sighted
            } else {
                Change::Digest
            };
            record.synced_at = Some(at);
            record.listed = Some(l.digest);
            writes.push((record, change));
        }
        // A change of the gateway's own noted while the page was compared wins too; one made
        // from here on waits for this write, and comes after it.
        let writing = self.records.sync_writing().await;
        let writes = self
            .records
            .untouched(writes, |(r, _)| &r.session_id, since);
        if writes.is_empty() {
            return Ok(());
        }
        let (records, changes): (Vec<SessionRecord>, Vec<Change>) = writes.into_iter().unzip();
        let written: HashSet<String> = self
            .records
            .rows()
            .put_sessions(&records)
            .await
            .inspect(|_| self.records.sessions_changed())?
            .into_iter()
            .collect();
        drop(writing);
        // Ids missing from `written` were tombstoned meanwhile: they stay deleted.
        for (record, change) in records.iter().zip(changes) {
            if !written.contains(&record.session_id) {
                continue;
            }
            match change {
                Change::Added => {
                    report.added += 1;
                    let view = self.views.view(record);
                    let created = GatewayLifecycleEvent::created(record, view);
                    self.log.lifecycle(record, created).await;
                }
                Change::Revived => report.revived += 1,
                Change::Updated => {
                    report.updated += 1;
                    self.placement.live().record_changed(record);
                    self.views.updated(record).await;
                }
                Change::Sighted => self.placement.live().record_changed(record),
                Change::Digest => {}
            }
        }
        Ok(())
    }

    /// The row of a listed session new to the cache: origin `upstream`, owned by the admin.
    fn discovered(
        &self,
        agent: &str,
        l: &Listed,
        info: &Value,
        at: DateTime<Utc>,
    ) -> SessionRecord {
        let mut record = SessionRecord {
            synced_at: Some(at),
            listed: Some(l.digest),
            ..SessionRecord::new(
                l.session_id.clone(),
                self.upstream_tenant.clone(),
                String::new(),
                agent.to_owned(),
                Origin::Upstream,
                at,
            )
        };
        apply_listed(&mut record, info);
        record
    }

    /// The background sync: once a member is ready, then every `interval` (`None`: only once).
    pub(super) async fn sync_forever(&self, interval: Option<Duration>) {
        let stop = self.stop.clone();
        while self
            .placement
            .agents()
            .all()
            .iter()
            .all(|a| a.pool().pick().is_none())
        {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop.cancelled() => return,
            }
        }
        loop {
            if let Err(e) = self.sync(None).await {
                tracing::warn!(error = %e, "session list sync failed");
            }
            let Some(every) = interval else { return };
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// Applies a listed `SessionInfo` to a cached row. A listing describes the session as it is,
/// but fields the agent leaves out keep their cached value (a title set through the gateway
/// on an agent without `session/set_title`, say); `null` clears; `_meta` is replaced whole.
fn apply_listed(record: &mut SessionRecord, info: &Value) {
    if let Some(cwd) = info.get("cwd").and_then(Value::as_str) {
        record.cwd = cwd.to_owned();
    }
    if let Some(dirs) = info.get("additionalDirectories") {
        record.additional_directories = dirs
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
    }
    if let Some(title) = info.get("title") {
        record.title = title.as_str().map(str::to_owned);
    }
    if let Some(at) = info
        .get("updatedAt")
        .and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
    {
        record.updated_at = at.with_timezone(&Utc).trunc_subsecs(6);
    }
    if let Some(meta) = info.get("_meta") {
        record.meta = (!meta.is_null()).then(|| meta.clone());
    }
    if let Some(archived) = info.get("archived").and_then(Value::as_bool) {
        record.archived = archived;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cached() -> SessionRecord {
        let at = DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap();
        SessionRecord {
            additional_directories: vec!["/x".into()],
            title: Some("kept".into()),
            meta: Some(json!({"a": 1, "b": {"c": 2}})),
            ..crate::gateway::parts::info_update::recorded("t", "/a", at)
        }
    }

    #[test]
    fn listed_fields_absent_keep_null_clears_meta_replaces() {
        type Check = dyn Fn(&SessionRecord);
        let cases: &[(Value, &Check)] = &[
            (json!({"sessionId": "s", "cwd": "/a"}), &|r| {
                assert_eq!(r, &cached())
            }),
            (
                json!({"sessionId": "s", "cwd": "/b", "title": null}),
                &|r| {
                    assert_eq!(r.cwd, "/b");
                    assert_eq!(r.title, None);
                },
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "title": "new"}),
                &|r| assert_eq!(r.title.as_deref(), Some("new")),
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "_meta": {"b": {"d": 3}}}),
                &|r| assert_eq!(r.meta, Some(json!({"b": {"d": 3}}))),
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "_meta": null}),
                &|r| assert_eq!(r.meta, None),
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "additionalDirectories": []}),
                &|r| assert!(r.additional_directories.is_empty()),
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "updatedAt": "2030-01-02T03:04:05.1234567Z"}),
                &|r| {
                    assert_eq!(
                        r.updated_at.to_rfc3339(),
                        "2030-01-02T03:04:05.123456+00:00"
                    )
                },
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "updatedAt": "yesterday"}),
                &|r| assert_eq!(r.updated_at, cached().updated_at),
            ),
            (
                json!({"sessionId": "s", "cwd": "/a", "archived": true}),
                &|r| assert!(r.archived),
            ),
        ];
        for (info, check) in cases {
            let mut r = cached();
            apply_listed(&mut r, info);
            check(&r);
        }
    }
}
