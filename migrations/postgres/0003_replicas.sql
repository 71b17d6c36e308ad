-- The gateway replicas sharing this database (keep in step with ../sqlite/0003_replicas.sql).
--
-- Each replica upserts its row every heartbeat interval and deletes it at a clean shutdown. The
-- heartbeat is the database's clock, so replicas on hosts whose clocks disagree still agree on
-- which of them are silent. Rows silent for an hour are forgotten.
CREATE TABLE replicas (
    id            TEXT COLLATE "C" PRIMARY KEY,
    address       TEXT        NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    sessions_live BIGINT      NOT NULL DEFAULT 0
);
