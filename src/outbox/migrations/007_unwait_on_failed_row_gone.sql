-- A waiting mark (migration 004) is justified by a failed row of its aggregate below it. When the
-- last such row goes, the marks are stale: a later row of the aggregate, not marked, could be
-- claimed ahead of them (G4). The claim used to guard against that by probing the waiting index
-- once for every aggregate it claimed, ~1 ms per claim of 500 rows whenever any row waited. Now
-- it probes only the aggregates that still have a failed row (a due one, a parked one under the
-- skip policy: their marks can be stale while the row is there), and this trigger clears the
-- marks in the very statement that removes an aggregate's failed row, whoever runs it: the relay
-- sending it, `parked retry` and `parked skip`, or a DELETE or UPDATE by hand. The marks below
-- the aggregate's first remaining failed row are cleared (all of them when none is left); those
-- above it are still justified by it.
--
-- Only failed rows fire it (the WHEN is tested on each row a statement deletes or updates; the
-- relay's move of a row sent at its first try is not slowed measurably): a failed row deleted,
-- or updated so that it no longer counts as failed (attempts 0, sent, skipped, moved to another
-- aggregate or seq). Security invoker: a role that deletes or resets failed rows by hand also
-- needs UPDATE on the table, which the relay's own role has.
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
