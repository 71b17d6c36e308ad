//! What `migrate` copies: the tables in the order they are copied, those it leaves, and the
//! text columns PostgreSQL keeps escaped. A test checks that every table of the schema is in
//! one list or the other, on both backends.

/// The tables copied, in this order (a session's row before its log, a webhook before its
/// deliveries).
pub const COPIED: &[&str] = &[
    "cluster_secret",
    "sessions",
    "session_seqs",
    "session_events",
    "session_states",
    "session_moves",
    "session_workspaces",
    "prompt_queue",
    "lifecycle_events",
    "webhooks",
    "webhook_deliveries",
    "idempotency_keys",
    "usage_ledger",
    "usage_alerts",
    "tenant_prompts",
    "installed_agents",
    "session_shares",
];

/// The tables not copied: the migrations each store applies itself, what running replicas hold
/// (a target's replicas start afresh), and the copies' own record.
pub const LEFT: &[&str] = &[
    "_sqlx_migrations",
    "replicas",
    "session_owners",
    "session_watchers",
    "tenant_slots",
    "store_copies",
    "sqlite_sequence",
];

/// Text columns PostgreSQL keeps with U+0000 escaped.
pub(super) const ESCAPED: &[(&str, &str)] = &[
    ("sessions", "title"),
    ("sessions", "owner_name"),
    ("session_events", "kind"),
    ("webhook_deliveries", "kind"),
];
