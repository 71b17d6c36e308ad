-- Per-tenant quotas across replicas (keep in step with ../sqlite/0014_tenant_quotas.sql).
--
-- `tenant_slots`: what a tenant has under way that its quotas bound: a running turn (kind
-- `turn`, held by its session) or a session being made live (kind `session`, a reservation
-- until the replica holds it in `session_owners`). A slot counts while its replica beats (and a
-- reservation for two minutes at most), so a dead replica's slots free themselves.
-- `tenant_prompts`: each tenant's prompts per minute (unix time / 60).
CREATE TABLE tenant_slots (
    kind       TEXT COLLATE "C" NOT NULL,
    holder     TEXT COLLATE "C" NOT NULL,
    tenant     TEXT COLLATE "C" NOT NULL,
    replica_id TEXT COLLATE "C" NOT NULL,
    taken_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, holder)
);
CREATE INDEX tenant_slots_tenant_idx ON tenant_slots (tenant, kind);

CREATE TABLE tenant_prompts (
    tenant  TEXT COLLATE "C" NOT NULL,
    minute  BIGINT NOT NULL,
    prompts BIGINT NOT NULL,
    PRIMARY KEY (tenant, minute)
);
