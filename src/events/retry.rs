//! What the log writer does when an append fails: retry it with backoff until the store takes
//! it (or the store refuses the data itself, or a shutdown gives up on the store), and check
//! after a lost connection whether it had committed unseen.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::stopping::Stopping;
use crate::store::{EventLog, LogWriter, NewEvent, StoreResult, StoredEvent};

/// The first pause before an append that failed is tried again; it doubles up to
/// [`RETRY_MAX`].
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest pause between two tries of a failing append.
pub(super) const RETRY_MAX: Duration = Duration::from_secs(2);

/// Whether the log writer's last append failed and it is retrying: set by its retries, read by
/// the hub (appenders wait; a flush does not).
#[derive(Clone, Default)]
pub(super) struct Failing(Arc<AtomicBool>);

impl Failing {
    /// The writer is retrying a failed append now.
    pub(super) fn now(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn set(&self, failing: bool) {
        self.0.store(failing, Ordering::SeqCst);
    }
}

/// The log writer's retries: what it last stored in each session (to check, after a lost
/// connection, whether an append had committed), whether it is failing now, and the shutdown
/// that ends them.
pub(super) struct Retries {
    /// The log, read back after a lost connection.
    log: Arc<dyn EventLog>,
    stopping: Stopping,
    known: KnownSeqs,
    failing: Failing,
}

impl Retries {
    pub(super) fn new(log: Arc<dyn EventLog>, stopping: Stopping, failing: Failing) -> Self {
        Retries {
            log,
            stopping,
            known: KnownSeqs::default(),
            failing,
        }
    }

    /// The writer stored the session's log up to `seq` (without these retries).
    pub(super) fn stored(&mut self, session_id: &str, seq: i64) {
        self.known.insert(session_id, seq);
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
    /// cannot tell, and appends again. `queued`: how many items wait in the writer's queue
    /// (for the logs).
    pub(super) async fn append_group(
        &mut self,
        log: &mut dyn LogWriter,
        session_id: &str,
        events: &[NewEvent],
        touch: Option<DateTime<Utc>>,
        mut unsure: bool,
        queued: &dyn Fn() -> usize,
    ) -> Result<Result<Vec<StoredEvent>, String>, Abandoned> {
        let mut pause = RETRY_FIRST;
        let mut failures: u32 = 0;
        let since = std::time::Instant::now();
        loop {
            let found = if unsure {
                let check = tokio::select! {
                    biased;
                    found = self.already_stored(session_id, events) => found,
                    _ = self.stopping.given_up() => return Err(Abandoned),
                };
                match check {
                    Ok(found) => found,
                    Err(e) => {
                        tracing::debug!(session = session_id, error = %e, "cannot read the event log yet");
                        wait_to_retry(&self.stopping, &mut pause).await?;
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
                    _ = self.stopping.given_up() => return Err(Abandoned),
                },
            };
            match attempt {
                Ok(stored) => {
                    if failures > 0 {
                        self.failing.set(false);
                        tracing::warn!(
                            session = session_id,
                            events = events.len(),
                            failures,
                            after = ?since.elapsed(),
                            queued = queued(),
                            "the event log is written again"
                        );
                    }
                    if let Some(last) = stored.last() {
                        self.known.insert(session_id, last.seq);
                    }
                    return Ok(Ok(stored));
                }
                Err(e) if e.is_about_the_data() => {
                    if failures > 0 {
                        // The store answers again, if only to refuse these: not failing now.
                        self.failing.set(false);
                    }
                    tracing::error!(session = session_id, error = %e, events = events.len(), "the store refused these events; they are not stored");
                    return Ok(Err(e.to_string()));
                }
                Err(e) => {
                    failures += 1;
                    unsure = e.is_connection_lost() && !e.is_shut_down_by_server();
                    self.failing.set(true);
                    if failures == 1 || failures.is_multiple_of(20) {
                        tracing::warn!(
                            session = session_id,
                            error = %e,
                            events = events.len(),
                            failures,
                            queued = queued(),
                            "cannot append to the event log; retrying until it can (appenders wait)"
                        );
                    } else {
                        tracing::debug!(session = session_id, error = %e, failures, "cannot append to the event log; still retrying");
                    }
                    wait_to_retry(&self.stopping, &mut pause).await?;
                }
            }
        }
    }

    /// `events` as stored right after the last sequence number this writer stored in the
    /// session, if that is exactly what the log holds there; `None` when it holds something
    /// else or nothing, or this writer has not stored in the session yet.
    async fn already_stored(
        &self,
        session_id: &str,
        events: &[NewEvent],
    ) -> StoreResult<Option<Vec<StoredEvent>>> {
        let Some(last) = self.known.get(session_id) else {
            return Ok(None);
        };
        let limit = i64::try_from(events.len())
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let after = self.log.read_events(session_id, last, limit).await?;
        let same = after.len() == events.len()
            && after
                .iter()
                .zip(events)
                .all(|(s, e)| s.kind == e.kind && s.payload == e.payload);
        Ok(same.then_some(after))
    }
}

/// Sleeps `pause`, then doubles it up to [`RETRY_MAX`]; `Err` when the shutdown gives up on
/// the store meanwhile.
pub(super) async fn wait_to_retry(
    stopping: &Stopping,
    pause: &mut Duration,
) -> Result<(), Abandoned> {
    tokio::select! {
        _ = tokio::time::sleep(*pause) => {}
        _ = stopping.given_up() => return Err(Abandoned),
    }
    *pause = (*pause * 2).min(RETRY_MAX);
    Ok(())
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
