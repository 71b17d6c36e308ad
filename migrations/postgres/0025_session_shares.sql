-- Read-only links to a session (keep in step with ../sqlite/0025_session_shares.sql): each
-- opens one session's transcript (and, when `live`, its stream) without a key, until it
-- expires or is revoked. Only the SHA-256 of the link's token is kept. Times in unix
-- microseconds.
CREATE TABLE session_shares (
    id         TEXT    NOT NULL PRIMARY KEY,
    token_hash TEXT    NOT NULL UNIQUE,
    session_id TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    live       BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT,
    created_by TEXT
);
CREATE INDEX session_shares_session_idx ON session_shares (session_id);
