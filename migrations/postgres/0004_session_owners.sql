-- Which replica holds each live session (keep in step with ../sqlite/0004_session_owners.sql).
--
-- A replica claims a session when it makes it live in one of its agent processes and releases
-- it when the session stops being live there. The claim is a lease on the owner's heartbeat
-- (the `replicas` table): while the owner beats, other replicas forward the session's requests
-- to it; once it has been silent for three heartbeat intervals, any replica may take the
-- session over.
CREATE TABLE session_owners (
    session_id TEXT COLLATE "C" PRIMARY KEY,
    replica_id TEXT COLLATE "C" NOT NULL
);

CREATE INDEX session_owners_replica_idx ON session_owners (replica_id);
