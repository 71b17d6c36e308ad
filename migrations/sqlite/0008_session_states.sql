-- Each session's state snapshot (keep in step with ../postgres/0008_session_states.sql).
--
-- A session's state (modes, models, config options, commands, usage, plan, the agent's `_meta`)
-- is a fold of its log; the snapshot is that fold up to the log position `seq`, so that reading
-- the state reads only the log after it. It is JSON text, written whole.
CREATE TABLE session_states (
    session_id TEXT    NOT NULL PRIMARY KEY,
    seq        INTEGER NOT NULL,
    state      TEXT    NOT NULL
) STRICT, WITHOUT ROWID;
