-- Idempotency keys (keep in step with ../sqlite/0013_idempotency_keys.sql).
--
-- A request sent with an `Idempotency-Key` header: per tenant, the key, a digest of the request
-- (method, path, body) and, once it has answered, its response (status, the headers replayed,
-- body), so that a repeat on any replica, or after a restart, gets that response again. A row
-- without a status is a request still running. Pruned once expired.
CREATE TABLE idempotency_keys (
    tenant      TEXT        NOT NULL,
    key         TEXT        NOT NULL,
    fingerprint TEXT        NOT NULL,
    status      INTEGER,
    -- A JSON array of [name, value] pairs.
    headers     TEXT,
    body        BYTEA,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
