// Every statement the relay runs against the outbox table, kept whole so it can be read and
// EXPLAINed. `{t}` is the validated, quoted table name (see identifier.ts); values are always
// bound parameters.
import type { ParkedPolicy } from '../domain.ts';
import type { ClaimFilter, PruneTarget } from '../loop/ports.ts';

/** A statement and its bound parameters, built together so they cannot disagree. */
export interface Statement {
  text: string;
  params: unknown[];
}

/** Numbers the parameters of a statement in the order its fragments ask for them. */
class Params {
  readonly list: unknown[] = [];
  add(value: unknown): string {
    this.list.push(value);
    return `$${this.list.length}`;
  }
}

/** The claim's bounds in bytes (OutboxStore's options; docs/order-guard.md, "Batches bounded in bytes"). */
export interface ClaimBytes {
  /** OUTBOX_MAX_BATCH_BYTES: the most payload bytes one claim takes (its first row, whatever its size) */
  batch: number;
  /**
   * a larger payload is left out (NULL, its size in payload_bytes): read afterwards if its topic
   * takes a message that large, else the row is parked from its size, its payload never read
   */
  payload: number;
}

/**
 * The claim: up to `limit` pending, due rows in seq order, and at most `bytes.batch` bytes of
 * payload, locked, each with whether the order guard lets it be published now (G4), in one
 * statement (one round trip). docs/order-guard.md explains it fragment by fragment; each fragment
 * below says why it exists. A fragment that serves a feature is in the statement only while that
 * feature is on (aggregates left out, topics backed off), so the usual claim is the short one;
 * each shape is its own prepared statement. `lockSeed` seeds the aggregates' advisory-lock keys
 * (the table's name).
 */
export function claimStatement(t: string, policy: ParkedPolicy, limit: number, filter: ClaimFilter, lockSeed: string, bytes: ClaimBytes): Statement {
  const p = new Params();
  const claim = { limit: p.add(limit), seed: p.add(lockSeed), inFlight: p.add(filter.inFlight) };
  const size = { batch: p.add(bytes.batch), payload: p.add(bytes.payload) };
  const leftOut = filter.aggregates.length > 0 ? p.add(filter.aggregates) : undefined;
  const topics = filter.topics.length > 0 ? { template: p.add(filter.topicTemplate), list: p.add(filter.topics) } : undefined;
  const ctes = [
    `blocked AS MATERIALIZED (${blockedAggregates(t, policy)})`,
    topics ? `held AS MATERIALIZED (${firstRowsForTopics(t, topics)})` : undefined,
    `cand AS MATERIALIZED (${candidates(t, claim, leftOut, topics !== undefined)})`,
    `cut AS MATERIALIZED (${batchBytesCut(size.batch)})`,
    'taken AS NOT MATERIALIZED (SELECT * FROM cand WHERE seq <= (SELECT last_seq FROM cut))',
    'aggs AS (SELECT aggregateid, max(seq) AS max_seq, array_agg(seq) AS seqs FROM taken GROUP BY aggregateid)',
    `quick AS MATERIALIZED (SELECT ${anyGapPossible(t, claim.inFlight)} OR ${staleMarkBelow(t)} AS maybe)`,
    `gap AS MATERIALIZED (${firstGaps(t, policy)})`,
  ].filter((c) => c !== undefined);
  // no ORDER BY: OutboxStore.claim puts the rows in seq order (a sort of the wide rows costs the
  // database more than it costs the caller). A payload is rendered here, for the rows taken only,
  // and only up to bytes.payload (see ClaimBytes).
  const text = `WITH ${ctes.join(',\n')}
SELECT c.seq, c.id, c.aggregatetype, c.aggregateid, c.type, CASE WHEN c.payload_bytes <= ${size.payload} THEN c.payload::text END AS payload, c.payload_bytes,
  c.topic, c.headers, c.attempts, g.first_gap, (g.first_gap IS NULL OR c.seq < g.first_gap) AS publishable
FROM taken c LEFT JOIN gap g ON g.aggregateid = c.aggregateid`;
  return { text, params: p.list };
}

