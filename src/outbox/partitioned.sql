-- A time-partitioned outbox and sent table (OUTBOX_PARTITION_WIDTH; docs/schema.md, "Partitioned
-- outboxes"). migrate.ts runs this before the numbered migrations, and only for a table it is
-- about to create or made so itself: the baseline's CREATE TABLE IF NOT EXISTS then finds these
-- parents and skips, its indexes and triggers go on the parents (and so on every partition), and
-- its one statement a partitioned table refuses, ALTER TABLE ... SET (autovacuum_...), is applied
-- to each partition instead (render(), migrate.ts). Idempotent: every statement may run again.
-- Placeholders as in the migrations, plus {{partition_width_s}}, the width in seconds.

-- The baseline's columns, defaults, identity and checks (test/integration/partitioned-outbox.test.ts
-- compares the two tables column by column), partitioned by created_at. A partitioned table's
-- unique constraints must include the partition key: the primary key is (id, created_at), which
-- keeps the table a replica identity (Debezium, or any logical replication, needs one to publish
-- the DELETEs that move sent rows out) at the cost the plain table's key already has; id stays
-- unique in practice (gen_random_uuid), not by constraint. seq has no unique constraint: the
-- identity alone makes it unique, and nothing looks a row up by it alone but the marks, which
-- name rows by address.
CREATE TABLE IF NOT EXISTS {{table}} (
  id              uuid        NOT NULL DEFAULT gen_random_uuid(),
  aggregatetype   text        NOT NULL,
  aggregateid     text        NOT NULL,
  type            text        NOT NULL,
  payload         jsonb,
  topic           text,
  headers         jsonb,
  payload_bytes   integer     GENERATED ALWAYS AS (octet_length(payload::text)) STORED,
  headers_bytes   integer     GENERATED ALWAYS AS (octet_length(headers::text)) STORED,
  tracingspancontext text,
  seq             bigint      GENERATED ALWAYS AS IDENTITY,
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz,
  attempts        integer     NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
  last_error      text,
  parked_at       timestamptz,
  skipped_at      timestamptz,
  skipped_by      text,
  skipped_reason  text,
  skipped_operator text,
  retried_at      timestamptz,
  retried_by      text,
  retried_reason  text,
  retried_operator text,
  waiting         boolean     NOT NULL DEFAULT false,
  CONSTRAINT {{pkey}} PRIMARY KEY (id, created_at),
  CONSTRAINT {{headers_check}} CHECK (headers IS NULL OR jsonb_typeof(headers) = 'object'),
  CONSTRAINT {{aggregatetype_max}} CHECK (char_length(aggregatetype) <= 255),
  CONSTRAINT {{aggregateid_max}} CHECK (char_length(aggregateid) <= 255),
  CONSTRAINT {{type_max}} CHECK (char_length(type) <= 255),
  CONSTRAINT {{topic_max}} CHECK (char_length(topic) <= 249),
  CONSTRAINT {{headers_max}} CHECK (headers_bytes <= 65536),
  CONSTRAINT {{tracingspancontext_max}} CHECK (char_length(tracingspancontext) <= 2048)
) PARTITION BY RANGE (created_at);

-- Where a row goes when no partition covers its time (maintenance lagging, a created_at far in the
-- past or future): an INSERT never fails for want of a partition. Maintenance never drops it, nor
-- makes a partition over a range where it holds rows (Postgres refuses that). Its storage options
-- are the ones every partition made later copies (the baseline's ALTER TABLE ... SET lands here).
CREATE TABLE IF NOT EXISTS {{table_default}} PARTITION OF {{table}} DEFAULT;

-- The sent table's columns, partitioned by sent_at: retention drops whole partitions.
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
) PARTITION BY RANGE (sent_at);

CREATE TABLE IF NOT EXISTS {{sent_default}} PARTITION OF {{sent_table}} DEFAULT;

