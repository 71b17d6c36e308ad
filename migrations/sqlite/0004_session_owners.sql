-- Which replica holds each live session (keep in step with ../postgres/0004_session_owners.sql).
--
-- A SQLite file has one gateway, which owns every live session; the table is kept so that both
-- backends share one ownership code path.
CREATE TABLE session_owners (
    session_id TEXT NOT NULL PRIMARY KEY,
    replica_id TEXT NOT NULL
) STRICT;

CREATE INDEX session_owners_replica_idx ON session_owners (replica_id);
