// Every statement the relay runs against the outbox table, kept whole so it can be read and
// EXPLAINed. `{t}` is the validated, quoted table name (identifier.ts).
import type { ParkedPolicy } from '../domain.ts';
import type { PruneTarget } from '../loop/ports.ts';
import { blockedAggregates, blockingRows } from './claim.ts';

// the claim and the statements that serve it (src/outbox/claim.ts); the schema check, which asks
// the catalogs rather than the outbox, is beside the code that reads its row (schema-check.ts)
export { claimStatement, heldGapsSql, payloadsSql, type ClaimBytes, type Statement } from './claim.ts';

/** `claimable`: only locks kept the empty claim from a due row (other invocations, or a row committed just now). */
export function whyEmptySql(t: string, policy: ParkedPolicy): string {
  return `
WITH blocked AS MATERIALIZED (${blockedAggregates(t, policy)})
SELECT
  EXISTS (
    SELECT 1 FROM ${t} r
    WHERE r.sent_at IS NULL AND r.skipped_at IS NULL AND r.parked_at IS NULL AND NOT r.waiting AND r.next_attempt_at <= now()
      AND (r.aggregateid NOT IN (SELECT aggregateid FROM blocked)
           OR r.seq < (SELECT b.first_blocked FROM blocked b WHERE b.aggregateid = r.aggregateid))
  ) AS claimable,
  EXISTS (
    SELECT 1 FROM ${t}
    WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting
  ) OR (
    SELECT true FROM ${t}
    WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL
    ORDER BY aggregateid, seq LIMIT 1
  ) IS NOT NULL AS pending`;
}

/** A backward scan of the claim's partial index that stops at its first entry: one index page, however long the backlog. */
export function newestPendingSql(t: string): string {
  return `
SELECT max(seq)::text AS newest FROM ${t}
WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting`;
}

/**
 * One statement, so a rollback undoes both halves of the move. It fails unless both halves
 * affected exactly the rows named: a mark that matched fewer (row-level security, a trigger
 * returning NULL) would re-send them forever, one that matched more loses rows.
 */
export function moveSentSql(t: string, sent: string, key: MarkKey = 'address'): string {
  const rows = markedBy(key, 'o');
  return `
WITH moved AS (
  DELETE FROM ${t} o${rows.using}
  WHERE ${rows.where} AND o.sent_at IS NULL
  RETURNING o.id, o.aggregatetype, o.aggregateid, o.type, o.payload, o.topic, o.headers, o.seq, o.created_at, o.attempts, o.retried_at, o.retried_by, o.retried_reason, o.retried_operator
),
put AS (
  INSERT INTO ${sent} (id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, sent_at, attempts, retried_at, retried_by, retried_reason, retried_operator)
  SELECT id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, now(), attempts, retried_at, retried_by, retried_reason, retried_operator
  FROM moved
  RETURNING 1
)
${exactly(rows.count, ['the mark moved', 'moved', 'rows out of the outbox'], ['and wrote', 'put', 'into the sent table'])}`;
}

/** Exactly-once delivery: which rows of a lane's batch in flight are still to mark, locked (outbox/side-tx.ts settleLane). */
export function inFlightPendingSql(t: string): string {
  return `SELECT seq::text AS seq FROM ${t} WHERE seq = ANY ($1::bigint[]) AND sent_at IS NULL AND skipped_at IS NULL FOR UPDATE`;
}

/** About five times cheaper than the move (no second copy, no index insertions). Checked as the move. */
export function deleteSentSql(t: string, key: MarkKey = 'address'): string {
  const rows = markedBy(key, 'o');
  return `
WITH gone AS (
  DELETE FROM ${t} o${rows.using}
  WHERE ${rows.where} AND o.sent_at IS NULL
  RETURNING 1
)
${exactly(rows.count, ['the mark deleted', 'gone', 'rows of the outbox'])}`;
}

/**
 * By tableoid and ctid, as the claim read them: the rows are locked from the claim on, and the pair
 * names one row version across partitions and inheritance children (a ctid alone repeats). The
 * CASE, decided at planning, leaves a filter on the one tableoid of the usual batch. Measured
 * (bench/db-cost.ts, delete mode, µs of Postgres CPU per event): ctid alone, unchecked 1.06; this,
 * checked 1.45; pairing every row by a join 1.93, by a hashed lookup 2.31
 * (docs/benchmarks/2026-12-03-database-cost.md).
 */
