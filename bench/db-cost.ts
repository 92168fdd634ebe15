// Where the relay's Postgres backend spends CPU per event, statement by statement (issue 28):
// one connection runs the batch transaction's statements as the relay sends them (BEGIN, the
// settings, the claim, the premark's savepoint and mark, COMMIT) over a filled table, and each is
// charged the backend's CPU (/proc/PID/schedstat, ns) and the WAL it wrote (pg_current_wal_lsn()
// before and after; other sessions' WAL counts too, so run it alone). Variants alternate by round.
//   node --import tsx bench/db-cost.ts [--events 20000] [--rounds 3] [--modes keep,delete]
//     [--variants current,ctid,seq,generic,...] (VARIANTS)
// (the services running; run it under the lock). docs/benchmarks/2026-12-03-database-cost.md has the results.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import postgres from 'postgres';
import { Deadline } from '../src/budget.ts';
import { parseTableName, qualified } from '../src/outbox/identifier.ts';
import { dropOutbox, migrate } from '../src/outbox/migrate.ts';
import { deleteSentSql, moveSentSql } from '../src/outbox/sql.ts';
import { OutboxStore, type SentRowsMode } from '../src/outbox/store.ts';
import { txSettings } from '../src/outbox/tx-settings.ts';

const { values } = parseArgs({
  options: {
    events: { type: 'string', default: '20000' },
    batch: { type: 'string', default: '500' },
    rounds: { type: 'string', default: '3' },
    modes: { type: 'string', default: 'keep,delete' },
    variants: { type: 'string', default: 'current' },
  },
});
const N = Number(values.events);
const BATCH = Number(values.batch);
const url = process.env.DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox';
const sql = postgres(url, { max: 1, onnotice: () => undefined });
const pad = 'x'.repeat(960);

const cpuNs = (pid: number) => Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);

type Step = 'begin+settings' | 'claim' | 'savepoint' | 'mark' | 'commit';
const STEPS: Step[] = ['begin+settings', 'claim', 'savepoint', 'mark', 'commit'];

/** ways of running the claim, compared in the same run */
interface Variant {
  claim?: (text: string, limit: number) => string;
  settings?: (params: string[]) => string[];
  /** the mark's text (by seq: $1 the rows' seqs, not their ctids), from the store's tables and mode */
  markBySeq?: (store: OutboxStore, mode: SentRowsMode) => string;
  /** the mark's text by ctid alone ($1 the rows' ctids) */
  markByCtid?: (store: OutboxStore, mode: SentRowsMode) => string;
}
const byCtid = (s: OutboxStore, mode: SentRowsMode) => {
  const moved = 'id, aggregatetype, aggregateid, type, payload, topic, headers, seq, created_at, attempts, retried_at, retried_by, retried_reason, retried_operator';
  return mode === 'delete'
    ? `DELETE FROM ${s.table} WHERE ctid = ANY($1::tid[]) AND sent_at IS NULL`
    : `WITH moved AS (DELETE FROM ${s.table} WHERE ctid = ANY($1::tid[]) AND sent_at IS NULL RETURNING ${moved})
INSERT INTO ${s.sentTable} (${moved}, sent_at) SELECT ${moved}, now() FROM moved`;
};
const bySeq = (s: OutboxStore, mode: SentRowsMode) =>
  mode === 'delete' ? deleteSentSql(s.table, 'seq') : moveSentSql(s.table, s.sentTable, 'seq');
