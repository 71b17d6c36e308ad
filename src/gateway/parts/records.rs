//! The session records as the service reads and writes them, and the coordination around
//! them: the gateway's own changes to cached sessions (numbered, so that a list sync that began
//! earlier does not undo them), the list pages read recently (kept until a session changes),
//! one list sync at a time, and the guard that keeps a sync from taking a session being
//! created for one the agent listed on its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::events::EventHub;
use crate::gateway::caller::Caller;
use crate::gateway::cursor::encode_cursor;
use crate::gateway::error::Error;
use crate::gateway::input::SessionId;
use crate::gateway::output::PageJson;
use crate::gateway::portable::read_only;
use crate::store::{ListQuery, SessionMutation, SessionRecord, SessionRecords, StoreResult};

/// Pages kept per generation; beyond it the page cache starts over.
const MAX_PAGES: usize = 1024;

/// The session records, and who may change them when.
pub(in crate::gateway) struct Records {
    store: Arc<dyn SessionRecords>,
    /// Counts the commits of prompts' `updatedAt` (part of the list generation).
    hub: Arc<EventHub>,
    /// Numbers the gateway's own changes to cached sessions ([`Records::update_cached`]).
    touches: AtomicU64,
    /// The number of each session's latest own change, kept until a sync has begun after it.
    touched: Mutex<HashMap<String, u64>>,
    /// Held shared by an own change from its mark to its write, and exclusively by a sync
    /// from its last look at the marks to its write: one never falls between the other's two
    /// steps. (Not `creating`, which a create holds across a call to the agent.)
    writes: tokio::sync::RwLock<()>,
    /// Bumped after every write to the session cache; invalidates `list_pages`.
    list_generation: AtomicU64,
    /// Recently read list pages (rows only: status is added per request) of the current
    /// `list_generation`. Every write to the cache, this replica's or (announced through the
    /// store) another's, moves the generation, so a page stays true until it moves.
    list_pages: Mutex<(u64, HashMap<String, Arc<PageJson>>)>,
    /// One `session/list` sync at a time (held across the sync's awaits on purpose).
    sync_lock: tokio::sync::Mutex<()>,
    /// Held shared by a create from `session/new` until its row is stored; a sync takes it
    /// exclusively (and drops it at once) after listing, so an id the agent listed because
    /// the gateway just created it is never taken for an upstream session.
    creating: tokio::sync::RwLock<()>,
}

impl Records {
    pub(in crate::gateway) fn new(store: Arc<dyn SessionRecords>, hub: Arc<EventHub>) -> Self {
        Records {
            store,
            hub,
            touches: AtomicU64::new(0),
            touched: Mutex::default(),
            writes: tokio::sync::RwLock::new(()),
            list_generation: AtomicU64::new(0),
            list_pages: Mutex::default(),
            sync_lock: tokio::sync::Mutex::new(()),
            creating: tokio::sync::RwLock::new(()),
        }
    }

    /// The session rows, for what these methods do not cover.
    pub(in crate::gateway) fn rows(&self) -> &dyn SessionRecords {
        self.store.as_ref()
    }

