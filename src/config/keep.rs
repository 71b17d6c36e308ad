//! The flags of how long the store keeps what it is given: events (`--retention-events`,
//! `--retention-age`) and idempotency keys (`--idempotency-ttl`), flattened into
//! [`super::Config`].

use clap::Args;

/// What the store keeps, and for how long.
#[derive(Debug, Clone, Args)]
pub struct KeepFlags {
    /// Keep at most this many of each session's latest events (0: all).
    #[arg(
        long,
        env = "ACP_GATEWAY_RETENTION_EVENTS",
        default_value_t = 0,
        global = true
    )]
    pub retention_events: i64,

    /// Drop events older than this many seconds (0: never).
    #[arg(
        long,
        env = "ACP_GATEWAY_RETENTION_AGE",
        default_value_t = 0,
        global = true
    )]
    pub retention_age: u64,

    /// Seconds an `Idempotency-Key` and the response it answered with are kept.
    #[arg(
        long,
        env = "ACP_GATEWAY_IDEMPOTENCY_TTL",
        default_value_t = 86400,
        global = true
    )]
    pub idempotency_ttl: u64,

    /// Seconds a repeat waits for the request still running under its `Idempotency-Key` before
    /// it answers 409 with `Retry-After` (keep it within `--request-timeout`, so that the
    /// client hears 409 rather than 504).
    #[arg(
        long,
        env = "ACP_GATEWAY_IDEMPOTENCY_WAIT",
        default_value_t = 30,
        global = true
    )]
    pub idempotency_wait: u64,
}
