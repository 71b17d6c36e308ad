//! Who is watching each session: every event stream opened on it (`GET /sessions/{id}/events`,
//! an `/acp` client following it) is a row of the store while it is open, so that any replica
//! answers `GET /sessions/{id}/watchers` for all of them. When a person's first stream of a
//! session opens or their last one ends, `watchers_changed` goes to the lifecycle log
//! (`GET /events`), out of the session's own log: the store counts a person's streams (on the
//! replicas that beat within the lease) as it adds or removes one, so that exactly one of
//! streams opening or ending at once, on any replicas, is their first or last. Rows of a
//! replica that is gone are skipped and removed by the next reader. On one replica a session's
//! changes are made one at a time (row, count, event), so that its events follow each other in
//! the order of the changes.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use tokio_util::task::TaskTracker;

use super::log::Log;
use crate::cluster::Cluster;
use crate::gateway::caller::Author;
use crate::gateway::clock::now;
use crate::gateway::event::{GatewayLifecycleEvent, WatchersChanged};
use crate::gateway::output::WatcherView;
use crate::store::{SessionRecord, SessionWatchers, WatcherRecord};

/// The watchers of every session, in the store.
pub(in crate::gateway) struct Watchers {
    store: Arc<dyn SessionWatchers>,
    log: Log,
    cluster: Arc<Cluster>,
    /// The removals of ended streams.
    tasks: TaskTracker,
    /// A session's changes take the lock its id hashes to, for the row, the count and the event.
    changes: [tokio::sync::Mutex<()>; LOCKS],
    hasher: RandomState,
}

/// How many locks the sessions' changes share.
const LOCKS: usize = 64;

/// An open stream's row, removed when this is dropped (the stream ended).
pub(in crate::gateway) struct Watching {
    watchers: Arc<Watchers>,
    record: SessionRecord,
    row: WatcherRecord,
}

impl Drop for Watching {
    fn drop(&mut self) {
        let (watchers, record) = (self.watchers.clone(), self.record.clone());
        let row = std::mem::take(&mut self.row);
        self.watchers.tasks.spawn(async move {
            let _one_at_a_time = watchers.lock(&record.session_id).await;
            match watchers.store.remove_watcher(&row, watchers.cluster.lease()).await {
                Ok(0) => watchers.changed(&record).await,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(session = record.session_id, error = %e, "an ended stream is still counted among the session's watchers")
                }
            }
        });
    }
}

impl Watchers {
    pub(in crate::gateway) fn new(
        store: Arc<dyn SessionWatchers>,
        log: Log,
        cluster: Arc<Cluster>,
        tasks: TaskTracker,
    ) -> Self {
        Watchers {
            store,
            log,
            cluster,
            tasks,
            changes: std::array::from_fn(|_| tokio::sync::Mutex::default()),
            hasher: RandomState::new(),
        }
    }

    /// The lock of `session_id`'s changes.
    async fn lock(&self, session_id: &str) -> tokio::sync::MutexGuard<'_, ()> {
        let slot = self.hasher.hash_one(session_id) as usize % LOCKS;
        self.changes[slot].lock().await
    }

    /// `author` opened a stream of the session of `record`: counted until the guard drops.
    pub(in crate::gateway) async fn watch(
        self: &Arc<Self>,
        record: &SessionRecord,
        author: Author,
    ) -> Watching {
        let row = WatcherRecord {
            watcher_id: format!("w_{}", uuid::Uuid::new_v4().simple()),
            session_id: record.session_id.clone(),
            replica: crate::cluster::replica_id().to_owned(),
            author: serde_json::to_string(&author).expect("an author serialises"),
            since: now().timestamp_micros(),
        };
        let _one_at_a_time = self.lock(&record.session_id).await;
        match self.store.add_watcher(&row, self.cluster.lease()).await {
            Ok(1) => self.changed(record).await,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = record.session_id, error = %e, "a stream is not counted among the session's watchers")
            }
        }
        Watching {
            watchers: self.clone(),
            record: record.clone(),
            row,
        }
    }

    /// The people watching the session, each with their streams, first watcher first.
    pub(in crate::gateway) async fn list(
        &self,
        session_id: &str,
    ) -> crate::store::StoreResult<Vec<WatcherView>> {
        let rows = self.store.watchers_of(session_id).await?;
        let mut gone = BTreeMap::new();
        let mut people: Vec<WatcherView> = Vec::new();
        for row in rows {
            if !gone.contains_key(&row.replica) {
                let is_gone = self.cluster.gone(&row.replica).await.unwrap_or(false);
                if is_gone {
                    let _ = self.store.forget_watchers_of(&row.replica).await;
                }
                gone.insert(row.replica.clone(), is_gone);
            }
            if gone[&row.replica] {
                continue;
            }
            let Ok(author) = serde_json::from_str::<Author>(&row.author) else {
                continue;
            };
            match people.iter_mut().find(|p| p.who == author) {
                Some(person) => person.streams += 1,
                None => people.push(WatcherView {
                    who: author,
                    streams: 1,
                    since: chrono::DateTime::from_timestamp_micros(row.since).unwrap_or_default(),
                }),
            }
        }
        Ok(people)
    }

    /// A person's first stream of the session opened or their last ended: `watchers_changed`
    /// with everyone watching now.
    async fn changed(&self, record: &SessionRecord) {
        let Ok(people) = self.list(&record.session_id).await else {
            return;
        };
        let changed = GatewayLifecycleEvent::WatchersChanged(WatchersChanged {
            session_id: record.session_id.clone(),
            watchers: people,
        });
        self.log.lifecycle(record, changed).await;
    }
}
