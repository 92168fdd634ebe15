// `--only marks`: what recording "sent" costs the database over a row's whole life, per way of
// recording it. The relay's claim and mark rate (sqlGuarded) shows only the batch transaction; a
// mark also leaves work behind: the dead row versions vacuum must clear, and the rows retention
// must later delete. So each option relays the same N rows through the relay's own claim and its
// statement for that option (src/outbox/sql.ts; the in-place mark: bench/sql.ts), then VACUUMs,
// then prunes everything through the relay's retention statements and VACUUMs again. Autovacuum is
// off on these tables so that each phase pays for its own cleanup. Per row: Postgres CPU (every
// backend, from /proc) and WAL bytes.
import type { Sql } from 'postgres';
import { parseTableName, qualified, sentTable } from '../src/outbox/identifier.ts';
import * as q from '../src/outbox/sql.ts';
import { DEFAULT_CLAIM_BYTES } from '../src/outbox/store.ts';
import { CpuMeter } from './cpu.ts';
import { markInPlaceSql, pruneInPlaceSql } from './sql.ts';

export interface MarksBenchContext {
  sql: Sql;
  meter: CpuMeter;
  events: number;
  batch: number;
  repeat: number;
  /** a migrated outbox table filled with `events` rows, as every measurement of the bench gets */
  prepare(name: string): Promise<string>;
  drop(table: string): Promise<void>;
}

interface Option {
  label: string;
  why: string;
  mark(t: string, sent: string): string;
  /** the retention statements that delete what it marked ($1: window in ms, $2: chunk rows) */
  prune(t: string, sent: string): string[];
  /** extra DDL before the run */
  setup?(sent: string): string;
}

const OPTIONS: Option[] = [
  {
    label: 'mark in place (UPDATE sent_at)',
    why: 'keep mode before the sent table',
    mark: (t) => markInPlaceSql(t),
    prune: (t) => [pruneInPlaceSql(t)],
  },
  {
    label: 'move to the sent table',
    why: 'keep mode (the default)',
    mark: (t, sent) => q.moveSentSql(t, sent, 'seq'),
    prune: (t, sent) => [q.pruneSql(t, sent, 'sent')],
  },
  {
    label: 'move, without the payload',
    why: 'not offered: would keep only the metadata',
    // the sent table stripped of payload, topic and headers for this run
    setup: (sent) => `ALTER TABLE ${sent} DROP COLUMN payload, DROP COLUMN topic, DROP COLUMN headers`,
    mark: (t, sent) => `
WITH moved AS (
  DELETE FROM ${t} WHERE seq = ANY($1::bigint[]) AND sent_at IS NULL
  RETURNING id, aggregatetype, aggregateid, type, seq, created_at, attempts
)
INSERT INTO ${sent} (id, aggregatetype, aggregateid, type, seq, created_at, sent_at, attempts)
SELECT id, aggregatetype, aggregateid, type, seq, created_at, now(), attempts FROM moved`,
    prune: (t, sent) => [q.pruneSql(t, sent, 'sent')],
  },
  {
    label: 'delete',
    why: 'OUTBOX_SENT_ROWS=delete: nothing kept',
    mark: (t) => q.deleteSentSql(t, 'seq'),
    prune: () => [],
  },
];

const PHASES = ['claim+mark', 'vacuum', 'prune'] as const;
type Phase = (typeof PHASES)[number];
type Cost = { cpuUs: number; walBytes: number };

async function walLsn(sql: Sql): Promise<string> {
  const [r] = await sql<{ lsn: string }[]>`SELECT pg_current_wal_insert_lsn()::text AS lsn`;
  return r!.lsn;
}

async function measure(ctx: MarksBenchContext, fn: () => Promise<void>): Promise<Cost> {
  const lsn = await walLsn(ctx.sql);
  const c0 = ctx.meter.sample();
  await fn();
  const cpu = CpuMeter.diff(c0, ctx.meter.sample());
  const [w] = await ctx.sql<{ bytes: string }[]>`SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), ${lsn}::pg_lsn)::bigint AS bytes`;
  return { cpuUs: (cpu.postgres * 1e6) / ctx.events, walBytes: Number(w!.bytes) / ctx.events };
}

