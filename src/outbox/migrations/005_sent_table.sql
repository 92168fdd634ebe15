-- Sent rows move to a table of their own (OUTBOX_SENT_ROWS=keep, the default). The batch's
-- transaction deletes each acked row from the outbox and inserts it here, whole, with its
-- sent_at (src/outbox/sql.ts, moveSentSql); retention deletes it from here once it is older than
-- OUTBOX_RETAIN_SENT_MS.
--
-- Why not mark the row where it is (`UPDATE ... SET sent_at = now()`, versions before this one):
-- sent_at is in the predicates of the partial indexes, so that UPDATE can never be HOT. It wrote a
-- second 1 KB version of every row, with entries in three indexes, and left the first version for
-- vacuum. Measured on 50,000 rows of ~1 KB, with every later cost of the row counted (claim, mark,
-- vacuum, prune; `npm run bench -- --only marks`), Postgres spent 29.4 µs of CPU and wrote 1.75 KB
-- of WAL per row that way; moving the row here, 20.2 µs and 1.5 KB. Deleting it
-- (OUTBOX_SENT_ROWS=delete) costs 13.6 µs.
-- The outbox itself then holds only unsent rows (and parked and skipped ones), as with `delete`.
--
-- Producers never touch this table. Columns the outbox gains later are added here as well; the
-- relay's bookkeeping that means nothing once a row is sent (next_attempt_at, last_error,
-- parked_at, skipped_at, waiting) is not kept.
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
  attempts      integer     NOT NULL
);

-- Retention deletes the oldest rows first and stops at the window: a b-tree on sent_at, whose
-- inserts all land on its rightmost page. (A BRIN index is cheaper to insert into, but its
-- ranges only ever widen: once retention has emptied pages and new rows have filled them, every
-- range matches an old cutoff and each prune reads the whole table.) No index on id: look-ups by
-- event id are an operator's, rare, and an index for them would cost every row; add one if you
-- need it.
CREATE INDEX IF NOT EXISTS {{idx_sent_table}} ON {{sent_table}} (sent_at);

-- Every row is inserted once and deleted once by retention, in 5,000-row chunks. Vacuum it as
-- eagerly as the outbox, so the space of pruned rows is reused instead of the file growing.
ALTER TABLE {{sent_table}} SET (
  autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 5000,
  autovacuum_vacuum_insert_scale_factor = 0.0,
  autovacuum_vacuum_insert_threshold = 50000,
  autovacuum_analyze_scale_factor = 0.0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 0
);
