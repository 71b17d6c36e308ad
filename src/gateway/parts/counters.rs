//! The service's own counters for `/metrics` (the event hub keeps those of the streams).

use std::sync::atomic::AtomicU64;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub turns_started: AtomicU64,
    pub turns_failed: AtomicU64,
    pub member_exits: AtomicU64,
    /// Sessions the list sync tombstoned because their agent no longer knows them.
    pub sessions_vanished: AtomicU64,
    /// Sessions the list sync had tombstoned that came back (listed or served again).
    pub sessions_revived: AtomicU64,
}
