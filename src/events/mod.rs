//! The event hub: every session event is appended to the durable log in the store first, then
//! broadcast to live subscribers. Subscribers read the log from their cursor, then follow the
//! broadcast; whenever they fall behind or see a gap they go back to the log, so a slow
//! subscriber never slows the agent and never misses or repeats an event.
//!
//! Appends go through one writer task (group commit): it takes everything queued, in order, and
//! writes each session's share in one transaction, so a fast-streaming agent costs one commit per
//! batch rather than one per chunk; after each commit it pauses briefly (`COMMIT_PACE`) so that
//! the next batch gathers without waking it, and a turn's opening event waits as long for the
//! turn's first answer, so that a turn answered at once is one commit. The queue is bounded:
//! when the store falls behind, the agent's stdout is read more slowly, and nothing is dropped.
//! So too when the store fails: the writer retries the failed append with backoff and takes
//! nothing more from the queue until it succeeds, so appenders wait (an agent blocks on its
//! pipe) with memory bounded by the queue; only a shutdown that outlasts its timeout gives up,
//! and logs what was not stored. Events older than the retention limits are pruned; a
//! subscriber whose cursor points into pruned history first gets a `gap` event.
//!
//! Each part keeps its state behind its methods. `hub.rs` is the hub itself, the face the rest
//! of the crate calls: it holds the parts, retention and the wake-ups from other replicas;
//! `writer.rs` is the log writer task that every append goes through and its handle,
//! `retry.rs` what it does when an append fails, `lifecycle.rs` the lifecycle log's writer
//! (queued and retried the same way), `followers.rs` the live broadcast channels, `stream.rs`
//! the subscribers' side (following a log) and its counters, `stages.rs` how long events wait
//! at each stage, `stopping.rs` the hub's tasks and
//! the words that stop them, `run.rs` what subscribers follow, `traced.rs` the trace a turn's
//! appends are written in. What the hub carries is typed: each edge writes its own wire form.
//! This file only declares the parts and re-exports their names.

mod followers;
mod hub;
mod lifecycle;
mod retry;
mod run;
mod stages;
mod stopping;
mod stream;
mod traced;
mod writer;

pub use hub::{EventHub, Retention};
pub use run::{Run, Sequenced};
pub use stages::{BOUNDS_US, LatencyCounts, StageTimes};
pub use stream::{StreamCounts, StreamStats};
pub use traced::Traced;
pub use writer::MAX_BATCH;

/// The events the hub carries, as the log stores them.
pub use crate::store::{StoredEvent, StoredLifecycleEvent};
