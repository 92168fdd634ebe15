// Every statement the relay runs against the outbox table, kept whole so it can be read and
// EXPLAINed. `{t}` is the validated, quoted table name (see identifier.ts); values are always
// bound parameters.
import type { ParkedPolicy } from '../config.ts';

/**
 * Claim up to $1 pending, due rows in seq order, skipping rows other invocations hold, and
 * apply the order guard (G4): a claimed row is publishable only if no unsent row of its
 * aggregate with a smaller seq exists outside this claim (held by another invocation, backing
 * off, parked, or between two of our rows). $2 lists this invocation's own in-flight rows (the
 * previous batch, already on its way to the broker in order), which do not hold anything back.
 *
 * The guard is one set-based pass per claimed aggregate: scan that aggregate's unsent rows below
 * the highest claimed seq (partial index on (aggregateid, seq)), drop the ones that are ours, and
 * the smallest remaining seq is the first gap; claimed rows at or above it wait.
 * Rows held back stay locked by this transaction until it ends, so no one else can take them
 * out of order either.
 */
export function claimSql(t: string, policy: ParkedPolicy): string {
  return `
WITH cand AS (
  SELECT seq, aggregateid
  FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL
    AND next_attempt_at <= now()
  ORDER BY seq
  LIMIT $1
  FOR UPDATE SKIP LOCKED
),
ours AS (
  SELECT seq FROM cand
  UNION ALL
  SELECT unnest($2::bigint[])
),
aggs AS (
  SELECT aggregateid, max(seq) AS max_seq FROM cand GROUP BY aggregateid
),
gap AS (
  SELECT o.aggregateid, min(o.seq) AS first_gap
  FROM aggs a
  JOIN ${t} o
    ON o.aggregateid = a.aggregateid
   AND o.sent_at IS NULL AND o.skipped_at IS NULL
   AND o.seq < a.max_seq${policy === 'skip' ? '\n   AND o.parked_at IS NULL' : ''}
  WHERE NOT EXISTS (SELECT 1 FROM ours WHERE ours.seq = o.seq)
  GROUP BY o.aggregateid
)
SELECT r.seq, r.id, r.aggregatetype, r.aggregateid, r.type, r.payload::text AS payload,
       r.topic, r.headers, r.attempts,
       (g.first_gap IS NULL OR c.seq < g.first_gap) AS publishable
FROM cand c
JOIN ${t} r ON r.seq = c.seq
LEFT JOIN gap g ON g.aggregateid = c.aggregateid
ORDER BY c.seq`;
}

/** The same claim without the order guard: only for the benchmark's comparison. */
export function claimUnguardedSql(t: string): string {
  return `
SELECT seq, id, aggregatetype, aggregateid, type, payload::text AS payload, topic, headers, attempts, true AS publishable
FROM ${t}
WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now()
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`;
}

/** Is anything pending and due at all (locked or not)? Tells "empty" from "others hold it". */
export function anyDueSql(t: string): string {
  return `
SELECT EXISTS (
  SELECT 1 FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND next_attempt_at <= now()
) AS due`;
}

export function markSentSql(t: string): string {
  return `
UPDATE ${t} SET sent_at = now(), last_error = NULL
WHERE seq = ANY($1::bigint[]) AND sent_at IS NULL`;
}

/** One attempt failed for each listed row: record why, when to try again, or park it. */
export function recordFailuresSql(t: string): string {
  return `
UPDATE ${t} AS r
SET attempts = r.attempts + 1,
    last_error = f.error,
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
    parked_at = CASE WHEN f.park THEN now() END
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::boolean[]) AS f(seq, error, delay_ms, park)
WHERE r.seq = f.seq`;
}

/** Bounded delete of old sent rows, so the table does not grow without end. */
export function pruneSql(t: string): string {
  return `
DELETE FROM ${t}
WHERE seq IN (
  SELECT seq FROM ${t}
  WHERE sent_at < now() - $1 * interval '1 millisecond'
     OR skipped_at < now() - $1 * interval '1 millisecond'
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)`;
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

export function parkedListSql(t: string): string {
  return `
SELECT id, seq, aggregatetype, aggregateid, type, topic, attempts, last_error, parked_at, created_at
FROM ${t}
WHERE parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
ORDER BY seq
LIMIT $1`;
}

/** Back to pending with a clean slate. $1: ids, or NULL for every parked row. */
export function parkedRetrySql(t: string): string {
  return `
UPDATE ${t}
SET parked_at = NULL, attempts = 0, next_attempt_at = '-infinity', last_error = NULL
WHERE parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
  AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
RETURNING id`;
}

/** Never to be sent; kept for audit, and no longer holds its aggregate back. */
export function parkedSkipSql(t: string): string {
  return `
UPDATE ${t}
SET skipped_at = now()
WHERE parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
  AND id = ANY($1::uuid[])
RETURNING id`;
}
