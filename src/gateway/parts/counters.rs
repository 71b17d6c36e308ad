//! The service's own counters for `/metrics` (the event hub keeps those of the streams): each
//! counted by a method named after what happened, read together by [`Counters::read`].

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    turns_started: AtomicU64,
    turns_failed: AtomicU64,
    member_exits: AtomicU64,
    /// Sessions the list sync tombstoned because their agent no longer knows them.
    sessions_vanished: AtomicU64,
    /// Sessions the list sync had tombstoned that came back (listed or served again).
    sessions_revived: AtomicU64,
}

/// What the counters held when read.
#[derive(Debug, Clone, Copy)]
pub struct Counted {
    pub turns_started: u64,
    pub turns_failed: u64,
    pub member_exits: u64,
    pub sessions_vanished: u64,
    pub sessions_revived: u64,
}

impl Counters {
    pub fn turn_started(&self) {
        self.turns_started.fetch_add(1, Ordering::Relaxed);
    }

    pub fn turn_failed(&self) {
        self.turns_failed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn member_exited(&self) {
        self.member_exits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn session_vanished(&self) {
        self.sessions_vanished.fetch_add(1, Ordering::Relaxed);
    }

    pub fn session_revived(&self) {
        self.sessions_revived.fetch_add(1, Ordering::Relaxed);
    }

    pub fn read(&self) -> Counted {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counted {
            turns_started: read(&self.turns_started),
            turns_failed: read(&self.turns_failed),
            member_exits: read(&self.member_exits),
            sessions_vanished: read(&self.sessions_vanished),
            sessions_revived: read(&self.sessions_revived),
        }
    }
}