/**
 * The last candidate the batch takes: candidates are taken in seq order while their payloads add
 * up to at most `batchBytes` (each row's size is stored with it: payload_bytes, migration 004), and
 * the first one whatever its size, so a batch never stalls behind a large row; a row too large for
 * any message is taken too, and parked from its size. The rows taken are a prefix of the
 * candidates in seq order, so an aggregate's rows taken stay a prefix of its pending rows (G4);
 * the candidates past the cut stay locked until the batch ends and go to a later batch. The window
 * sorts only (seq, size) pairs, at most the batch size of them.
 */
function batchBytesCut(batchBytes: string): string {
  return `SELECT coalesce(max(seq) FILTER (WHERE running <= ${batchBytes}::bigint), min(seq)) AS last_seq
  FROM (SELECT seq, sum(coalesce(payload_bytes, 0)) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) AS running FROM cand) s`;
}

/** the conditions of a pending row: not sent, skipped, parked or marked waiting (the claim index's predicate) */
function pending(alias: string): string {
  return `${alias}.sent_at IS NULL AND ${alias}.skipped_at IS NULL AND ${alias}.parked_at IS NULL AND NOT ${alias}.waiting`;
}

/**
 * The first row per aggregate bound for a topic backed off in this invocation (the broker refused
 * the topic as a whole): that row and every later one of its aggregate are not claimed, whatever
 * their topic, so they neither fill batches nor jump ahead (G4).
 */
function firstRowsForTopics(t: string, $: { template: string; list: string }): string {
  // marked waiting or not: any pending row bound for the topic holds its aggregate's later rows
  return `SELECT aggregateid, min(seq) AS first_held FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL
    AND coalesce(nullif(topic, ''), replace(replace(${$.template}::text, '{aggregatetype}', aggregatetype), '{type}', type)) = ANY (${$.list}::text[])
  GROUP BY aggregateid`;
}

/**
 * The candidates, in seq order, locked (SKIP LOCKED: rows another invocation holds are passed
 * over). A row is taken only with its aggregate's transaction-scoped advisory lock, so concurrent
 * invocations claim disjoint aggregates instead of rows that wait behind each other's. Left out:
 * rows at or after their aggregate's first blocking row (`blocked`; NOT IN is a hashed lookup, a
 * NOT EXISTS was a nested loop over every blocked aggregate), aggregates the invocation left out,
 * rows behind a backed-off topic, and rows not due (tested on the claim index's entry). The CASE
 * tries the lock only for rows otherwise claimable, in whatever order the plan
 * tests the conditions. ORDER BY both keys of the claim index: the only path that yields seq
 * order without a sort (the batch's planner settings price sorts out). The payload is kept as
 * stored (a large one as a pointer to its TOAST data), not rendered: only the rows the byte cut
 * takes are.
 */
function candidates(t: string, $: { limit: string; seed: string }, leftOut: string | undefined, topics: boolean): string {
  return `SELECT r.seq, r.id, r.aggregatetype, r.aggregateid, r.type, r.payload, r.payload_bytes, r.topic, r.headers, r.attempts
  FROM ${t} r
  WHERE ${pending('r')}
    AND (r.aggregateid NOT IN (SELECT aggregateid FROM blocked) OR r.seq < (SELECT b.first_blocked FROM blocked b WHERE b.aggregateid = r.aggregateid))${
      topics ? '\n    AND NOT EXISTS (SELECT 1 FROM held h WHERE h.aggregateid = r.aggregateid AND h.first_held <= r.seq)' : ''}${
      leftOut ? `\n    AND r.aggregateid <> ALL (${leftOut}::text[])` : ''}
    AND r.next_attempt_at <= now()
    AND CASE WHEN r.next_attempt_at <= now() THEN pg_try_advisory_xact_lock(hashtextextended(r.aggregateid, hashtext(${$.seed}))) ELSE false END
  ORDER BY r.seq, r.next_attempt_at
  LIMIT ${$.limit}
  FOR UPDATE OF r SKIP LOCKED`;
}

/**
 * Can any claimed row have a gap at all? Only if some pending row below the highest claimed seq
 * is neither claimed nor in the invocation's batch in flight (`inFlight`: other aggregates, whose
 * locks that batch's open transaction holds). One range scan of the claim index, in its order; a
 * single relay's steady state finds none and skips the per-aggregate probes. A row that backs off
 * is no gap (it blocks its aggregate: no claimed row is above it); a row set not due by hand
 * (never failed) blocks nothing and stays a possible gap.
 */
