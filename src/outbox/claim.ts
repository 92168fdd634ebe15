// docs/order-guard.md explains the claim fragment by fragment; the comments here keep only what the
// planner needed. `{t}` is the validated, quoted table name (identifier.ts).
import type { ClaimColumn, ParkedPolicy } from '../domain.ts';
import type { ClaimFilter } from '../loop/ports.ts';

export interface Statement {
  text: string;
  params: unknown[];
}

class Params {
  readonly list: unknown[] = [];
  add(value: unknown): string {
    this.list.push(value);
    return `$${this.list.length}`;
  }
}

/** docs/order-guard.md, "Batches bounded in bytes" */
export interface ClaimBytes {
  batch: number;
  payload: number;
}

// A feature's fragment is in the text only while the feature is on, so the usual claim is the
// short one (each shape its own prepared statement).
export function claimStatement(t: string, policy: ParkedPolicy, limit: number, filter: ClaimFilter, lockSeed: string, bytes: ClaimBytes,
  columns: readonly ClaimColumn[] = [], lanes?: string): Statement {
  const p = new Params();
  const extra = columns.map(columnName);
  const claim = { limit: p.add(limit), seed: p.add(lockSeed), inFlight: p.add(filter.inFlight) };
  const size = { batch: p.add(bytes.batch), payload: p.add(bytes.payload) };
  const leftOut = filter.aggregates.length > 0 ? p.add(filter.aggregates) : undefined;
  const topics = filter.topics.length > 0 ? { template: p.add(filter.topicTemplate), list: p.add(filter.topics) } : undefined;
  const ctes = [
    `blocked AS MATERIALIZED (${blockedAggregates(t, policy)})`,
    topics ? `held AS MATERIALIZED (${firstRowsForTopics(t, topics)})` : undefined,
    lanes ? `settling AS MATERIALIZED (${inFlightSql(lanes)})` : undefined,
    `cand AS MATERIALIZED (${candidates(t, claim, leftOut, topics !== undefined, columns, lanes !== undefined)})`,
    `cut AS MATERIALIZED (${batchBytesCut(size.batch)})`,
    'taken AS NOT MATERIALIZED (SELECT * FROM cand WHERE seq <= (SELECT last_seq FROM cut))',
    'aggs AS (SELECT aggregateid, max(seq) AS max_seq, array_agg(seq) AS seqs FROM taken GROUP BY aggregateid)',
    `gap AS MATERIALIZED (${firstGaps(t, policy, `${anyGapPossible(t, claim.inFlight)} OR ${staleMarkBelow(t)}`)})`,
  ].filter((c) => c !== undefined);
  // no ORDER BY: a sort of the wide rows costs the database more than it costs OutboxStore.claim
  const text = `WITH ${ctes.join(',\n')}
SELECT seq, id, aggregatetype, aggregateid, type, CASE WHEN payload_bytes <= ${size.payload} THEN payload::text END AS payload, payload_bytes,
  topic, headers, attempts${extra.map((c) => `, ${c}`).join('')}, rel, tid, first_gap, (first_gap IS NULL OR seq < first_gap) AS publishable
FROM taken LEFT JOIN gap USING (aggregateid)`;
  return { text, params: p.list };
}

// Named, never `*`: an application's own column (one called `tid`, say) must not shadow an alias.
const CAND_COLUMNS = ['tableoid AS rel', 'ctid AS tid', 'seq', 'id', 'aggregatetype', 'aggregateid', 'type', 'payload', 'payload_bytes',
  'headers_bytes', 'topic', 'headers', 'attempts'];

function columnName(c: ClaimColumn): string {
  return / AS (\w+)$/.exec(c)?.[1] ?? c;
}

// the first row whatever its size, so a batch never stalls behind a large one
function batchBytesCut(batchBytes: string): string {
  return `SELECT coalesce(max(seq) FILTER (WHERE running <= ${batchBytes}::bigint), min(seq)) AS last_seq
  FROM (SELECT seq, sum(coalesce(payload_bytes, 0) + coalesce(headers_bytes, 0)) OVER (ORDER BY seq) AS running FROM cand) s`;
}

/** the claim index's predicate */
function pending(alias?: string): string {
  const c = alias ? `${alias}.` : '';
  return `${c}sent_at IS NULL AND ${c}skipped_at IS NULL AND ${c}parked_at IS NULL AND NOT ${c}waiting`;
}

function firstRowsForTopics(t: string, $: { template: string; list: string }): string {
  // marked waiting or not: any pending row bound for a refused topic holds its aggregate's later rows (G4)
  return `SELECT aggregateid, min(seq) AS first_held FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL
    AND coalesce(nullif(topic, ''), replace(replace(${$.template}::text, '{aggregatetype}', aggregatetype), '{type}', type)) = ANY (${$.list}::text[])
  GROUP BY aggregateid`;
}

