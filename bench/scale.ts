// `npm run bench -- --only scale`: the relay with 1, 2, 4 and 8 concurrent invocations on the same
// backlog (issue 28, docs/benchmarks/scale.md). Each invocation is a process of its own
// (bench/scale-worker.ts) running invocations back to back until the backlog is drained; they
// share the work through the table's locks only, as Lambda's concurrent invocations do. Per case:
// events/s, and the CPU per event of each party (the relay processes summed, every Postgres
// process, the broker), for each Kafka client; the 4-invocation case again on a few hot
// aggregates, where the order guard lets one invocation at a time have an aggregate. Rounds are
// interleaved (every case once per round), medians printed, then the model of bench/scale-model.ts.
// Every event is read back from the topic: exactly once by id, in order per aggregate, or it fails.
// `--scale-shapes plain,partitioned` runs every case on both outboxes, `migrate`'s plain table and
// its partitioned one (OUTBOX_PARTITION_WIDTH, docs/schema.md "Partitioned outboxes"), in the same
// rounds: each case's Postgres WAL per event too, and what retention of its sent rows costs, row by
// row (the plain table) or by dropping the partition that holds them (the partitioned one).
import { fork, type ChildProcess } from 'node:child_process';
import type kafkajs from 'kafkajs';
import type { Sql } from 'postgres';
import type { KafkaClientName } from '../src/config/types.ts';
import { parseTableName, qualified, sentTable } from '../src/outbox/identifier.ts';
import { pruneSql } from '../src/outbox/sql.ts';
import { walLsn } from './debezium/peer.ts';
import { CpuMeter, processCpu } from './cpu.ts';
import { ceilings, DEFAULT_ASSUMPTIONS, eventsPerSec, medianSample, perEvent } from './scale-model.ts';
import type { Ceilings, Sample } from './scale-model.ts';
import type { ScaleWorkerReport, ScaleWorkerRequest, WorkerTotals } from './scale-worker.ts';

export interface ScaleContext {
  sql: Sql;
  kafka: kafkajs.Kafka;
  /** base environment for loadConfig (database, brokers, batch size, log level) */
  env: Record<string, string>;
  meter: CpuMeter;
  clients: KafkaClientName[];
  /** the commit measured (bench/commit.ts) */
  commit: string;
  /** a migrated, empty outbox table named after `name` and the bench's run, of that shape */
  createTable(name: string, shape?: Shape): Promise<string>;
  fillTable(table: string, events: number, aggregates: number): Promise<void>;
  createTopic(topic: string): Promise<void>;
  drop(table: string): Promise<void>;
  /** the bench's run id, for topic names */
  run(): string;
}

export interface ScaleOptions {
  events: number;
  /** concurrent invocations per case, e.g. 1,2,4,8 */
  concurrency: number[];
  aggregates: number;
  /** the hot cases: this many aggregates, with each of `hotConcurrency` invocations */
  hot: number;
  hotConcurrency: number[];
  repeat: number;
  /** the outboxes each case runs on (--scale-shapes): migrate's plain table, its partitioned one */
  shapes?: Shape[];
}

/** migrate's plain outbox, or its partitioned one (a day's partitions) */
export type Shape = 'plain' | 'partitioned';
export const SHAPES: readonly Shape[] = ['plain', 'partitioned'];

interface Case {
  client: KafkaClientName;
  invocations: number;
  aggregates: number;
  shape: Shape;
}

/** A case's round: the drain, its WAL, and retention of the rows it moved to the sent table. */
type ShapeSample = Sample & { walBytes: number; retention: { ms: number; postgresCpu?: number; walBytes: number } };

/** no invocation published anything for this long: the relays are stuck, fail rather than wait */
const STALL_MS = 60_000;

/** How a worker process starts: Node flags after `--import tsx`, environment variables added to the bench's. */
export interface WorkerStart {
  execArgv?: string[];
  env?: Record<string, string>;
}

