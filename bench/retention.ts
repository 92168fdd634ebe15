// Retention under load: does the table stay bounded while the relay runs at its full rate?
//   sustained  a producer keeps a small backlog in a fresh table for several minutes while the
//              relay runs as in production (consecutive invocations of one warm Runtime, keep
//              mode, a short OUTBOX_RETAIN_SENT_MS so retention must keep pace); every 10 s a row
//              of table figures; a verdict comparing the run's halves, and the relay's rate
//              against the same run without retention (the baseline, measured first).
//   burst      200,000 rows relayed at once, then the time of an empty claim right after, after
//              retention deleted them, and after a VACUUM, next to the 20 ms goal.
// Both are opt-in (`npm run bench -- --only sustained,burst`); bench.ts wires them in.
import { Worker } from 'node:worker_threads';
import type kafkajs from 'kafkajs';
import type { Sql } from 'postgres';
import { Deadline, MIN_SAFETY_MARGIN_MS } from '../src/budget.ts';
import { loadConfig } from '../src/config/load.ts';
import type { Logger } from '../src/log.ts';
import { parseTableName, qualified, sentTable } from '../src/outbox/identifier.ts';
import { dropOutbox, migrate } from '../src/outbox/migrate.ts';
import { OutboxStore } from '../src/outbox/store.ts';
import type { Summary } from '../src/loop/invocation.ts';
import { Runtime } from '../src/lambda/runtime.ts';
import { CpuMeter, type CpuSample } from './cpu.ts';
import type { ProducerWorkerData } from './producer-worker.ts';
import { MarkInPlaceStore, RuntimeWith } from './stores.ts';

/**
 * The ways of recording sent rows the sustained run compares (--sent-rows): OUTBOX_SENT_ROWS's two,
 * and `mark-in-place`, how pre-release versions marked a row (bench/sql.ts markInPlaceSql).
 */
export const SENT_ROWS_WAYS = ['keep', 'delete', 'mark-in-place'] as const;
export type SentRowsWay = (typeof SENT_ROWS_WAYS)[number];

export interface RetentionBenchContext {
  /** the bench's own client (producer, sampler, claims), not the relay's */
  sql: Sql;
  kafka: kafkajs.Kafka;
  /** base environment for loadConfig (database, brokers, batch size, log level) */
  env: Record<string, string>;
  logger: Logger;
  meter: CpuMeter;
  run: string;
  batch: number;
  payloadBytes: number;
  aggregates: number;
  partitions: number;
}

export interface SustainedOptions {
  minutes: number;
  /** one invocation per period, each given the whole period as its remaining time */
  invokeSeconds: number;
  retainSeconds: number;
  /** a run with retention off before the main run, for the rate without retention */
  baselineSeconds: number;
  /** the producer tops the pending backlog up to this many batches */
  backlogBatches: number;
  producers: number;
  /**
   * the ways of recording sent rows to run, each a baseline and a main run of its own, in this
   * order (--sent-rows keep,mark-in-place: the move against the in-place mark of pre-release
   * versions, in one run, since the machine's speed drifts by the hour)
   */
  sentRows: SentRowsWay[];
}

const SAMPLE_MS = 10_000;
const ROWS_PER_TX = 500;
/** the invocation stops this long before its period ends: 5 %, as 3 s of a 60 s Lambda timeout */
const marginFor = (periodMs: number) => Math.max(MIN_SAFETY_MARGIN_MS, Math.round(periodMs * 0.05));

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)));
const fmt = (n: number) => Math.round(n).toLocaleString('en-US');
const mb = (bytes: number) => (bytes / 1048576).toFixed(0);

async function freshTable(ctx: RetentionBenchContext, name: string): Promise<{ table: string; t: string; topic: string }> {
  const table = `bench_${name}_${ctx.run}`;
  await migrate(ctx.sql, parseTableName(table));
  const topic = `bench.${ctx.run}.${name}`;
  const admin = ctx.kafka.admin();
  await admin.connect();
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: ctx.partitions, replicationFactor: 1 }] });
  await admin.disconnect();
  return { table, t: qualified(parseTableName(table)), topic };
}

async function dropTable(ctx: RetentionBenchContext, table: string, topic: string): Promise<void> {
  await dropOutbox(ctx.sql, parseTableName(table));
  // these topics hold gigabytes: give the broker its disk back
  const admin = ctx.kafka.admin();
  await admin.connect();
  await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
  await admin.disconnect();
}

