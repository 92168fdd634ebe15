-- The outbox table and everything the relay keeps beside it, as released in 0.1.0: the migrations
-- written before the first release folded into one. Never edited once released: from here on, one
-- additive migration per released change (test/integration/upgrade.test.ts holds every release's
-- schema to it). Idempotent: every statement may run again.
-- Placeholders are replaced with quoted identifiers by migrate.ts; nothing else is substituted.
-- docs/schema.md explains each part; the comments here say why it is shaped so.

-- Debezium's outbox columns (id, aggregatetype, aggregateid, type, payload) come first, so that
-- producers can insert with only those four (id defaults) and the same table can later be served
-- by Debezium CDC unchanged. The relay's own bookkeeping follows.
CREATE TABLE IF NOT EXISTS {{table}} (
  id              uuid        NOT NULL DEFAULT gen_random_uuid(),
  aggregatetype   text        NOT NULL,
  aggregateid     text        NOT NULL,
  type            text        NOT NULL,
  payload         jsonb,
  -- optional per-row topic override and extra Kafka headers (a flat JSON object)
  topic           text,
  headers         jsonb,
  -- the payload's and the headers' JSON text in bytes, computed once by the INSERT: the claim's
  -- byte cut adds them up, reading no payload it will not send (docs/schema.md says why stored)
  payload_bytes   integer     GENERATED ALWAYS AS (octet_length(payload::text)) STORED,
  headers_bytes   integer     GENERATED ALWAYS AS (octet_length(headers::text)) STORED,
  -- the writer's trace context, Debezium's column (its outbox extension writes Java properties
  -- text: traceparent=00-...); with OUTBOX_METADATA=trace, the traceparent/tracestate headers
  tracingspancontext text,
  -- relay order: identity, so it follows insert order, not commit order
  seq             bigint      GENERATED ALWAYS AS IDENTITY,
  created_at      timestamptz NOT NULL DEFAULT now(),
  -- never set: sent rows leave the table (kept in the partial indexes' predicates and statements)
  sent_at         timestamptz,
  attempts        integer     NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
  last_error      text,
  -- parked: gave up after max attempts (or can never be sent); an operator retries or skips it
  parked_at       timestamptz,
  -- skipped: an operator decided it will never be sent; kept for audit until retention, with who
  -- and why (`outbox-relay parked skip --reason`; the database role is session_user)
  skipped_at      timestamptz,
  skipped_by      text,
  skipped_reason  text,
  -- who ran the command (--operator, the AWS caller identity or the OS user): the role may be the relay's own
  skipped_operator text,
  -- the last time an operator put the row back to pending (a retry resets attempts and last_error,
  -- so without these nothing would say it was ever parked); moved to the sent table with the row
  retried_at      timestamptz,
  retried_by      text,
  retried_reason  text,
  retried_operator text,
  -- behind a failed row of its aggregate: out of the claim index (the relay sets and clears it;
  -- producers never do, and the default keeps their inserts unchanged)
  waiting         boolean     NOT NULL DEFAULT false,
  CONSTRAINT {{pkey}} PRIMARY KEY (id),
  CONSTRAINT {{seq_key}} UNIQUE (seq),
  CONSTRAINT {{headers_check}} CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object'),
  -- Every column but the payload has a small bound, refused at INSERT by a check that names the
  -- column and the limit, so that no row takes the relay past its memory through them
  -- (docs/schema.md): Debezium's outbox columns are varchar(255), Kafka's topic names at most 249
  -- characters, headers a few names and values. The payload is bounded by the claim's byte cut.
  CONSTRAINT {{aggregatetype_max}} CHECK (char_length(aggregatetype) <= 255),
  CONSTRAINT {{aggregateid_max}} CHECK (char_length(aggregateid) <= 255),
  CONSTRAINT {{type_max}} CHECK (char_length(type) <= 255),
  CONSTRAINT {{topic_max}} CHECK (char_length(topic) <= 249),
  CONSTRAINT {{headers_max}} CHECK (headers_bytes <= 65536),
  -- trace context headers are the relay's, outside the row's header limits: bounded here (a
  -- traceparent is 55 characters; W3C asks vendors to pass at least 512 of tracestate)
  CONSTRAINT {{tracingspancontext_max}} CHECK (char_length(tracingspancontext) <= 2048)
);

-- The claim: pending rows in seq order. Partial, so sent, parked and waiting rows never enter it.
-- next_attempt_at is its second key, so that a claim's `next_attempt_at <= now()` is tested on the
-- index entry and a row that backs off is passed over without a heap read (as an INCLUDE column it
-- would be tested only in an index-only scan); attempts is included for the claim's quick gap
-- check, an index-only scan, which tells a row that backs off from one set not due by hand.
CREATE INDEX IF NOT EXISTS {{idx_claim}} ON {{table}} (seq, next_attempt_at) INCLUDE (attempts)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting;

-- The order guard: unsent rows of one aggregate by seq (parked ones included: they hold order).
CREATE INDEX IF NOT EXISTS {{idx_aggregate}} ON {{table}} (aggregateid, seq)
  WHERE sent_at IS NULL AND skipped_at IS NULL;

-- Failed, unsent rows: the claim reads them to leave out the aggregates behind a backing-off or
-- parked row. Normally (nearly) empty; it carries what decides whether a failed row blocks, so
-- that look-up reads no heap page.
CREATE INDEX IF NOT EXISTS {{idx_retry}} ON {{table}} (aggregateid, seq) INCLUDE (next_attempt_at, parked_at)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0;

-- The waiting rows by aggregate: to clear an aggregate's marks, to find the aggregates that have
-- any (one probe each), and for the backlog figures. Normally empty.
CREATE INDEX IF NOT EXISTS {{idx_waiting}} ON {{table}} (aggregateid, seq)
  WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL;

-- Retention of skipped rows (normally a handful).
CREATE INDEX IF NOT EXISTS {{idx_skipped}} ON {{table}} (skipped_at) WHERE skipped_at IS NOT NULL;

-- Every row is inserted and deleted once, so the table churns dead tuples quickly; Postgres'
-- default thresholds (20% of the table) let dead index entries pile up (after a burst of 200k
-- rows an empty claim took ~0.6 s until vacuum ran). Vacuum it eagerly.
ALTER TABLE {{table}} SET (
  autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 5000,
  autovacuum_vacuum_insert_scale_factor = 0.0,
  autovacuum_vacuum_insert_threshold = 50000,
  autovacuum_analyze_scale_factor = 0.0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 0
);

-- Sent rows, moved here whole by the batch's transaction (OUTBOX_SENT_ROWS=keep, the default):
-- marking a row in place can never be a HOT update (sent_at is in the partial indexes' predicates)
-- and cost 29.4 µs of database CPU per row against 20.2 µs for the move (13.6 µs to delete it,
-- OUTBOX_SENT_ROWS=delete). Producers never touch it. The bookkeeping that means nothing once a
-- row is sent is not kept.
CREATE TABLE IF NOT EXISTS {{sent_table}} (
  id            uuid        NOT NULL,
  aggregatetype text        NOT NULL,
  aggregateid   text        NOT NULL,
  type          text        NOT NULL,
  payload       jsonb,
  topic         text,
  headers       jsonb,
  seq           bigint      NOT NULL,
  created_at    timestamptz NOT NULL,
  sent_at       timestamptz NOT NULL,
  attempts      integer     NOT NULL,
  retried_at    timestamptz,
  retried_by    text,
  retried_reason text,
  retried_operator text
);

-- Retention deletes the oldest first: a b-tree on sent_at (a BRIN index's ranges only widen once
-- pruned pages are refilled, and every prune then reads the whole table). No index on id: look-ups
-- by event id are rare and an operator's; add one if you need it.
CREATE INDEX IF NOT EXISTS {{idx_sent_table}} ON {{sent_table}} (sent_at);

ALTER TABLE {{sent_table}} SET (
  autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 5000,
  autovacuum_vacuum_insert_scale_factor = 0.0,
  autovacuum_vacuum_insert_threshold = 50000,
  autovacuum_analyze_scale_factor = 0.0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 0
);

-- Linger mode on a direct connection (no pooler): a lingering invocation LISTENs on the table's channel. A
-- statement-level trigger notifies once per statement, and Postgres folds a transaction's
-- identical notifications into one, delivered at COMMIT. pg_notify needs no privilege: any role
-- that may insert still may.
CREATE OR REPLACE FUNCTION {{notify_fn}}() RETURNS trigger LANGUAGE plpgsql AS $notify$
BEGIN
  PERFORM pg_notify({{channel}}, '');
  RETURN NULL;
END
$notify$;

-- DROP + CREATE rather than CREATE OR REPLACE TRIGGER, which needs Postgres 14
DROP TRIGGER IF EXISTS {{notify_trigger}} ON {{table}};
CREATE TRIGGER {{notify_trigger}} AFTER INSERT ON {{table}}
  FOR EACH STATEMENT EXECUTE FUNCTION {{notify_fn}}();

-- When an aggregate's last failed row goes (sent, deleted, reset, skipped, by the relay or by
-- hand), its waiting marks below the first remaining failed row are cleared in the same
-- statement. For latency only: the claim never trusts the marks (docs/order-guard.md). Only
-- failed rows fire it. Security invoker: a role that deletes or resets failed rows by hand also
-- needs UPDATE on the table.
CREATE OR REPLACE FUNCTION {{unwait_fn}}() RETURNS trigger LANGUAGE plpgsql AS $unwait$
BEGIN
  UPDATE {{table}} w SET waiting = false
  WHERE w.aggregateid = OLD.aggregateid AND w.waiting AND w.sent_at IS NULL AND w.skipped_at IS NULL
    AND w.seq < coalesce(
      (SELECT min(b.seq) FROM {{table}} b
       WHERE b.aggregateid = OLD.aggregateid AND b.sent_at IS NULL AND b.skipped_at IS NULL AND b.attempts > 0),
      9223372036854775807);
  RETURN NULL;
END
$unwait$;

DROP TRIGGER IF EXISTS {{unwait_delete_trigger}} ON {{table}};
CREATE TRIGGER {{unwait_delete_trigger}} AFTER DELETE ON {{table}}
  FOR EACH ROW
  WHEN (OLD.attempts > 0 AND OLD.sent_at IS NULL AND OLD.skipped_at IS NULL)
  EXECUTE FUNCTION {{unwait_fn}}();

DROP TRIGGER IF EXISTS {{unwait_update_trigger}} ON {{table}};
CREATE TRIGGER {{unwait_update_trigger}} AFTER UPDATE OF attempts, sent_at, skipped_at, aggregateid, seq ON {{table}}
  FOR EACH ROW
  WHEN (OLD.attempts > 0 AND OLD.sent_at IS NULL AND OLD.skipped_at IS NULL
        AND (NEW.attempts <= 0 OR NEW.sent_at IS NOT NULL OR NEW.skipped_at IS NOT NULL
             OR NEW.aggregateid IS DISTINCT FROM OLD.aggregateid OR NEW.seq IS DISTINCT FROM OLD.seq))
  EXECUTE FUNCTION {{unwait_fn}}();

-- The trigger functions get a fixed search_path: without one, every unqualified name in their
-- bodies (the table when OUTBOX_TABLE names no schema, pg_notify, min, the = operator) is looked up
-- in the path of whoever fires them, who could make them update a table or call a function of
-- its choosing. pg_catalog first, the table's own schema, pg_temp last (named, so a temporary
-- table of the same name is not searched first). The schema is known only here, where this
-- session's search_path found the table: hence the dynamic ALTER FUNCTION.
DO $search_path$
DECLARE
  table_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c WHERE c.oid = {{table_literal}}::regclass);
BEGIN
  EXECUTE pg_catalog.format('ALTER FUNCTION %s() SET search_path = pg_catalog, %s, pg_temp', {{notify_fn_literal}}, table_schema);
  EXECUTE pg_catalog.format('ALTER FUNCTION %s() SET search_path = pg_catalog, %s, pg_temp', {{unwait_fn_literal}}, table_schema);
END
$search_path$;