export class Worker {
  readonly child: ChildProcess;
  private listener: ((m: ScaleWorkerReport) => void) | undefined;
  private readonly exited: Promise<void>;
  /** what the process wrote to stderr (it is passed through as well) */
  stderr = '';

  constructor(start: WorkerStart = {}) {
    this.child = fork(new URL('./scale-worker.ts', import.meta.url), {
      execArgv: ['--import', 'tsx', ...(start.execArgv ?? [])],
      env: { ...process.env, ...start.env },
      stdio: ['inherit', 'inherit', 'pipe', 'ipc'],
    });
    this.child.stderr!.on('data', (d: Buffer) => {
      this.stderr += d.toString();
      process.stderr.write(d);
    });
    this.exited = new Promise((r) => this.child.once('exit', () => r()));
  }

  onReport(listener: (m: ScaleWorkerReport) => void): void {
    this.listener = listener;
    this.child.removeAllListeners('message');
    this.child.on('message', (m: ScaleWorkerReport) => this.listener?.(m));
  }

  send(req: ScaleWorkerRequest): void {
    this.child.send(req);
  }

  cpu(): number {
    return processCpu(this.child.pid!);
  }

  async close(): Promise<void> {
    if (this.child.exitCode === null) this.send({ close: true });
    await this.exited;
  }
}

/** Starts `n` workers, each warm on `table`'s (still empty) outbox and the topic. */
export async function startWorkers(n: number, env: Record<string, string>, topic: string, start: WorkerStart = {}): Promise<Worker[]> {
  const workers = Array.from({ length: n }, () => new Worker(start));
  await Promise.all(
    workers.map(
      (w) =>
        new Promise<void>((resolve, reject) => {
          const exit = (code: number | null) => reject(new Error(`scale worker exited with ${code} before ready`));
          w.child.once('exit', exit);
          w.onReport((m) => {
            if ('ready' in m) resolve();
            else if ('error' in m) reject(new Error(`scale worker: ${m.error}`));
            else return;
            w.child.off('exit', exit);
          });
          w.send({ setup: env, topic });
        }),
    ),
  );
  return workers;
}

/** Lets the workers relay until `events` rows were published, then stops them: invocations and empty ones. */
export async function drain(workers: Worker[], events: number): Promise<WorkerTotals & { published: number }> {
  let published = 0;
  let last = Date.now();
  const totals: WorkerTotals = { invocations: 0, empty: 0, heldBack: 0, waitedMs: { claim: 0, publish: 0, commit: 0 } };
  const exit = (code: number | null) => fail(new Error(`scale worker exited with ${code} while relaying`));
  let fail: (err: Error) => void = () => undefined;
  const drained = new Promise<void>((resolve, reject) => {
    let done = 0;
    let stopped = false;
    const stall = setInterval(() => {
      if (Date.now() - last <= STALL_MS) return;
      reject(new Error(`scale: ${published} of ${events} events published, none for ${STALL_MS / 1000} s`));
    }, 1_000);
    const finish = (err?: Error) => {
      clearInterval(stall);
      if (err) reject(err);
      else resolve();
    };
    fail = finish;
    for (const w of workers) {
      w.child.once('exit', exit);
      w.onReport((m) => {
        if ('error' in m) return finish(new Error(`scale worker: ${m.error}`));
        if ('published' in m) {
          published += m.published;
          if (m.published > 0) last = Date.now();
          if (published >= events && !stopped) {
            stopped = true;
            for (const x of workers) x.send({ stop: true });
          }
        } else if ('done' in m) {
          totals.invocations += m.done.invocations;
          totals.empty += m.done.empty;
          totals.heldBack += m.done.heldBack;
          for (const k of ['claim', 'publish', 'commit'] as const) totals.waitedMs[k] += m.done.waitedMs[k];
          if (++done === workers.length) finish();
        }
      });
      w.send({ go: true });
    }
  });
  try {
    await drained;
  } finally {
    for (const w of workers) w.child.off('exit', exit);
  }
  return { ...totals, published };
}

