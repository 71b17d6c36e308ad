-- Who is watching each session (keep in step with ../sqlite/0020_session_watchers.sql): a row
-- per open event stream, with the replica serving it and its watcher (JSON text); removed when
-- the stream ends, or with its replica once that is gone. Times are unix microseconds.
CREATE TABLE session_watchers (
    watcher_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    session_id TEXT COLLATE "C" NOT NULL,
    replica    TEXT COLLATE "C" NOT NULL,
    author     TEXT NOT NULL,
    since      BIGINT NOT NULL
);
CREATE INDEX session_watchers_session ON session_watchers (session_id);
CREATE INDEX session_watchers_replica ON session_watchers (replica);
