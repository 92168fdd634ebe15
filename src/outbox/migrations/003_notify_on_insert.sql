-- Linger mode (OUTBOX_IDLE=linger with OUTBOX_WAKE=notify): a lingering invocation LISTENs on the
-- table's channel and claims as soon as a producer's transaction commits rows. A statement-level
-- trigger, so a statement notifies once however many rows it inserts; Postgres folds identical
-- notifications of one transaction into one, so a transaction notifies once. Nothing in the
-- producer's INSERT changes, and pg_notify needs no privilege: any role that may insert still may.
-- The notification is delivered at COMMIT, only if the transaction commits.
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
