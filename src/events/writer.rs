//! The log writer: one task, on a thread of its own, through which every append to a session's
//! log goes (group commit, then a pause of [`COMMIT_PACE`]), and the hub's methods that queue
//! for it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use super::{EventHub, Frame};
use crate::store::{LogWriter, NewEvent, StoreResult, StoredEvent};

/// Events queued for the writer before appenders wait.
pub(super) const QUEUE: usize = 8192;
/// The least time between the end of one commit of the event log and the start of the next,
/// unless someone waits for one ([`EventHub::append`], [`EventHub::flush`]) or the last batch
/// was full: events queued meanwhile gather into one commit, without waking the writer. An
/// event queued while the writer is idle is committed at once; a streaming turn's are
/// committed (and reach live subscribers) in batches about this far apart. On a small
/// machine each commit, and each wake-up of the writer, takes CPU and file-system time from
/// the agent the gateway is waiting for (see the README's Performance section).
pub(super) const COMMIT_PACE: Duration = Duration::from_millis(2);
/// Most events written in one batch.
const MAX_BATCH: usize = 2048;
/// The first pause before an append that failed is tried again; it doubles up to
/// [`RETRY_MAX`].
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two tries of a failing append.
const RETRY_MAX: Duration = Duration::from_secs(2);

pub(super) struct Queued {
    session_id: String,
    /// `None`: a barrier ([`EventHub::flush`]), answered once everything before it is stored.
    event: Option<NewEvent>,
    /// Raise the session's `updated_at` to at least this, with the event.
    touch: Option<DateTime<Utc>>,
    done: Option<oneshot::Sender<Result<i64, String>>>,
}

/// The niceness of the event log writer's thread: request handling and agents go first on a
/// busy CPU.
const LOG_WRITER_NICE: u8 = 5;

/// Lowers the calling thread's CPU priority to [`LOG_WRITER_NICE`]. The writer commits in the
/// background (no request waits for it; readers of the log flush the queue first), so on a
/// machine with few cores its commits should not delay a prompt's answer or slow an agent
/// that shares the cores. Not being allowed to is harmless.
pub(super) fn log_writer_priority() {
    use thread_priority::{ThreadPriority, ThreadPriorityValue, set_current_thread_priority};
    // The crate maps 0..=99 linearly onto niceness 19..=-20, rounding towards 19.
    let value = 99 * (19 - u16::from(LOG_WRITER_NICE)) / 39;
    let set = u8::try_from(value)
        .ok()
        .and_then(|v| ThreadPriorityValue::try_from(v).ok())
        .map(|v| set_current_thread_priority(ThreadPriority::Crossplatform(v)));
    if !matches!(set, Some(Ok(()))) {
        tracing::debug!(?set, "cannot lower the event log writer's priority");
    }
}

impl EventHub {
    /// Appends to a session's log and waits until it is stored (and broadcast); returns its
    /// sequence number.
    pub async fn append(&self, session_id: &str, event: NewEvent) -> Result<i64, String> {
        let (tx, rx) = oneshot::channel();
        self.enqueue_with(session_id, event, None, Some(tx)).await;
        rx.await
            .unwrap_or_else(|_| Err("the event writer has stopped".into()))
    }

    /// Queues an append without waiting for it to be stored. Order is kept: it is written
    /// before anything queued (or appended) later.
    pub async fn enqueue(&self, session_id: &str, event: NewEvent) {
        self.enqueue_with(session_id, event, None, None).await;
    }

    /// As [`EventHub::enqueue`], and the session's `updated_at` is raised to at least `at` in
    /// the same commit; [`EventHub::touches`] counts such commits.
    pub async fn enqueue_touching(&self, session_id: &str, event: NewEvent, at: DateTime<Utc>) {
        self.enqueue_with(session_id, event, Some(at), None).await;
    }

    /// Waits until everything queued so far is stored (read-your-writes for log readers).
    /// Returns at once while the writer retries a failed append (the store is down): a reader
    /// then gets what is stored, or the store's error, instead of waiting for the outage.
    pub async fn flush(&self) {
        if !self.log_failing() {
            self.stored().await;
        }
    }

    /// Waits until everything queued so far is stored, however long the store is down (until
    /// a shutdown gives up on it).
    pub async fn stored(&self) {
        let (tx, rx) = oneshot::channel();
        let barrier = Queued {
            session_id: String::new(),
            event: None,
            touch: None,
            done: Some(tx),
        };
        if self.send(barrier).await.is_ok() {
            let _ = rx.await;
        }
    }