function runtimeFor(ctx: RetentionBenchContext, table: string, topic: string, retainMs: number, marginMs: number, sentRows: SentRowsWay = 'keep'): Runtime {
  const config = loadConfig({
    ...ctx.env,
    OUTBOX_TABLE: table,
    OUTBOX_TOPIC_TEMPLATE: topic,
    OUTBOX_SENT_ROWS: sentRows === 'delete' ? 'delete' : 'keep',
    OUTBOX_RETAIN_SENT_MS: String(retainMs),
    OUTBOX_SAFETY_MARGIN_MS: String(marginMs),
    OUTBOX_METRICS: 'off',
    // its own application_name: tests that terminate the relay's backends by name leave it alone
    OUTBOX_CLIENT_ID: 'outbox-relay-bench',
  });
  // the in-place mark is no configuration any more: the bench's store marks so, in keep mode (bench/stores.ts)
  return sentRows === 'mark-in-place' ? new RuntimeWith(MarkInPlaceStore, config, ctx.logger) : new Runtime(config, ctx.logger);
}

/** The application, in a worker thread (bench/producer-worker.ts): 500-row transactions whenever fewer than `target` rows are pending. */
class Producer {
  private readonly counter = new SharedArrayBuffer(8);
  private readonly worker: Worker;
  private readonly exited: Promise<void>;

  constructor(ctx: RetentionBenchContext, t: string, target: number, connections: number) {
    const workerData: ProducerWorkerData = {
      url: ctx.env.DATABASE_URL!,
      t,
      target,
      rowsPerTx: ROWS_PER_TX,
      aggregates: ctx.aggregates,
      payloadBytes: ctx.payloadBytes,
      connections,
      inserted: this.counter,
    };
    // the worker inherits this process's --import tsx
    this.worker = new Worker(new URL('./producer-worker.ts', import.meta.url), { workerData });
    this.exited = new Promise((resolve, reject) => {
      this.worker.once('error', reject);
      this.worker.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`the producer worker exited with ${code}`))));
    });
    this.exited.catch((err: unknown) => (this.failure = err as Error));
  }

  /** set when the worker failed: the run cannot go on */
  failure: Error | undefined;

  check(): void {
    if (this.failure) throw new Error(`the producer failed: ${this.failure.message}`, { cause: this.failure });
  }

  /** rows committed so far */
  get inserted(): number {
    return Number(Atomics.load(new BigInt64Array(this.counter), 0));
  }

  async stop(): Promise<void> {
    this.worker.postMessage('stop');
    await this.exited;
  }
}

interface Sample {
  elapsedS: number;
  relayed: number;
  ratePerSec: number;
  /** n_live_tup of the outbox and its sent table: pg_stat_user_tables' count, kept by every insert and delete (and reset by each vacuum and analyze) */
  rows: number;
  pending: number;
  /** sent rows still in the table: rows - pending */
  sent: number;
  /** sent longer ago than the window, not deleted yet; -1 with retention off */
  overdue: number;
  /** the sent table's n_tup_del: rows deleted by retention (the only one that deletes there) */
  pruned: number;
  deadTuples: number;
  totalBytes: number;
  indexBytes: number;
  autovacuums: number;
  /** how long counting the pending rows took: a walk of the claim index from its start, as every claim makes */
  scanMs: number;
  sampleMs: number;
}

/**
 * Cheap figures only (the samples share the 2 cores with the relay): pending and overdue are exact
 * counts through the claim and sent_at indexes, the rest is pg_stat_user_tables (flushed by each
 * backend at most once a second). An exact count(*) of a 2 GB table took ~1 s of a core per sample.
 */
