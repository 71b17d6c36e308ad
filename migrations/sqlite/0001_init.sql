-- acp-gateway store schema, SQLite flavour (keep in step with ../postgres/0001_init.sql).
--
-- Timestamps are INTEGER unix microseconds (UTC): exact ordering and keyset comparisons, and a
-- lossless round trip of the microsecond precision the store promises. JSON is TEXT.
-- Tables are STRICT so that a value of the wrong type is an error instead of being coerced.

-- The session metadata cache. Rows are never deleted: a deleted session keeps its row with
-- `deleted_at` set (a tombstone) so that a later sync with the agent cannot resurrect it.
CREATE TABLE sessions (
    session_id             TEXT    NOT NULL PRIMARY KEY,
    tenant                 TEXT    NOT NULL,
    cwd                    TEXT    NOT NULL,
    additional_directories TEXT    NOT NULL DEFAULT '[]',
    title                  TEXT,
    updated_at             INTEGER NOT NULL,
    created_at             INTEGER NOT NULL,
    meta                   TEXT,
    archived               INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1)),
    origin                 TEXT    NOT NULL CHECK (origin IN ('gateway', 'upstream')),
    deleted_at             INTEGER,
    synced_at              INTEGER
) STRICT;

-- Keyset pagination of the session list, newest first. Listing only ever shows live rows, so the
-- indexes leave tombstones out.
CREATE INDEX sessions_tenant_updated_idx
    ON sessions (tenant, updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;
CREATE INDEX sessions_cwd_updated_idx
    ON sessions (cwd, updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;
-- Listing every tenant (admin).
CREATE INDEX sessions_updated_idx
    ON sessions (updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;

-- Per-session event counter, bumped with an upsert in the same transaction as the event inserts.
CREATE TABLE session_seqs (
    session_id TEXT    NOT NULL PRIMARY KEY,
    last_seq   INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- The per-session event log (seq = 1, 2, 3… without gaps).
CREATE TABLE session_events (
    session_id TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT, WITHOUT ROWID;

-- Session lifecycle events (created, info updated, status changed, deleted) for `GET /events`.
-- AUTOINCREMENT: a sequence number is never reused, even after the newest row is removed.
CREATE TABLE lifecycle_events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

CREATE INDEX lifecycle_events_tenant_seq_idx ON lifecycle_events (tenant, seq);

-- Retention by age.
CREATE INDEX session_events_created_idx ON session_events (created_at);
