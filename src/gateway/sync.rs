//! Keeping the session cache true to the agent: paging through `session/list` at start, every
//! `--sync-interval` and on `GET /sessions?refresh=true`.
//!
//! What the agent lists is upserted (new ids with origin `upstream`, owned by the admin tenant);
//! a session the agent listed before and lists no more has been deleted by another client and is
//! tombstoned; a tombstoned id is never brought back. Agents without `session/list` have
//! nothing to sync: the cache of the gateway's own sessions is the list.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use super::model::now;
use super::{Error, Gateway};
use crate::store::{Origin, SessionRecord};

/// An agent that hands out more pages than this is not listing a finite set: the sync stops
/// without marking anything vanished.
const MAX_PAGES: usize = 10_000;

/// What one sync did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// Sessions the agent listed.
    pub listed: usize,
    /// Listed sessions new to the cache.
    pub added: usize,
    /// Cached sessions whose metadata changed.
    pub updated: usize,
    /// Cached sessions the agent listed before and no longer does, now tombstoned.
    pub vanished: usize,
}

/// One `SessionInfo` as listed, checked.
struct Listed {
    session_id: String,
    info: Value,
}

impl Gateway {
    /// Syncs the cache with the agent's `session/list` now (one sync at a time). Without the
    /// capability, nothing to do.
    pub async fn sync(&self) -> Result<SyncReport, Error> {
        let caps = self.caps();
        if !caps.list {
            return Ok(SyncReport::default());
        }
        let _one_at_a_time = self.inner.sync_lock.lock().await;
        let started = now();
        // The gateway's own changes from now on are newer than anything this listing says.
        let since = self.inner.cache.touches.load(Ordering::SeqCst);
        let listed = self.list_upstream(None).await?;
        // Creates that were under way while the agent listed have stored their rows now.
        drop(self.inner.creating.write().await);
        let mut report = SyncReport {
            listed: listed.len(),
            ..SyncReport::default()
        };
        let mut seen = HashSet::with_capacity(listed.len());
        for l in listed {
            seen.insert(l.session_id.clone());
            if self.touched_since(&l.session_id, since) {
                continue;
            }
            match self.upsert_listed(&l, started).await? {
                Upsert::Added => report.added += 1,
                Upsert::Updated => report.updated += 1,
                Upsert::Unchanged | Upsert::Tombstoned => {}
            }
        }
        // Sessions listed before and missing now. A live one is in the agent's memory whatever
        // its list says. An agent's pages are not always stable while its sessions change, so
        // a miss is confirmed by listing the session's cwd again before it counts.
        let mut missing: HashMap<String, Vec<SessionRecord>> = HashMap::new();
        for id in self.store().synced_session_ids().await? {
            if seen.contains(&id)
                || self.inner.live.member(&id).is_some()
                || self.touched_since(&id, since)
            {
                continue;
            }
            if let Some(r) = self.store().get_session(&id).await? {
                missing.entry(r.cwd.clone()).or_default().push(r);
            }
        }
        for (cwd, records) in missing {
            let again: HashSet<String> = self
                .list_upstream(Some(&cwd))
                .await?
                .into_iter()
                .map(|l| l.session_id)
                .collect();
            for r in records {
                if !again.contains(&r.session_id) && self.vanish(&r).await? {
                    report.vanished += 1;
                }
            }
        }
        self.inner
            .cache
            .touched
            .lock()
            .expect("touched lock")
            .retain(|_, n| *n > since);
        if report.added + report.updated + report.vanished > 0 {
            tracing::info!(?report, "synced the session list with the agent");
        }
        Ok(report)
    }

    fn touched_since(&self, session_id: &str, since: u64) -> bool {
        let touched = self.inner.cache.touched.lock().expect("touched lock");
        touched.get(session_id).is_some_and(|n| *n > since)
    }

