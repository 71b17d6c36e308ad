-- What each turn spent (keep in step with ../sqlite/0021_usage_ledger.sql): a row per turn whose
-- agent reported tokens or cost, with whose session it was, kept when the session is deleted.
-- A figure the agent did not report is NULL, never 0. `cost_amount` is the turn's own;
-- `cost_cumulative` the session's total the agent reported by the turn's end, from which the
-- next turn's amount is taken. `ended_at` is unix microseconds, `day` its UTC date.
CREATE TABLE usage_ledger (
    id                 BIGSERIAL PRIMARY KEY,
    session_id         TEXT COLLATE "C" NOT NULL,
    tenant             TEXT COLLATE "C" NOT NULL,
    user_id            TEXT COLLATE "C",
    agent              TEXT COLLATE "C" NOT NULL,
    model              TEXT COLLATE "C",
    ended_at           BIGINT NOT NULL,
    day                TEXT COLLATE "C" NOT NULL,
    input_tokens       BIGINT,
    output_tokens      BIGINT,
    thought_tokens     BIGINT,
    cache_read_tokens  BIGINT,
    cache_write_tokens BIGINT,
    total_tokens       BIGINT,
    cost_amount        DOUBLE PRECISION,
    cost_currency      TEXT COLLATE "C",
    cost_cumulative    DOUBLE PRECISION
);
CREATE INDEX usage_ledger_session ON usage_ledger (session_id, id);
CREATE INDEX usage_ledger_tenant_day ON usage_ledger (tenant, day);
CREATE INDEX usage_ledger_ended ON usage_ledger (ended_at);
-- The budget alerts sent: one per tenant, day, budget and threshold, whichever replica saw it.
CREATE TABLE usage_alerts (
    tenant  TEXT COLLATE "C" NOT NULL,
    day     TEXT COLLATE "C" NOT NULL,
    budget  TEXT COLLATE "C" NOT NULL,
    percent BIGINT NOT NULL,
    PRIMARY KEY (tenant, day, budget, percent)
);
