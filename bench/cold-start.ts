// Cold starts of the packaged zip under AWS's Lambda Runtime Interface Emulator (the runtime
// test/integration/lambda-runtime.test.ts uses): how long the init phase takes (the runtime
// client started and the bundle imported, what Lambda reports as "Init Duration"), and the first
// invocation after it, which publishes one row (the database and Kafka connected, and whatever
// the handler loads on first use). Each cold start is a new emulator with a new runtime process,
// the rounds interleave the clients, and a round before them is not counted (it fills the file
// cache). For reference, the init of a handler that imports nothing: what the runtime itself takes.
//
//   node --import tsx bench/cold-start.ts [--runs 7] [--clients kafkajs,platformatic]
//                                          [--zip LABEL=PATH ...]
//
// It needs the local Postgres and Kafka (`npm run services:up`) and the emulator
// (`bash scripts/lambda-runtime.sh install`). It builds the zip (scripts/build.mjs --lambda-only)
// and measures it, or measures the zips given with --zip instead, their cold starts interleaved
// (two builds compared on the same machine at the same time, e.g. before and after a change).
// docs/benchmarks/cold-start.md has the results.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { parse } from 'yaml';
import { KAFKA_CLIENTS } from '../src/config/types.ts';
import { dropOutbox } from '../src/outbox/migrate.ts';
import { parseTableName } from '../src/outbox/identifier.ts';
import { db, fixture, insertEvents, kafka, ROOT } from '../test/integration/helpers.ts';
import { Emulator } from '../test/integration/lambda-emulator.ts';
import { measuredCommit } from './commit.ts';

const { values: args } = parseArgs({
  options: {
    runs: { type: 'string', default: '7' },
    clients: { type: 'string', default: KAFKA_CLIENTS.join(',') },
    zip: { type: 'string', multiple: true },
  },
});
const zips = (args.zip ?? []).map((z) => {
  const eq = z.indexOf('=');
  assert.ok(eq > 0, `--zip takes LABEL=PATH, got ${z}`);
  return { label: z.slice(0, eq), path: z.slice(eq + 1) };
});
const runs = Number(args.runs);
assert.ok(Number.isInteger(runs) && runs >= 1, `--runs must be a positive integer, got ${args.runs}`);
const clients = args.clients.split(',');
for (const c of clients) assert.ok((KAFKA_CLIENTS as readonly string[]).includes(c), `--clients: unknown client ${c}; one of ${KAFKA_CLIENTS.join(', ')}`);

interface ColdStart {
  initMs: number;
  /** the first invocation; undefined for the reference handler */
  firstInvokeMs?: number;
  peakRssMiB?: number;
}

function run(cmd: string, argv: string[]): void {
  const r = spawnSync(cmd, argv, { cwd: ROOT, encoding: 'utf8', timeout: 900_000 });
  assert.equal(r.status, 0, `${cmd} ${argv.join(' ')} failed:\n${r.stdout}${r.stderr}`);
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
};
const fmt = (xs: number[]): string => (xs.length ? `${median(xs).toFixed(0)} (${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)})` : '–');

