-- Idempotency keys (keep in step with ../postgres/0013_idempotency_keys.sql).
--
-- A request sent with an `Idempotency-Key` header: per tenant, the key, a digest of the request
-- (method, path, body) and, once it has answered, its response (status, the headers replayed,
-- body). A row without a status is a request still running. Pruned once expired. Timestamps
-- are INTEGER unix microseconds, as in the other tables.
CREATE TABLE idempotency_keys (
    tenant      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    status      INTEGER,
    -- A JSON array of [name, value] pairs.
    headers     TEXT,
    body        BLOB,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) STRICT;
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