function anyGapPossible(t: string, inFlight: string): string {
  return `(SELECT true FROM ${t} o
    WHERE ${pending('o')}
      AND o.seq < (SELECT max(seq) FROM taken) AND o.seq NOT IN (SELECT seq FROM taken) AND o.seq NOT IN (SELECT unnest(${inFlight}::bigint[]))
      AND (o.next_attempt_at <= now() OR o.attempts = 0)
    ORDER BY o.seq, o.next_attempt_at LIMIT 1) IS NOT NULL`;
}

/**
 * A waiting row below a claimed row of its aggregate is a gap too: its mark is stale (a mark is
 * only justified by a blocking row below it, and no claimed row is above one). Marks are never
 * trusted to be cleared on time (two removals at once, triggers disabled), so while any row waits,
 * each claimed aggregate gets one probe of the waiting index (LATERAL ... LIMIT 1; a semi-join was
 * planned as a hash of every waiting row). The CASE reads the waiting index's first entry first:
 * no row waits, no probe.
 */
function staleMarkBelow(t: string): string {
  return `CASE WHEN (SELECT true FROM ${t} w WHERE w.waiting AND w.sent_at IS NULL AND w.skipped_at IS NULL ORDER BY w.aggregateid, w.seq LIMIT 1)
    THEN EXISTS (SELECT 1 FROM aggs a CROSS JOIN LATERAL (SELECT 1 FROM ${t} w
      WHERE w.aggregateid = a.aggregateid AND w.waiting AND w.sent_at IS NULL AND w.skipped_at IS NULL AND w.seq < a.max_seq LIMIT 1) probe)
    ELSE false END`;
}

/**
 * Per claimed aggregate, its first gap: the first unsent row below our highest seq that is not
 * ours (held by a transaction that is not a relay's, skipped while another invocation held the
 * aggregate, committed late, or between two of our rows). One index range scan each, only when
 * `quick` says a gap is possible; our rows above the gap wait. The statement's snapshot may
 * predate a mark another invocation committed meanwhile: such a row only looks like a gap (the
 * error is on the safe side), and heldGapsSql tells the cases apart. Under `skip`, parked rows
 * are no gap. OFFSET 0: not flattened, each probe runs once.
 */
function firstGaps(t: string, policy: ParkedPolicy): string {
  return `SELECT aggregateid, first_gap FROM (
    SELECT a.aggregateid, (SELECT o.seq FROM ${t} o
      WHERE o.aggregateid = a.aggregateid AND o.sent_at IS NULL AND o.skipped_at IS NULL AND o.seq < a.max_seq${policy === 'skip' ? ' AND o.parked_at IS NULL' : ''}
        AND o.seq <> ALL (a.seqs)
      ORDER BY o.seq LIMIT 1) AS first_gap
    FROM aggs a WHERE (SELECT maybe FROM quick) OFFSET 0) probed
  WHERE first_gap IS NOT NULL`;
}

/**
 * For held-back rows, with a fresh snapshot (a separate statement): why can the rows they wait for
 * ($1) not be claimed now? One row per gap row that still exists unsent, with `why`:
 * - `locked`: a transaction that is not a relay's holds it (relays hold the aggregate's lock, and
 *   we hold that), such as an application's SELECT ... FOR UPDATE: it may stay held for long;
 * - `not-due`, `parked`: it is not claimable now (set so by hand: a row that fails blocks its
 *   aggregate and is never a gap);
 * - `waiting`: its mark is stale (see staleMarkBelow);
 * - NULL: it can be claimed now; the next claim starts with it.
 * A gap row that is gone (sent or deleted after the claim's snapshot) is not listed: the next
 * claim does not see it. The caller leaves out the aggregates of the first three for the rest of
 * the invocation, so a claim is never repeated behind a row it cannot take (a tight loop of
 * claim, hold back, roll back); a stale mark is cleared first (unwaitSql), once. Gap rows we can
 * lock stay locked by us, so no one else takes them out of order meanwhile.
 */
