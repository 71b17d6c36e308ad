-- The agents each replica runs (keep in step with ../sqlite/0012_replica_agents.sql).
--
-- Replicas may run different `--agent` sets. Each writes its agents' names, its default first,
-- at every heartbeat, so that the others know where to send a new session of an agent they do
-- not run and the requests about an existing one. A row written by a replica older than this
-- column names none.
ALTER TABLE replicas ADD COLUMN agents TEXT[] NOT NULL DEFAULT '{}';
