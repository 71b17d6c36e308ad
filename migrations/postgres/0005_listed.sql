-- What a list sync last made each session's row from (keep in step with ../sqlite/0005_listed.sql).
--
-- The digest of the agent's `SessionInfo` the row was last synced from, cleared by any other
-- write to the row (the gateway's own changes, a prompt's activity). A sync compares a page of
-- the agent's list with these digests in one query and reads and writes only the sessions whose
-- digest differs: an unchanged list costs a query per page, not a row per session.
ALTER TABLE sessions ADD COLUMN listed BIGINT;

-- The live sessions a sync has seen listed, whose ids each sync reads to find those the agent
-- no longer lists.
CREATE INDEX sessions_synced_idx ON sessions (session_id)
    WHERE deleted_at IS NULL AND synced_at IS NOT NULL;
