-- Each session's prompts waiting for their turn (keep in step with ../sqlite/0019_prompt_queue.sql):
-- a row per prompt until its turn has ended or it is withdrawn, in `rank` order (an interrupt
-- ranks before its session's others); `started_by` names the replica that started its turn.
-- Times are unix microseconds.
CREATE TABLE prompt_queue (
    queue_id   TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL,
    rank       BIGINT NOT NULL,
    prompt     TEXT NOT NULL,
    author     TEXT NOT NULL,
    interrupt  BOOLEAN NOT NULL,
    created_at BIGINT NOT NULL,
    started_by TEXT COLLATE "C"
);
-- One rank per place: prompts queued at once that computed the same rank are tried again.
CREATE UNIQUE INDEX prompt_queue_rank ON prompt_queue (session_id, rank);
