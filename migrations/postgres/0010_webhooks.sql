-- Webhooks: subscriptions and their outbox (keep in step with ../sqlite/0010_webhooks.sql).
--
-- Every append to a session's log or to the lifecycle log inserts, in the same statement, one
-- `webhook_deliveries` row per stored event and matching enabled webhook (a transactional
-- outbox); senders claim the rows with leases. Session ids are "C"-collated, as in the other
-- tables, so that they compare with theirs.
CREATE TABLE webhooks (
    id              TEXT PRIMARY KEY,
    tenant          TEXT        NOT NULL,
    -- Created with an admin key: every tenant's events.
    admin           BOOLEAN     NOT NULL,
    url             TEXT        NOT NULL,
    -- The event kinds, or ["*"].
    events          JSONB       NOT NULL,
    -- Only this session's events when set.
    session_id      TEXT COLLATE "C",
    description     TEXT,
    secret          TEXT        NOT NULL,
    enabled         BOOLEAN     NOT NULL DEFAULT TRUE,
    disabled_reason TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL
);

CREATE TABLE webhook_deliveries (
    -- Insertion order: a session's deliveries are numbered in its log's order.
    id              BIGSERIAL PRIMARY KEY,
    webhook_id      TEXT        NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    -- Stable: "<sessionId>.<seq>" or "lifecycle.<seq>".
    message_id      TEXT        NOT NULL,
    session_id      TEXT COLLATE "C" NOT NULL,
    tenant          TEXT        NOT NULL,
    seq             BIGINT      NOT NULL,
    kind            TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    event_at        TIMESTAMPTZ NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    -- Retries give up this long after (a manual retry resets it).
    retry_from      TIMESTAMPTZ NOT NULL,
    lease_owner     TEXT,
    lease_until     TIMESTAMPTZ,
    last_status     INTEGER,
    last_body       TEXT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    UNIQUE (webhook_id, message_id)
);

-- The claim: the lowest pending delivery of each (webhook, session).
CREATE INDEX webhook_deliveries_pending_idx
    ON webhook_deliveries (webhook_id, session_id, id) WHERE status = 'pending';
-- A webhook's deliveries, newest first.
CREATE INDEX webhook_deliveries_webhook_idx ON webhook_deliveries (webhook_id, id DESC);