async function sample(ctx: RetentionBenchContext, table: string, sentRows: SentRowsWay, retainMs: number, inserted: number, elapsedS: number, previous: Sample | undefined): Promise<Sample> {
  const t = qualified(parseTableName(table));
  const sent = qualified(sentTable(parseTableName(table)));
  const started = performance.now();
  const [p] = await ctx.sql.unsafe<{ pending: string }[]>(`SELECT count(*) AS pending FROM ${t} WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL`);
  const scanMs = performance.now() - started;
  // the outbox and its sent table (the sent table) together: rows, dead tuples, sizes are sums.
  // Sent rows are in the sent table, or in the outbox itself when marked in place; only retention
  // deletes where they are, so that table's n_tup_del is what retention pruned.
  const kept = sentRows === 'mark-in-place' ? t : sent;
  const [r] = await ctx.sql.unsafe<{ overdue: string; live: string; deleted: string; dead: string; autovacuums: string; total: string; indexes: string }[]>(
    `SELECT (SELECT count(*) FROM ${kept} WHERE sent_at < now() - $1::int * interval '1 millisecond') AS overdue,
            sum(s.n_live_tup) AS live, sum(s.n_tup_del) FILTER (WHERE s.relid = $4::regclass) AS deleted, sum(s.n_dead_tup) AS dead,
            sum(s.autovacuum_count) AS autovacuums, sum(pg_total_relation_size(s.relid)) AS total, sum(pg_indexes_size(s.relid)) AS indexes
     FROM pg_stat_user_tables s WHERE s.relid IN ($2::regclass, $3::regclass)`,
    [retainMs, t, sent, kept],
  );
  const pending = Number(p!.pending);
  const rows = Number(r!.live);
  // `inserted` was read before the count, so it counts only committed rows, each pending or relayed
  const relayed = inserted - pending;
  const ratePerSec = previous ? (relayed - previous.relayed) / (elapsedS - previous.elapsedS) : relayed / Math.max(1e-3, elapsedS);
  return {
    elapsedS,
    relayed,
    ratePerSec,
    rows,
    pending,
    sent: Math.max(0, rows - pending),
    overdue: retainMs > 0 ? Number(r!.overdue) : -1,
    pruned: Number(r!.deleted),
    deadTuples: Number(r!.dead),
    totalBytes: Number(r!.total),
    indexBytes: Number(r!.indexes),
    autovacuums: Number(r!.autovacuums),
    scanMs,
    sampleMs: performance.now() - started,
  };
}

const SAMPLE_HEAD = `${'s'.padStart(5)} ${'relayed'.padStart(10)} ${'ev/s'.padStart(7)} ${'rows'.padStart(9)} ${'pending'.padStart(8)} ${'sent'.padStart(9)} ${'overdue'.padStart(8)} ${'pruned'.padStart(10)} ${'dead tup'.padStart(9)} ${'size MB'.padStart(8)} ${'idx MB'.padStart(7)} ${'autovac'.padStart(7)} ${'scan ms'.padStart(7)}`;

function sampleLine(s: Sample): string {
  return `${s.elapsedS.toFixed(0).padStart(5)} ${fmt(s.relayed).padStart(10)} ${fmt(s.ratePerSec).padStart(7)} ${fmt(s.rows).padStart(9)} ${fmt(s.pending).padStart(8)} ${fmt(s.sent).padStart(9)} ${(s.overdue < 0 ? '-' : fmt(s.overdue)).padStart(8)} ${fmt(s.pruned).padStart(10)} ${fmt(s.deadTuples).padStart(9)} ${mb(s.totalBytes).padStart(8)} ${mb(s.indexBytes).padStart(7)} ${String(s.autovacuums).padStart(7)} ${s.scanMs.toFixed(1).padStart(7)}`;
}

interface Invocation {
  n: number;
  startS: number;
  summary: Summary | undefined;
  failed: string | undefined;
}

const INVOCATION_HEAD = `${'invocation'.padEnd(10)} ${'at s'.padStart(5)} ${'published'.padStart(10)} ${'batches'.padStart(7)} ${'pruned'.padStart(9)} ${'ms'.padStart(6)}   ${'per batch waited (ms): claim / publish / commit'.padEnd(48)} stopped`;

function invocationLine({ n, startS, summary: s, failed }: Invocation): string {
  if (!s) return `${String(n).padEnd(10)} ${startS.toFixed(0).padStart(5)}   FAILED without a summary`;
  const per = (ms: number) => (s.batches ? ms / s.batches : 0).toFixed(1);
  const waited = `${per(s.waitedMs.claim)} / ${per(s.waitedMs.publish)} / ${per(s.waitedMs.commit)}`;
  return `${String(n).padEnd(10)} ${startS.toFixed(0).padStart(5)} ${fmt(s.published).padStart(10)} ${String(s.batches).padStart(7)} ${fmt(s.pruned).padStart(9)} ${String(s.durationMs).padStart(6)}   ${waited.padEnd(48)} ${s.stoppedBecause}${failed ? ' (FAILED)' : ''}`;
}

