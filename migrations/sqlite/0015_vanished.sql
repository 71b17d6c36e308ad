-- Sessions the list sync tombstoned (keep in step with ../postgres/0015_vanished.sql).
--
-- `vanished_at` (unix microseconds) is set with `deleted_at` when the list sync tombstones a
-- session the agent no longer knows, and cleared with it when the session comes back (the agent
-- lists it again, or serves it to a client): unlike a deletion, such a tombstone is not the end
-- of a session.
ALTER TABLE sessions ADD COLUMN vanished_at INTEGER;