export function heldGapsSql(t: string): string {
  return `
WITH lockable AS (
  SELECT seq FROM ${t}
  WHERE seq = ANY ($1::bigint[])
  FOR UPDATE SKIP LOCKED
)
SELECT o.seq,
       CASE WHEN NOT EXISTS (SELECT 1 FROM lockable l WHERE l.seq = o.seq) THEN 'locked'
            WHEN o.waiting THEN 'waiting'
            WHEN o.parked_at IS NOT NULL THEN 'parked'
            WHEN o.next_attempt_at > now() THEN 'not-due'
       END AS why
FROM ${t} o
WHERE o.seq = ANY ($1::bigint[])
  AND o.sent_at IS NULL AND o.skipped_at IS NULL`;
}

/**
 * The payloads the claim left out ($1: their seqs) of rows whose topic takes a message that large
 * (ClaimBytes.payload; its limit is known only once the batch's topics were asked): rows of the
 * batch, locked by its transaction.
 */
export function payloadsSql(t: string): string {
  return `
SELECT seq, payload::text AS payload FROM ${t}
WHERE seq = ANY ($1::bigint[])`;
}

/**
 * After a claim came back empty, why? `claimable`: some pending row is due and not behind a
 * failed row of its aggregate, so only locks kept us from it (other invocations hold it, or it was
 * committed just now). Else `pending`: unsent rows exist, all backing off or waiting behind a
 * backing-off (or, under the hold policy, parked) row. Neither: nothing is left to send.
 */
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

/**
 * Linger mode's probe (behind a pooler): the newest pending row. A backward scan of the claim's
 * partial index that stops at its first entry: one index page, however long the backlog.
 */
export function newestPendingSql(t: string): string {
  return `
SELECT max(seq)::text AS newest FROM ${t}
WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting`;
}

/**
 * Per aggregate, its first blocking row (blockingRows), for the why-empty check; the claim and the
 * waiting marks read the same rows. Only rows that failed at least once are read (partial index
 * on attempts > 0): normally none.
 */
function blockedAggregates(t: string, policy: ParkedPolicy): string {
  return `
  SELECT aggregateid, min(seq) AS first_blocked
  FROM ${t}
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0
    AND (${blockingRows(policy)})
  GROUP BY aggregateid
`;
}

/** The failed rows that hold their aggregate's later rows back: backing off, and parked under `hold`. */
function blockingRows(policy: ParkedPolicy, alias?: string): string {
  const c = alias ? `${alias}.` : '';
  return `${policy === 'hold' ? `${c}parked_at IS NOT NULL OR ` : ''}${c}next_attempt_at > now()`;
}

/**
 * OUTBOX_SENT_ROWS=keep (the default): acked rows move, whole, from the outbox `t` to its sent
 * table `sent` (the sent table), in the batch transaction, stamped with sent_at. One statement: the
 * DELETE's RETURNING feeds the INSERT. A rollback (a crash, a failed COMMIT, the premark's
 * savepoint) undoes both halves, so a row is either unsent in the outbox or sent in `sent`.
 */
export function moveSentSql(t: string, sent: string): string {
  return `
WITH moved AS (
  DELETE FROM ${t}
  WHERE seq = ANY($1::bigint[]) AND sent_at IS NULL
  RETURNING id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, attempts, retried_at, retried_by, retried_reason, retried_operator
)
INSERT INTO ${sent} (id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, sent_at, attempts, retried_at, retried_by, retried_reason, retried_operator)
SELECT id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, now(), attempts, retried_at, retried_by, retried_reason, retried_operator
FROM moved`;
}

/**
 * The columns the relay's own statements use, by privilege: a role granted columns rather than
 * tables needs exactly these (schemaCheckSql). SELECT: what claims, marks, the order guard and the
 * move read; UPDATE: what recordFailuresSql and the waiting marks write; INSERT: what moveSentSql
 * writes into the sent table.
 */
