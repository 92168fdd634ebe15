// services: postgres
// The claim's plan on the table it meets under full load: a heap of many pages that holds little
// but pending rows, once autovacuum has counted them. Postgres' cost model then prices the ordered
// walk of the claim index as a read of the whole heap, and reads every pending row through the
// aggregate index and sorts them instead, on every claim. The batch transaction's planner settings
// (BATCH_PLANNER_SETTINGS) must keep the claim on the claim index.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { parseTableName, qualified, sentTable } from '../../src/outbox/identifier.ts';
import { migrate } from '../../src/outbox/migrate.ts';
import { moveSentSql } from '../../src/outbox/sql.ts';
import { OutboxStore } from '../../src/outbox/store.ts';
import { BATCH_PLANNER_SETTINGS } from '../../src/outbox/tx-settings.ts';
import { fileDb, uniqueName } from './helpers.ts';

/** a claim with nothing left out: the usual shape */
const NO_FILTER = { aggregates: [], inFlight: [], topics: [], topicTemplate: '' };

const sql = fileDb();

interface PlanNode {
  'Node Type': string;
  'Index Name'?: string;
  'Subplan Name'?: string;
  'Index Cond'?: string;
  'Actual Rows'?: number;
  'Actual Loops'?: number;
  'Rows Removed by Filter'?: number;
  Plans?: PlanNode[];
}

function nodes(n: PlanNode): PlanNode[] {
  return [n, ...(n.Plans ?? []).flatMap(nodes)];
}

