-- The gateway replicas sharing this database (keep in step with ../postgres/0003_replicas.sql).
--
-- A SQLite file has one gateway (it refuses a second), so this holds at most that one row; it
-- is kept so that both backends answer the same cluster view. Times in microseconds since the
-- epoch.
CREATE TABLE replicas (
    id            TEXT    PRIMARY KEY,
    address       TEXT    NOT NULL,
    started_at    INTEGER NOT NULL,
    heartbeat_at  INTEGER NOT NULL,
    sessions_live INTEGER NOT NULL DEFAULT 0
) STRICT;