// NOT IN on `blocked` is a hashed lookup (NOT EXISTS planned a nested loop over every blocked
// aggregate). The CASE tries the lock only for a row otherwise claimable, whatever order the plan
// tests the conditions in. ORDER BY both keys of the claim index: the one path to seq order
// without a sort.
function candidates(t: string, $: { limit: string; seed: string }, leftOut: string | undefined, topics: boolean,
  columns: readonly ClaimColumn[], settling: boolean): string {
  return `SELECT ${[...CAND_COLUMNS, ...columns].join(', ')} FROM ${t} r
  WHERE ${pending()}
    AND (aggregateid NOT IN (SELECT aggregateid FROM blocked) OR seq < (SELECT b.first_blocked FROM blocked b WHERE b.aggregateid = r.aggregateid))${
      topics ? '\n    AND NOT EXISTS (SELECT 1 FROM held h WHERE h.aggregateid = r.aggregateid AND h.first_held <= r.seq)' : ''}${
      settling ? '\n    AND seq NOT IN (SELECT seq FROM settling)' : ''}${
      leftOut ? `\n    AND aggregateid <> ALL (${leftOut}::text[])` : ''}
    AND next_attempt_at <= now()
    AND CASE WHEN next_attempt_at <= now() THEN pg_try_advisory_xact_lock(hashtextextended(aggregateid, hashtext(${$.seed}))) END
  ORDER BY seq, next_attempt_at
  LIMIT ${$.limit}
  FOR UPDATE OF r SKIP LOCKED`;
}

// One range scan that lets a single relay's steady state skip the per-aggregate gap probes. A row
// set not due by hand (never failed) blocks nothing, so it stays a possible gap.
function anyGapPossible(t: string, inFlight: string): string {
  return `(SELECT true FROM ${t} WHERE ${pending()}
      AND seq < (SELECT max(seq) FROM taken) AND seq NOT IN (SELECT seq FROM taken) AND seq NOT IN (SELECT unnest(${inFlight}::bigint[]))
      AND (next_attempt_at <= now() OR attempts = 0)
    ORDER BY seq, next_attempt_at LIMIT 1) IS NOT NULL`;
}

// Marks are never trusted to be cleared on time. LATERAL ... LIMIT 1 probes the waiting index once
// per aggregate (a semi-join was planned as a hash of every waiting row), and only while any row waits.
function staleMarkBelow(t: string): string {
  return `CASE WHEN (SELECT true FROM ${t} WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL ORDER BY aggregateid, seq LIMIT 1)
    THEN EXISTS (SELECT FROM aggs a, LATERAL (SELECT FROM ${t}
      WHERE aggregateid = a.aggregateid AND waiting AND sent_at IS NULL AND skipped_at IS NULL AND seq < a.max_seq LIMIT 1) w) END`;
}

// A mark committed after our snapshot only looks like a gap: the error is on the safe side, and
// heldGapsSql tells the cases apart.
function firstGaps(t: string, policy: ParkedPolicy, possible: string): string {
  return `SELECT a.aggregateid, (SELECT seq FROM ${t}
      WHERE aggregateid = a.aggregateid AND sent_at IS NULL AND skipped_at IS NULL AND seq < a.max_seq${policy === 'skip' ? ' AND parked_at IS NULL' : ''}
        AND seq <> ALL (a.seqs)
      ORDER BY seq LIMIT 1) AS first_gap
    FROM aggs a WHERE ${possible}`;
}

// reads only rows that failed (the partial index on attempts > 0): normally none
export function blockedAggregates(t: string, policy: ParkedPolicy): string {
  return `
  SELECT aggregateid, min(seq) AS first_blocked
  FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0
    AND (${blockingRows(policy)})
  GROUP BY aggregateid
`;
}

export function blockingRows(policy: ParkedPolicy, alias?: string): string {
  const c = alias ? `${alias}.` : '';
  return `${policy === 'hold' ? `${c}parked_at IS NOT NULL OR ` : ''}${c}next_attempt_at > now()`;
}

// A fresh snapshot (docs/order-guard.md, "Rows held back: the second statement"). 'locked' is a transaction that is not a relay's (relays
// hold the aggregate's lock, and we hold that), such as an application's SELECT ... FOR UPDATE: the
// caller leaves such aggregates out for the invocation, so a claim is never repeated behind a row
// it cannot take. Gap rows we can lock stay locked by us, so no one takes them out of order meanwhile.
export function heldGapsSql(t: string, lanes?: string): string {
  return `
WITH lockable AS (
  SELECT seq FROM ${t}
  WHERE seq = ANY ($1::bigint[])
  FOR UPDATE SKIP LOCKED
)
SELECT o.seq,
       CASE WHEN NOT EXISTS (SELECT 1 FROM lockable l WHERE l.seq = o.seq) THEN 'locked'${
         lanes ? `\n            WHEN o.seq IN (${inFlightSql(lanes)}) THEN 'in-flight'` : ''}
            WHEN o.waiting THEN 'waiting'
            WHEN o.parked_at IS NOT NULL THEN 'parked'
            WHEN o.next_attempt_at > now() THEN 'not-due'
       END AS why
FROM ${t} o
WHERE o.seq = ANY ($1::bigint[])
  AND o.sent_at IS NULL AND o.skipped_at IS NULL`;
}

/**
 * Exactly-once delivery: rows of a lane's batch whose Kafka transaction may have committed, until
 * the lane settles them (outbox/lanes.ts). No claim takes them, so none is sent twice.
 */
function inFlightSql(lanes: string): string {
  return `SELECT unnest(in_flight) AS seq FROM ${lanes} WHERE in_flight IS NOT NULL`;
}

export function payloadsSql(t: string): string {
  return `
SELECT seq, payload::text AS payload FROM ${t}
WHERE seq = ANY ($1::bigint[])`;
}
