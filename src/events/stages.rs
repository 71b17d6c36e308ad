//! How long the hub's events spend at each stage on their way to a subscriber, as histograms
//! of fixed buckets (atomic counters: no lock and no allocation per event): from being queued to
//! the start of their batch's write (`waited`), that write, commit included (`written`, one per
//! batch), and from the commit to a subscriber's stream taking the run (`handed`, one per live
//! subscriber and run). `/metrics` shows them; the open-loop bench reads them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The buckets' upper bounds, in microseconds (and one more for anything longer).
pub const BOUNDS_US: [u64; 17] = [
    25, 50, 100, 200, 300, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 10_000, 25_000, 50_000,
    100_000, 1_000_000,
];

/// One stage's histogram.
#[derive(Default)]
pub struct Latencies {
    /// Observations per bucket: `buckets[i]` those at most `BOUNDS_US[i]` and above the bound
    /// before; the last, those above every bound.
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_ns: AtomicU64,
}

/// A histogram as read at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyCounts {
    /// Observations per bucket, as [`Latencies`] keeps them (not cumulative).
    pub buckets: Vec<u64>,
    /// The sum of the observations, in nanoseconds.
    pub sum_ns: u64,
}

impl Latencies {
    /// Counts one observation.
    pub fn observe(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_US.partition_point(|&us| us * 1_000 < ns);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn read(&self) -> LatencyCounts {
        LatencyCounts {
            buckets: (self.buckets.iter())
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// The stages of an event's way from the agent's line to a subscriber.
#[derive(Default)]
pub struct StageTimes {
    /// Queued for the log writer → its batch's write starts (per event).
    pub waited: Latencies,
    /// A batch's write, commit included (per batch).
    pub written: Latencies,
    /// A batch committed → a live subscriber's stream takes it (per subscriber and batch).
    pub handed: Latencies,
}

impl StageTimes {
    /// Each stage's name and its counts now.
    pub fn read(&self) -> Vec<(&'static str, LatencyCounts)> {
        vec![
            ("waited", self.waited.read()),
            ("written", self.written.read()),
            ("handed", self.handed.read()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_holds_it() {
        let l = Latencies::default();
        l.observe(Duration::from_micros(25));
        l.observe(Duration::from_nanos(25_001));
        l.observe(Duration::from_millis(2));
        l.observe(Duration::from_secs(3));
        let read = l.read();
        assert_eq!(read.buckets[0], 1, "25 µs is within 25 µs");
        assert_eq!(read.buckets[1], 1, "25.001 µs is not");
        assert_eq!(
            read.buckets[BOUNDS_US.iter().position(|&b| b == 2_000).unwrap()],
            1
        );
        assert_eq!(read.buckets[BOUNDS_US.len()], 1, "beyond every bound");
        assert_eq!(read.buckets.iter().sum::<u64>(), 4);
        assert_eq!(read.sum_ns, 25_000 + 25_001 + 2_000_000 + 3_000_000_000);
    }
}