export const RELAY_COLUMNS = {
  outboxSelect: ['id', 'aggregatetype', 'aggregateid', 'type', 'payload', 'topic', 'headers', 'seq', 'created_at', 'sent_at', 'attempts', 'next_attempt_at', 'parked_at', 'skipped_at', 'waiting', 'retried_at', 'retried_by', 'retried_reason', 'retried_operator', 'payload_bytes'],
  outboxUpdate: ['attempts', 'last_error', 'next_attempt_at', 'parked_at', 'waiting'],
  sentInsert: ['id', 'aggregatetype', 'aggregateid', 'type', 'payload', 'topic', 'headers', 'seq', 'created_at', 'sent_at', 'attempts', 'retried_at', 'retried_by', 'retried_reason', 'retried_operator'],
} as const;

/**
 * What the relay needs of the database, in one round trip (OutboxStore.checkTables; read by
 * src/outbox/schema-check.ts): the outbox $1 and its sent table $2 (quoted names), whether they
 * exist and what this role may do with them, and the migrations `migrate` recorded for the outbox.
 * Nothing in it fails for a missing or forbidden object, it answers NULL instead:
 * - to_regclass answers NULL for a missing table, but fails for a schema the role may not use:
 *   asked only once USAGE on the outbox's schema is known (an unqualified name goes through the
 *   search_path, which skips such schemas by itself);
 * - privileges: has_any_column_privilege (a grant on the table, or on some of its columns), and
 *   then, for a role granted columns, the columns the relay uses that it lacks (RELAY_COLUMNS;
 *   columns a missing migration would add are the migration's problem); NULL for a missing table;
 * - the migrations table can only be named in the statement if it exists and may be read, which
 *   is known only as this statement runs: query_to_xml runs its SELECT, only in that case (CASE),
 *   and its XML is read with a regular expression (xpath needs a server built with libxml).
 * `target` is the outbox's name as migrate() records it (displayName: the identifiers, unquoted).
 */
export function schemaCheckSql(): string {
  const lacking = (rel: string, columns: readonly string[], privilege: string) => `
       CASE WHEN ${rel} IS NOT NULL THEN to_json(ARRAY(
         SELECT a.attname::text FROM pg_attribute a
         WHERE a.attrelid = ${rel} AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attname = ANY (ARRAY[${columns.map((c) => `'${c}'`).join(', ')}]::name[])
           AND NOT has_column_privilege(${rel}, a.attnum, '${privilege}')
         ORDER BY a.attnum)) END`;
  return `
WITH name AS (
  SELECT CASE WHEN cardinality(parse_ident($1)) = 2 THEN (parse_ident($1))[1] END AS schema,
         array_to_string(parse_ident($1), '.') AS target
),
usable AS (
  SELECT n.schema, n.target,
         CASE WHEN n.schema IS NULL THEN true
              ELSE has_schema_privilege((SELECT oid FROM pg_namespace WHERE nspname = n.schema), 'USAGE') END AS schema_usage
  FROM name n
),
-- materialized: inlined, the column checks' lookup by r.outbox ran to_regclass where USAGE is lacking
rel AS MATERIALIZED (
  SELECT u.*,
         CASE WHEN u.schema_usage THEN to_regclass($1) END AS outbox,
         CASE WHEN u.schema_usage THEN to_regclass($2) END AS sent,
         to_regclass('outbox_relay_migrations') AS migrations
  FROM usable u
)
SELECT current_user AS role, quote_ident(current_user) AS role_ident,
       quote_ident(r.schema) AS schema_ident, r.schema_usage,
       r.outbox IS NOT NULL AS outbox_present,
       has_any_column_privilege(r.outbox, 'SELECT') AS outbox_select,
       has_any_column_privilege(r.outbox, 'UPDATE') AS outbox_update,
       has_table_privilege(r.outbox, 'DELETE') AS outbox_delete,
       r.sent IS NOT NULL AS sent_present,
       has_any_column_privilege(r.sent, 'INSERT') AS sent_insert,
       has_any_column_privilege(r.sent, 'SELECT') AS sent_select,
       has_table_privilege(r.sent, 'DELETE') AS sent_delete,
       -- json: the relay's client parses no array type (src/outbox/client.ts)${lacking('r.outbox', RELAY_COLUMNS.outboxSelect, 'SELECT')} AS outbox_select_lacking,${lacking('r.outbox', RELAY_COLUMNS.outboxUpdate, 'UPDATE')} AS outbox_update_lacking,${lacking('r.sent', RELAY_COLUMNS.sentInsert, 'INSERT')} AS sent_insert_lacking,
       r.migrations::text AS migrations_table,
       has_table_privilege(r.migrations, 'SELECT') AS migrations_readable,
       -- json: the relay's client parses no array type (src/outbox/client.ts)
       CASE WHEN has_table_privilege(r.migrations, 'SELECT') THEN to_json(ARRAY(
         SELECT v[1]::int FROM regexp_matches(
           query_to_xml(format('SELECT version FROM %s WHERE target = %L ORDER BY version', r.migrations, r.target), false, false, '')::text,
           '<version>(\\d+)</version>', 'g') AS v
       )) END AS versions
FROM rel r`;
}