export type MarkKey = 'address' | 'seq';
export function markedBy(key: MarkKey, alias: string): { using: string; where: string; count: string } {
  if (key === 'seq') return { using: '', where: `${alias}.seq = ANY ($1::bigint[])`, count: 'cardinality($1::bigint[])' };
  return {
    using: '',
    where: `${alias}.ctid = ANY ($2::tid[]) AND CASE WHEN cardinality($1::oid[]) = 1 THEN ${alias}.tableoid = ($1::oid[])[1]
    ELSE (${alias}.tableoid, ${alias}.ctid) IN (SELECT * FROM unnest($1::oid[], $2::tid[])) END`,
    count: 'cardinality($2::tid[])',
  };
}

/**
 * What a failed row check's error says first (db-errors.ts reads it): plain SQL raises nothing, so
 * `exactly` fails a cast of its message to bigint (22P02), which aborts the transaction.
 */
export const ROW_CHECK_FAILED = 'outbox-relay row check';

/** Postgres runs every data-modifying CTE to completion, so a CTE's rows are counted whether or not the SELECT reads them. */
function exactly(expected: string, ...parts: Array<[before: string, cte: string, after: string]>): string {
  const counts = parts.map(([, cte]) => `(SELECT count(*) FROM ${cte})`);
  const said = parts.map(([before, , after], i) => `'${before} ' || ${counts[i]} || ' ${after}'`).join(` || ' ' || `);
  return `SELECT CASE WHEN ${counts.map((c) => `${c} = ${expected}`).join(' AND ')} THEN ${expected}::bigint
  ELSE ('${ROW_CHECK_FAILED}: ' || ${said} || ', of ' || ${expected} || ' rows named')::bigint END AS affected`;
}

/**
 * Every listed row must be charged: an UPDATE hidden by row-level security or a trigger would
 * leave a poison row uncharged, retried without backoff forever.
 */
export function recordFailuresSql(t: string): string {
  return `
WITH charged AS (
  UPDATE ${t} AS r
  SET attempts = r.attempts + 1,
      last_error = f.error,
      next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
      parked_at = CASE WHEN f.park = 1 THEN now() END
  -- park travels as 0/1: postgres.js mis-types a JS boolean[] parameter (sends it as boolean)
  FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::int[], $5::oid[], $6::tid[]) AS f(seq, error, delay_ms, park, rel, tid)
  WHERE r.seq = f.seq AND r.tableoid = f.rel AND r.ctid = f.tid
  RETURNING 1
)
${exactly('cardinality($1::bigint[])', ['recording failed attempts updated', 'charged', 'rows'])}`;
}

/**
 * One short chunk of retention (the caller repeats until one comes back short). No row lock in
 * the sent table (FOR UPDATE would need the UPDATE privilege on it): of two retentions at once,
 * the second finds the first's rows gone, so fewer than chosen is no error there. Skipped rows
 * are locked, so every one chosen must go.
 */
export function pruneSql(t: string, sent: string, what: PruneTarget): string {
  if (what === 'sent') {
    return `
WITH due AS MATERIALIZED (
  SELECT tableoid AS rel, ctid AS tid FROM ${sent}
  WHERE sent_at < now() - $1 * interval '1 millisecond'
  ORDER BY sent_at
  LIMIT $2
),
gone AS (DELETE FROM ${sent} s USING due d WHERE s.tableoid = d.rel AND s.ctid = d.tid RETURNING 1)
SELECT count(*) AS affected FROM gone`;
  }
  return `
WITH due AS MATERIALIZED (
  SELECT tableoid AS rel, ctid AS tid FROM ${t}
  WHERE skipped_at IS NOT NULL AND skipped_at < now() - $1 * interval '1 millisecond'
  ORDER BY skipped_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
),
gone AS (DELETE FROM ${t} o USING due d WHERE o.tableoid = d.rel AND o.ctid = d.tid RETURNING 1)
${exactly('(SELECT count(*) FROM due)', ['retention deleted', 'gone', 'skipped rows'])}`;
}

/** Its JSON answer as text: the relay's client parses no jsonb it does not need to. */
export function maintainPartitionsSql(fn: string): string {
  return `SELECT ${fn}($1::bigint)::text AS done`;
}

