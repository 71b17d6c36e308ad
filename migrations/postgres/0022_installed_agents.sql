-- The agents installed from an ACP registry (keep in step with ../sqlite/0022_installed_agents.sql):
-- one row per agent, by the name sessions call it; what was chosen of the registry entry (JSON
-- text, enough for any replica to install the same), the sha256 of a binary archive as first
-- downloaded (every later download must match it), when and by which replica, and the auth
-- method an admin signed it in with (every replica's members authenticate with it). Every replica
-- runs the agents of these rows. Times are unix microseconds.
CREATE TABLE installed_agents (
    name         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    registry_id  TEXT NOT NULL,
    kind         TEXT NOT NULL,
    version      TEXT NOT NULL,
    choice       TEXT NOT NULL,
    sha256       TEXT,
    installed_at BIGINT NOT NULL,
    installed_by TEXT NOT NULL,
    auth_method  TEXT
);
