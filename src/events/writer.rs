//! The log writer: one task, on a thread of its own, through which every append to a session's
//! log goes (group commit, then a pause of [`COMMIT_PACE`](super::hub::COMMIT_PACE)), the hub's methods that queue for
//! it, and the account of what was not stored when a shutdown gives up on the store.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use super::hub::EventHub;
use super::hub::{QUIET_BATCH, Queued};
use super::retry::{Abandoned, KnownSeqs};
use super::run::Run;
use super::traced::write_spans;
use crate::store::{LogWriter, NewEvent, StoredEvent};

/// Most events written in one batch.
pub const MAX_BATCH: usize = 2048;

/// One session's share of a batch: its items (their events taken out, in order) and the
/// latest `touch` among them.
struct Share {
    session_id: String,
    items: Vec<Queued>,
    events: Vec<NewEvent>,
    touch: Option<DateTime<Utc>>,
}

impl Share {
    /// The items with their events put back (for the account of what was not stored).
    fn into_items(self) -> Vec<Queued> {
        let mut items = self.items;
        for (item, event) in items.iter_mut().zip(self.events) {
            item.event = Some(event);
        }
        items
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

    /// As [`EventHub::enqueue`], and, when someone follows the session live, the writer's
    /// pause ([`EventHub::pace`]) ends unless the writer is busy ([`QUIET_BATCH`]): what ends a
    /// turn reaches its subscribers with the answer, not a pace later. Unfollowed, it waits for
    /// the pace: the commit it would cost falls on the client's next request instead.
    pub async fn enqueue_now(&self, session_id: &str, event: NewEvent) {
        self.enqueue_with(session_id, event, None, None).await;
        if self.quiet.load(Ordering::Relaxed) && self.followed(session_id) {
            self.urgent.notify_one();
        }
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
            span: None,
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
            span: self.traced.of(session_id),
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
    /// a pause of [`EventHub::pace`] unless someone waits for a commit (or a
    /// followed turn ends, [`EventHub::enqueue_now`]) or the batch was full.
    /// An append that fails is retried until it succeeds (see [`EventHub::append_group`]);
    /// meanwhile nothing more is taken from the queue, so appenders wait when it is full.
    pub(super) async fn write(&self, mut rx: mpsc::Receiver<Queued>) {
        let mut log = self.log.log_writer();
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
            // Before the batch is written, so that whoever it answers sees it.
            self.quiet
                .store(batch.len() < QUIET_BATCH, Ordering::Relaxed);
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

    /// Writes `batch`: every session's share in one transaction when the store can, else (or
    /// when that fails) each session's share in one append of its own, retried. `Err`: the hub
    /// gave up during an outage (shutdown), with the items not written.
    async fn write_batch(
        &self,
        log: &mut dyn LogWriter,
        known: &mut KnownSeqs,
        batch: &mut Vec<Queued>,
    ) -> Result<(), Vec<Queued>> {
        // Group by session, keeping each session's order (sessions are independent logs).
        let mut shares: Vec<Share> = Vec::new();
        let mut barriers = Vec::new();
        for mut item in batch.drain(..) {
            let Some(event) = item.event.take() else {
                barriers.extend(item.done);
                continue;
            };
            let share = match shares
                .iter_mut()
                .position(|s| s.session_id == item.session_id)
            {
                Some(i) => &mut shares[i],
                None => {
                    shares.push(Share {
                        session_id: item.session_id.clone(),
                        items: Vec::new(),
                        events: Vec::new(),
                        touch: None,
                    });
                    shares.last_mut().expect("just pushed")
                }
            };
            share.touch = share.touch.max(item.touch);
            share.events.push(event);
            share.items.push(item);
        }
        // Ended when the batch is written (or given up on).
        let total = shares.iter().map(|s| s.events.len()).sum();
        let _spans: Vec<tracing::Span> = shares
            .iter()
            .flat_map(|s| {
                write_spans(
                    &s.session_id,
                    s.items.iter().map(|i| i.span.as_ref()),
                    total,
                )
            })
            .collect();
        let mut unsure = false;
        if shares.len() > 1 {
            let all: Vec<_> = shares
                .iter()
                .map(|s| (s.session_id.as_str(), s.events.as_slice(), s.touch))
                .collect();
            match log.append_all(&all).await {
                Some(Ok(stored)) => {
                    self.commits.fetch_add(1, Ordering::Relaxed);
                    for (share, stored) in shares.into_iter().zip(stored) {
                        if let Some(last) = stored.last() {
                            known.insert(&share.session_id, last.seq);
                        }
                        self.written(share, Ok(stored));
                    }
                    shares = Vec::new();
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "appending every session's share at once failed; appending each alone");
                    unsure = e.is_connection_lost() && !e.is_shut_down_by_server();
                }
                None => {}
            }
        }
        let mut shares = shares.into_iter();
        while let Some(share) = shares.next() {
            let appended = self
                .append_group(
                    log,
                    known,
                    &share.session_id,
                    &share.events,
                    share.touch,
                    unsure,
                )
                .await;
            match appended {
                Ok(stored) => {
                    if stored.is_ok() {
                        self.commits.fetch_add(1, Ordering::Relaxed);
                    }
                    self.written(share, stored);
                }
                Err(Abandoned) => {
                    // Put the events back, for the account of what was lost.
                    return Err(std::iter::once(share)
                        .chain(shares)
                        .flat_map(Share::into_items)
                        .collect());
                }
            }
        }
        // Everything queued before the barriers is in this batch or an earlier one: stored.
        for done in barriers {
            let _ = done.send(Ok(0));
        }
        Ok(())
    }

    /// Counts the events of a session's share that was written (or refused), broadcasts it and
    /// answers whoever waits for it.
    fn written(&self, share: Share, stored: Result<Vec<StoredEvent>, String>) {
        match stored {
            Ok(stored) => {
                self.appended
                    .fetch_add(stored.len() as u64, Ordering::Relaxed);
                if share.touch.is_some() {
                    self.touches.fetch_add(1, Ordering::SeqCst);
                }
                // The events are consecutive: the `n`th item's is `first + n`.
                let (first, count) = (stored.first().map_or(0, |e| e.seq), stored.len());
                if count > 0 {
                    self.broadcast(&share.session_id, || Run::committed(stored));
                }
                for (item, seq) in share.items.into_iter().zip(first..).take(count) {
                    if let Some(done) = item.done {
                        let _ = done.send(Ok(seq));
                    }
                }
            }
            Err(e) => {
                for item in share.items {
                    if let Some(done) = item.done {
                        let _ = done.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Events (and barriers) waiting in the queue.
    pub(super) fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }
}

/// After the hub gave up: fails whoever waits for `left` and for what is still queued, and
/// logs, per session, how many events were not stored.
pub(super) async fn give_up(left: Vec<Queued>, mut rx: mpsc::Receiver<Queued>) {
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
    use std::time::Duration;

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
            payload: serde_json::json!({"i": i}).into(),
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

    /// Waits until `store` holds `n` events of "s".
    async fn until_appended(store: &Arc<dyn Store>, n: usize, what: &str) {
        let stored = async {
            while appended(store, "s").await < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), stored)
            .await
            .expect(what);
    }

    /// A turn's end (`enqueue_now`) in a session someone follows is committed without waiting
    /// out the pause while the writer is quiet, and waits for it after a commit of a busy
    /// writer ([`QUIET_BATCH`] events or more); in a session nobody follows it always waits.
    /// The pace is far longer than the test.
    #[tokio::test]
    async fn a_turns_end_cuts_the_pause_of_a_quiet_writer_only() {
        let (_dir, store) = file_store().await;
        let hub = EventHub::with_pace(
            store.clone(),
            CancellationToken::new(),
            Retention::default(),
            Duration::from_secs(600),
        );
        hub.enqueue("s", event(0)).await;
        until_appended(&store, 1, "an idle writer commits at once").await;
        hub.enqueue_now("s", event(1)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            appended(&store, "s").await,
            1,
            "the end of a turn nobody follows waits for the pace"
        );
        let follower = hub.session_stream("s", None).await.unwrap();
        hub.enqueue_now("s", event(2)).await;
        until_appended(
            &store,
            3,
            "a followed turn's end cuts a quiet writer's pause",
        )
        .await;

        // A busy writer: one commit of QUIET_BATCH events, queued before it wakes (an awaited
        // append ends the pause), then a turn's end, which waits for the pace.
        for i in 0..QUIET_BATCH - 1 {
            hub.enqueue("s", event(3 + i)).await;
        }
        hub.append("s", event(2 + QUIET_BATCH)).await.unwrap();
        let busy = 3 + QUIET_BATCH;
        hub.enqueue_now("s", event(busy)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            appended(&store, "s").await,
            busy,
            "after a large commit a turn's end waits for the pace"
        );
        hub.flush().await;
        assert_eq!(appended(&store, "s").await, busy + 1);
        drop(follower);
        hub.close().await;
    }
}
