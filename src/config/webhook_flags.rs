//! The webhook flags (`--webhook-…`), flattened into [`super::Config`].

use clap::Args;

/// How webhooks are delivered.
#[derive(Debug, Clone, Args)]
pub struct WebhookFlags {
    /// Deliver webhooks to loopback, private and other non-public addresses too (refused
    /// otherwise). Link-local and cloud instance-metadata addresses stay refused.
    #[arg(long, env = "ACP_GATEWAY_WEBHOOK_ALLOW_PRIVATE", global = true)]
    pub webhook_allow_private: bool,

    /// Deliver webhooks to link-local addresses (169.254.0.0/16, fe80::/10) and the cloud
    /// instance-metadata endpoints (169.254.169.254, fd00:ec2::254, 100.100.100.200) too.
    #[arg(long, env = "ACP_GATEWAY_WEBHOOK_ALLOW_LINK_LOCAL", global = true)]
    pub webhook_allow_link_local: bool,

    /// Seconds one delivery attempt may take (connect, send, answer).
    #[arg(
        long,
        env = "ACP_GATEWAY_WEBHOOK_TIMEOUT",
        default_value_t = 10,
        global = true
    )]
    pub webhook_timeout: u64,

    /// Milliseconds before a failed delivery's first retry; doubled at each attempt.
    #[arg(
        long,
        env = "ACP_GATEWAY_WEBHOOK_RETRY_BASE_MS",
        default_value_t = 5000,
        global = true
    )]
    pub webhook_retry_base_ms: u64,

    /// Longest wait between two attempts, in seconds.
    #[arg(
        long,
        env = "ACP_GATEWAY_WEBHOOK_RETRY_MAX",
        default_value_t = 3600,
        global = true
    )]
    pub webhook_retry_max: u64,

    /// Seconds a delivery is retried before it fails and its subscription is disabled.
    #[arg(
        long,
        env = "ACP_GATEWAY_WEBHOOK_MAX_AGE",
        default_value_t = 86400,
        global = true
    )]
    pub webhook_max_age: u64,

    /// Milliseconds between two looks for due deliveries.
    #[arg(
        long,
        env = "ACP_GATEWAY_WEBHOOK_POLL_MS",
        default_value_t = 500,
        global = true
    )]
    pub webhook_poll_ms: u64,

    /// Largest delivery body in bytes: a bigger event is sent without its `data`.
    #[arg(long, env = "ACP_GATEWAY_WEBHOOK_MAX_BODY_BYTES", default_value_t = 256 * 1024, global = true)]
    pub webhook_max_body_bytes: usize,
}
