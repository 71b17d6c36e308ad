-- The agent each session lives in (keep in step with ../postgres/0009_session_agent.sql).
--
-- A gateway runs several named agents; a session belongs to one of them for good. Rows written
-- before agents had names get '' here and are given the default agent at start
-- (`Store::adopt_sessions`), whatever it is named. The index serves `GET /sessions?agent=`.
ALTER TABLE sessions ADD COLUMN agent TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_agent_updated_idx
    ON sessions (agent, updated_at DESC, session_id DESC) WHERE deleted_at IS NULL;
