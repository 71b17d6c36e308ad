-- Per-tenant quotas (keep in step with ../postgres/0014_tenant_quotas.sql).
--
-- `tenant_slots`: what a tenant has under way that its quotas bound: a running turn (kind
-- `turn`, held by its session) or a session being made live (kind `session`, a reservation
-- until the gateway holds it in `session_owners`). A file has one gateway: only the slots of
-- the one serving it count (and a reservation for two minutes at most). Timestamps are INTEGER
-- unix microseconds. `tenant_prompts`: each tenant's prompts per minute (unix time / 60).
CREATE TABLE tenant_slots (
    kind       TEXT    NOT NULL,
    holder     TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    replica_id TEXT    NOT NULL,
    taken_at   INTEGER NOT NULL,
    PRIMARY KEY (kind, holder)
) STRICT;
CREATE INDEX tenant_slots_tenant_idx ON tenant_slots (tenant, kind);

CREATE TABLE tenant_prompts (
    tenant  TEXT    NOT NULL,
    minute  INTEGER NOT NULL,
    prompts INTEGER NOT NULL,
    PRIMARY KEY (tenant, minute)
) STRICT;