    /// Every page of `session/list` (of one `cwd`, if given), archived sessions included when
    /// the agent archives.
    async fn list_upstream(&self, cwd: Option<&str>) -> Result<Vec<Listed>, Error> {
        let agent = self.any_client().await?;
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let page = agent.list_sessions(cwd, cursor.as_deref()).await?;
            for info in page
                .get("sessions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                match checked(info) {
                    Some(l) => out.push(l),
                    None => tracing::warn!(%info, "session/list returned an unusable session"),
                }
            }
            match page.get("nextCursor").and_then(Value::as_str) {
                Some(next) if cursor.as_deref() != Some(next) => cursor = Some(next.to_owned()),
                Some(_) => return Err(agent_error("session/list repeated its cursor")),
                None => return Ok(out),
            }
        }
        Err(agent_error("session/list did not end within 10,000 pages"))
    }

    async fn upsert_listed(&self, l: &Listed, at: DateTime<Utc>) -> Result<Upsert, Error> {
        let Some(existing) = self.store().get_session(&l.session_id).await? else {
            let mut record = SessionRecord {
                session_id: l.session_id.clone(),
                tenant: self.inner.config.upstream_tenant.clone(),
                cwd: String::new(),
                additional_directories: Vec::new(),
                title: None,
                updated_at: at,
                created_at: at,
                meta: None,
                archived: false,
                origin: Origin::Upstream,
                deleted_at: None,
                synced_at: Some(at),
            };
            apply_listed(&mut record, &l.info);
            let added = self.store().put_session(&record).await?;
            self.inner.sessions_changed();
            if !added {
                return Ok(Upsert::Tombstoned);
            }
            self.inner
                .lifecycle(
                    &record,
                    "session_created",
                    json!({"session": self.inner.view(&record)}),
                )
                .await;
            return Ok(Upsert::Added);
        };
        if existing.deleted_at.is_some() {
            return Ok(Upsert::Tombstoned);
        }
        let mut changed = existing.clone();
        apply_listed(&mut changed, &l.info);
        let first_sighting = existing.synced_at.is_none();
        if changed == existing && !first_sighting {
            return Ok(Upsert::Unchanged);
        }
        let info = l.info.clone();
        let Some(record) = self
            .store()
            .update_session(&l.session_id, &|r| {
                apply_listed(r, &info);
                r.synced_at = Some(at);
            })
            .await
            .inspect(|_| self.inner.sessions_changed())?
        else {
            return Ok(Upsert::Tombstoned);
        };
        self.inner.live.record_changed(&record);
        if changed == existing {
            return Ok(Upsert::Unchanged);
        }
        self.inner.updated(&record).await;
        Ok(Upsert::Updated)
    }

    /// Tombstones a session the agent no longer lists; `true` if it was live in the cache.
    async fn vanish(&self, record: &SessionRecord) -> Result<bool, Error> {
        let id = record.session_id.as_str();
        if !self
            .store()
            .tombstone_session(id, &record.tenant, now())
            .await
            .inspect(|_| self.inner.sessions_changed())?
        {
            return Ok(false);
        }
        self.inner
            .append(
                id,
                "session_deleted",
                json!({"sessionId": id, "reason": "vanished_upstream"}),
            )
            .await;
        self.inner
            .lifecycle(
                record,
                "session_deleted",
                json!({"reason": "vanished_upstream"}),
            )
            .await;
        Ok(true)
    }

    /// The background sync: once a member is ready, then every `interval` (`None`: only once).
    pub(super) async fn sync_forever(&self, interval: Option<Duration>) {
        let stop = self.inner.stop.clone();
        while self.pool.pick().is_none() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stop.cancelled() => return,
            }
        }
        loop {
            if let Err(e) = self.sync().await {
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

enum Upsert {
    Added,
    Updated,
    Unchanged,
    Tombstoned,
}

fn agent_error(message: &str) -> Error {
    Error::Agent {
        code: -32603,
        message: message.into(),
    }
}

/// A listed `SessionInfo` the cache can hold: a valid id and an absolute cwd.
fn checked(info: &Value) -> Option<Listed> {
    let id = info.get("sessionId")?.as_str()?;
    super::model::SessionId::parse(id).ok()?;
    let cwd = info.get("cwd")?.as_str()?;
    super::model::validate_abs_path("cwd", cwd).ok()?;
    Some(Listed {
        session_id: id.to_owned(),
        info: info.clone(),
    })
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

    fn cached() -> SessionRecord {
        let at = DateTime::from_timestamp_micros(1_700_000_000_000_000).unwrap();
        SessionRecord {
            session_id: "s".into(),
            tenant: "t".into(),
            cwd: "/a".into(),
            additional_directories: vec!["/x".into()],
            title: Some("kept".into()),
            updated_at: at,
            created_at: at,
            meta: Some(json!({"a": 1, "b": {"c": 2}})),
            archived: false,
            origin: Origin::Gateway,
            deleted_at: None,
            synced_at: None,
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

    #[test]
    fn unusable_listings_are_skipped() {
        assert!(checked(&json!({"sessionId": "ok", "cwd": "/w"})).is_some());
        assert!(checked(&json!({"sessionId": "has space", "cwd": "/w"})).is_none());
        assert!(checked(&json!({"sessionId": "ok", "cwd": "relative"})).is_none());
        assert!(checked(&json!({"sessionId": "ok"})).is_none());
        assert!(checked(&json!({"cwd": "/w"})).is_none());
    }
}
