-- Webhooks: subscriptions and their outbox (keep in step with ../postgres/0010_webhooks.sql).
--
-- Every append to a session's log or to the lifecycle log inserts, in the same transaction, one
-- `webhook_deliveries` row per stored event and matching enabled webhook (a transactional
-- outbox); senders claim the rows with leases. Timestamps are INTEGER unix microseconds, JSON
-- is TEXT, booleans are 0 or 1, as in the other tables.
CREATE TABLE webhooks (
    id              TEXT    NOT NULL PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    -- Created with an admin key: every tenant's events.
    admin           INTEGER NOT NULL CHECK (admin IN (0, 1)),
    url             TEXT    NOT NULL,
    -- The event kinds, or ["*"].
    events          TEXT    NOT NULL,
    -- Only this session's events when set.
    session_id      TEXT,
    description     TEXT,
    secret          TEXT    NOT NULL,
    enabled         INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    disabled_reason TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;

-- AUTOINCREMENT: an id is never reused, so that ids stay in log order.
CREATE TABLE webhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id      TEXT    NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    -- Stable: "<sessionId>.<seq>" or "lifecycle.<seq>".
    message_id      TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    tenant          TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    kind            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    event_at        INTEGER NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    -- Retries give up this long after (a manual retry resets it).
    retry_from      INTEGER NOT NULL,
    lease_owner     TEXT,
    lease_until     INTEGER,
    last_status     INTEGER,
    last_body       TEXT,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    UNIQUE (webhook_id, message_id)
) STRICT;

-- The claim: the lowest pending delivery of each (webhook, session).
CREATE INDEX webhook_deliveries_pending_idx
    ON webhook_deliveries (webhook_id, session_id, id) WHERE status = 'pending';
-- A webhook's deliveries, newest first.
CREATE INDEX webhook_deliveries_webhook_idx ON webhook_deliveries (webhook_id, id DESC);