-- Maintenance: makes the partitions of the current width and the next three (of both tables),
-- drops the outbox's partitions wholly before the current one that hold no row, and, given
-- retain_sent_ms, the sent table's partitions whose upper bound is older than that. Returns what
-- it did as JSON: {"created": n, "dropped": n, "busy": n}; busy counts what it left for the next
-- call because a lock was not had within the function's lock_timeout (a claim in flight holds the
-- parent) or Postgres refused the partition (the DEFAULT partition holds rows of its range; a
-- partition of another width overlaps it). Each step runs in a block of its own, so one refused
-- never undoes another. The relay calls it before each invocation's first claim; migrate after
-- the migrations.
--
-- SECURITY DEFINER: creating and dropping partitions takes the tables' owner, and the relay's role
-- usually is not; this function is all of what it lends, with a fixed search_path (set below, as
-- the baseline's trigger functions get) and EXECUTE revoked from PUBLIC: GRANT EXECUTE ON FUNCTION
-- {{partitions_fn}}(bigint) TO the relay's role (docs/schema.md).
-- lock_timeout: every lock it asks for on a parent blocks the claims queued behind it; it waits
-- at most this long, at most twice per table (one creation, one drop: a parent held for one is
-- held for the next), and most calls ask for none (nothing to create or drop).
CREATE OR REPLACE FUNCTION {{partitions_fn}}(retain_sent_ms bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET lock_timeout = '200ms' AS $partitions$
DECLARE
  width     constant double precision := {{partition_width_s}};
  ahead     constant integer := 3;
  outbox    constant regclass := {{table_literal}}::regclass;
  sent      constant regclass := {{sent_table_literal}}::regclass;
  -- the current width's lower bound, widths counted from the epoch (UTC)
  now_lo    constant timestamptz := to_timestamp(floor(extract(epoch FROM now()) / width) * width);
  parent    regclass;
  rel       regclass;
  drops     regclass[];
  nsp       text;
  base      text;
  opts      text;
  part_name text;
  lo        timestamptz;
  has_rows  boolean;
  n         integer;
  created   integer := 0;
  dropped   integer := 0;
  busy      integer := 0;
BEGIN
  -- one call at a time per outbox (fan-out helpers, warm relays and migrate may call at once): a
  -- second would wait for the first's locks, then find its CREATE or DROP done and fail. Tried,
  -- never waited for: the call under way does the work; held to the caller's COMMIT.
  IF NOT pg_try_advisory_xact_lock(hashtext('outbox-relay:partitions:' || outbox::oid::text)) THEN
    RETURN jsonb_build_object('created', 0, 'dropped', 0, 'busy', 0);
  END IF;
  FOREACH parent IN ARRAY ARRAY[outbox, sent] LOOP
    -- partitions are named <parent>_pYYYYMMDD_HHMI; a parent's name too long for that keeps its
    -- first 35 characters and a hash of the whole (the outbox's and its sent table's may share 44)
    SELECT ns.nspname, CASE WHEN length(c.relname) <= 44 THEN c.relname::text ELSE left(c.relname, 35) || '_' || left(md5(c.relname), 8) END
    INTO nsp, base FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE c.oid = parent;
    -- the DEFAULT partition's storage options (the baseline's autovacuum settings), for each new one
    SELECT array_to_string(d.reloptions, ', ') INTO opts
    FROM pg_partitioned_table p JOIN pg_class d ON d.oid = p.partdefid WHERE p.partrelid = parent;
    FOR i IN 0 .. ahead LOOP
      lo := now_lo + make_interval(secs => i * width);
      part_name := base || '_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MI');
      CONTINUE WHEN to_regclass(format('%I.%I', nsp, part_name)) IS NOT NULL;
      -- a partition of another width (OUTBOX_PARTITION_WIDTH changed) covers some of it: the
      -- CREATE would wait for the parent's lock only to be refused
      CONTINUE WHEN EXISTS (
        SELECT FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid,
             substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)') AS lb,
             substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)') AS ub
        WHERE h.inhparent = parent AND lb::timestamptz < lo + make_interval(secs => width) AND ub::timestamptz > lo);
      BEGIN
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                       nsp, part_name, parent, lo, lo + make_interval(secs => width));
        IF opts IS NOT NULL THEN EXECUTE format('ALTER TABLE %I.%I SET (%s)', nsp, part_name, opts); END IF;
        created := created + 1;
      EXCEPTION
        -- the parent is held: so would it be for the next ones (each wait is a lock_timeout)
        WHEN lock_not_available THEN
          busy := busy + ahead - i + 1;
          EXIT;
        -- the DEFAULT partition holds rows of this range, or a partition of another width overlaps it
        WHEN check_violation OR invalid_object_definition THEN
          busy := busy + 1;
      END;
    END LOOP;
  END LOOP;

  -- Drops: the partitions (never the DEFAULT one) whose upper bound has passed, the outbox's before
  -- the current width, the sent table's before the retention window. An outbox partition is
  -- dropped only if it holds no row at all, pending, parked or skipped: looked at first without a
  -- lock (one that holds rows costs no lock), then again under the parent's ACCESS EXCLUSIVE lock
  -- (LOCK TABLE takes it on every partition too), under which no row can arrive (an INSERT with an
  -- old created_at) and which DETACH needs anyway.
  FOREACH parent IN ARRAY ARRAY[outbox, sent] LOOP
    CONTINUE WHEN parent = sent AND retain_sent_ms IS NULL;
    drops := '{}';
    FOR rel IN
      SELECT c.oid::regclass
      FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)') AS ub
      WHERE h.inhparent = parent AND ub IS NOT NULL
        -- a negative window would reach the current partition and those ahead: none is shorter than 0
        AND ub::timestamptz <= CASE WHEN parent = outbox THEN now_lo
                                    ELSE now() - make_interval(secs => greatest(retain_sent_ms, 0) / 1000.0) END
      ORDER BY ub::timestamptz
    LOOP
      IF parent = outbox THEN
        EXECUTE format('SELECT EXISTS (SELECT FROM %s)', rel) INTO has_rows;
        CONTINUE WHEN has_rows;
      END IF;
      drops := drops || rel;
    END LOOP;
    CONTINUE WHEN cardinality(drops) = 0;
    n := 0;
    BEGIN
      EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', parent);
      FOREACH rel IN ARRAY drops LOOP
        IF parent = outbox THEN
          EXECUTE format('SELECT EXISTS (SELECT FROM %s)', rel) INTO has_rows;
          CONTINUE WHEN has_rows;
        END IF;
        EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', parent, rel);
        EXECUTE format('DROP TABLE %s', rel);
        n := n + 1;
      END LOOP;
      dropped := dropped + n;
    EXCEPTION WHEN lock_not_available THEN
      busy := busy + cardinality(drops);
    END;
  END LOOP;
  RETURN jsonb_build_object('created', created, 'dropped', dropped, 'busy', busy);
END
$partitions$;

REVOKE EXECUTE ON FUNCTION {{partitions_fn}}(bigint) FROM PUBLIC;

-- the fixed search_path, as the baseline sets its trigger functions' (001_baseline.sql says why)
DO $search_path$
DECLARE
  table_schema text := (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class c WHERE c.oid = {{table_literal}}::regclass);
BEGIN
  EXECUTE pg_catalog.format('ALTER FUNCTION %s(bigint) SET search_path = pg_catalog, %s, pg_temp', {{partitions_fn_literal}}, table_schema);
END
$search_path$;
