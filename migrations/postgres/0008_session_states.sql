-- Each session's state snapshot (keep in step with ../sqlite/0008_session_states.sql).
--
-- A session's state (modes, models, config options, commands, usage, plan, the agent's `_meta`)
-- is a fold of its log; the snapshot is that fold up to the log position `seq`, so that reading
-- the state reads only the log after it. It is JSON text, written whole: nothing queries inside
-- it, and text takes any escape an agent's JSON holds.
CREATE TABLE session_states (
    session_id TEXT   NOT NULL PRIMARY KEY,
    seq        BIGINT NOT NULL,
    state      TEXT   NOT NULL
);