export function statusSql(t: string): string {
  return `
SELECT coalesce(topic, '') AS topic_override, aggregatetype,
       count(*) FILTER (WHERE parked_at IS NULL)                           AS pending,
       count(*) FILTER (WHERE parked_at IS NULL AND attempts > 0)          AS retrying,
       count(*) FILTER (WHERE parked_at IS NOT NULL)                       AS parked,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)) * 1000 AS oldest_pending_ms
FROM ${t}
WHERE sent_at IS NULL AND skipped_at IS NULL
GROUP BY 1, 2
ORDER BY 1, 2`;
}

/**
 * Cheap however large the table: each figure reads one partial index, at most $1 + 1 entries. The
 * lowest pending seq's age stands in for the oldest created_at: seq follows insert order, and
 * created_at is the inserting transaction's start, so they disagree only by how long writers'
 * transactions overlapped. Waiting rows are outside the claim index, so the waiting index is read too.
 */
export function backlogSql(t: string): string {
  return `
WITH RECURSIVE ${waitingAggregates(t)}
SELECT
  greatest(
    (SELECT extract(epoch FROM clock_timestamp() - created_at) * 1000
     FROM ${t}
     WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting
     ORDER BY seq
     LIMIT 1),
    -- the oldest waiting row: the first of each waiting aggregate, one probe per aggregate
    (SELECT extract(epoch FROM clock_timestamp() - o.created_at) * 1000
     FROM ${t} o
     WHERE o.seq = (SELECT min(first_seq) FROM waiting_aggs))
  ) AS oldest_pending_age_ms,
  least($1::int + 1, (SELECT count(*) FROM (
     SELECT 1 FROM ${t}
     WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting
     LIMIT $1::int + 1) p) + (SELECT count(*) FROM (
     SELECT 1 FROM ${t}
     WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL
     LIMIT $1::int + 1) w)) AS pending_rows,
  (SELECT count(*) FROM (
     SELECT 1 FROM ${t}
     WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0 AND parked_at IS NOT NULL
     LIMIT $1::int + 1) parked) AS parked_rows`;
}

export function parkedListSql(t: string): string {
  return `
SELECT id, seq, aggregatetype, aggregateid, type, topic, attempts, last_error, parked_at, created_at, retried_at, retried_by, retried_reason, retried_operator
FROM ${t}
WHERE parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
ORDER BY seq
LIMIT $1`;
}

/** Locked when the command is to act, so nothing changes the rows between this read and the UPDATE. */
export function operatorLookupSql(t: string, rows: 'ids' | 'all-parked', lock: boolean): string {
  return `
SELECT id, aggregateid, parked_at, skipped_at, skipped_by, sent_at, attempts, next_attempt_at
FROM ${t}
WHERE ${rows === 'ids' ? 'id = ANY($1::uuid[])' : 'parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL'}
ORDER BY seq${lock ? '\nFOR UPDATE' : ''}`;
}

/** The time its transaction started, which the UPDATEs record. */
export const operatorSql = 'SELECT session_user::text AS by, now() AS at';

/** The lookup's conditions restated, so the statement alone never puts back a row that is not parked. */
export function parkedRetrySql(t: string): string {
  return `
UPDATE ${t}
SET parked_at = NULL, attempts = 0, next_attempt_at = '-infinity', last_error = NULL,
    retried_at = now(), retried_by = session_user, retried_reason = $2, retried_operator = $3
WHERE id = ANY($1::uuid[]) AND parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
RETURNING id, aggregateid`;
}

/** Kept for audit (OUTBOX_RETAIN_SKIPPED_MS); no longer holds its aggregate back. */
export function parkedSkipSql(t: string): string {
  return `
UPDATE ${t}
SET skipped_at = now(), skipped_by = session_user, skipped_reason = $2, skipped_operator = $3
WHERE id = ANY($1::uuid[]) AND parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
RETURNING id, aggregateid`;
}

/** A loose index scan of the waiting index: one probe per aggregate, however many rows wait. */
function waitingAggregates(t: string): string {
  return `waiting_aggs(aggregateid, first_seq) AS (
  (SELECT aggregateid, seq FROM ${t}
   WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL
   ORDER BY aggregateid, seq LIMIT 1)
  UNION ALL
  SELECT n.aggregateid, n.seq FROM waiting_aggs a CROSS JOIN LATERAL (
    SELECT aggregateid, seq FROM ${t}
    WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL AND aggregateid > a.aggregateid
    ORDER BY aggregateid, seq LIMIT 1) n
)`;
}

