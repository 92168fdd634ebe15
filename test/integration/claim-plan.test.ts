// The claim's plan on the table it meets under full load: a heap of many pages that holds little
// but pending rows, once autovacuum has counted them. Postgres' cost model then prices the ordered
// walk of the claim index as a read of the whole heap, and reads every pending row through the
// aggregate index and sorts them instead, on every claim. The batch transaction's planner settings
// (BATCH_PLANNER_SETTINGS) must keep the claim on the claim index.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { Deadline } from '../../src/budget.ts';
import { parseTableName, qualified, sentTable } from '../../src/outbox/identifier.ts';
import { migrate } from '../../src/outbox/migrate.ts';
import { moveSentSql } from '../../src/outbox/sql.ts';
import { BATCH_PLANNER_SETTINGS, OutboxStore } from '../../src/outbox/store.ts';
import { db, uniqueName } from './helpers.ts';

let sql: Sql;
before(() => {
  sql = db();
});
after(async () => {
  await sql.end();
});

interface PlanNode {
  'Node Type': string;
  'Index Name'?: string;
  'Subplan Name'?: string;
  Plans?: PlanNode[];
}

function nodes(n: PlanNode): PlanNode[] {
  return [n, ...(n.Plans ?? []).flatMap(nodes)];
}

describe('claim plan', () => {
  it('a heap of sent-and-gone rows with 1,500 pending: the claim walks the claim index in seq order, sorts nothing, and returns the oldest 500', async () => {
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
      await sql.unsafe(moveSentSql(t, qualified(sentTable(name))), [sent.slice(i, i + 2_000).map((r) => r.seq)]);
    }
    await sql.unsafe(`VACUUM ANALYZE ${t}`);

    const store = new OutboxStore(sql, name, 'hold');
    const params = [500, t, [], [], '', []];
    const plan = async (settings: ReadonlyArray<readonly [string, string]>): Promise<PlanNode[]> =>
      sql.begin(async (tx) => {
        for (const [k, v] of settings) await tx`SELECT set_config(${k}, ${v}, true)`;
        const [row] = await tx.unsafe<Array<{ 'QUERY PLAN': Array<{ Plan: PlanNode }> }>>(`EXPLAIN (FORMAT JSON) ${store.claimText}`, params);
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
    assert.ok(!guided.some((n) => n['Node Type'] === 'Sort'), `the claim sorts: ${shape.join(' > ')}`);
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
});
