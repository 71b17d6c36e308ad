-- acp-gateway store schema, PostgreSQL flavour (keep in step with ../sqlite/0001_init.sql).
--
-- Session ids use the "C" collation so that `ORDER BY session_id` and the keyset comparison
-- `(updated_at, session_id) < (…)` follow byte order, the same order as SQLite and Rust strings,
-- whatever the database's default locale is.

-- The session metadata cache. Rows are never deleted: a deleted session keeps its row with
-- `deleted_at` set (a tombstone) so that a later sync with the agent cannot resurrect it.
CREATE TABLE sessions (
    session_id             TEXT COLLATE "C" PRIMARY KEY,
    tenant                 TEXT        NOT NULL,
    cwd                    TEXT        NOT NULL,
    additional_directories JSONB       NOT NULL DEFAULT '[]'::jsonb,
    title                  TEXT,
    updated_at             TIMESTAMPTZ NOT NULL,
    created_at             TIMESTAMPTZ NOT NULL,
    meta                   JSONB,
    archived               BOOLEAN     NOT NULL DEFAULT FALSE,
    origin                 TEXT        NOT NULL CHECK (origin IN ('gateway', 'upstream')),
    deleted_at             TIMESTAMPTZ,
    synced_at              TIMESTAMPTZ
);

-- Keyset pagination of the session list, newest first. Listing only ever shows live rows, so the
-- indexes leave tombstones out.
CREATE INDEX sessions_tenant_updated_idx
    ON sessions (tenant, updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;
CREATE INDEX sessions_cwd_updated_idx
    ON sessions (cwd, updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;
-- Listing every tenant (admin).
CREATE INDEX sessions_updated_idx
    ON sessions (updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;

-- Per-session event counter. Appending bumps it with an upsert in the same transaction as the
-- event inserts; the row lock taken by the upsert serialises concurrent appenders of a session.
CREATE TABLE session_seqs (
    session_id TEXT COLLATE "C" PRIMARY KEY,
    last_seq   BIGINT NOT NULL
);

-- The per-session event log (seq = 1, 2, 3… without gaps).
CREATE TABLE session_events (
    session_id TEXT COLLATE "C" NOT NULL,
    seq        BIGINT      NOT NULL,
    kind       TEXT        NOT NULL,
    payload    JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- Session lifecycle events (created, info updated, status changed, deleted) for `GET /events`.
CREATE TABLE lifecycle_events (
    seq        BIGSERIAL PRIMARY KEY,
    session_id TEXT        NOT NULL,
    tenant     TEXT        NOT NULL,
    kind       TEXT        NOT NULL,
    payload    JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX lifecycle_events_tenant_seq_idx ON lifecycle_events (tenant, seq);

-- Retention by age.
CREATE INDEX session_events_created_idx ON session_events (created_at);
