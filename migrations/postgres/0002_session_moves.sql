-- Stable list pagination (keep in step with ../sqlite/0002_session_moves.sql).
--
-- The session list is ordered by `updated_at`, which changes with activity: a session updated
-- while a client pages through the list would jump ahead of the client's cursor and be skipped.
-- Every change of a live row's `updated_at` is recorded here with the position it left. A list
-- cursor remembers the newest move its first page saw (`id`); later pages place a session that
-- moved since then at the position it had when the listing started, so no session is skipped or
-- repeated. Moves are kept for an hour (the gateway prunes them), the lifetime of a stable cursor.
CREATE TABLE session_moves (
    id              BIGSERIAL PRIMARY KEY,
    session_id      TEXT COLLATE "C" NOT NULL,
    from_updated_at TIMESTAMPTZ NOT NULL,
    moved_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX session_moves_session_idx ON session_moves (session_id, id);
CREATE INDEX session_moves_moved_at_idx ON session_moves (moved_at);

-- Numbers must follow commit order, or a cursor taken between two concurrent moves could treat
-- the later-committing one as already seen. The transaction-scoped advisory lock serialises the
-- insert with its commit (the same key as nothing else uses).
CREATE FUNCTION sessions_record_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7259318403);
    INSERT INTO session_moves (session_id, from_updated_at) VALUES (OLD.session_id, OLD.updated_at);
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_move AFTER UPDATE OF updated_at ON sessions FOR EACH ROW
    WHEN (OLD.deleted_at IS NULL AND OLD.updated_at IS DISTINCT FROM NEW.updated_at)
    EXECUTE FUNCTION sessions_record_move();

-- Archived sessions are listed on their own (`archived=true`).
CREATE INDEX sessions_archived_updated_idx
    ON sessions (updated_at DESC, session_id DESC) WHERE deleted_at IS NULL AND archived;