/**
 * OUTBOX_SENT_ROWS=delete: acked rows are deleted in the batch transaction instead of marked.
 * About five times cheaper than the UPDATE (no new 1 KB row version, no index insertions), for
 * teams that need no record of sent events in the table (Debezium's own advice for outboxes).
 */
export function deleteSentSql(t: string): string {
  return `
DELETE FROM ${t}
WHERE seq = ANY($1::bigint[]) AND sent_at IS NULL`;
}

/** One attempt failed for each listed row: record why, when to try again, or park it. */
export function recordFailuresSql(t: string): string {
  return `
UPDATE ${t} AS r
SET attempts = r.attempts + 1,
    last_error = f.error,
    next_attempt_at = now() + f.delay_ms * interval '1 millisecond',
    parked_at = CASE WHEN f.park = 1 THEN now() END
-- park travels as 0/1: postgres.js mis-types a JS boolean[] parameter (sends it as boolean)
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::int[]) AS f(seq, error, delay_ms, park)
WHERE r.seq = f.seq`;
}

/**
 * Retention, one chunk: delete up to $2 rows sent (or skipped) more than $1 ms ago, oldest first,
 * skipping rows someone else holds. Chunks keep each transaction short; the caller repeats them
 * until a chunk comes back short. Three places hold such rows:
 * - `sent`: the sent table, through its sent_at index;
 * - `legacy-sent`: rows that pre-release versions, before the sent table, marked sent in the outbox itself
 *   (its sent_at index is empty once they are gone: one probe per invocation);
 * - `skipped`: rows an operator skipped, kept in the outbox for audit (their own window, OUTBOX_RETAIN_SKIPPED_MS).
 * In the sent table rows are found by ctid: it has no key, and a TID scan needs none. No row
 * lock there (FOR UPDATE would need the UPDATE privilege on it): only retention touches its rows,
 * and of two retentions at once, the second waits for the first's chunk and finds its rows gone,
 * which ends its pass early; a TID scan visits rows in ctid order, so the two cannot deadlock.
 */
