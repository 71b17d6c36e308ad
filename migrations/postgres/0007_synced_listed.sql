-- The digests a sync compares a listing with, read from the index alone (keep in step with
-- ../sqlite/0007_synced_listed.sql).
--
-- A sync starts by reading the id and `listed` digest of every live session a sync has seen;
-- with `listed` in the index (not the row) that is an index-only scan of a million entries.
-- It replaces `sessions_synced_idx`, which had the same key and predicate.
CREATE INDEX sessions_synced_listed_idx ON sessions (session_id) INCLUDE (listed)
    WHERE deleted_at IS NULL AND synced_at IS NOT NULL;
DROP INDEX sessions_synced_idx;