interface LoadRun {
  label: string;
  retainMs: number;
  samples: Sample[];
  summaries: Summary[];
  invocations: Invocation[];
  failures: string[];
  published: number;
  pruned: number;
  wallMs: number;
  ratePerSec: number;
  stops: Record<string, number>;
  cpu?: CpuSample;
}

/**
 * Producer + relay for `seconds`: one invocation per period, each with the period as its
 * remaining time (EventBridge's minute and the Lambda timeout, compressed), the next one at the
 * next tick (late when the previous ran past it, as an overlapping tick would have started).
 */
async function loadRun(ctx: RetentionBenchContext, name: string, label: string, seconds: number, retainMs: number, o: SustainedOptions, sentRows: SentRowsWay): Promise<LoadRun> {
  const { table, t, topic } = await freshTable(ctx, name);
  const periodMs = o.invokeSeconds * 1000;
  const runtime = runtimeFor(ctx, table, topic, retainMs, marginFor(periodMs), sentRows);
  // a warm container: producer connected, topic metadata read
  await runtime.publisher().publish([], new Deadline(Date.now() + 10_000));
  await runtime.publisher().maxMessageBytes(topic, new Deadline(Date.now() + 10_000));
  const producer = new Producer(ctx, t, o.backlogBatches * ctx.batch, o.producers);
  while (producer.inserted < o.backlogBatches * ctx.batch) {
    producer.check();
    await sleep(10);
  }

  console.log(`\n${label}: ${seconds} s, one ${o.invokeSeconds} s invocation per ${o.invokeSeconds} s, OUTBOX_RETAIN_SENT_MS=${retainMs}, backlog ~${fmt(o.backlogBatches * ctx.batch)} rows`);
  console.log(SAMPLE_HEAD);
  const t0 = Date.now();
  const cpuStart = ctx.meter.available ? ctx.meter.sample() : undefined;
  const samples: Sample[] = [];
  let sampling = true;
  let wake = () => {};
  const nap = (ms: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, Math.max(0, ms));
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  const sampler = (async () => {
    for (let k = 1; sampling; k++) {
      await nap(t0 + k * SAMPLE_MS - Date.now());
      if (!sampling) break;
      const s = await sample(ctx, table, sentRows, retainMs, producer.inserted, (Date.now() - t0) / 1000, samples.at(-1));
      samples.push(s);
      console.log(sampleLine(s));
    }
  })();

  const summaries: Summary[] = [];
  const invocations: Invocation[] = [];
  const failures: string[] = [];
  const endAt = t0 + seconds * 1000;
  let lastEnd = t0;
  let ticks = 0;
  for (let tick = 0; t0 + tick * periodMs < endAt; tick++) {
    ticks++;
    producer.check();
    await sleep(t0 + tick * periodMs - Date.now());
    const startS = (Date.now() - t0) / 1000;
    let summary: Summary | undefined;
    let failed: string | undefined;
    try {
      summary = await runtime.invoke(periodMs);
    } catch (err) {
      failed = (err as Error).message;
      failures.push(failed);
      summary = (err as { summary?: Summary }).summary;
    }
    if (summary) summaries.push(summary);
    const inv: Invocation = { n: tick + 1, startS, summary, failed };
    invocations.push(inv);
    process.stderr.write(`  invocation ${invocationLine(inv)}${failed ? `\n      FAILED: ${failed}` : ''}\n`);
    lastEnd = Date.now();
  }
  const cpu = cpuStart ? CpuMeter.diff(cpuStart, ctx.meter.sample()) : undefined;
  sampling = false;
  wake();
  await sampler;
  await producer.stop();
  // the relay's backends flush their statistics as they exit
  await runtime.close();
  const final = await sample(ctx, table, sentRows, retainMs, producer.inserted, (Date.now() - t0) / 1000, samples.at(-1));
  samples.push(final);
  const [exact] = await ctx.sql.unsafe<{ n: string }[]>(`SELECT count(*) AS n FROM ${t}`);
  console.log(`${sampleLine(final)}   final, producer and relay stopped; count(*) = ${fmt(Number(exact!.n))}`);
  console.log(`\n${INVOCATION_HEAD}`);
  for (const inv of invocations) console.log(invocationLine(inv));
  await dropTable(ctx, table, topic);

  const published = summaries.reduce((a, s) => a + s.published, 0);
  // the schedule's time: an invocation that stopped early (nothing pending) leaves its period idle
  const wallMs = Math.max(lastEnd, t0 + ticks * periodMs) - t0;
  const stops: Record<string, number> = {};
  for (const s of summaries) stops[s.stoppedBecause] = (stops[s.stoppedBecause] ?? 0) + 1;
  return {
    label,
    retainMs,
    samples,
    summaries,
    invocations,
    failures,
    published,
    pruned: summaries.reduce((a, s) => a + s.pruned, 0),
    wallMs,
    ratePerSec: published / (wallMs / 1000),
    stops,
    cpu,
  };
}

