// Statements the relay never runs, for the benches' comparisons (and one G4 test's): each stands in
// for one of the relay's own (src/outbox/sql.ts) to show what that one buys. bench/stores.ts puts
// them in an OutboxStore; bench/marks.ts runs them by itself. `{t}` as there: the quoted table.
import { type MarkKey, markedBy } from '../src/outbox/sql.ts';

/**
 * A plain SKIP LOCKED claim without any order guard (in place of claimStatement): every row it
 * takes is publishable. The benches' `sqlPlain`, next to the guarded claim; and
 * test/integration/relay.test.ts, which shows it breaks per-aggregate order (G4).
 */
export function claimUnguardedSql(t: string): string {
  return `
SELECT seq, tableoid AS rel, ctid AS tid, id, aggregatetype, aggregateid, type, payload::text AS payload, topic, headers, attempts,
  true AS publishable
FROM ${t}
WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting AND next_attempt_at <= now()
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`;
}

/**
 * How pre-release versions, before the sent table, marked a row sent (in place of moveSentSql): a
 * second version of the row, in place. pruneInPlaceSql deletes such rows.
 */
export function markInPlaceSql(t: string, key: MarkKey = 'seq'): string {
  const rows = markedBy(key, 'o');
  return `
UPDATE ${t} o SET sent_at = now(), last_error = NULL${rows.using.replace(' USING ', ' FROM ')}
WHERE ${rows.where} AND o.sent_at IS NULL`;
}

/** Retention of rows marked sent in place (markInPlaceSql), one chunk, as pre-release versions pruned them. */
export function pruneInPlaceSql(t: string): string {
  return `
DELETE FROM ${t}
WHERE seq IN (
  SELECT seq FROM ${t}
  WHERE sent_at IS NOT NULL AND sent_at < now() - $1 * interval '1 millisecond'
  ORDER BY sent_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`;
}
