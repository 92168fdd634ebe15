-- A row that backs off stays in the claim index: it becomes claimable again when its
-- next_attempt_at passes, without anyone touching it. Its aggregate's later rows leave the index
-- (migration 004), but the row itself did not: with 1,000 aggregates backing off, every claim
-- read those 1,000 rows from the heap to learn that they were not due, and the claim's quick gap
-- check stepped over them once more. next_attempt_at becomes the claim index's second key. The
-- index keeps seq order (seq is unique), and a claim's `next_attempt_at <= now()` is tested on the
-- index entry itself, so the rows that are not due are passed over without a heap read.
-- (As an INCLUDE column it would not do: Postgres tests those only in an index-only scan, and the
-- claim's scan reads the rows it takes.) attempts is included for the quick gap check, which is
-- an index-only scan: a row not due is left out there only if it failed, which tells a row that
-- backs off from one set not due by hand.
--
-- The failed rows' index (the claim reads it for the blocked aggregates) carries the two columns
-- that decide whether a failed row blocks, so that look-up reads no heap page once vacuum has
-- passed.
--
-- Both indexes are rebuilt within the migration's transaction, which locks the table against
-- writes while they build: a few seconds for a million pending rows; the failed rows' index is
-- normally nearly empty.
DROP INDEX IF EXISTS {{idx_claim_qualified}};
CREATE INDEX IF NOT EXISTS {{idx_claim}} ON {{table}} (seq, next_attempt_at) INCLUDE (attempts)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting;

DROP INDEX IF EXISTS {{idx_retry_qualified}};
CREATE INDEX IF NOT EXISTS {{idx_retry}} ON {{table}} (aggregateid, seq) INCLUDE (next_attempt_at, parked_at)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0;