function cpuText(r: LoadRun): string {
  if (!r.cpu) return '; ';
  const per = (s: number) => ((s * 1e6) / r.published).toFixed(0);
  const cores = (r.cpu.node + r.cpu.postgres + r.cpu.broker) / (r.wallMs / 1000);
  return `; CPU ms per 1k events node ${per(r.cpu.node)} / pg ${per(r.cpu.postgres)} / broker ${per(r.cpu.broker)} (producer and sampler included), ${cores.toFixed(2)} cores busy`;
}

const stopsText = (r: LoadRun) =>
  Object.entries(r.stops)
    .map(([k, v]) => `${v}× ${k}`)
    .join(', ');

export async function benchSustained(ctx: RetentionBenchContext, o: SustainedOptions): Promise<Record<string, unknown>> {
  const seconds = Math.round(o.minutes * 60);
  process.stderr.write(
    `sustained: ${seconds} s with retention ${o.retainSeconds} s (after a ${o.baselineSeconds} s baseline without), ${o.invokeSeconds} s invocations (safety margin ${marginFor(o.invokeSeconds * 1000)} ms), ${o.producers} producer connections, batch ${ctx.batch}, ~${ctx.payloadBytes}-byte payloads, ${ctx.aggregates} aggregates; sent rows: ${o.sentRows.join(', then ')}\n`,
  );
  const results: Array<[SentRowsWay, SustainedResult]> = [];
  for (const mode of o.sentRows) results.push([mode, await sustainedOnce(ctx, o, seconds, mode)]);
  if (results.length === 1) return { sentRows: results[0]![0], ...results[0]![1] };
  // the ways side by side, each against the first named
  const [, first] = results[0]!;
  const cpuPer = (r: SustainedResult) => (r.cpuMsPer1k ? r.cpuMsPer1k.node + r.cpuMsPer1k.postgres + r.cpuMsPer1k.broker : undefined);
  console.log(`\nsent rows, side by side (${seconds} s each, same run):`);
  console.log(`${'sent rows'.padEnd(16)} ${'ev/s w/o retention'.padStart(18)} ${'ev/s with'.padStart(10)} ${'vs first'.padStart(8)} ${'retention costs'.padStart(15)} ${'claim ms/batch'.padStart(14)}   CPU ms/1k events with retention: node / pg / broker`);
  for (const [mode, r] of results) {
    const c = r.cpuMsPer1k;
    console.log(
      `${mode.padEnd(16)} ${(r.baselineEventsPerSec !== undefined ? fmt(r.baselineEventsPerSec) : '-').padStart(18)} ${fmt(r.relayEventsPerSec).padStart(10)} ${(r.relayEventsPerSec / first.relayEventsPerSec).toFixed(2).padStart(8)} ${(r.retentionCost !== undefined ? `${(r.retentionCost * 100).toFixed(1)} %` : '-').padStart(15)} ${r.claimWaitPerBatchMs.join(' → ').padStart(14)}   ${c ? `${c.node} / ${c.postgres} / ${c.broker} (total ${cpuPer(r)})` : '-'}`,
    );
  }
  return Object.fromEntries(results.map(([mode, r]) => [mode, r]));
}

interface SustainedResult {
  seconds: number;
  invokeSeconds: number;
  retainSeconds: number;
  relayEventsPerSec: number;
  relayLastHalfEventsPerSec: number;
  baselineEventsPerSec: number | undefined;
  retentionCost: number | undefined;
  published: number;
  pruned: number;
  failures: number;
  bounded: boolean;
  claimWaitPerBatchMs: number[];
  claimIndexWalkMaxMs: number[];
  claimsSlowing: boolean;
  /** CPU ms per 1,000 events of the run with retention, producer and sampler included */
  cpuMsPer1k: { node: number; postgres: number; broker: number } | undefined;
  [figure: string]: unknown;
}

