// The claim + mark (move to the sent table) of one commit against another's, each with its own
// schema: 500-row batches over 20,000 pending ~1 KB rows, one table per side and round, the sides
// alternating, 5 rounds: events/s per round and the medians (docs/benchmarks/claim-columns.md).
//   node --import tsx bench/claim-columns.ts <a checkout of the commit before>
import postgres from 'postgres';
import { resolve } from 'node:path';
import * as after from '../src/outbox/sql.ts';
import { migrate as migrateAfter, dropOutbox as dropAfter } from '../src/outbox/migrate.ts';
import { parseTableName } from '../src/outbox/identifier.ts';

const beforeDir = resolve(process.argv[2] ?? '');
const before = (await import(`${beforeDir}/src/outbox/sql.ts`)) as typeof after;
const { migrate: migrateBefore, dropOutbox: dropBefore } = (await import(`${beforeDir}/src/outbox/migrate.ts`)) as typeof import('../src/outbox/migrate.ts');
const sql = postgres(process.env.DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox', { max: 1, onnotice: () => {} });
const EVENTS = 20_000, BATCH = 500, ROUNDS = 5;
const sides = [
  { name: 'before', q: before, migrate: migrateBefore, drop: dropBefore },
  { name: 'after', q: after, migrate: migrateAfter, drop: dropAfter },
] as const;
const rates: Record<string, number[]> = { before: [], after: [] };
for (let round = 0; round < ROUNDS; round++) {
  for (const s of round % 2 ? [...sides].reverse() : sides) {
    const name = `cb_${s.name}_${Date.now()}`;
    const t = parseTableName(name);
    await s.migrate(sql, t);
    await sql.unsafe(`INSERT INTO ${name} (aggregatetype, aggregateid, type, payload) SELECT 'order', 'a-' || (g % 1000), 'T', jsonb_build_object('n', g, 'pad', repeat('x', 960)) FROM generate_series(1, ${EVENTS}) g ORDER BY g`);
    await sql.unsafe(`VACUUM ANALYZE ${name}`);
    const filter = { aggregates: [], inFlight: [], topics: [], topicTemplate: '{aggregatetype}' };
    const claim = s.q.claimStatement(`"${name}"`, 'hold', BATCH, filter, name, { batch: 64 * 1024 * 1024, payload: 1_048_576 });
    const move = s.q.moveSentSql(`"${name}"`, `"${name}_sent"`, 'seq');
    const t0 = performance.now();
    let n = 0;
    for (;;) {
      const got = await sql.begin(async (tx) => {
        await tx`SET LOCAL jit = off`;
        const rows = await tx.unsafe<{ seq: string }[]>(claim.text, claim.params as never[], { prepare: true });
        if (rows.length) await tx.unsafe(move, [rows.map((r: { seq: string }) => r.seq)] as never[], { prepare: true });
        return rows.length;
      });
      n += got;
      if (got === 0) break;
    }
    const ms = performance.now() - t0;
    if (n !== EVENTS) throw new Error(`${s.name}: ${n} of ${EVENTS}`);
    rates[s.name]!.push(Math.round((n / ms) * 1000));
    await s.drop(sql, t);
  }
}
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
console.log(JSON.stringify({ rates, before: med(rates.before!), after: med(rates.after!), ratio: +(med(rates.after!) / med(rates.before!)).toFixed(3) }));
await sql.end();