async function main(): Promise<void> {
  run('bash', [join(ROOT, 'scripts', 'lambda-runtime.sh'), 'install']);
  if (!zips.length) {
    run(process.execPath, [join(ROOT, 'scripts', 'build.mjs'), '--lambda-only']);
    zips.push({ label: 'relay', path: join(ROOT, '.build', 'relay.zip') });
  }
  mkdirSync(join(ROOT, '.cache'), { recursive: true });
  // each zip unpacked as Lambda does into its task root; and a task root whose handler imports nothing
  const taskRoots = new Map<string, string>();
  for (const z of zips) {
    const dir = mkdtempSync(join(ROOT, '.cache', 'cold-start-'));
    taskRoots.set(z.label, dir);
    run('unzip', ['-q', z.path, '-d', dir]);
  }
  const emptyRoot = mkdtempSync(join(ROOT, '.cache', 'cold-start-empty-'));
  writeFileSync(join(emptyRoot, 'handler.mjs'), 'export const handler = async () => ({});\n');
  const handler = (parse(readFileSync(join(ROOT, 'serverless.yml'), 'utf8')) as { functions: { relay: { handler: string } } }).functions.relay.handler;

  const sql = db();
  const f = await fixture(sql, 'coldstart');
  const kinds = [...zips.flatMap((z) => clients.map((c) => `${z.label}, ${c}`)), 'reference'];
  const results = new Map<string, ColdStart[]>(kinds.map((k) => [k, []]));
  let row = 0;

  /** `kind`: "LABEL, CLIENT", or 'reference' */
  async function coldStart(kind: string): Promise<ColdStart> {
    if (kind === 'reference') {
      const e = await Emulator.start(emptyRoot, 'handler.handler', 30, {});
      try {
        await e.invoke();
        return { initMs: e.initDurationsMs()[0]! };
      } finally {
        await e.stop();
      }
    }
    const [label, client] = kind.split(', ') as [string, string];
    await insertEvents(sql, f.table, [{ aggregateid: `a-${row}`, payload: { row: row++ } }]);
    const e = await Emulator.start(taskRoots.get(label)!, handler, 30, { ...f.env, OUTBOX_KAFKA_CLIENT: client, OUTBOX_LOG_LEVEL: 'warn' });
    try {
      const summary = await e.invokeOk();
      assert.equal(summary.published, 1, `the first invocation published ${summary.published} rows, not 1: ${JSON.stringify(summary)}`);
      const [initMs] = e.initDurationsMs();
      const [firstInvokeMs] = e.invokeDurationsMs();
      assert.ok(initMs !== undefined && firstInvokeMs !== undefined, `the emulator reported no init or invoke duration:\n${e.output().slice(-3_000)}`);
      const rss = e.runtimePeakRssKiB();
      return { initMs, firstInvokeMs, peakRssMiB: rss === undefined ? undefined : rss / 1024 };
    } finally {
      await e.stop();
    }
  }

  try {
    // one round not counted: the page cache, the emulator's and Node's first start
    for (const k of kinds) await coldStart(k);
    for (let i = 0; i < runs; i++) {
      // each round in another order, so no kind always follows the same one
      const order = kinds.map((_, j) => kinds[(i + j) % kinds.length]!);
      for (const k of order) {
        const r = await coldStart(k);
        results.get(k)!.push(r);
        console.log(`run ${i + 1}/${runs} ${k.padEnd(24)} init ${r.initMs.toFixed(0)} ms${r.firstInvokeMs === undefined ? '' : `, first invocation ${r.firstInvokeMs.toFixed(0)} ms, peak RSS ${r.peakRssMiB?.toFixed(0)} MiB`}`);
      }
    }
  } finally {
    await dropOutbox(sql, parseTableName(f.table)).catch(() => undefined);
    await sql.end();
    const admin = kafka.admin();
    await admin
      .connect()
      .then(() => admin.deleteTopics({ topics: [f.topic('order')] }))
      .catch(() => undefined)
      .finally(() => admin.disconnect());
    for (const dir of taskRoots.values()) rmSync(dir, { recursive: true, force: true });
    rmSync(emptyRoot, { recursive: true, force: true });
  }

  console.log(`\ncold-start: commit ${measuredCommit()}, ${new Date().toISOString()}, ${runs} cold starts each (median (min–max)), load average ${loadavg().map((l) => l.toFixed(1)).join(' ')}`);
  for (const z of zips) console.log(`${z.label}: ${z.path}, ${statSync(z.path).size} bytes`);
  console.log('');
  console.log('| handler | init, ms | first invocation, ms | init + first invocation, ms | peak RSS after it, MiB |');
  console.log('|---|---|---|---|---|');
  const json: Record<string, unknown> = { commit: measuredCommit(), runs, zips };
  for (const [k, rs] of results) {
    const init = rs.map((r) => r.initMs);
    const first = rs.flatMap((r) => (r.firstInvokeMs === undefined ? [] : [r.firstInvokeMs]));
    const total = rs.flatMap((r) => (r.firstInvokeMs === undefined ? [] : [r.initMs + r.firstInvokeMs]));
    const rss = rs.flatMap((r) => (r.peakRssMiB === undefined ? [] : [r.peakRssMiB]));
    console.log(`| ${k === 'reference' ? 'reference (imports nothing)' : k} | ${fmt(init)} | ${fmt(first)} | ${fmt(total)} | ${fmt(rss)} |`);
    json[k] = { initMs: init, firstInvokeMs: first, peakRssMiB: rss.map((x) => Math.round(x)), medianInitMs: median(init), medianFirstInvokeMs: first.length ? median(first) : undefined };
  }
  console.log(JSON.stringify(json));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