/** One way of recording sent rows: the baseline without retention, then the main run with it. */
async function sustainedOnce(ctx: RetentionBenchContext, o: SustainedOptions, seconds: number, sentRows: SentRowsWay): Promise<SustainedResult> {
  const tag = o.sentRows.length > 1 ? ` (${sentRows})` : '';
  // table names: bench_<name>_<run>; one name per mode, each table dropped at the end of its run
  const short = { keep: '', delete: 'del', 'mark-in-place': 'inpl' }[sentRows];
  const baseline = o.baselineSeconds > 0 ? await loadRun(ctx, `nore${short}`, `baseline, retention off${tag}`, o.baselineSeconds, 0, o, sentRows) : undefined;
  const main = await loadRun(ctx, `sustained${short}`, `sustained, retention on${tag}`, seconds, o.retainSeconds * 1000, o, sentRows);

  // the halves of the main run (the final sample, taken once the producer and the relay stopped, belongs to the last)
  const timed = main.samples;
  const first = timed.filter((s) => s.elapsedS <= seconds / 2);
  const last = timed.filter((s) => s.elapsedS > seconds / 2);
  const max = (xs: Sample[], f: (s: Sample) => number) => Math.max(0, ...xs.map(f));
  const figures = [
    ['rows', 'rowsMax', (s: Sample) => s.rows, fmt],
    ['dead tuples', 'deadTuplesMax', (s: Sample) => s.deadTuples, fmt],
    ['size', 'sizeMbMax', (s: Sample) => s.totalBytes / 1048576, (n: number) => `${n.toFixed(0)} MB`],
    ['overdue', 'overdueMax', (s: Sample) => s.overdue, fmt],
  ] as const;
  // bounded: the second half's peak is no higher than the first half's, give or take 15 %
  const verdicts = figures.map(([name, key, f, show]) => {
    const a = max(first, f);
    const b = max(last, f);
    return { key, first: Math.round(a), last: Math.round(b), text: `${name} ${show(a)} → ${show(b)}`, bounded: b <= a * 1.15 + 1 };
  });
  // the claim: what the loop waited for it per batch, and the walk of the claim index a claim starts with
  const claimWait = (invs: Invocation[]) => {
    const sums = invs.reduce((a, i) => ({ ms: a.ms + (i.summary?.waitedMs.claim ?? 0), batches: a.batches + (i.summary?.batches ?? 0) }), { ms: 0, batches: 0 });
    return sums.batches ? sums.ms / sums.batches : 0;
  };
  const claimFirst = claimWait(main.invocations.filter((i) => i.startS < seconds / 2));
  const claimLast = claimWait(main.invocations.filter((i) => i.startS >= seconds / 2));
  const scanFirst = max(first, (s) => s.scanMs);
  const scanLast = max(last, (s) => s.scanMs);
  const claimsSlowing = claimLast > claimFirst * 1.5 + 1;
  const midRelayed = first.at(-1)?.relayed ?? 0;
  const midAt = first.at(-1)?.elapsedS ?? 0;
  const end = timed.at(-1);
  const lastHalfRate = end && end.elapsedS > midAt ? (end.relayed - midRelayed) / (end.elapsedS - midAt) : 0;
  const cost = baseline ? 1 - main.ratePerSec / baseline.ratePerSec : undefined;

  console.log('');
  console.log(`${'run'.padEnd(28)} ${'events'.padStart(10)} ${'seconds'.padStart(8)} ${'events/s'.padStart(9)} ${'pruned'.padStart(10)}   invocations stopped`);
  for (const r of [baseline, main]) {
    if (!r) continue;
    console.log(`${r.label.padEnd(28)} ${fmt(r.published).padStart(10)} ${(r.wallMs / 1000).toFixed(0).padStart(8)} ${fmt(r.ratePerSec).padStart(9)} ${fmt(r.pruned).padStart(10)}   ${stopsText(r)}${r.failures.length ? `; ${r.failures.length} FAILED` : ''}`);
    const sampleMs = r.samples.reduce((a, x) => a + x.sampleMs, 0) / Math.max(1, r.samples.length);
    console.log(`${''.padEnd(28)} ${cpuText(r).slice(2)}; each sample took ${sampleMs.toFixed(0)} ms`);
  }
  const bounded = verdicts.every((v) => v.bounded);
  console.log(
    `\nverdict: max over the first half → the last half: ${verdicts.map((v) => `${v.text}${v.bounded ? '' : ' (GROWING)'}`).join('; ')} — ${bounded ? 'bounded, not growing' : 'NOT bounded'}. ` +
      `Claim wait per batch ${claimFirst.toFixed(1)} → ${claimLast.toFixed(1)} ms, claim-index walk (max) ${scanFirst.toFixed(1)} → ${scanLast.toFixed(1)} ms${claimsSlowing ? ' (claims SLOWING)' : ''}. ` +
      `Relay ${fmt(main.ratePerSec)} events/s with retention (last half ${fmt(lastHalfRate)})` +
      (baseline && cost !== undefined ? ` vs ${fmt(baseline.ratePerSec)} without: retention costs ${(cost * 100).toFixed(1)} %` : ''),
  );
  return {
    seconds,
    invokeSeconds: o.invokeSeconds,
    retainSeconds: o.retainSeconds,
    relayEventsPerSec: Math.round(main.ratePerSec),
    relayLastHalfEventsPerSec: Math.round(lastHalfRate),
    baselineEventsPerSec: baseline ? Math.round(baseline.ratePerSec) : undefined,
    retentionCost: cost !== undefined ? Number(cost.toFixed(3)) : undefined,
    published: main.published,
    pruned: main.pruned,
    failures: main.failures.length + (baseline?.failures.length ?? 0),
    bounded,
    claimWaitPerBatchMs: [Number(claimFirst.toFixed(1)), Number(claimLast.toFixed(1))],
    claimIndexWalkMaxMs: [Number(scanFirst.toFixed(1)), Number(scanLast.toFixed(1))],
    claimsSlowing,
    cpuMsPer1k: main.cpu
      ? {
          node: Math.round((main.cpu.node * 1e6) / main.published),
          postgres: Math.round((main.cpu.postgres * 1e6) / main.published),
          broker: Math.round((main.cpu.broker * 1e6) / main.published),
        }
      : undefined,
    ...Object.fromEntries(verdicts.map((v) => [v.key, [v.first, v.last]])),
  };
}