const VARIANTS: Record<string, Variant> = {
  current: {},
  // the LIMIT written into the text, and the plan made once per connection
  generic: {
    claim: (text, limit) => text.replace('LIMIT $1\n', `LIMIT ${limit} + 0 * $1::int\n`),
    settings: (params) => params.map((p) => (p === 'force_custom_plan' ? 'force_generic_plan' : p)),
  },
  // the mark by seq, as before 2026-12-03 (current: by address, a TID scan): 500 probes of the seq index
  seq: { markBySeq: bySeq },
  // the mark by ctid alone, unchecked, as 8e518f2 to f93d769 (current: by tableoid and ctid, its count checked)
  ctid: { markByCtid: (s, mode) => byCtid(s, mode) },
  // by seq, bounded by the batch's range too (a range scan, the list a hashed filter); delete mode only
  range: {
    markBySeq: (s, mode) =>
      mode === 'delete'
        ? `DELETE FROM ${s.table} WHERE seq BETWEEN (SELECT min(s) FROM unnest($1::bigint[]) s)
      AND (SELECT max(s) FROM unnest($1::bigint[]) s) AND seq = ANY($1::bigint[]) AND sent_at IS NULL`
        : bySeq(s, mode),
  },
  // the byte cut's window only when the candidates' bytes exceed the batch's (an initplan runs when first read)
  'cut-sum-first': {
    claim: (text) =>
      text.replace(
        'cut AS MATERIALIZED (SELECT coalesce(',
        'cut AS MATERIALIZED (SELECT CASE WHEN (SELECT sum(coalesce(payload_bytes, 0) + coalesce(headers_bytes, 0)) '
          + 'FROM cand) <= $4::bigint THEN (SELECT max(seq) FROM cand) ELSE (SELECT coalesce(',
      ).replace('FROM cand) s),\n', 'FROM cand) s) END AS last_seq),\n'),
  },
  // attribution only (not equivalent claims): one part of the claim left out at a time
  'no-gap': {
    claim: (text) =>
      text.replace('LEFT JOIN gap USING', 'LEFT JOIN (SELECT NULL::text, NULL::bigint WHERE false) gap(aggregateid, first_gap) USING'),
  },
  'no-cut': { claim: (text) => text.replace('WHERE seq <= (SELECT last_seq FROM cut)', 'WHERE $4::bigint > 0') },
  'no-advisory': {
    claim: (text) => text.replace(/pg_try_advisory_xact_lock\(hashtextextended\(aggregateid, hashtext\(\$2\)\)\)/, '$2::text <> \'\''),
  },
  'no-rowlock': { claim: (text) => text.replace('FOR UPDATE OF r SKIP LOCKED', '') },
  'no-blocked': {
    claim: (text) => text.replace(/\(aggregateid NOT IN \(SELECT aggregateid FROM blocked\) OR [^\n]*\)\n/, 'true\n'),
  },
};

type Costs = Record<Step, { ns: number; wal: number }>;

