//! The log writer: one task, on a thread of its own, through which every append to a session's
//! log goes (group commit, then a pause of [`COMMIT_PACE`]), and its handle ([`Writer`]), which
//! queues for it and reads what it counts; and the account of what was not stored when a
//! shutdown gives up on the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, mpsc, oneshot};

use super::followers::Followers;
use super::retry::{Abandoned, Failing, Retries};
use super::run::Run;
use super::stages::StageTimes;
use super::stopping::Stopping;
use super::traced::{Traced, write_spans};
use crate::store::{EventLog, LogWriter, NewEvent, StoredEvent};

/// Most events written in one batch.
pub const MAX_BATCH: usize = 2048;
/// Events queued for the writer before appenders wait.
const QUEUE: usize = 8192;
/// The least time between the end of one commit of the event log and the start of the next,
/// unless someone waits for one ([`Writer::append`], [`Writer::flush`]) or the last batch
/// was full: events queued meanwhile gather into one commit, without waking the writer. An
/// event queued while the writer is idle is committed at once, but for a turn's opening, which
/// waits up to this long for the turn's first answer ([`Writer::enqueue_opening`]); a
/// streaming turn's events are committed (and reach live subscribers) in batches about this
/// far apart. On a small machine each commit, and each wake-up of the writer, takes CPU and
/// file-system time from the agent the gateway is waiting for (see `bench/README.md`).
pub(super) const COMMIT_PACE: Duration = Duration::from_millis(2);
/// A commit of fewer events than this leaves the writer quiet: the end of a turn then ends its
/// pause, so that a client sees the turn end with the answer. A larger commit means events
/// arrive faster than the pace gathers them; turns' ends then wait for the pace like the rest,
/// and the commits (and their CPU) stay few.
const QUIET_BATCH: usize = 64;

/// An append waiting for the writer.
struct Queued {
    session_id: String,
    /// `None`: a barrier ([`Writer::stored`]), answered once everything before it is stored.
    event: Option<NewEvent>,
    /// Raise the session's `updated_at` to at least this, with the event.
    touch: Option<DateTime<Utc>>,
    /// How it wakes the writer.
    wakes: Wakes,
    done: Option<oneshot::Sender<Result<i64, String>>>,
    /// The span whose trace the append belongs to (a turn's), while traces are exported.
    span: Option<tracing::Span>,
    /// When it was queued.
    at: Instant,
}

impl Queued {
    /// A barrier: `done` is answered once everything queued before it is stored.
    fn barrier(done: oneshot::Sender<Result<i64, String>>) -> Self {
        Queued {
            session_id: String::new(),
            event: None,
            touch: None,
            wakes: Wakes::Now,
            done: Some(done),
            span: None,
            at: Instant::now(),
        }
    }
}

/// How a queued append wakes the writer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wakes {
    /// At once if it is idle; after its pause if not.
    Paced,
    /// It ended the writer's pause, or would have: someone waits for it, or it ends a turn
    /// someone follows while the writer is quiet ([`Writer::enqueue_now`]).
    Now,
    /// It opens a turn: an idle writer waits for the turn's first answer before committing it
    /// ([`Writer::enqueue_opening`]).
    Opening,
}

/// What the writer and its handle share: the writer's pace and what it counts.
struct Shared {
    /// Ends the writer's pause: someone waits for a commit, or a followed turn has ended
    /// while the writer is quiet.
    urgent: Notify,
    /// The writer's last batch was small ([`QUIET_BATCH`]): a turn's end may end its pause
    /// ([`Writer::enqueue_now`]).
    quiet: AtomicBool,
    appended: AtomicU64,
    /// Group commits (each one broadcast to live subscribers as one run).
    commits: AtomicU64,
    /// Commits that raised a session's `updated_at`, and every append another replica
    /// announced (it may have changed any cached session).
    touches: AtomicU64,
}

/// The handle to the log writer: queues appends for it (bounded: when the writer falls behind,
/// appenders wait) and reads what it counts. The writer itself ends once the hub is closing
/// and its queue is written, or when the handle is dropped.
pub(super) struct Writer {
    queue: mpsc::Sender<Queued>,
    shared: Arc<Shared>,
    failing: Failing,
    /// Whose appends are followed live (a followed turn's end ends the writer's pause).
    followers: Arc<Followers>,
    /// The sessions whose appends are traced, and their spans.
    traced: Traced,
}

