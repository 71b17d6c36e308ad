-- The session event log becomes a rowid table with a unique (session_id, seq) index.
--
-- As a WITHOUT ROWID table its rows (a few hundred bytes of payload each) lived in the
-- (session_id, seq) B-tree itself: every commit of a busy gateway inserted into as many places of
-- it as there were sessions in the batch, splitting full pages and writing them all to the WAL.
-- SQLite advises rowid tables for rows over a twentieth of a page. Now the rows are appended at the
-- end of the table, and only the small index entries land in the sessions' places
-- (see bench/README.md, "Session 20").
CREATE TABLE session_events_by_rowid (
    session_id TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

INSERT INTO session_events_by_rowid (session_id, seq, kind, payload, created_at)
SELECT session_id, seq, kind, payload, created_at FROM session_events ORDER BY created_at, session_id, seq;

DROP TABLE session_events;
ALTER TABLE session_events_by_rowid RENAME TO session_events;
CREATE UNIQUE INDEX session_events_seq_idx ON session_events (session_id, seq);
CREATE INDEX session_events_created_idx ON session_events (created_at);
