//! Which member takes a request: the least-loaded ready one, or, while members start or
//! restart, the first to become ready within a bound (like a database pool's acquire timeout),
//! woken by the supervisors' state changes rather than by polling. When none will be ready in
//! time, why, and when to try again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::members::Pool;
use crate::agent_rpc::Connection;

/// What a client should wait before retrying when every ready member is full: nothing about
/// the pool says when a session will be closed.
const FULL_RETRY_AFTER: Duration = Duration::from_secs(5);

/// No member can take the request.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// Why, for the client.
    pub reason: String,
    /// When trying again makes sense: the next restart attempt (at least a second away), or
    /// [`FULL_RETRY_AFTER`] when ready members are full.
    pub retry_after: Duration,
    /// Ready members exist, but each holds its maximum of live sessions.
    pub full: bool,
}

impl Pool {
    /// The least-loaded ready member.
    pub fn pick(&self) -> Option<(usize, Arc<Connection>)> {
        self.pick_below(usize::MAX)
    }

    /// The least-loaded ready member holding fewer than `cap` live sessions. A member whose
    /// connection is gone is not ready: a request that found it broken is never sent to that
    /// process again, but is to the member's next one.
    pub fn pick_below(&self, cap: usize) -> Option<(usize, Arc<Connection>)> {
        self.every_member()
            .iter()
            .filter_map(|m| {
                let load = m.sessions();
                (load < cap)
                    .then(|| m.ready_conn())
                    .flatten()
                    .map(|c| (load, m.index(), c))
            })
            .min_by_key(|(load, index, _)| (*load, *index))
            .map(|(_, index, c)| (index, c))
    }

    /// A ready member below `cap`, waiting at most `timeout` for one that is starting or
    /// restarting. Answers at once when no member can become ready in time: every one is full,
    /// crash-looping, stopped, or backing off past the deadline.
    pub async fn acquire(
        &self,
        cap: usize,
        timeout: Duration,
    ) -> Result<(usize, Arc<Connection>), Unavailable> {
        let deadline = Instant::now() + timeout;
        loop {
            // Registered before looking, so that a change in between is not missed.
            let changed = self.changed();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if let Some(found) = self.pick_below(cap) {
                return Ok(found);
            }
            let now = Instant::now();
            match self.next_chance() {
                Some(at) if at < deadline && now < deadline => {}
                _ => return Err(self.unavailable(cap)),
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
                _ = self.shutting_down() => return Err(self.unavailable(cap)),
            }
        }
    }

    /// The earliest moment a member may become ready (see [`Member::next_chance`]).
    ///
    /// [`Member::next_chance`]: super::members::Member::next_chance
    fn next_chance(&self) -> Option<Instant> {
        let now = Instant::now();
        self.every_member()
            .iter()
            .filter_map(|m| m.next_chance(now))
            .min()
    }

    /// Why no member can take a request now, and when to try again.
    fn unavailable(&self, cap: usize) -> Unavailable {
        if self.ready_count() > 0 {
            return Unavailable {
                reason: format!(
                    "every ready agent member already holds its maximum of {cap} live sessions; close some or try again later"
                ),
                retry_after: FULL_RETRY_AFTER,
                full: true,
            };
        }
        let now = Instant::now();
        let next = self
            .every_member()
            .iter()
            .filter_map(|m| m.next_attempt())
            .min()
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        // Whole seconds (Retry-After has no fraction), rounded up, at least one.
        let retry_after = Duration::from_secs(next.as_secs() + u64::from(next.subsec_nanos() > 0))
            .max(Duration::from_secs(1));
        Unavailable {
            reason: self
                .unready_reason()
                .unwrap_or_else(|| "no agent member is ready".into()),
            retry_after,
            full: false,
        }
    }

    /// Why the pool is not ready, when no member is.
    pub fn unready_reason(&self) -> Option<String> {
        if self.ready_count() > 0 {
            return None;
        }
        let looping = self
            .every_member()
            .iter()
            .filter(|m| m.crash_looping())
            .count();
        let last = self.members().into_iter().find_map(|m| {
            m.last_error.or_else(|| {
                m.last_exit
                    .as_ref()
                    .map(|e| format!("last exit: code {:?}, signal {:?}", e.code, e.signal))
            })
        });
        Some(match (looping, last) {
            (0, None) => "no agent member is ready yet".to_owned(),
            (0, Some(l)) => format!("no agent member is ready ({l})"),
            (n, l) => format!(
                "{n} of {} agent members are crash-looping ({}); see /agent",
                self.size(),
                l.unwrap_or_default()
            ),
        })
    }
}
