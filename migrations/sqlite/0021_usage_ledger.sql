-- What each turn spent (keep in step with ../postgres/0021_usage_ledger.sql): a row per turn whose
-- agent reported tokens or cost, with whose session it was, kept when the session is deleted.
-- A figure the agent did not report is NULL, never 0. `cost_amount` is the turn's own;
-- `cost_cumulative` the session's total the agent reported by the turn's end, from which the
-- next turn's amount is taken. `ended_at` is unix microseconds, `day` its UTC date.
CREATE TABLE usage_ledger (
    id                 INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id         TEXT NOT NULL,
    tenant             TEXT NOT NULL,
    user_id            TEXT,
    agent              TEXT NOT NULL,
    model              TEXT,
    ended_at           INTEGER NOT NULL,
    day                TEXT NOT NULL,
    input_tokens       INTEGER,
    output_tokens      INTEGER,
    thought_tokens     INTEGER,
    cache_read_tokens  INTEGER,
    cache_write_tokens INTEGER,
    total_tokens       INTEGER,
    cost_amount        REAL,
    cost_currency      TEXT,
    cost_cumulative    REAL
) STRICT;
CREATE INDEX usage_ledger_session ON usage_ledger (session_id, id);
CREATE INDEX usage_ledger_tenant_day ON usage_ledger (tenant, day);
CREATE INDEX usage_ledger_ended ON usage_ledger (ended_at);
-- The budget alerts sent: one per tenant, day, budget and threshold, whichever replica saw it.
CREATE TABLE usage_alerts (
    tenant  TEXT NOT NULL,
    day     TEXT NOT NULL,
    budget  TEXT NOT NULL,
    percent INTEGER NOT NULL,
    PRIMARY KEY (tenant, day, budget, percent)
) STRICT;