/**
 * Reads the topic back: every row's id exactly once, each aggregate's events in the order of their
 * rows (the payload's `n` grows with seq), `events` in all. Throws what it found otherwise.
 */
export async function readBack(kafka: kafkajs.Kafka, topic: string, events: number): Promise<void> {
  const ids = new Set<string>();
  const lastN = new Map<string, number>();
  const problems: string[] = [];
  let count = 0;
  const consumer = kafka.consumer({ groupId: `${topic}.check`, maxWaitTimeInMs: 50 });
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true });
    let last = Date.now();
    await consumer.run({
      // eslint-disable-next-line @typescript-eslint/require-await -- kafkajs wants a promise-returning handler
      eachMessage: async ({ message }) => {
        count++;
        last = Date.now();
        const id = message.headers?.id?.toString() ?? '';
        if (ids.has(id) && problems.length < 5) problems.push(`id ${id} twice`);
        ids.add(id);
        const key = message.key?.toString() ?? '';
        const n = (JSON.parse(message.value!.toString()) as { n: number }).n;
        const before = lastN.get(key) ?? -1;
        if (before >= n && problems.length < 5) problems.push(`aggregate ${key}: event ${n} after ${before}`);
        lastN.set(key, n);
      },
    });
    while (count < events && Date.now() - last < 20_000) await new Promise((r) => setTimeout(r, 50));
    // a duplicate would arrive after the count is reached: give it a moment to show
    await new Promise((r) => setTimeout(r, 200));
  } finally {
    await consumer.disconnect();
  }
  if (count !== events || ids.size !== events) {
    problems.unshift(`${count} messages, ${ids.size} distinct ids read back for ${events} events`);
  }
  if (problems.length) throw new Error(`scale, topic ${topic}: ${problems.join('; ')}`);
}

