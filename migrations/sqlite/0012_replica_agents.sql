-- The agents each replica runs (keep in step with ../postgres/0012_replica_agents.sql).
--
-- A SQLite file has one gateway, which knows its own agents; the column is kept so that both
-- backends' `replicas` tables stay alike. A JSON array of names, the default first.
ALTER TABLE replicas ADD COLUMN agents TEXT NOT NULL DEFAULT '[]';
