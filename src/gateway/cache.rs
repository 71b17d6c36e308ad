//! The session cache as the service writes and reads it: the gateway's own changes to cached
//! sessions (numbered, so that a list sync that began earlier does not undo them), and the list
//! pages read recently, kept until a session changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Inner;
use super::model::{PageJson, encode_cursor};
use crate::store::{ListQuery, SessionMutation, SessionRecord, StoreResult};

/// Pages kept per generation; beyond it the page cache starts over.
const MAX_PAGES: usize = 1024;

#[derive(Default)]
pub(super) struct Cache {
    /// Numbers the gateway's own changes to cached sessions ([`Inner::update_cached`]).
    pub(super) touches: AtomicU64,
    /// The number of each session's latest own change, kept until a sync has begun after it.
    pub(super) touched: Mutex<HashMap<String, u64>>,
    /// Held shared by an own change from its mark to its write, and exclusively by a sync
    /// from its last look at the marks to its write: one never falls between the other's two
    /// steps. (Not `Inner::creating`, which a create holds across a call to the agent.)
    pub(super) writes: tokio::sync::RwLock<()>,
    /// Bumped after every write to the session cache; invalidates `list_pages`.
    list_generation: AtomicU64,
    /// Recently read list pages (rows only: status is added per request) of the current
    /// `list_generation`. Every write to the cache, this replica's or (announced through the
    /// store) another's, moves the generation, so a page stays true until it moves.
    list_pages: Mutex<(u64, HashMap<String, Arc<PageJson>>)>,
}

impl Inner {
    /// Changes a cached session on the gateway's own authority (not from a listing). The
    /// change is noted so that a sync whose listing began earlier does not undo it.
    pub(super) async fn update_cached(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        // Not between a sync's last look at the marks and its write (see `sync_page`), which
        // would write over this with what the agent listed before.
        let _not_while_a_sync_writes = self.cache.writes.read().await;
        self.mark_touched(session_id);
        let updated = self.store.update_session(session_id, mutate).await;
        self.sessions_changed();
        if let Ok(Some(r)) = &updated {
            self.live.record_changed(r);
        }
        updated
    }

    /// Notes a change of the gateway's own to a cached session, before it is written, so that
    /// a list sync running meanwhile does not undo it with what the agent had before.
    pub(super) fn mark_touched(&self, session_id: &str) {
        let n = self.cache.touches.fetch_add(1, Ordering::SeqCst) + 1;
        self.cache
            .touched
            .lock()
            .expect("touched lock")
            .insert(session_id.to_owned(), n);
    }

    /// Moves after every committed write to the session cache: the gateway's own, counted
    /// here, and prompts' `updatedAt`, committed by the event writer.
    fn list_generation(&self) -> u64 {
        self.cache.list_generation.load(Ordering::SeqCst) + self.hub.touches()
    }

    /// Call after every write to the session cache (once it has committed).
    pub(super) fn sessions_changed(&self) {
        self.cache.list_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// One page of the session list, from `list_pages` when it holds the page (unless
    /// `fresh`), else from the store.
    pub(super) async fn list_page(
        &self,
        query: &ListQuery,
        fresh: bool,
    ) -> StoreResult<Arc<PageJson>> {
        let key = format!("{query:?}");
        let generation = self.list_generation();
        if !fresh {
            let pages = self.cache.list_pages.lock().expect("list cache lock");
            if let Some(page) = pages.1.get(&key).filter(|_| pages.0 == generation) {
                return Ok(page.clone());
            }
        }
        let list = self.store.list_sessions(query).await?;
        let next_cursor = list.next.as_ref().map(|n| encode_cursor(query, n));
        let page = Arc::new(PageJson::new(&list.sessions, next_cursor));
        let mut pages = self.cache.list_pages.lock().expect("list cache lock");
        // Only a page read entirely within one generation may be kept for it.
        if self.list_generation() == generation {
            if pages.0 != generation || pages.1.len() >= MAX_PAGES {
                *pages = (generation, HashMap::new());
            }
            pages.1.insert(key, page.clone());
        }
        Ok(page)
    }
}