impl Writer {
    /// Starts the writer on a thread of its own, pausing `pace` after each commit, and
    /// committed runs broadcast to `followers`, timing its stages into `stages`; `stopping`
    /// closes it and tracks its end.
    pub(super) fn start(
        log: Arc<dyn EventLog>,
        followers: Arc<Followers>,
        stopping: &Stopping,
        pace: Duration,
        stages: Arc<StageTimes>,
    ) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            urgent: Notify::new(),
            quiet: AtomicBool::new(true),
            appended: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            touches: AtomicU64::new(0),
        });
        let failing = Failing::default();
        let task = WriterTask {
            rx,
            shared: shared.clone(),
            log: log.clone(),
            followers: followers.clone(),
            stopping: stopping.clone(),
            pace,
            retries: Retries::new(log, stopping.clone(), failing.clone()),
            stages,
        };
        let (written, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("acp-event-log".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(task.run()),
                    Err(e) => tracing::error!(error = %e, "cannot start the event log writer"),
                }
                drop(written);
            })
            .expect("the event log writer thread starts");
        stopping.finish_with(stopped);
        Writer {
            queue,
            shared,
            failing,
            followers,
            traced: Traced::default(),
        }
    }

    /// Appends and waits until it is stored (and broadcast); its sequence number.
    pub(super) async fn append(&self, session_id: &str, event: NewEvent) -> Result<i64, String> {
        let (tx, rx) = oneshot::channel();
        self.enqueue_as(session_id, event, None, Wakes::Now, Some(tx))
            .await;
        rx.await
            .unwrap_or_else(|_| Err("the event writer has stopped".into()))
    }

    /// Queues an append without waiting for it to be stored.
    pub(super) async fn enqueue(&self, session_id: &str, event: NewEvent) {
        self.enqueue_as(session_id, event, None, Wakes::Paced, None)
            .await;
    }

    /// Queues the append that opens a turn, raising the session's `updated_at` to at least
    /// `touch` in the same commit. Queued while the writer is idle (nothing written for a pace)
    /// and quiet ([`QUIET_BATCH`]), it is not committed at once like other events: the writer
    /// first waits, up to its pace, for what it knows comes soon, the turn's first answer (its
    /// end, or anyone waiting for a commit; the updates before gather meanwhile), so that an
    /// agent answering at once has the turn stored in one commit, not two in series. A writer
    /// in a stream of commits, which gathers events in its pauses anyway, commits it at once.
    pub(super) async fn enqueue_opening(
        &self,
        session_id: &str,
        event: NewEvent,
        touch: DateTime<Utc>,
    ) {
        let wakes = Wakes::Opening;
        self.enqueue_as(session_id, event, Some(touch), wakes, None)
            .await;
    }

    /// Queues an append, and ends the writer's pause if someone follows the session live and
    /// the writer is quiet ([`QUIET_BATCH`]).
    pub(super) async fn enqueue_now(&self, session_id: &str, event: NewEvent) {
        let now = self.shared.quiet.load(Ordering::Relaxed) && self.followers.followed(session_id);
        let wakes = if now { Wakes::Now } else { Wakes::Paced };
        self.enqueue_as(session_id, event, None, wakes, None).await;
    }

    /// Waits until everything queued so far is stored, unless the writer is retrying a failed
    /// append.
    pub(super) async fn flush(&self) {
        if !self.failing() {
            self.stored().await;
        }
    }

    /// Waits until everything queued so far is stored, however long the store is down (until
    /// a shutdown gives up on it).
    pub(super) async fn stored(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Queued::barrier(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    async fn enqueue_as(
        &self,
        session_id: &str,
        event: NewEvent,
        touch: Option<DateTime<Utc>>,
        wakes: Wakes,
        done: Option<oneshot::Sender<Result<i64, String>>>,
    ) {
        let item = Queued {
            session_id: session_id.to_owned(),
            event: Some(event),
            touch,
            wakes,
            done,
            span: self.traced.of(session_id),
            at: Instant::now(),
        };
        if let Err(mpsc::error::SendError(item)) = self.send(item).await {
            tracing::error!(
                session = item.session_id,
                kind = item.event.map(|e| e.kind),
                "the event writer has stopped; event not stored"
            );
        }
    }

    /// Queues `item` for the writer; one that [`Wakes::Now`] ends the writer's pause.
    async fn send(&self, item: Queued) -> Result<(), mpsc::error::SendError<Queued>> {
        let now = item.wakes == Wakes::Now;
        self.queue.send(item).await?;
        if now {
            self.shared.urgent.notify_one();
        }
        Ok(())
    }

    /// The writer's last append failed and it is retrying.
    pub(super) fn failing(&self) -> bool {
        self.failing.now()
    }

    /// Events appended since start.
    pub(super) fn appended(&self) -> u64 {
        self.shared.appended.load(Ordering::Relaxed)
    }

    /// Group commits since start.
    pub(super) fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    /// Commits that raised a session's `updated_at`, and appends other replicas announced.
    pub(super) fn touches(&self) -> u64 {
        self.shared.touches.load(Ordering::SeqCst)
    }

    /// Another replica appended: it may have changed any cached session.
    pub(super) fn touched_elsewhere(&self) {
        self.shared.touches.fetch_add(1, Ordering::SeqCst);
    }

    /// Which sessions' appends are written in a turn's trace.
    pub(super) fn traced(&self) -> &Traced {
        &self.traced
    }
}

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

/// The writer task: it owns the queue's receiving end and its retries.
struct WriterTask {
    rx: mpsc::Receiver<Queued>,
    shared: Arc<Shared>,
    log: Arc<dyn EventLog>,
    followers: Arc<Followers>,
    stopping: Stopping,
    /// The pause after each commit ([`COMMIT_PACE`]).
    pace: Duration,
    retries: Retries,
    /// How long events wait for their batch's write, and the writes.
    stages: Arc<StageTimes>,
}

impl WriterTask {
    /// Group commit of everything queued, session by session, in queue order, then a pause of
    /// [`WriterTask::pace`] unless someone waits for a commit (or a followed turn ends,
    /// [`Writer::enqueue_now`]) or the batch was full. An append that fails is retried until
    /// it succeeds (see [`Retries::append_group`]); meanwhile nothing more is taken from the
    /// queue, so appenders wait when it is full.
    async fn run(mut self) {
        let mut log = self.log.log_writer();
        let mut batch = Vec::with_capacity(MAX_BATCH);
        // When the last write ended.
        let mut wrote: Option<Instant> = None;
        loop {
            let first = tokio::select! {
                biased;
                item = self.rx.recv() => item,
                _ = self.stopping.closing() => {
                    self.rx.close();
                    self.rx.recv().await
                }
            };
            let Some(first) = first else { return };
            let opening = first.wakes == Wakes::Opening;
            batch.push(first);
            self.take(&mut batch);
            // A turn's opening waits for the turn's first answer (`Writer::enqueue_opening`)
            // when the writer has been idle for a pace and is quiet, the turn's end then ending
            // the wait; not when what is queued behind it is the answer, or fills the batch.
            if opening
                && wrote.is_none_or(|at| at.elapsed() >= self.pace)
                && self.shared.quiet.load(Ordering::Relaxed)
                && batch.len() < MAX_BATCH
                && !batch.iter().any(|i| i.wakes == Wakes::Now)
            {
                self.pause().await;
                self.take(&mut batch);
            }
            let full = batch.len() == MAX_BATCH;
            // Before the batch is written, so that whoever it answers sees it.
            self.shared
                .quiet
                .store(batch.len() < QUIET_BATCH, Ordering::Relaxed);
            let writing = Instant::now();
            let mut events = 0;
            for item in batch.iter().filter(|item| item.event.is_some()) {
                self.stages.waited.observe(writing - item.at);
                events += 1;
            }
            if let Err(left) = self.write_batch(log.as_mut(), &mut batch).await {
                give_up(left, self.rx).await;
                return;
            }
            wrote = Some(Instant::now());
            if events > 0 {
                self.stages.written.observe(writing.elapsed());
            }
            if !full {
                self.pause().await;
            }
        }
    }

    /// Waits for the writer's pace, unless someone needs a commit sooner ([`Wakes::Now`]) or the
    /// hub is closing.
    async fn pause(&self) {
        tokio::select! {
            biased;
            _ = self.shared.urgent.notified() => {}
            _ = self.stopping.closing() => {}
            _ = tokio::time::sleep(self.pace) => {}
        }
    }

    /// Takes what else is queued into `batch`, up to [`MAX_BATCH`].
    fn take(&mut self, batch: &mut Vec<Queued>) {
        while batch.len() < MAX_BATCH {
            match self.rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
    }

    /// Writes `batch`: every session's share in one transaction when the store can, else (or
    /// when that fails) each session's share in one append of its own, retried. `Err`: the hub
    /// gave up during an outage (shutdown), with the items not written.
    async fn write_batch(
        &mut self,
        log: &mut dyn LogWriter,
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
                    self.shared.commits.fetch_add(1, Ordering::Relaxed);
                    for (share, stored) in shares.into_iter().zip(stored) {
                        if let Some(last) = stored.last() {
                            self.retries.stored(&share.session_id, last.seq);
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
            let rx = &self.rx;
            let queued = || rx.max_capacity() - rx.capacity();
            let appended = self
                .retries
                .append_group(
                    log,
                    &share.session_id,
                    &share.events,
                    share.touch,
                    unsure,
                    &queued,
                )
                .await;
            match appended {
                Ok(stored) => {
                    if stored.is_ok() {
                        self.shared.commits.fetch_add(1, Ordering::Relaxed);
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
                self.shared
                    .appended
                    .fetch_add(stored.len() as u64, Ordering::Relaxed);
                if share.touch.is_some() {
                    self.shared.touches.fetch_add(1, Ordering::SeqCst);
                }
                // The events are consecutive: the `n`th item's is `first + n`.
                let (first, count) = (stored.first().map_or(0, |e| e.seq), stored.len());
                if count > 0 {
                    self.followers
                        .broadcast(&share.session_id, || Run::committed(stored));
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
mod tests;
