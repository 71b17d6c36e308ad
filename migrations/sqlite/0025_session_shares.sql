-- Read-only links to a session (keep in step with ../postgres/0025_session_shares.sql): each
-- opens one session's transcript (and, when `live`, its stream) without a key, until it
-- expires or is revoked. Only the SHA-256 of the link's token is kept. Times in unix
-- microseconds.
CREATE TABLE session_shares (
    id         TEXT    NOT NULL PRIMARY KEY,
    token_hash TEXT    NOT NULL UNIQUE,
    session_id TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    live       INTEGER NOT NULL DEFAULT 0 CHECK (live IN (0, 1)),
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    revoked_at INTEGER,
    created_by TEXT
) STRICT;
CREATE INDEX session_shares_session_idx ON session_shares (session_id);