export function pruneSql(t: string, sent: string, what: PruneTarget): string {
  if (what === 'sent') {
    return `
DELETE FROM ${sent}
WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM ${sent}
  WHERE sent_at < now() - $1 * interval '1 millisecond'
  ORDER BY sent_at
  LIMIT $2
))`;
  }
  const column = what === 'skipped' ? 'skipped_at' : 'sent_at';
  return `
DELETE FROM ${t}
WHERE seq IN (
  SELECT seq FROM ${t}
  WHERE ${column} IS NOT NULL AND ${column} < now() - $1 * interval '1 millisecond'
  ORDER BY ${column}
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

/**
 * The backlog's three figures for the metrics and `status` (src/outbox/admin.ts `backlog`), cheap
 * however large the table: each reads one partial index, and at most $1 + 1 of its entries.
 * - oldest_pending_age_ms: the age of the pending row with the lowest seq, the first entry of the
 *   claim index (one index probe). This stands in for the oldest created_at among pending rows:
 *   seq follows insert order and created_at is the inserting transaction's start, so the two
 *   disagree only by how long writers' transactions overlapped (or when an application sets
 *   created_at itself). NULL when no row is pending.
 * - pending_rows: unsent, unskipped, unparked rows (backing-off ones included: the claim
 *   index's rows, and the waiting rows), counted up to $1 + 1.
 * The waiting rows are outside the claim index: the age also looks at the first
 * waiting row of each aggregate that has any (normally none), the count at the waiting index.
 * - parked_rows: parked rows, counted up to $1 + 1 through the retry index (a row is parked
 *   only by a failed attempt, so it has attempts > 0).
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

/**
 * `parked retry|skip`: the rows an operator named (`ids`: $1, by primary key), or every parked row
 * (`retry --all`), each with what decides whether the command may act on it (admin.ts, decide).
 * Locked FOR UPDATE when the command is to act (`lock`), so that nothing changes them between this
 * read and the UPDATE; a dry run reads them unlocked, in a read-only transaction.
 */
export function operatorLookupSql(t: string, rows: 'ids' | 'all-parked', lock: boolean): string {
  return `
SELECT id, aggregateid, parked_at, skipped_at, skipped_by, sent_at, attempts, next_attempt_at
FROM ${t}
WHERE ${rows === 'ids' ? 'id = ANY($1::uuid[])' : 'parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL'}
ORDER BY seq${lock ? '\nFOR UPDATE' : ''}`;
}

/** Who ran a command, and when (the time its transaction started, which the UPDATEs record). */
export const operatorSql = 'SELECT session_user::text AS by, now() AS at';

/**
 * Back to pending with a clean slate ($1: the ids decided on), recording who (the role, and the
 * operator $3), when and why ($2).
 * The conditions are the lookup's, restated so that the statement alone never puts back a row
 * that is not parked.
 */
export function parkedRetrySql(t: string): string {
  return `
UPDATE ${t}
SET parked_at = NULL, attempts = 0, next_attempt_at = '-infinity', last_error = NULL,
    retried_at = now(), retried_by = session_user, retried_reason = $2, retried_operator = $3
WHERE id = ANY($1::uuid[]) AND parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
RETURNING id, aggregateid`;
}

/** Never to be sent; kept for audit (OUTBOX_RETAIN_SKIPPED_MS) with who (role, operator $3), when and why ($2), and no longer holds its aggregate back. */
export function parkedSkipSql(t: string): string {
  return `
UPDATE ${t}
SET skipped_at = now(), skipped_by = session_user, skipped_reason = $2, skipped_operator = $3
WHERE id = ANY($1::uuid[]) AND parked_at IS NOT NULL AND sent_at IS NULL AND skipped_at IS NULL
RETURNING id, aggregateid`;
}

/**
 * The aggregates that have waiting rows, with each one's lowest waiting seq: a loose index scan
 * of the waiting index (one probe per aggregate, however many rows wait). For a WITH RECURSIVE.
 */
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
 * Mark `waiting` the pending rows that wait behind a blocking row of their aggregate (backing off,
 * or parked under the hold policy), so that claims no longer read them. $1: the
 * aggregates to look at (those whose rows just failed), or NULL for every blocked aggregate (once
 * per invocation, for rows written behind a blocking row since). Only rows after the aggregate's
 * last waiting row are looked at, so a second pass costs nothing: a row committed late below it
 * stays unmarked and is skipped by the claim as before. Rows someone holds are left for later.
 * At most $2 rows per statement: a long backlog is marked in short transactions.
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
 * Clear the marks of waiting rows that no longer wait: those below their aggregate's first
 * blocking row (all of them when it has none). $1: the aggregates to look at (those whose failed
 * rows were just sent, charged again, retried or skipped), or NULL for every aggregate with
 * waiting rows (once per invocation: marks behind a row that no longer blocks, such as one parked
 * under hold before a switch to skip; a failed row deleted or reset clears its marks itself,
 * the unwait trigger). Runs after the statements that changed the blocking rows, in the same
 * transaction. Rows locked by others are skipped: a mark is an optimisation, and one left stale is
 * cleared by the next pass (the claim treats it as a gap meanwhile, so order holds).
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

/** Does a row wait, is an aggregate blocked? One probe each of the waiting and retry indexes (OutboxStore.clearStaleMarks). */
export function waitingWorkSql(t: string, policy: ParkedPolicy): string {
  return `
SELECT (SELECT true FROM ${t}
        WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL
        ORDER BY aggregateid, seq LIMIT 1) IS NOT NULL AS waiting,
       EXISTS (SELECT 1 FROM ${t}
               WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0 AND (${blockingRows(policy)})) AS blocked`;
}
