-- The stores this one was copied from by `acp-gateway migrate --from … --to …` (keep in step with
-- ../sqlite/0024_store_copies.sql): a copy started and not finished may be run again; a
-- finished one, or a store with data of its own, is not copied into. Times in unix microseconds.
CREATE TABLE store_copies (
    source      TEXT   NOT NULL PRIMARY KEY,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT
);