    async fn enqueue_with(
        &self,
        session_id: &str,
        event: NewEvent,
        touch: Option<DateTime<Utc>>,
        done: Option<oneshot::Sender<Result<i64, String>>>,
    ) {
        let item = Queued {
            session_id: session_id.to_owned(),
            event: Some(event),
            touch,
            done,
        };
        if let Err(mpsc::error::SendError(item)) = self.send(item).await {
            tracing::error!(
                session = item.session_id,
                kind = item.event.map(|e| e.kind),
                "the event writer has stopped; event not stored"
            );
        }
    }

    /// Queues `item` for the writer; one that someone waits for ends the writer's pause.
    async fn send(&self, item: Queued) -> Result<(), mpsc::error::SendError<Queued>> {
        let waited_for = item.done.is_some();
        self.queue.send(item).await?;
        if waited_for {
            self.urgent.notify_one();
        }
        Ok(())
    }

    /// The writer: group commit of everything queued, session by session, in queue order, then
    /// a pause of [`EventHub::pace`] unless someone waits for a commit or the batch was full.
    /// An append that fails is retried until it succeeds (see [`EventHub::append_group`]);
    /// meanwhile nothing more is taken from the queue, so appenders wait when it is full.
    pub(super) async fn write(&self, mut rx: mpsc::Receiver<Queued>) {
        let mut log = self.store.log_writer();
        let mut known = KnownSeqs::default();
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                biased;
                item = rx.recv() => item,
                _ = self.closing.cancelled() => {
                    rx.close();
                    rx.recv().await
                }
            };
            let Some(first) = first else { return };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(item) => batch.push(item),
                    Err(_) => break,
                }
            }
            let full = batch.len() == MAX_BATCH;
            if let Err(left) = self.write_batch(log.as_mut(), &mut known, &mut batch).await {
                give_up(left, rx).await;
                return;
            }
            if !full {
                tokio::select! {
                    biased;
                    _ = self.urgent.notified() => {}
                    _ = self.closing.cancelled() => {}
                    _ = tokio::time::sleep(self.pace) => {}
                }
            }
        }
    }

    /// Writes `batch`, each session's share in one append. `Err`: the hub gave up during an
    /// outage (shutdown), with the items not written.
    async fn write_batch(
        &self,
        log: &mut dyn LogWriter,
        known: &mut KnownSeqs,
        batch: &mut Vec<Queued>,
    ) -> Result<(), Vec<Queued>> {
        // Group by session, keeping each session's order (sessions are independent logs).
        let mut groups: Vec<(String, Vec<Queued>)> = Vec::new();
        let mut barriers = Vec::new();
        for item in batch.drain(..) {
            if item.event.is_none() {
                barriers.extend(item.done);
                continue;
            }
            match groups.iter_mut().find(|(id, _)| *id == item.session_id) {
                Some((_, items)) => items.push(item),
                None => groups.push((item.session_id.clone(), vec![item])),
            }
        }
        let mut groups = groups.into_iter();
        while let Some((session_id, mut items)) = groups.next() {
            let events: Vec<NewEvent> = items.iter_mut().filter_map(|i| i.event.take()).collect();
            let touch = items.iter().filter_map(|i| i.touch).max();
            let stored = match self
                .append_group(log, known, &session_id, &events, touch)
                .await
            {
                Ok(stored) => stored,
                Err(Abandoned) => {
                    // Put the events back, for the account of what was lost.
                    for (item, event) in items.iter_mut().zip(events) {
                        item.event = Some(event);
                    }
                    return Err(items
                        .into_iter()
                        .chain(groups.flat_map(|(_, items)| items))
                        .collect());
                }
            };
            match stored {
                Ok(stored) => {
                    self.appended
                        .fetch_add(stored.len() as u64, Ordering::Relaxed);
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    if touch.is_some() {
                        self.touches.fetch_add(1, Ordering::SeqCst);
                    }
                    if !stored.is_empty() {
                        self.broadcast(&session_id, || Frame::run(&stored));
                    }
                    for (item, e) in items.into_iter().zip(&stored) {
                        if let Some(done) = item.done {
                            let _ = done.send(Ok(e.seq));
                        }
                    }
                }
                Err(e) => {
                    for item in items {
                        if let Some(done) = item.done {
                            let _ = done.send(Err(e.clone()));
                        }
                    }
                }
            }
        }
        // Everything queued before the barriers is in this batch or an earlier one: stored.
        for done in barriers {
            let _ = done.send(Ok(0));
        }
        Ok(())
    }

    /// Appends one session's events, retrying with backoff ([`RETRY_FIRST`] doubling to
    /// [`RETRY_MAX`]) for as long as the store fails, until the hub gives up ([`Abandoned`],
    /// at shutdown). The inner `Err`: the store refused the data itself, which no retry
    /// changes (logged; the events are not stored).
    ///
    /// After a lost connection the append may have committed before the answer was lost; so
    /// before appending again it reads the session's log after the last sequence number this
    /// writer stored there, and takes an exact match of the batch as the commit (no
    /// duplicate). For a session this writer has not yet stored anything in since start, it
    /// cannot tell, and appends again.
    async fn append_group(
        &self,
        log: &mut dyn LogWriter,
        known: &mut KnownSeqs,
        session_id: &str,
        events: &[NewEvent],
        touch: Option<DateTime<Utc>>,
    ) -> Result<Result<Vec<StoredEvent>, String>, Abandoned> {
        let mut pause = RETRY_FIRST;
        let mut failures: u32 = 0;
        let since = std::time::Instant::now();
        let mut unsure = false;
        loop {
            let found = if unsure {
                let check = tokio::select! {
                    biased;
                    found = self.already_stored(known, session_id, events) => found,
                    _ = self.abandon.cancelled() => return Err(Abandoned),
                };
                match check {
                    Ok(found) => found,
                    Err(e) => {
                        tracing::debug!(session = session_id, error = %e, "cannot read the event log yet");
                        self.wait_to_retry(&mut pause).await?;
                        continue;
                    }
                }
            } else {
                None
            };
            let attempt = match found {
                Some(stored) => {
                    tracing::info!(
                        session = session_id,
                        events = events.len(),
                        "an append whose answer was lost had been committed; not appending it again"
                    );
                    Ok(stored)
                }
                None => tokio::select! {
                    biased;
                    r = log.append(session_id, events, touch) => r,
                    _ = self.abandon.cancelled() => return Err(Abandoned),
                },
            };
            match attempt {
                Ok(stored) => {
                    if failures > 0 {
                        self.failing.store(false, Ordering::SeqCst);
                        tracing::warn!(
                            session = session_id,
                            events = events.len(),
                            failures,
                            after = ?since.elapsed(),
                            queued = self.queued(),
                            "the event log is written again"
                        );
                    }
                    if let Some(last) = stored.last() {
                        known.insert(session_id, last.seq);
                    }
                    return Ok(Ok(stored));
                }
                Err(e) if e.is_about_the_data() => {
                    if failures > 0 {
                        // The store answers again, if only to refuse these: not failing now.
                        self.failing.store(false, Ordering::SeqCst);
                    }
                    tracing::error!(session = session_id, error = %e, events = events.len(), "the store refused these events; they are not stored");
                    return Ok(Err(e.to_string()));
                }
                Err(e) => {
                    failures += 1;
                    unsure = e.is_connection_lost() && !e.is_shut_down_by_server();
                    self.failing.store(true, Ordering::SeqCst);
                    if failures == 1 || failures.is_multiple_of(20) {
                        tracing::warn!(
                            session = session_id,
                            error = %e,
                            events = events.len(),
                            failures,
                            queued = self.queued(),
                            "cannot append to the event log; retrying until it can (appenders wait)"
                        );
                    } else {
                        tracing::debug!(session = session_id, error = %e, failures, "cannot append to the event log; still retrying");
                    }
                    self.wait_to_retry(&mut pause).await?;
                }
            }
        }
    }

    /// Events (and barriers) waiting in the queue.
    fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    /// Sleeps `pause`, then doubles it up to [`RETRY_MAX`].
    pub(super) async fn wait_to_retry(&self, pause: &mut Duration) -> Result<(), Abandoned> {
        tokio::select! {
            _ = tokio::time::sleep(*pause) => {}
            _ = self.abandon.cancelled() => return Err(Abandoned),
        }
        *pause = (*pause * 2).min(RETRY_MAX);
        Ok(())
    }

    /// `events` as stored right after the last sequence number this writer stored in the
    /// session, if that is exactly what the log holds there; `None` when it holds something
    /// else or nothing, or this writer has not stored in the session yet.
    async fn already_stored(
        &self,
        known: &KnownSeqs,
        session_id: &str,
        events: &[NewEvent],
    ) -> StoreResult<Option<Vec<StoredEvent>>> {
        let Some(last) = known.get(session_id) else {
            return Ok(None);
        };
        let limit = i64::try_from(events.len())
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let after = self.store.read_events(session_id, last, limit).await?;
        let same = after.len() == events.len()
            && after
                .iter()
                .zip(events)
                .all(|(s, e)| s.kind == e.kind && s.payload == e.payload);
        Ok(same.then_some(after))
    }
}