    /// A known, non-deleted session of the caller's, or 404 (another tenant's session is
    /// indistinguishable from an unknown one).
    pub(in crate::gateway) async fn get(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<SessionRecord, Error> {
        match self.store.get_session(id.as_str()).await? {
            Some(r) if r.deleted_at.is_none() && caller.sees(&r.tenant) => Ok(r),
            _ => Err(Error::NotFound(format!("no session {}", id.as_str()))),
        }
    }

    /// [`Records::get`] for a request that makes the session live (a prompt, a resume): a
    /// session the list sync tombstoned is found too, as it would be live (`true`: it comes
    /// back once its agent serves it); an imported transcript is refused (409).
    pub(in crate::gateway) async fn get_to_use(
        &self,
        caller: &Caller,
        id: &SessionId,
    ) -> Result<(SessionRecord, bool), Error> {
        match self.store.get_session(id.as_str()).await? {
            Some(r) if r.deleted_at.is_none() && caller.sees(&r.tenant) => match read_only(&r) {
                Some(why) => Err(Error::Conflict(why)),
                None => Ok((r, false)),
            },
            Some(r) if caller.sees(&r.tenant) && self.store.vanished(id.as_str()).await? => {
                let r = SessionRecord {
                    deleted_at: None,
                    ..r
                };
                Ok((r, true))
            }
            _ => Err(Error::NotFound(format!("no session {}", id.as_str()))),
        }
    }

    /// Changes a cached session on the gateway's own authority (not from a listing). The
    /// change is noted so that a sync whose listing began earlier does not undo it.
    pub(in crate::gateway) async fn update_cached(
        &self,
        session_id: &str,
        mutate: SessionMutation<'_>,
    ) -> StoreResult<Option<SessionRecord>> {
        // Not between a sync's last look at the marks and its write (see `sync_page`), which
        // would write over this with what the agent listed before.
        let _not_while_a_sync_writes = self.writes.read().await;
        self.mark_touched(session_id);
        let updated = self.store.update_session(session_id, mutate).await;
        self.sessions_changed();
        updated
    }

    /// Notes a change of the gateway's own to a cached session, before it is written, so that
    /// a list sync running meanwhile does not undo it with what the agent had before.
    pub(in crate::gateway) fn mark_touched(&self, session_id: &str) {
        let n = self.touches.fetch_add(1, Ordering::SeqCst) + 1;
        self.touched
            .lock()
            .expect("touched lock")
            .insert(session_id.to_owned(), n);
    }

    /// The number of the latest own change: a sync that starts now lists what came before.
    pub(in crate::gateway) fn touches(&self) -> u64 {
        self.touches.load(Ordering::SeqCst)
    }

    /// Whether the gateway changed the session on its own after change `since`.
    pub(in crate::gateway) fn touched_since(&self, session_id: &str, since: u64) -> bool {
        let touched = self.touched.lock().expect("touched lock");
        touched.get(session_id).is_some_and(|n| *n > since)
    }

    /// `items` without those whose session the gateway has changed on its own authority
    /// since change `since`: that change is newer than the listing.
    pub(in crate::gateway) fn untouched<T>(
        &self,
        mut items: Vec<T>,
        id: impl Fn(&T) -> &str,
        since: u64,
    ) -> Vec<T> {
        let touched = self.touched.lock().expect("touched lock");
        if touched.values().any(|n| *n > since) {
            items.retain(|item| touched.get(id(item)).is_none_or(|n| *n <= since));
        }
        items
    }

    /// Forgets the marks a sync that began after change `since` has seen.
    pub(in crate::gateway) fn forget_touches_up_to(&self, since: u64) {
        self.touched
            .lock()
            .expect("touched lock")
            .retain(|_, n| *n > since);
    }

    /// Held by a sync from its last look at the marks to its write.
    pub(in crate::gateway) async fn sync_writing(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.writes.write().await
    }

    /// Held for a whole sync: one at a time.
    pub(in crate::gateway) async fn one_sync(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.sync_lock.lock().await
    }

    /// Held by a create from its `session/new` until its row is stored.
    pub(in crate::gateway) async fn creating(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.creating.read().await
    }

    /// Waits for the creates under way to store their rows.
    pub(in crate::gateway) async fn creates_stored(&self) {
        drop(self.creating.write().await);
    }

    /// Moves after every committed write to the session cache: the gateway's own, counted
    /// here, and prompts' `updatedAt`, committed by the event writer.
    fn list_generation(&self) -> u64 {
        self.list_generation.load(Ordering::SeqCst) + self.hub.touches()
    }

    /// Call after every write to the session cache (once it has committed).
    pub(in crate::gateway) fn sessions_changed(&self) {
        self.list_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// One page of the session list, from `list_pages` when it holds the page (unless
    /// `fresh`), else from the store.
    pub(in crate::gateway) async fn list_page(
        &self,
        query: &ListQuery,
        fresh: bool,
    ) -> StoreResult<Arc<PageJson>> {
        let key = format!("{query:?}");
        let generation = self.list_generation();
        if !fresh {
            let pages = self.list_pages.lock().expect("list cache lock");
            if let Some(page) = pages.1.get(&key).filter(|_| pages.0 == generation) {
                return Ok(page.clone());
            }
        }
        let list = self.store.list_sessions(query).await?;
        let next_cursor = list.next.as_ref().map(|n| encode_cursor(query, n));
        let page = Arc::new(PageJson::new(&list.sessions, next_cursor));
        let mut pages = self.list_pages.lock().expect("list cache lock");
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
