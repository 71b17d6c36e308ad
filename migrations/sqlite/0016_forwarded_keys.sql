-- Requests between replicas (keep in step with ../postgres/0016_forwarded_keys.sql).
--
-- `replica` is the replica running the request that holds an idempotency key: while that replica
-- runs, the key is not taken again; a later gateway on the file (the earlier one is gone) may take
-- it over. '' for a key taken before this column existed.
ALTER TABLE idempotency_keys ADD COLUMN replica TEXT NOT NULL DEFAULT '';
-- The secret requests forwarded between replicas are signed with (one row). SQLite has one
-- gateway, which forwards nothing; the table is kept in step with PostgreSQL's.
CREATE TABLE cluster_secret (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    secret BLOB    NOT NULL
) STRICT;