describe('claim plan', () => {
  it('a heap of sent-and-gone rows with 1,500 pending: the claim walks the claim index in seq order, sorts no row (only the byte cut sorts (seq, size) pairs), and returns the oldest 500', async () => {
    const table = uniqueName('plan');
    const name = parseTableName(table);
    await migrate(sql, name);
    const t = qualified(name);
    const TOTAL = 20_000;
    const PENDING = 1_500;
    // ~1 KB rows, as the bench's: the heap grows to ~2,900 pages
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'order', 'o-' || (g % 100), 'Planned', jsonb_build_object('n', g, 'pad', repeat('x', 960))
       FROM generate_series(1, $1::int) g ORDER BY g`,
      [TOTAL],
    );
    // all but the last PENDING sent, through the relay's own move, then counted by a vacuum as autovacuum would
    const sent = await sql.unsafe<{ seq: string }[]>(`SELECT seq FROM ${t} ORDER BY seq LIMIT $1`, [TOTAL - PENDING]);
    for (let i = 0; i < sent.length; i += 2_000) {
      await sql.unsafe(moveSentSql(t, qualified(sentTable(name)), 'seq'), [sent.slice(i, i + 2_000).map((r) => r.seq)]);
    }
    await sql.unsafe(`VACUUM ANALYZE ${t}`);

    const store = new OutboxStore(sql, name, 'hold');
    const claim = store.claimStatement(500, NO_FILTER);
    const plan = async (settings: ReadonlyArray<readonly [string, string]>): Promise<PlanNode[]> =>
      sql.begin(async (tx) => {
        for (const [k, v] of settings) await tx`SELECT set_config(${k}, ${v}, true)`;
        const [row] = await tx.unsafe<Array<{ 'QUERY PLAN': Array<{ Plan: PlanNode }> }>>(`EXPLAIN (FORMAT JSON) ${claim.text}`, claim.params as never[]);
        return nodes(row!['QUERY PLAN'][0]!.Plan);
      });
    const claimIndex = `${table}_claim_idx`;
    const cand = (all: PlanNode[]) => nodes(all.find((n) => n['Subplan Name'] === 'CTE cand')!);

    // why the setting exists: left to itself, the planner sorts here (if a Postgres release stops
    // doing so, this line says so, and the setting may go)
    const unguided = await plan([['plan_cache_mode', 'force_custom_plan']]);
    assert.ok(
      cand(unguided).some((n) => n['Node Type'] === 'Sort'),
      `expected the planner alone to sort the pending rows on this table; its claim plan: ${cand(unguided).map((n) => `${n['Node Type']}${n['Index Name'] ? ` on ${n['Index Name']}` : ''}`).join(' > ')}`,
    );

    const guided = await plan(BATCH_PLANNER_SETTINGS);
    const shape = cand(guided).map((n) => `${n['Node Type']}${n['Index Name'] ? ` on ${n['Index Name']}` : ''}`);
    // the one sort is the byte cut's, of (seq, size) pairs (sql.ts batchBytesCut), never the rows
    const cutNodes = new Set(nodes(guided.find((n) => n['Subplan Name'] === 'CTE cut')!));
    assert.ok(!guided.some((n) => n['Node Type'].endsWith('Sort') && !cutNodes.has(n)), `the claim sorts: ${shape.join(' > ')}`);
    assert.ok(
      cand(guided).some((n) => n['Node Type'] === 'Index Scan' && n['Index Name'] === claimIndex),
      `the claim does not walk ${claimIndex}: ${shape.join(' > ')}`,
    );

    // and the store's own transaction (its settings included) claims the oldest pending rows, in order
    const tx = await store.begin(new Deadline(Date.now() + 20_000));
    const rows = await tx.claim(500);
    await tx.rollback();
    const [first] = await sql.unsafe<{ seq: string }[]>(`SELECT min(seq)::text AS seq FROM ${t}`);
    assert.deepEqual(
      rows.map((r) => Number(r.seq)),
      Array.from({ length: 500 }, (_, i) => Number(first!.seq) + i),
    );
    assert.ok(rows.every((r) => r.publishable));
  });

  it('1,000 aggregates backing off, their later rows waiting: the claim passes over the backing-off rows inside the claim index, probes the waiting index once per claimed aggregate, runs no per-aggregate gap probe, and claims the clean rows in order', async () => {
    const table = uniqueName('planbackoff');
    const name = parseTableName(table);
    await migrate(sql, name);
    const t = qualified(name);
    const STUCK = 1_000;
    // older than every clean row, as the bench's: a claim in seq order meets every failed row first
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload, attempts, next_attempt_at, last_error)
       SELECT 'order', 'stuck-' || (g % $1::int), 'Failed', '{}', 1, now() + interval '1 hour', 'the test says so'
       FROM generate_series(0, 2 * $1::int - 1) g ORDER BY g`,
      [STUCK],
    );
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'order', 'stuck-' || (g % $1::int), 'Waiting', '{}' FROM generate_series(0, 10 * $1::int - 1) g ORDER BY g`,
      [STUCK],
    );
    const store = new OutboxStore(sql, name, 'hold');
    // a plan-shape test, not a speed test: a deadline no slow machine reaches (a fresh-clone CI run
    // on a machine 35 % slower than usual missed 20 s marking the 10,000 rows)
    const deadline = new Deadline(Date.now() + 300_000);
    // the later rows are marked; the second failed row of each aggregate is not (a failed row is
    // never marked: the claim's blocked filter leaves it out, and once due it must be claimable)
    assert.equal(await store.markWaiting(deadline), 10 * STUCK);
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'order', 'o-' || (g % 100), 'Clean', jsonb_build_object('n', g) FROM generate_series(1, 600) g ORDER BY g`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${t}`);

    const claimIndex = `${table}_claim_idx`;
    const all = await sql.begin(async (tx) => {
      for (const [k, v] of BATCH_PLANNER_SETTINGS) await tx`SELECT set_config(${k}, ${v}, true)`;
      const claim = store.claimStatement(500, NO_FILTER);
      const [row] = await tx.unsafe<Array<{ 'QUERY PLAN': Array<{ Plan: PlanNode }> }>>(`EXPLAIN (ANALYZE, FORMAT JSON) ${claim.text}`, claim.params as never[]);
      return nodes(row!['QUERY PLAN'][0]!.Plan);
    });
    const subtree = (label: string) => nodes(all.find((n) => n['Subplan Name'] === label)!);
    const shape = (list: PlanNode[]) => list.map((n) => `${n['Node Type']}${n['Index Name'] ? ` on ${n['Index Name']}` : ''}`).join(' > ');

    // the claim's scan: the failed rows are not due, and that is decided on the index entry
    const scan = subtree('CTE cand').find((n) => n['Index Name'] === claimIndex);
    assert.ok(scan, `the claim does not walk ${claimIndex}: ${shape(subtree('CTE cand'))}`);
    assert.match(scan['Index Cond'] ?? '', /next_attempt_at <= now\(\)/, 'the claim tests next_attempt_at outside the index');
    assert.equal(scan['Actual Rows'], 500);
    assert.equal(scan['Rows Removed by Filter'] ?? 0, 0, `the claim read ${scan['Rows Removed by Filter']} rows from the heap to leave them out`);

    // the quick gap check: no failed row is a possible gap (each blocks its own aggregate, whose
    // rows the claim leaves out above it), so the per-aggregate probes never run
    const probes = subtree('CTE gap').filter((n) => n['Index Name'] === `${table}_aggregate_idx`);
    assert.ok(probes.length > 0, `no gap probe in the plan: ${shape(subtree('CTE gap'))}`);
    assert.ok(
      probes.every((n) => (n['Actual Loops'] ?? 0) === 0),
      `the claim probed ${Math.max(...probes.map((n) => n['Actual Loops'] ?? 0))} aggregates for gaps`,
    );

    // the waiting rows' index: read once for its first entry (does any row wait?), then probed
    // once per claimed aggregate (100 clean ones), for a stale mark below its rows: marks are not
    // trusted to be cleared on time, so while any row waits, every claimed aggregate is looked at
    const waitingReads = subtree('CTE gap').filter((n) => n['Index Name'] === `${table}_waiting_idx`);
    assert.equal(waitingReads.length, 2, `the quick check's reads of the waiting index: ${shape(subtree('CTE gap'))}`);
    assert.deepEqual(
      waitingReads.map((n) => n['Actual Loops']),
      [1, 100],
      'the waiting index: its first entry, then one probe per claimed aggregate',
    );

    // and the store's own transaction claims the oldest 500 clean rows, in order, all publishable
    const tx = await store.begin(deadline);
    const rows = await tx.claim(500);
    await tx.rollback();
    const [first] = await sql.unsafe<{ seq: string }[]>(`SELECT min(seq)::text AS seq FROM ${t} WHERE type = 'Clean'`);
    assert.deepEqual(
      rows.map((r) => Number(r.seq)),
      Array.from({ length: 500 }, (_, i) => Number(first!.seq) + i),
    );
    assert.ok(rows.every((r) => r.publishable));
  });

  it('G4: a row set not due by hand, that never failed, still holds back its aggregate\'s later rows', async () => {
    const table = uniqueName('plandue');
    const name = parseTableName(table);
    await migrate(sql, name);
    const t = qualified(name);
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'order', 'o-' || (g % 10), 'Placed', jsonb_build_object('n', g) FROM generate_series(1, 50) g ORDER BY g`,
    );
    // attempts stays 0: nothing failed, so the aggregate is not blocked; only the gap check can hold o-3 back
    const [held] = await sql.unsafe<{ seq: string }[]>(
      `UPDATE ${t} SET next_attempt_at = now() + interval '1 hour'
       WHERE seq = (SELECT min(seq) FROM ${t} WHERE aggregateid = 'o-3') RETURNING seq::text`,
    );
    await sql.unsafe(`VACUUM ANALYZE ${t}`);
    const store = new OutboxStore(sql, name, 'hold');
    const tx = await store.begin(new Deadline(Date.now() + 20_000));
    const rows = await tx.claim(500);
    await tx.rollback();
    assert.equal(rows.length, 49, 'every row but the one not due is claimed');
    const o3 = rows.filter((r) => r.aggregateid === 'o-3');
    assert.equal(o3.length, 4);
    assert.ok(o3.every((r) => !r.publishable), `o-3's rows after seq ${held!.seq} were publishable ahead of it`);
    assert.ok(rows.filter((r) => r.aggregateid !== 'o-3').every((r) => r.publishable));
  });
});
