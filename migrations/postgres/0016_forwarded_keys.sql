-- Requests between replicas (keep in step with ../sqlite/0016_forwarded_keys.sql).
--
-- `replica` is the replica running the request that holds an idempotency key (the one that took
-- it, or the one it was forwarded to): while that replica is live the key is not taken again,
-- and once its lease has run out a repeat may take the key over. '' for a key taken before this
-- column existed (its replica is unknown, taken for gone).
ALTER TABLE idempotency_keys ADD COLUMN replica TEXT NOT NULL DEFAULT '';
-- The secret the replicas sharing this database sign the requests they forward to each other
-- with (one row, written by the first replica that needs it).
CREATE TABLE cluster_secret (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    secret BYTEA   NOT NULL
);