// ---------------------------------------------------------------------------------------------

interface ClaimTimes {
  label: string;
  ms: number[];
  median: number;
  deadTuples: number;
  autovacuums: number;
  claimIndexBytes: number;
  rows: number;
}

async function tableStats(ctx: RetentionBenchContext, t: string, table: string): Promise<{ deadTuples: number; autovacuums: number; claimIndexBytes: number; rows: number }> {
  const [r] = await ctx.sql.unsafe<{ dead: string; autovacuums: string; claim: string; rows: string }[]>(
    `SELECT s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums, pg_relation_size(to_regclass($2)) AS claim,
            (SELECT count(*) FROM ${t}) AS rows
     FROM pg_stat_user_tables s WHERE s.relid = $1::regclass`,
    [t, qualified(parseTableName(`${table}_claim_idx`))],
  );
  return { deadTuples: Number(r!.dead), autovacuums: Number(r!.autovacuums), claimIndexBytes: Number(r!.claim), rows: Number(r!.rows) };
}

/** `n` empty claims, each the relay's claim statement in a transaction of its own, then rolled back: ms each. */
async function emptyClaims(ctx: RetentionBenchContext, store: OutboxStore, t: string, table: string, label: string, n: number): Promise<ClaimTimes> {
  // stats first: the claims themselves kill dead index entries and change what is measured
  const stats = await tableStats(ctx, t, table);
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    const tx = await store.begin(new Deadline(Date.now() + 60_000));
    const rows = await tx.claim(ctx.batch);
    ms.push(performance.now() - started);
    await tx.rollback();
    if (rows.length > 0) throw new Error(`burst: the claim ${label} found ${rows.length} rows; expected none`);
  }
  const sorted = [...ms].sort((a, b) => a - b);
  return { label, ms, median: sorted[Math.floor(sorted.length / 2)]!, ...stats };
}

