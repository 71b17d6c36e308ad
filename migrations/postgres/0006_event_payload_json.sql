-- Event payloads as `json`, not `jsonb` (PostgreSQL only; SQLite stores JSON text already).
--
-- The gateway stores an agent's update as the text the agent wrote and streams that same text
-- to subscribers, so the log keeps it verbatim: `json` only checks the text, where `jsonb`
-- builds a binary form on every insert and gives back a respaced, reordered text on every read
-- (what a live subscriber and a replaying one see would then differ in form). Nothing queries
-- inside payloads. Rows wrapped because they held U+0000 (see `postgres/mod.rs`) stay wrapped.
ALTER TABLE session_events ALTER COLUMN payload TYPE json USING payload::json;