async function lifeOf(ctx: MarksBenchContext, o: Option, run: number): Promise<Record<Phase, Cost>> {
  const table = await ctx.prepare(`marks${OPTIONS.indexOf(o)}r${run}`);
  const t = qualified(parseTableName(table));
  const sent = qualified(sentTable(parseTableName(table)));
  if (o.setup) await ctx.sql.unsafe(o.setup(sent));
  await ctx.sql.unsafe(`ALTER TABLE ${t} SET (autovacuum_enabled = false); ALTER TABLE ${sent} SET (autovacuum_enabled = false)`);
  const claim = q.claimStatement(t, 'hold', ctx.batch, { aggregates: [], inFlight: [], topics: [], topicTemplate: 'bench' }, table, DEFAULT_CLAIM_BYTES);
  const mark = o.mark(t, sent);
  const out = {} as Record<Phase, Cost>;
  out['claim+mark'] = await measure(ctx, async () => {
    let done = 0;
    for (;;) {
      const n = await ctx.sql.begin(async (tx) => {
        await tx`SELECT set_config('plan_cache_mode', 'force_custom_plan', true)`;
        const rows = await tx.unsafe<{ seq: string; publishable: boolean }[]>(claim.text, claim.params as never[]);
        const ok = rows.filter((r) => r.publishable).map((r) => r.seq);
        if (ok.length) await tx.unsafe(mark, [ok]);
        return ok.length;
      });
      done += n;
      if (n === 0) break;
    }
    if (done !== ctx.events) throw new Error(`marks: ${o.label} relayed ${done} of ${ctx.events}`);
  });
  out.vacuum = await measure(ctx, async () => {
    await ctx.sql.unsafe(`VACUUM ${t}`);
    await ctx.sql.unsafe(`VACUUM ${sent}`);
  });
  out.prune = await measure(ctx, async () => {
    for (const text of o.prune(t, sent)) {
      // a 0 ms window: everything sent before this statement's transaction began
      // the relay's statements answer one row, `affected`; the in-place one its DELETE's count
      const chunk = async () => {
        const r = await ctx.sql.unsafe<{ affected?: string }[]>(text, [0, 5_000]);
        return r[0]?.affected === undefined ? r.count : Number(r[0].affected);
      };
      while ((await chunk()) === 5_000);
    }
    await ctx.sql.unsafe(`VACUUM ${t}`);
    await ctx.sql.unsafe(`VACUUM ${sent}`);
  });
  const [left] = await ctx.sql.unsafe<{ n: string }[]>(`SELECT (SELECT count(*) FROM ${t}) + (SELECT count(*) FROM ${sent}) AS n`);
  if (Number(left!.n) !== 0) throw new Error(`marks: ${o.label} left ${left!.n} rows after retention`);
  await ctx.drop(table);
  return out;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export async function benchMarks(ctx: MarksBenchContext): Promise<Record<string, unknown>> {
  if (!ctx.meter.available) throw new Error('marks: needs /proc and the local Postgres (its CPU is what is measured)');
  process.stderr.write(`marks: ${ctx.events} rows per option, batch ${ctx.batch}, ${ctx.repeat} repetitions (medians)\n`);
  const runs = new Map<Option, Record<Phase, Cost>[]>(OPTIONS.map((o) => [o, []]));
  // options interleaved, so a noisy minute falls on all of them
  for (let i = 0; i < ctx.repeat; i++) {
    for (const o of OPTIONS) {
      const r = await lifeOf(ctx, o, i);
      runs.get(o)!.push(r);
      process.stderr.write(`  run ${i + 1}/${ctx.repeat} ${o.label}: ${PHASES.map((p) => `${p} ${r[p].cpuUs.toFixed(1)} µs`).join(', ')}\n`);
    }
  }
  const table = OPTIONS.map((o) => {
    const rs = runs.get(o)!;
    const phase = Object.fromEntries(PHASES.map((p) => [p, { cpuUs: median(rs.map((r) => r[p].cpuUs)), walBytes: median(rs.map((r) => r[p].walBytes)) }])) as Record<Phase, Cost>;
    const total = { cpuUs: median(rs.map((r) => PHASES.reduce((s, p) => s + r[p].cpuUs, 0))), walBytes: median(rs.map((r) => PHASES.reduce((s, p) => s + r[p].walBytes, 0))) };
    return { o, phase, total };
  });
  const base = table[0]!.total;
  console.log(`\nmarks: a row's life after its insert, per way of recording "sent" (median of ${ctx.repeat}; Postgres CPU µs / WAL bytes per row)`);
  console.log(`${'option'.padEnd(34)} ${PHASES.map((p) => p.padStart(14)).join(' ')} ${'total'.padStart(14)}  ${'vs in place'.padStart(11)}  why`);
  for (const { o, phase, total } of table) {
    const cell = (c: Cost) => `${c.cpuUs.toFixed(1)} / ${Math.round(c.walBytes)}`.padStart(14);
    console.log(`${o.label.padEnd(34)} ${PHASES.map((p) => cell(phase[p])).join(' ')} ${cell(total)}  ${(total.cpuUs / base.cpuUs).toFixed(2).padStart(11)}  ${o.why}`);
  }
  const round = (c: Cost) => ({ cpuUs: Number(c.cpuUs.toFixed(1)), walBytes: Math.round(c.walBytes) });
  return Object.fromEntries(table.map(({ o, phase, total }) => [o.label, { ...Object.fromEntries(PHASES.map((p) => [p, round(phase[p])])), total: round(total) }]));
}