export async function benchBurst(ctx: RetentionBenchContext, events: number, claims: number): Promise<Record<string, unknown>> {
  process.stderr.write(`burst: ${fmt(events)} events, ~${ctx.payloadBytes}-byte payloads, ${ctx.aggregates} aggregates, batch ${ctx.batch}; ${claims} empty claims per state\n`);
  const { table, t, topic } = await freshTable(ctx, 'burst');
  const store = new OutboxStore(ctx.sql, parseTableName(table), 'hold');
  const results: ClaimTimes[] = [];
  results.push(await emptyClaims(ctx, store, t, table, 'fresh table (reference)', claims));

  const pad = 'x'.repeat(Math.max(0, ctx.payloadBytes - 40));
  for (let i = 0; i < events; i += 10_000) {
    await ctx.sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'bench', 'agg-' || ((g * 7919) % $2), 'Benchmarked', jsonb_build_object('n', g, 'pad', $3::text)
       FROM generate_series($1::int, $1::int + $4::int - 1) g ORDER BY g`,
      [i, ctx.aggregates, pad, Math.min(10_000, events - i)],
    );
  }
  // the planner's statistics, as a table in use has them (no VACUUM: autovacuum does what it does)
  await ctx.sql.unsafe(`ANALYZE ${t}`);

  // relay them all: one warm Runtime, retention off, keep mode (rows moved to the sent table)
  const relay = runtimeFor(ctx, table, topic, 0, MIN_SAFETY_MARGIN_MS);
  let published = 0;
  const relayStart = performance.now();
  while (published < events) {
    const s = await relay.invoke(600_000);
    published += s.published;
    if (s.published === 0) throw new Error(`burst: the relay stopped with ${published} of ${events} published: ${JSON.stringify(s)}`);
  }
  const relayMs = performance.now() - relayStart;
  await relay.close();
  results.push(await emptyClaims(ctx, store, t, table, `after the burst (${fmt(events)} moved to the sent table)`, claims));

  // retention with a 1 ms window, through the production path: an invocation whose loop finds
  // nothing and whose retention deletes every sent row, 5,000 per chunk
  await sleep(50);
  const pruner = runtimeFor(ctx, table, topic, 1, MIN_SAFETY_MARGIN_MS);
  const pruneStart = performance.now();
  const ps = await pruner.invoke(600_000);
  const pruneMs = performance.now() - pruneStart;
  await pruner.close();
  results.push(await emptyClaims(ctx, store, t, table, `after retention deleted them`, claims));

  const vacuumStart = performance.now();
  await ctx.sql.unsafe(`VACUUM ${t}`);
  const vacuumMs = performance.now() - vacuumStart;
  results.push(await emptyClaims(ctx, store, t, table, 'after VACUUM', claims));
  await dropTable(ctx, table, topic);

  const GOAL_MS = 20;
  console.log(
    `\nburst: relayed ${fmt(events)} in ${(relayMs / 1000).toFixed(1)} s (${fmt(events / (relayMs / 1000))} events/s); retention deleted ${fmt(ps.pruned)} in ${(pruneMs / 1000).toFixed(1)} s (${fmt(ps.pruned / (pruneMs / 1000))} rows/s); VACUUM ${(vacuumMs / 1000).toFixed(1)} s`,
  );
  console.log(
    `${`empty claim (${claims} claims)`.padEnd(40)} ${'median ms'.padStart(9)} ${'first'.padStart(8)} ${'max'.padStart(8)} ${'rows'.padStart(8)} ${'dead tup'.padStart(9)} ${'autovac'.padStart(7)} ${'claim idx MB'.padStart(12)}   goal ≤ ${GOAL_MS} ms`,
  );
  for (const r of results) {
    const max = Math.max(...r.ms);
    console.log(
      `${r.label.padEnd(40)} ${r.median.toFixed(1).padStart(9)} ${r.ms[0]!.toFixed(1).padStart(8)} ${max.toFixed(1).padStart(8)} ${fmt(r.rows).padStart(8)} ${fmt(r.deadTuples).padStart(9)} ${String(r.autovacuums).padStart(7)} ${(r.claimIndexBytes / 1048576).toFixed(1).padStart(12)}   ${r.median <= GOAL_MS ? 'met' : 'NOT met'}${max > GOAL_MS ? ` (max ${max.toFixed(0)} ms)` : ''}`,
    );
  }
  const key = ['fresh', 'afterBurst', 'afterPrune', 'afterVacuum'];
  return {
    events,
    relayEventsPerSec: Math.round(events / (relayMs / 1000)),
    pruned: ps.pruned,
    pruneRowsPerSec: Math.round(ps.pruned / (pruneMs / 1000)),
    vacuumMs: Math.round(vacuumMs),
    claimMedianMs: Object.fromEntries(results.map((r, i) => [key[i], Number(r.median.toFixed(2))])),
    claimFirstMs: Object.fromEntries(results.map((r, i) => [key[i], Number(r.ms[0]!.toFixed(2))])),
    claimMaxMs: Object.fromEntries(results.map((r, i) => [key[i], Number(Math.max(...r.ms).toFixed(2))])),
    goalMs: GOAL_MS,
  };
}
