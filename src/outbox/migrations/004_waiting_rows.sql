-- Rows that wait behind a failed row of their aggregate leave the claim index. A row that fails
-- (backing off, or parked under the hold policy) holds back its aggregate's later rows (G4). The
-- claim used to step over every one of them, in seq order, on every claim: an aggregate parked
-- for a day with 100,000 rows behind it made each claim read 100,000 rows to discard them. The
-- relay now marks those rows `waiting` when their aggregate becomes blocked and clears the mark
-- when it is free again (src/outbox/sql.ts, markWaitingSql and unwaitSql). The claim still checks
-- every row it takes for a blocking row, so the mark only saves work: a row not yet marked is
-- skipped as before, and a stale mark is cleared once per invocation at the latest.
-- Producers never set it; the default keeps their inserts (and Debezium's) unchanged.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS waiting boolean NOT NULL DEFAULT false;

DROP INDEX IF EXISTS {{idx_claim_qualified}};
CREATE INDEX IF NOT EXISTS {{idx_claim}} ON {{table}} (seq)
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting;

-- The waiting rows by aggregate: to clear an aggregate's marks, to find the aggregates that have
-- any (one probe per aggregate), and for the backlog figures. Normally empty.
CREATE INDEX IF NOT EXISTS {{idx_waiting}} ON {{table}} (aggregateid, seq)
  WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL;
