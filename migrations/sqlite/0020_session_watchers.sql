-- Who is watching each session (keep in step with ../postgres/0020_session_watchers.sql): a row
-- per open event stream, with the replica serving it and its watcher (JSON text); removed when
-- the stream ends, or with its replica once that is gone. Times are unix microseconds.
CREATE TABLE session_watchers (
    watcher_id TEXT NOT NULL PRIMARY KEY,
    session_id TEXT NOT NULL,
    replica    TEXT NOT NULL,
    author     TEXT NOT NULL,
    since      INTEGER NOT NULL
) STRICT;
CREATE INDEX session_watchers_session ON session_watchers (session_id);
CREATE INDEX session_watchers_replica ON session_watchers (replica);