/// The hub gave up writing (shutdown during an outage).
pub(super) struct Abandoned;

/// The last sequence number this writer stored in each session (a bounded number of them).
#[derive(Default)]
struct KnownSeqs(HashMap<String, i64>);

impl KnownSeqs {
    /// Sessions remembered; past it the map starts over (a session forgotten is one whose
    /// next lost append, if any, cannot be checked).
    const MAX: usize = 10_000;

    fn get(&self, session_id: &str) -> Option<i64> {
        self.0.get(session_id).copied()
    }

    fn insert(&mut self, session_id: &str, seq: i64) {
        if self.0.len() >= Self::MAX && !self.0.contains_key(session_id) {
            self.0.clear();
        }
        self.0.insert(session_id.to_owned(), seq);
    }
}

/// After the hub gave up: fails whoever waits for `left` and for what is still queued, and
/// logs, per session, how many events were not stored.
async fn give_up(left: Vec<Queued>, mut rx: mpsc::Receiver<Queued>) {
    rx.close();
    let mut lost: Vec<(String, usize)> = Vec::new();
    let mut count = |item: Queued| {
        if let Some(done) = item.done {
            let _ = done.send(Err(
                "the event log could not be written before shutdown".into()
            ));
        }
        if item.event.is_none() {
            return;
        }
        match lost.iter_mut().find(|(id, _)| *id == item.session_id) {
            Some((_, n)) => *n += 1,
            None => lost.push((item.session_id, 1)),
        }
    };
    left.into_iter().for_each(&mut count);
    while let Some(item) = rx.recv().await {
        count(item);
    }
    for (session, events) in lost {
        tracing::error!(
            session,
            events,
            "shutting down while the event log cannot be written: these events are not stored"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::events::Retention;
    use crate::store::Store;

    /// A store on an SQLite file of its own (a file, so that the log writer has its own
    /// connection, as in production), and the directory to keep while it is used.
    async fn file_store() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = crate::store::connect(&url, "test-replica")
            .await
            .unwrap()
            .store;
        (dir, store)
    }

    /// `flush` returns once everything queued before it is stored. On this single-threaded
    /// runtime the writer cannot run between the enqueues and the read unless `flush` waits.
    #[tokio::test]
    async fn flush_waits_for_everything_queued_before_it() {
        let (_dir, store) = file_store().await;
        let hub = EventHub::new(
            store.clone(),
            CancellationToken::new(),
            Retention::default(),
        );
        for i in 0..100 {
            hub.enqueue("s", event(i)).await;
        }
        hub.flush().await;
        assert_eq!(store.read_events("s", 0, 1000).await.unwrap().len(), 100);
        hub.close().await;
    }

    async fn appended(store: &Arc<dyn Store>, session: &str) -> usize {
        store.read_events(session, 0, 1000).await.unwrap().len()
    }

    fn event(i: usize) -> NewEvent {
        NewEvent {
            kind: "x".into(),
            payload: serde_json::json!({"i": i}),
        }
    }

    /// After a commit the writer pauses: what is queued meanwhile waits and then goes into one
    /// commit. An event queued while the writer is idle is committed at once, and a `flush`
    /// or an awaited `append` ends the pause instead of waiting it out. The pace here is far
    /// longer than the test, so that no timing decides the outcome.
    #[tokio::test]
    async fn events_queued_during_the_pause_share_one_commit() {
        let (_dir, store) = file_store().await;
        let pace = Duration::from_secs(600);
        let hub = EventHub::with_pace(
            store.clone(),
            CancellationToken::new(),
            Retention::default(),
            pace,
        );
        hub.enqueue("s", event(0)).await;
        // The counter moves just after the commit becomes readable: wait for both.
        let committed = async {
            while appended(&store, "s").await == 0 || hub.commits() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), committed)
            .await
            .expect("an event queued while the writer is idle is committed without a pause");
        assert_eq!(hub.commits(), 1);

        for i in 1..50 {
            hub.enqueue("s", event(i)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            appended(&store, "s").await,
            1,
            "the writer pauses after a commit"
        );
        tokio::time::timeout(Duration::from_secs(30), hub.flush())
            .await
            .expect("a flush ends the pause");
        assert_eq!(appended(&store, "s").await, 50);
        assert_eq!(
            hub.commits(),
            2,
            "what was queued during the pause is one commit"
        );

        hub.enqueue("s", event(50)).await;
        let seq = tokio::time::timeout(Duration::from_secs(30), hub.append("s", event(51)))
            .await
            .expect("an awaited append ends the pause")
            .unwrap();
        assert_eq!(seq, 52);
        assert_eq!(hub.commits(), 3);
        tokio::time::timeout(Duration::from_secs(30), hub.close())
            .await
            .expect("closing ends the pause");
    }
}
