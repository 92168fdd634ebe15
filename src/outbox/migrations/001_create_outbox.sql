-- The outbox table. Debezium's outbox columns (id, aggregatetype, aggregateid, type, payload)
-- come first so producers can insert with only those four (id defaults), and the same table can
-- later be served by Debezium CDC unchanged. The relay's own bookkeeping follows.
-- Placeholders are replaced with quoted identifiers by migrate.ts; nothing else is substituted.
CREATE TABLE IF NOT EXISTS {{table}} (
  id              uuid        NOT NULL DEFAULT gen_random_uuid(),
  aggregatetype   text        NOT NULL,
  aggregateid     text        NOT NULL,
  type            text        NOT NULL,
  payload         jsonb,
  -- optional per-row topic override and extra Kafka headers (a flat JSON object)
  topic           text,
  headers         jsonb,
  -- relay order: identity, so it follows insert order, not commit order
  seq             bigint      GENERATED ALWAYS AS IDENTITY,
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz,
  attempts        integer     NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
  last_error      text,
  -- parked: gave up after max attempts (or can never be sent); an operator retries or skips it
  parked_at       timestamptz,
  -- skipped: an operator decided it will never be sent; kept for audit
  skipped_at      timestamptz,
  CONSTRAINT {{pkey}} PRIMARY KEY (id),
  CONSTRAINT {{seq_key}} UNIQUE (seq),
  CONSTRAINT {{headers_check}} CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object')
);

-- The claim: pending, not parked, in seq order. Partial, so sent rows never enter it and the
-- claim stays an index scan however many sent rows the table holds.
CREATE INDEX IF NOT EXISTS {{idx_claim}} ON {{table}} (seq)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL;

-- The order guard: unsent rows of one aggregate by seq (parked ones included: they hold order).
CREATE INDEX IF NOT EXISTS {{idx_aggregate}} ON {{table}} (aggregateid, seq)
  WHERE sent_at IS NULL AND skipped_at IS NULL;

-- Rows that failed at least once and are still unsent: the claim reads these to leave out the
-- aggregates that wait behind a backing-off or parked row. Normally (nearly) empty.
CREATE INDEX IF NOT EXISTS {{idx_retry}} ON {{table}} (aggregateid, seq)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0;

-- Retention and status queries.
CREATE INDEX IF NOT EXISTS {{idx_sent}} ON {{table}} (sent_at) WHERE sent_at IS NOT NULL;

-- Every row is updated once (marked sent) and later deleted, so it churns dead tuples quickly.
-- Postgres' default thresholds (20% of the table) let dead index entries pile up: after a burst
-- of 200k sent rows an empty claim took ~0.6 s until vacuum ran. Vacuum this table eagerly.
ALTER TABLE {{table}} SET (
  autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 5000,
  autovacuum_vacuum_insert_scale_factor = 0.0,
  autovacuum_vacuum_insert_threshold = 50000,
  autovacuum_analyze_scale_factor = 0.0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 0
);
