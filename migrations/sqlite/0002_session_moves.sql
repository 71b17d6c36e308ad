-- Stable list pagination (keep in step with ../postgres/0002_session_moves.sql).
--
-- The session list is ordered by `updated_at`, which changes with activity: a session updated
-- while a client pages through the list would jump ahead of the client's cursor and be skipped.
-- Every change of a live row's `updated_at` is recorded here with the position it left. A list
-- cursor remembers the newest move its first page saw (`id`); later pages place a session that
-- moved since then at the position it had when the listing started, so no session is skipped or
-- repeated. Moves are kept for an hour (the gateway prunes them), the lifetime of a stable cursor.
-- SQLite has one writer at a time, so `id` follows commit order.
CREATE TABLE session_moves (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id      TEXT    NOT NULL,
    from_updated_at INTEGER NOT NULL,
    moved_at        INTEGER NOT NULL
) STRICT;

CREATE INDEX session_moves_session_idx ON session_moves (session_id, id);
CREATE INDEX session_moves_moved_at_idx ON session_moves (moved_at);

CREATE TRIGGER sessions_move AFTER UPDATE OF updated_at ON sessions FOR EACH ROW
    WHEN OLD.deleted_at IS NULL AND OLD.updated_at IS NOT NEW.updated_at
BEGIN
    INSERT INTO session_moves (session_id, from_updated_at, moved_at)
    VALUES (OLD.session_id, OLD.updated_at, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER));
END;

-- Archived sessions are listed on their own (`archived=true`).
CREATE INDEX sessions_archived_updated_idx
    ON sessions (updated_at DESC, session_id DESC) WHERE deleted_at IS NULL AND archived = 1;