async function one(mode: SentRowsMode, round: number, variant: string): Promise<Costs> {
  const name = `bench_dbcost_${mode}_${Date.now().toString(36)}${round}`;
  const v = VARIANTS[variant]!;
  const table = parseTableName(name);
  await migrate(sql, table);
  const t = qualified(table);
  for (let i = 0; i < N; i += 10_000) {
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'bench', 'agg-' || ((g * 7919) % 1000), 'Benchmarked', jsonb_build_object('n', g, 'pad', $2::text)
       FROM generate_series($1::int, $1::int + $3::int - 1) g ORDER BY g`,
      [i, pad, Math.min(10_000, N - i)],
    );
  }
  await sql.unsafe(`VACUUM ANALYZE ${t}`);
  const store = new OutboxStore(sql, table, 'hold', { sentRows: mode });
  const out = Object.fromEntries(STEPS.map((s) => [s, { ns: 0, wal: 0 }])) as Record<Step, { ns: number; wal: number }>;
  await sql.reserve().then(async (conn) => {
    const pid = (await conn<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`)[0]!.pid;
    const step = async (s: Step, f: () => Promise<unknown>) => {
      const w0 = await lsnAt();
      const c0 = cpuNs(pid);
      const r = await f();
      const c1 = cpuNs(pid);
      const w1 = await lsnAt();
      out[s].ns += c1 - c0;
      out[s].wal += Number(w1 - w0);
      return r;
    };
    // an LSN as a number: the two halves of X/Y
    const lsnAt = async () => {
      const l = (await conn<{ l: string }[]>`SELECT pg_current_wal_insert_lsn()::text AS l`)[0]!.l;
      const [hi, lo] = l.split('/');
      return (BigInt('0x' + hi) << 32n) + BigInt('0x' + lo);
    };
    for (;;) {
      const deadline = new Deadline(Date.now() + 60_000);
      const settings = txSettings(deadline, { batch: true });
      await step('begin+settings', async () => {
        await conn`BEGIN`;
        await conn.unsafe(settings.text, v.settings ? v.settings(settings.params) : settings.params, { prepare: true });
      });
      const claim = store.claimStatement(BATCH, { aggregates: [], inFlight: [], topics: [], topicTemplate: '' });
      const text = v.claim ? v.claim(claim.text, BATCH) : claim.text;
      type Claimed = Array<{ seq: string; rel: string; tid: string; publishable: boolean }>;
      const claimed = () => conn.unsafe(text, claim.params as never[], { prepare: true });
      const rows = (await step('claim', claimed)) as Claimed;
      const marked = rows.filter((r) => r.publishable);
      const tids = marked.map((r) => r.tid);
      const rels = [...new Set(marked.map((r) => r.rel))];
      const params = v.markBySeq ? [marked.map((r) => r.seq)] : v.markByCtid ? [tids] : [rels.length === 1 ? rels : marked.map((r) => r.rel), tids];
      const markText = v.markBySeq?.(store, mode) ?? v.markByCtid?.(store, mode) ?? store.markText;
      await step('savepoint', () => conn`SAVEPOINT premark`);
      await step('mark', () => conn.unsafe(markText, params as never[], { prepare: true }));
      await step('commit', () => conn`COMMIT`);
      if (rows.length < BATCH) break;
    }
    conn.release();
  });
  const left = await sql.unsafe(`SELECT count(*)::int AS n FROM ${t}`);
  if (mode === 'delete' && left[0]!.n !== 0) throw new Error(`${variant}: ${left[0]!.n} rows left after the run`);
  await dropOutbox(sql, table);
  return out;
}

for (const v of values.variants.split(',')) {
  if (!VARIANTS[v]) throw new Error(`--variants: unknown '${v}'; choose from ${Object.keys(VARIANTS).join(', ')}`);
}
const modes = values.modes.split(',').flatMap((m) => values.variants.split(',').map((v) => `${m}:${v}`));
const all = new Map<string, Array<Record<Step, { ns: number; wal: number }>>>(modes.map((m) => [m, []]));
for (let r = 0; r < Number(values.rounds); r++) {
  for (const m of modes) {
    const [mode, variant] = m.split(':') as [SentRowsMode, string];
    all.get(m)!.push(await one(mode, r, variant));
  }
}
const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
for (const m of modes) {
  const runs = all.get(m)!;
  const what = `median of ${runs.length}, ${N} events, batch ${BATCH}`;
  console.log(`\n${m}: µs of backend CPU / bytes of WAL per event (${what})`);
  let total = 0;
  let wal = 0;
  for (const s of STEPS) {
    const us = med(runs.map((x) => x[s].ns)) / 1000 / N;
    const w = med(runs.map((x) => x[s].wal)) / N;
    total += us;
    wal += w;
    const each = runs.map((x) => (x[s].ns / 1000 / N).toFixed(2)).join(' ');
    console.log(`  ${s.padEnd(16)} ${us.toFixed(2).padStart(7)} µs ${w.toFixed(0).padStart(7)} B   rounds: ${each}`);
  }
  console.log(`  ${'total'.padEnd(16)} ${total.toFixed(2).padStart(7)} µs ${wal.toFixed(0).padStart(7)} B`);
}
await sql.end();