/**
 * So that claims no longer read the rows behind a blocking row. Only rows after the aggregate's last
 * waiting row are looked at, so a second pass costs nothing (a row committed late below it stays
 * unmarked, skipped by the claim as before); at most $2 rows per statement, so a long backlog is
 * marked in short transactions.
 */
export function markWaitingSql(t: string, policy: ParkedPolicy): string {
  return `
WITH blockers AS MATERIALIZED (
  -- the blocking rows this pass relies on, share-locked until it commits: whoever takes one away
  -- meanwhile (the relay sending it once due, a DELETE by hand) waits, and the unwait
  -- trigger then sees our marks and clears them. A blocking row someone else holds is left
  -- out, and so are the rows behind it (a claim's batch holds it: it is being sent).
  SELECT aggregateid, seq FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0
    AND (${blockingRows(policy)})
    AND ($1::text[] IS NULL OR aggregateid = ANY ($1::text[]))
  FOR SHARE SKIP LOCKED
),
blocked AS MATERIALIZED (SELECT aggregateid, min(seq) AS first_blocked FROM blockers GROUP BY aggregateid),
since AS MATERIALIZED (
  -- where to start: after the last row already marked (a backward probe of the waiting index)
  SELECT b.aggregateid, greatest(b.first_blocked, coalesce(
           (SELECT m.seq FROM ${t} m
            WHERE m.aggregateid = b.aggregateid AND m.waiting AND m.sent_at IS NULL AND m.skipped_at IS NULL
            ORDER BY m.aggregateid DESC, m.seq DESC LIMIT 1), 0)) AS after_seq
  FROM blocked b
)
UPDATE ${t} SET waiting = true
WHERE seq IN (
  SELECT w.seq
  FROM since s
  JOIN ${t} w ON w.aggregateid = s.aggregateid AND w.seq > s.after_seq
  -- a failed row is never marked: it is a blocking row itself, or due and claimable at once
  WHERE w.sent_at IS NULL AND w.skipped_at IS NULL AND w.parked_at IS NULL AND NOT w.waiting AND w.attempts = 0
  LIMIT $2
  FOR UPDATE OF w SKIP LOCKED
)`;
}

/**
 * Runs after the statements that changed the blocking rows, in the same transaction. Rows locked
 * by others are skipped: a mark left stale is cleared by the next pass, and the claim treats it as
 * a gap meanwhile, so order holds.
 */
export function unwaitSql(t: string, policy: ParkedPolicy): string {
  return `
WITH RECURSIVE ${waitingAggregates(t)},
scope AS (
  SELECT aggregateid FROM waiting_aggs WHERE $1::text[] IS NULL
  UNION
  SELECT unnest($1::text[])
),
firsts AS MATERIALIZED (
  SELECT s.aggregateid,
         (SELECT min(b.seq) FROM ${t} b
          WHERE b.aggregateid = s.aggregateid AND b.sent_at IS NULL AND b.skipped_at IS NULL AND b.attempts > 0
            AND (${blockingRows(policy, 'b')})) AS first_blocked
  FROM scope s
)
UPDATE ${t} SET waiting = false
WHERE seq IN (
  SELECT w.seq FROM ${t} w JOIN firsts f ON w.aggregateid = f.aggregateid
  WHERE w.waiting AND w.sent_at IS NULL AND w.skipped_at IS NULL
    -- a failed row's mark (versions before this one set them) would outlive its reason once due
    AND (f.first_blocked IS NULL OR w.seq < f.first_blocked OR w.attempts > 0)
  -- a row someone holds (an application's lock) keeps its mark for a later pass; waiting for it
  -- would leave every other aggregate's marks in place too
  FOR UPDATE OF w SKIP LOCKED
)`;
}

/** One probe each of the waiting and retry indexes. */
export function waitingWorkSql(t: string, policy: ParkedPolicy): string {
  return `
SELECT (SELECT true FROM ${t}
        WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL
        ORDER BY aggregateid, seq LIMIT 1) IS NOT NULL AS waiting,
       EXISTS (SELECT 1 FROM ${t}
               WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0 AND (${blockingRows(policy)})) AS blocked`;
}