async function measure(ctx: ScaleContext, c: Case, events: number, round: number): Promise<ShapeSample> {
  const name = `scale${c.client.slice(0, 2)}${c.invocations}a${c.aggregates}${c.shape === 'plain' ? '' : 'p'}r${round}`;
  const table = await ctx.createTable(name, c.shape);
  const topic = `bench.${ctx.run()}.${name}`;
  await ctx.createTopic(topic);
  const env = {
    ...ctx.env,
    OUTBOX_TABLE: table,
    OUTBOX_TOPIC_TEMPLATE: topic,
    OUTBOX_KAFKA_CLIENT: c.client,
    OUTBOX_METRICS: 'off',
  };
  const workers = await startWorkers(c.invocations, env, topic);
  try {
    await ctx.fillTable(table, events, c.aggregates);
    const relayCpu0 = workers.reduce((s, w) => s + w.cpu(), 0);
    const cpu0 = ctx.meter.available ? ctx.meter.sample() : undefined;
    const wal0 = await walLsn(ctx.sql);
    const start = performance.now();
    const { invocations, empty, heldBack, waitedMs, published } = await drain(workers, events);
    const ms = performance.now() - start;
    const cpu1 = cpu0 ? CpuMeter.diff(cpu0, ctx.meter.sample()) : undefined;
    const walBytes = Number((await walLsn(ctx.sql)) - wal0);
    const relay = workers.reduce((s, w) => s + w.cpu(), 0) - relayCpu0;
    // the count check of every bench: the relays published each event once, no more, no fewer
    if (published !== events) throw new Error(`scale ${name}: the invocations published ${published} of ${events}`);
    const t = qualified(parseTableName(table));
    const [left] = await ctx.sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t}`);
    if (left!.n !== 0) throw new Error(`scale ${name}: ${left!.n} rows left in the outbox once drained`);
    await readBack(ctx.kafka, topic, events);
    const cpu = cpu1 ? { relay, postgres: cpu1.postgres, broker: cpu1.broker } : undefined;
    const invocationsAtOnce = c.invocations;
    const retention = await retire(ctx, table, c.shape, events);
    return { events, ms, invocations, empty, heldBack, waitedMs, invocationsAtOnce, ...(cpu ? { cpu } : {}), walBytes, retention };
  } finally {
    await Promise.all(workers.map((w) => w.close()));
    await ctx.drop(table);
  }
}

/**
 * Retention of the `events` rows the drain moved to the sent table, all at once: the plain table's
 * by the relay's own chunks (pruneSql, a 0 ms window, 5,000 rows a transaction, as
 * src/loop/retention.ts runs them); the partitioned table's by detaching and dropping the
 * partitions that hold them, as its maintenance function does once they are older than the window
 * (no partition ages during a bench, so the statements are run here). Its time, Postgres CPU and WAL.
 */
async function retire(ctx: ScaleContext, table: string, shape: Shape, events: number): Promise<ShapeSample['retention']> {
  const name = parseTableName(table);
  const sent = qualified(sentTable(name));
  // the partitions that hold sent rows, and how many (the check below), read before the clock starts
  const held: Array<{ part: string; n: number }> = [];
  if (shape === 'partitioned') {
    const parts = await ctx.sql.unsafe<{ part: string }[]>(
      `SELECT c.oid::regclass::text AS part FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
       WHERE h.inhparent = $1::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT'`, [sent]);
    for (const { part } of parts) held.push({ part, n: (await ctx.sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${part}`))[0]!.n });
  }
  const cpu0 = ctx.meter.available ? ctx.meter.sample() : undefined;
  const wal0 = await walLsn(ctx.sql);
  const start = performance.now();
  let retired = 0;
  if (shape === 'plain') {
    const chunk = pruneSql(qualified(name), sent, 'sent');
    for (;;) {
      const [row] = await ctx.sql.unsafe<{ affected: string }[]>(chunk, [0, 5_000]);
      const n = Number(row!.affected);
      retired += n;
      if (n < 5_000) break;
    }
  } else {
    await ctx.sql.begin(async (tx) => {
      for (const { part, n } of held.filter((h) => h.n > 0)) {
        await tx.unsafe(`ALTER TABLE ${sent} DETACH PARTITION ${part}`);
        await tx.unsafe(`DROP TABLE ${part}`);
        retired += n;
      }
    });
  }
  const ms = performance.now() - start;
  const cpu = cpu0 ? CpuMeter.diff(cpu0, ctx.meter.sample()).postgres : undefined;
  const walBytes = Number((await walLsn(ctx.sql)) - wal0);
  if (retired !== events) throw new Error(`scale ${table}: retention retired ${retired} sent rows of ${events}`);
  return { ms, ...(cpu === undefined ? {} : { postgresCpu: cpu }), walBytes };
}

/** where the invocations' time went: claim, publish, commit, as shares of the wall time × invocations */
function waitedShares(s: Sample): string {
  const total = s.ms * (s.invocationsAtOnce ?? 1);
  return (['claim', 'publish', 'commit'] as const).map((k) => `${k} ${(s.waitedMs![k] / total).toFixed(2)}`).join(', ');
}

const label = (c: Case) =>
  `${c.client}, ${c.invocations} invocation${c.invocations > 1 ? 's' : ''}, ${c.aggregates} aggregates${c.shape === 'plain' ? '' : `, ${c.shape}`}`;
const msPer1k = (seconds: number) => Math.round(seconds * 1e6);

/** one line of the table: each cell right-aligned to its column's width (the first left-aligned) */
const WIDTHS = [13, 4, 6, 10, 14, 5, 7, 5, 7, 6, 6, 14, 8, 7, 13];
const line = (cells: Array<string | number>) =>
  cells.map((c, i) => (i === 0 ? String(c).padEnd(WIDTHS[0]!) : String(c).padStart(WIDTHS[i]!))).join('');

export async function benchScale(ctx: ScaleContext, o: ScaleOptions): Promise<Record<string, unknown>> {
  for (const n of [...o.concurrency, ...o.hotConcurrency, o.hot, o.aggregates, o.events]) {
    if (Number.isInteger(n) && n >= 1) continue;
    throw new Error(`--only scale: ${n} is not a positive whole number; check the --scale-* options`);
  }
  const shapes = o.shapes ?? ['plain'];
  for (const shape of shapes) if (!SHAPES.includes(shape)) throw new Error(`--scale-shapes: unknown '${shape}'; choose from ${SHAPES.join(', ')}`);
  const cases: Case[] = ctx.clients.flatMap((client) => shapes.flatMap((shape) => [
    ...o.concurrency.map((invocations) => ({ client, invocations, aggregates: o.aggregates, shape })),
    ...o.hotConcurrency.map((invocations) => ({ client, invocations, aggregates: o.hot, shape })),
  ]));
  console.log(`bench: commit ${ctx.commit}, ${new Date().toISOString()}`);
  process.stderr.write(
    `scale: ${o.events} events per case, ${cases.length} cases (${o.concurrency.join(', ')} invocations on ` +
      `${o.aggregates} aggregates, ${o.hotConcurrency.join(', ')} on ${o.hot} hot ones; clients ` +
      `${ctx.clients.join(', ')}), ${o.repeat} rounds interleaved (medians)\n`,
  );
  const samples = new Map<Case, ShapeSample[]>(cases.map((c) => [c, []]));
  for (let round = 0; round < o.repeat; round++) {
    for (const c of cases) {
      const s = await measure(ctx, c, o.events, round);
      samples.get(c)!.push(s);
      const pe = perEvent(s);
      const ms = pe && ([pe.relay, pe.postgres, pe.broker].map(msPer1k) as [number, number, number]);
      const cpu = ms ? `  cpu ms/1k: relay ${ms[0]} pg ${ms[1]} broker ${ms[2]}` : '';
      process.stderr.write(
        `  round ${round + 1}/${o.repeat} ${label(c)}: ${Math.round(eventsPerSec(s))} events/s${cpu}, ${Math.round(s.walBytes / s.events)} B WAL/event, ` +
          `retention ${retentionFigures(s)}, ` +
          `${s.invocations} invocations (${s.empty} empty), ${s.heldBack} rows held back\n` +
          `      per invocation-second waited: ${waitedShares(s)}\n`,
      );
    }
  }
  return report(cases, samples, o);
}

/** retention's figures of a round, per event: µs of Postgres CPU, bytes of WAL */
const retentionPerEvent = (s: ShapeSample) => ({
  ...(s.retention.postgresCpu === undefined ? {} : { postgresCpuUs: Number(((s.retention.postgresCpu / s.events) * 1e6).toFixed(2)) }),
  walBytes: Number((s.retention.walBytes / s.events).toFixed(2)),
  ms: Math.round(s.retention.ms),
});
const retentionFigures = (s: ShapeSample) => {
  const r = retentionPerEvent(s);
  return `${r.ms} ms${r.postgresCpuUs === undefined ? '' : `, pg ${r.postgresCpuUs} µs/event`}, ${r.walBytes} B WAL/event`;
};

function report(cases: Case[], samples: Map<Case, ShapeSample[]>, o: ScaleOptions): Record<string, unknown> {
  const medians = new Map(cases.map((c) => [c, medianSample(samples.get(c)!) as ShapeSample & { min: number; max: number }]));
  console.log(`\nscale: ${o.events} events per case, median of ${o.repeat} (range); cpu in ms per 1,000 events; ` +
    'cores = CPU seconds / wall seconds;\ninv(ocations) (empty: published nothing), ' +
    "held: rows claimed but held back behind another invocation's");
  console.log(line(['client', 'inv', 'aggs', 'events/s', 'range', 'x1', 'relay', 'pg', 'broker', 'total', 'cores']
    .concat(['inv (empty)', 'held', 'WAL B', 'shape'])));
  const rows = cases.map((c) => {
    const m = medians.get(c)!;
    const alone = cases.find((x) => x.client === c.client && x.invocations === 1 && x.aggregates === c.aggregates && x.shape === c.shape);
    const rate = eventsPerSec(m);
    const speedup = rate / eventsPerSec(medians.get(alone ?? c)!);
    const pe = perEvent(m);
    const total = pe && pe.relay + pe.postgres + pe.broker;
    const cpu = pe ? [pe.relay, pe.postgres, pe.broker, total!].map(msPer1k) : ['', '', '', ''];
    const cores = m.cpu ? ((m.cpu.relay + m.cpu.postgres + m.cpu.broker) / (m.ms / 1000)).toFixed(2) : '';
    const range = `${Math.round(m.min)}-${Math.round(m.max)}`;
    const invocations = `${m.invocations} (${m.empty})`;
    const walPerEvent = Math.round(m.walBytes / m.events);
    const figures = [Math.round(rate), range, speedup.toFixed(2), ...cpu, cores, invocations, m.heldBack, walPerEvent, c.shape];
    console.log(line([c.client, c.invocations, c.aggregates, ...figures]));
    return {
      ...c,
      eventsPerSec: Math.round(rate),
      min: Math.round(m.min),
      max: Math.round(m.max),
      speedup: Number(speedup.toFixed(2)),
      ...(pe && { cpuMsPer1k: { relay: cpu[0], postgres: cpu[1], broker: cpu[2] } }),
      invocationsRun: m.invocations,
      emptyInvocations: m.empty,
      heldBack: m.heldBack,
      walBytesPerEvent: walPerEvent,
      retentionPerEvent: retentionPerEvent(m),
    };
  });
  if (new Set(cases.map((c) => c.shape)).size > 1) {
    console.log("\nretention of each case's sent rows (median round): plain by row chunks, partitioned by dropping their partition");
    for (const c of cases) console.log(`  ${label(c)}: ${retentionFigures(medians.get(c)!)}`);
  }
  return { events: o.events, rounds: o.repeat, cases: rows, model: printModel(cases, medians, o.aggregates) };
}

/**
 * The model from the least and the most concurrent case on many aggregates: the CPU per event of
 * one invocation alone, and what scale-out paid on this machine (docs/benchmarks/scale.md).
 */
function printModel(cases: Case[], medians: Map<Case, Sample>, aggregates: number): Record<string, Ceilings> {
  const a = DEFAULT_ASSUMPTIONS;
  const model: Record<string, Ceilings> = {};
  console.log(`\nmodel: ${a.utilization * 100}% of the vCPUs; replication factor ${a.replicationFactor}; ` +
    `Lambda 512 MB = ${a.lambdaVcpu.toFixed(2)} vCPU (docs/benchmarks/scale.md)`);
  for (const client of new Set(cases.map((c) => c.client))) {
    const many = cases.filter((c) => c.client === client && c.aggregates === aggregates);
    for (const from of new Set([many[0]!, many.at(-1)!])) {
      const pe = perEvent(medians.get(from)!);
      if (!pe) continue;
      const m = (model[`${client}@${from.invocations}`] = ceilings(pe, a));
      const rds = m.rds.map((r) => `${r.name} (${r.vcpus}) ${r.eventsPerSec}`).join(', ');
      const msk = m.msk.map((b) => `${b.brokers} × ${b.name} ${b.eventsPerSec}`).join(', ');
      console.log(`${label(from)}:`);
      console.log(`  database: ${m.perDbVcpu} events/s per vCPU of the primary → ${rds}`);
      console.log(`  brokers:  ${m.perBrokerVcpu} events/s per broker vCPU → ${msk}`);
      console.log(`  relay:    ${m.perInvocation} events/s per invocation's CPU → ` +
        `${m.invocationsForSmallestRds} invocations to reach ${m.rds[0]!.name}'s ceiling`);
    }
  }
  return model;
}
