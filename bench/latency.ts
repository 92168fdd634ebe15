// Latency of an event, from its row's created_at to its append on the broker, in exit and linger
// modes (`npm run bench:latency`). For each mode and rate:
//   - a fresh outbox table and a topic that stamps each record with the broker's append time
//     (message.timestamp.type=LogAppendTime);
//   - the application (bench/rate-producer-worker.ts): R events/s for T seconds, small
//     transactions through the project's enqueue helper;
//   - the schedule, as EventBridge fires it but compressed (every --period seconds instead of 60,
//     each invocation given --timeout seconds, --margin of it kept as the safety margin), on two
//     containers that take turns (bench/relay-worker.ts, one warm Runtime per worker thread), as
//     Lambda runs overlapping invocations in separate containers;
//   - a consumer reading each record's append time; created_at comes from the table afterwards.
// Prints p50/p95/p99/max per case, the backlog, each mode's CPU per event, and the monthly cost
// table (bench/cost.ts); writes bench/results/latency.json and latency.svg (latency and backlog
// over time, one line per case), each naming the commit measured, the date and the producer's
// achieved rate (the machine's own speed in the same run: a producer that could not hold the
// rate is said so). Fails (exit 1) when fewer events were measured than were sent, or a figure is
// not a number. `--smoke`: a few seconds of each case, written to a temporary folder (.ci/run).
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { parseArgs } from 'node:util';
import { Worker } from 'node:worker_threads';
import kafkajs from 'kafkajs';
import postgres from 'postgres';
import { parseTableName, qualified, sentTable } from '../src/outbox/identifier.ts';
import { dropOutbox, migrate } from '../src/outbox/migrate.ts';
import { lineChart, type Series } from './chart.ts';
import { costRow, PRICE, type CostInputs } from './cost.ts';
import { measuredCommit } from './commit.ts';
import { CpuMeter, type CpuSample } from './cpu.ts';
import type { RateProducerData } from './rate-producer-worker.ts';
import type { RelayWorkerAnswer, RelayWorkerRequest } from './relay-worker.ts';

const { Kafka, logLevel } = kafkajs;

const { values } = parseArgs({
  options: {
    rates: { type: 'string', default: '200,2000' },
    modes: { type: 'string', default: 'exit,linger' },
    seconds: { type: 'string', default: '40' },
    period: { type: 'string', default: '10' },
    timeout: { type: 'string', default: '12' },
    margin: { type: 'string', default: '1.25' },
    wake: { type: 'string', default: 'notify' },
    payload: { type: 'string', default: '1000' },
    aggregates: { type: 'string', default: '1000' },
    partitions: { type: 'string', default: '6' },
    out: { type: 'string' },
    // a few seconds per case, results to a temporary folder: that the bench still measures (CI)
    smoke: { type: 'boolean', default: false },
  },
});
if (values.smoke) Object.assign(values, { rates: '50', seconds: '3', period: '2', timeout: '4', aggregates: '50' });
const OUT: string = values.out ?? (values.smoke ? `${tmpdir()}/outbox-relay-bench-smoke` : new URL('./results', import.meta.url).pathname);
/** the commit measured, as every published figure names it */
const COMMIT = measuredCommit();
const RATES = values.rates.split(',').map(Number);
const MODES = values.modes.split(',') as Array<'exit' | 'linger'>;
const SECONDS = Number(values.seconds);
const PERIOD_MS = Number(values.period) * 1000;
const TIMEOUT_MS = Number(values.timeout) * 1000;
const MARGIN_MS = Number(values.margin) * 1000;
/** the producer starts once the first invocation is under way */
const LEAD_MS = 2_000;
const SAMPLE_MS = 250;

const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox';
const KAFKA_BROKERS = process.env.KAFKA_BROKERS ?? '127.0.0.1:9092';
const sql = postgres(DATABASE_URL, { max: 2, onnotice: () => undefined });
const kafka = new Kafka({ clientId: 'bench-latency', brokers: KAFKA_BROKERS.split(','), logLevel: logLevel.NOTHING });
const meter = new CpuMeter(new URL('../.cache/run', import.meta.url).pathname);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)));
const run = Date.now().toString(36);

interface CaseResult {
  mode: 'exit' | 'linger';
  rate: number;
  /** events the producer committed */
  sent: number;
  /** the rate the producer achieved, events/s: below `rate`, the machine could not hold it */
  producedRate: number;
  events: number;
  duplicates: number;
  p50: number;
  p95: number;
  p99: number;
  max: number;
  /** pending rows sampled every SAMPLE_MS: [seconds, rows] */
  backlog: Array<[number, number]>;
  /** the latest event's latency per second of creation: [seconds, ms] */
  latencyBySecond: Array<[number, number]>;
  invocations: number;
  failedInvocations: number;
  /** sum of the invocations' durations, seconds: what Lambda bills */
  billedSeconds: number;
  /** the relay's own threads' CPU per event, seconds */
  relayCpuPerEvent: number;
  cpu?: CpuSample;
  wakeups: { notified: number; probe: number; reclaim: number };
}

/** One container: a warm Runtime in a worker thread; one invocation at a time, as on Lambda. */
class Container {
  private readonly worker: Worker;
  private pending: ((a: RelayWorkerAnswer) => void) | undefined;
  busy = false;

  constructor(env: Record<string, string>) {
    this.worker = new Worker(new URL('./relay-worker.ts', import.meta.url), { workerData: env });
    this.worker.on('message', (a: RelayWorkerAnswer) => this.pending?.(a));
    this.worker.on('error', (err) => {
      throw err;
    });
  }

  async invoke(remainingMs: number): Promise<RelayWorkerAnswer> {
    this.busy = true;
    try {
      const answer = new Promise<RelayWorkerAnswer>((resolve) => (this.pending = resolve));
      this.worker.postMessage({ invoke: remainingMs } satisfies RelayWorkerRequest);
      return await answer;
    } finally {
      this.busy = false;
    }
  }

  async close(): Promise<void> {
    const exited = new Promise((r) => this.worker.once('exit', r));
    this.worker.postMessage({ close: true } satisfies RelayWorkerRequest);
    await exited;
  }
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

async function freshCase(name: string): Promise<{ table: string; t: string; topic: string }> {
  const table = `bench_lat_${name}_${run}`;
  await migrate(sql, parseTableName(table));
  const topic = `bench.${run}.lat.${name}`;
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({
    waitForLeaders: true,
    topics: [{ topic, numPartitions: Number(values.partitions), replicationFactor: 1, configEntries: [{ name: 'message.timestamp.type', value: 'LogAppendTime' }] }],
  });
  await admin.disconnect();
  return { table, t: qualified(parseTableName(table)), topic };
}

async function dropCase(table: string, topic: string): Promise<void> {
  await dropOutbox(sql, parseTableName(table));
  const admin = kafka.admin();
  await admin.connect();
  await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
  await admin.disconnect();
}

async function runCase(mode: 'exit' | 'linger', rate: number): Promise<CaseResult> {
  const name = `${mode}_${rate}`;
  const { table, t, topic } = await freshCase(name);
  const env = {
    DATABASE_URL,
    KAFKA_BROKERS,
    OUTBOX_TABLE: table,
    OUTBOX_TOPIC_TEMPLATE: topic,
    OUTBOX_IDLE: mode,
    // a pooler in between (DATABASE_PREPARE=false) is what makes a lingering invocation poll
    DATABASE_PREPARE: String(values.wake === 'notify'),
    OUTBOX_SAFETY_MARGIN_MS: String(MARGIN_MS),
    OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0',
    OUTBOX_METRICS: 'off',
    OUTBOX_LOG_LEVEL: 'warn',
    OUTBOX_CLIENT_ID: 'outbox-relay-bench',
  };
  const containers = [new Container(env), new Container(env)];
  const total = Math.round(rate * SECONDS);

  // the consumer: each record's append time (LogAppendTime), by row id
  const appended = new Map<string, number>();
  let duplicates = 0;
  const consumer = kafka.consumer({ groupId: `bench-lat-${name}-${run}`, maxWaitTimeInMs: 20 });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const joined = new Promise<void>((r) => consumer.on(consumer.events.GROUP_JOIN, () => r()));
  await consumer.run({
    // eslint-disable-next-line @typescript-eslint/require-await -- kafkajs wants a promise-returning handler
    eachMessage: async ({ message }) => {
      const id = message.headers?.id?.toString() ?? '';
      if (appended.has(id)) duplicates++;
      else appended.set(id, Number(message.timestamp));
    },
  });
  await joined;

  const started = Date.now();
  const cpu0 = meter.available ? meter.sample() : undefined;
  const answers: RelayWorkerAnswer[] = [];
  const invocations: Promise<void>[] = [];
  let throttled = 0;
  // the schedule: invocation k at k × period, on container k mod 2 (or the other, if still busy)
  const scheduling = (async () => {
    for (let k = 0; ; k++) {
      await sleep(started + k * PERIOD_MS - Date.now());
      if (appended.size >= total) return;
      const c = containers[k % 2]!.busy ? containers[(k + 1) % 2]! : containers[k % 2]!;
      if (c.busy) {
        throttled++;
        continue;
      }
      invocations.push(c.invoke(TIMEOUT_MS).then((a) => void answers.push(a)));
    }
  })();

  // the backlog, sampled
  const backlog: Array<[number, number]> = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t} WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL`);
      backlog.push([(Date.now() - started) / 1000, r!.n]);
      await sleep(SAMPLE_MS);
    }
  })();

  await sleep(LEAD_MS);
  const counter = new SharedArrayBuffer(8);
  const producer = new Worker(new URL('./rate-producer-worker.ts', import.meta.url), {
    workerData: { url: DATABASE_URL, table, rate, seconds: SECONDS, aggregates: Number(values.aggregates), payloadBytes: Number(values.payload), committed: counter } satisfies RateProducerData,
  });
  await new Promise<void>((resolve, reject) => {
    producer.once('error', reject);
    producer.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`the producer worker exited with ${code}`))));
  });
  const producedBy = Date.now();
  const producerLate = (producedBy - started - LEAD_MS) / 1000 - SECONDS;
  const producedRate = total / ((producedBy - started - LEAD_MS) / 1000);
  // every event on the broker (the schedule goes on until then), then the running invocations end
  while (appended.size < total) {
    if (Date.now() - producedBy > 3 * PERIOD_MS + TIMEOUT_MS) throw new Error(`${name}: ${appended.size} of ${total} events on the broker ${Math.round((Date.now() - producedBy) / 1000)} s after the producer finished`);
    await sleep(50);
  }
  const cpu = cpu0 ? CpuMeter.diff(cpu0, meter.sample()) : undefined;
  await scheduling;
  await Promise.all(invocations);
  sampling = false;
  await sampler;
  await consumer.disconnect();
  await Promise.all(containers.map((c) => c.close()));

  // latency: append time - created_at, per event. A sent row is in the sent table (keep mode,
  // retention off here), any other still in the outbox: both are read.
  const sent = qualified(sentTable(parseTableName(table)));
  const created = await sql.unsafe<{ id: string; c: number }[]>(
    `SELECT id::text, (extract(epoch FROM created_at) * 1000)::float8 AS c FROM ${t}
     UNION ALL SELECT id::text, (extract(epoch FROM created_at) * 1000)::float8 FROM ${sent}`,
  );
  // every event sent must be measured: a bench that reads the wrong table measures nothing
  if (created.length !== total) throw new Error(`${name}: ${created.length} rows found for the ${total} events produced`);
  const missing = created.filter((r) => !appended.has(r.id)).length;
  if (missing > 0) throw new Error(`${name}: ${missing} of ${total} events have no append time on the broker`);
  const lat: Array<[number, number]> = created.map((r) => [r.c, appended.get(r.id)! - r.c]);
  const sorted = lat.map(([, l]) => l).sort((a, b) => a - b);
  const bySecond = new Map<number, number>();
  for (const [c, l] of lat) {
    const s = Math.floor((c - started) / 1000);
    bySecond.set(s, Math.max(bySecond.get(s) ?? 0, l));
  }
  const summaries = answers.filter((a) => a.summary).map((a) => a.summary as { wakeups?: CaseResult['wakeups'] });
  const wakeups = { notified: 0, probe: 0, reclaim: 0 };
  for (const s of summaries) for (const k of Object.keys(wakeups) as Array<keyof typeof wakeups>) wakeups[k] += s.wakeups?.[k] ?? 0;
  await dropCase(table, topic);
  if (throttled) process.stderr.write(`  ${name}: ${throttled} scheduled invocations found both containers busy (not run)\n`);
  if (producerLate > 1) process.stderr.write(`  ${name}: the producer finished ${producerLate.toFixed(1)} s late (rate not held)\n`);
  return {
    mode,
    rate,
    sent: total,
    producedRate,
    events: sorted.length,
    duplicates,
    p50: percentile(sorted, 50),
    p95: percentile(sorted, 95),
    p99: percentile(sorted, 99),
    max: sorted[sorted.length - 1]!,
    backlog,
    latencyBySecond: [...bySecond].sort((a, b) => a[0] - b[0]),
    invocations: answers.length,
    failedInvocations: answers.filter((a) => a.error).length,
    billedSeconds: answers.reduce((s, a) => s + (a.endedAt - a.startedAt) / 1000, 0),
    relayCpuPerEvent: answers.reduce((s, a) => s + a.cpu, 0) / total,
    cpu,
    wakeups,
  };
}

/** A warm invocation with nothing to do, in exit mode: the fixed part of every exit-mode invocation (median of 15). */
async function emptyInvocationSeconds(): Promise<number> {
  const { table, topic } = await freshCase('empty');
  const c = new Container({ DATABASE_URL, KAFKA_BROKERS, OUTBOX_TABLE: table, OUTBOX_TOPIC_TEMPLATE: topic, OUTBOX_METRICS: 'off', OUTBOX_LOG_LEVEL: 'warn', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0' });
  const ds: number[] = [];
  for (let i = 0; i < (values.smoke ? 4 : 16); i++) {
    const a = await c.invoke(TIMEOUT_MS);
    if (i > 0) ds.push((a.endedAt - a.startedAt) / 1000);
  }
  await c.close();
  await dropCase(table, topic);
  return ds.sort((a, b) => a - b)[Math.floor(ds.length / 2)]!;
}

const fmtMs = (ms: number) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`);
const COLORS: Record<string, string> = { exit: '#d62728', linger: '#1f77b4' };

async function main(): Promise<void> {
  const machine = `${availableParallelism()} cores (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Node ${process.version}`;
  process.stderr.write(
    `bench:latency: ${MODES.join(', ')} × ${RATES.join(', ')} events/s, ${SECONDS} s each; schedule every ${PERIOD_MS / 1000} s, timeout ${TIMEOUT_MS / 1000} s, margin ${MARGIN_MS / 1000} s (EventBridge's minute compressed); wake=${values.wake}; ${machine}\n`,
  );
  const results: CaseResult[] = [];
  for (const rate of RATES) {
    for (const mode of MODES) {
      process.stderr.write(`  ${mode} at ${rate}/s …\n`);
      const r = await runCase(mode, rate);
      // a figure that is not a number means the bench measured nothing: fail, never print NaN
      for (const [k, v] of Object.entries({ p50: r.p50, p95: r.p95, p99: r.p99, max: r.max, relayCpuPerEvent: r.relayCpuPerEvent })) {
        if (!Number.isFinite(v)) throw new Error(`${mode} at ${rate}/s: ${k} is ${v} (${r.events} events measured of ${r.sent})`);
      }
      results.push(r);
      process.stderr.write(`    p50 ${fmtMs(r.p50)}  p95 ${fmtMs(r.p95)}  p99 ${fmtMs(r.p99)}  max ${fmtMs(r.max)}  (${r.events} events, ${r.duplicates} duplicates, ${r.invocations} invocations, ${r.failedInvocations} failed)\n`);
    }
  }
  const emptyS = await emptyInvocationSeconds();

  console.log(`\nlatency: created_at → append on the broker (LogAppendTime); schedule every ${PERIOD_MS / 1000} s (EventBridge: 60 s), timeout ${TIMEOUT_MS / 1000} s; ${machine}`);
  console.log(`commit ${COMMIT}, ${new Date().toISOString()}${values.smoke ? ' (smoke: a few seconds per case, not a measurement)' : ''}`);
  for (const r of results) {
    const held = r.producedRate >= 0.95 * r.rate;
    console.log(`  ${r.mode} ${r.rate}/s: the producer achieved ${Math.round(r.producedRate)} events/s${held ? '' : ' — it could not hold the rate on this machine: the figures below are for a lower load'}`);
  }
  console.log(`${'mode'.padEnd(8)}${'events/s'.padStart(9)}${'events'.padStart(9)}${'p50'.padStart(10)}${'p95'.padStart(10)}${'p99'.padStart(10)}${'max'.padStart(10)}${'backlog max'.padStart(13)}${'invocations'.padStart(13)}${'relay cpu/event'.padStart(17)}  wakeups (notified/probe/reclaim)`);
  for (const r of results) {
    const maxBacklog = Math.max(...r.backlog.map(([, n]) => n));
    console.log(
      `${r.mode.padEnd(8)}${String(r.rate).padStart(9)}${String(r.events).padStart(9)}${fmtMs(r.p50).padStart(10)}${fmtMs(r.p95).padStart(10)}${fmtMs(r.p99).padStart(10)}${fmtMs(r.max).padStart(10)}${String(maxBacklog).padStart(13)}${`${r.invocations}${r.failedInvocations ? ` (${r.failedInvocations} failed)` : ''}`.padStart(13)}${`${(r.relayCpuPerEvent * 1e6).toFixed(0)} µs`.padStart(17)}  ${r.mode === 'linger' ? `${r.wakeups.notified}/${r.wakeups.probe}/${r.wakeups.reclaim}` : '-'}`,
    );
  }
  for (const r of results) if (r.duplicates) console.log(`  ${r.mode} ${r.rate}/s: ${r.duplicates} duplicates on the broker`);

  // the cost table: each mode's CPU per event as measured at each rate (batches grow with the rate,
  // so the CPU per event falls; a lingering invocation also spends CPU on every wake)
  const measured = (mode: 'exit' | 'linger', rate: number) => results.find((r) => r.mode === mode && r.rate === rate)?.relayCpuPerEvent;
  const inputs = (rate: number, cpuPerEvent: number): CostInputs => ({ rate, cpuPerEvent, emptyInvocationS: emptyS, periodS: 60, lingerTimeoutS: 70, marginS: 3 });
  console.log(`\nmonthly cost on Lambda, schedule rate(1 minute): arm64 at ${PRICE.gbSecond} $/GB-s + ${PRICE.perRequest * 1e6} $/1M requests (${PRICE.source})`);
  console.log(`exit: a warm invocation that finds nothing takes ${fmtMs(emptyS * 1000)}, plus each event's CPU measured here at that rate, scaled by the function's vCPU share (memory / 1,769 MB);`);
  console.log(`linger: timeout 70 s, margin 3 s (67 s billed per invocation). cpu = the share of the function's vCPU relaying that rate takes (near 100%: it cannot keep up)`);
  console.log(`${'mode'.padEnd(8)}${'memory'.padStart(8)}${RATES.map((r) => `${`${r}/s: GB-s`.padStart(18)}${'$/month'.padStart(9)}${'cpu'.padStart(6)}`).join('')}`);
  const costs: Array<ReturnType<typeof costRow> & { rate: number; cpuPerEvent: number }> = [];
  for (const mode of ['exit', 'linger'] as const) {
    for (const mb of [256, 512, 1024]) {
      const cells = RATES.map((rate) => {
        const cpuPerEvent = measured(mode, rate);
        if (cpuPerEvent === undefined) return `${'-'.padStart(18)}${'-'.padStart(9)}${'-'.padStart(6)}`;
        const c = costRow(mode, mb, inputs(rate, cpuPerEvent));
        costs.push({ ...c, rate, cpuPerEvent });
        return `${Math.round(c.gbSecondsPerMonth).toLocaleString('en-US').padStart(18)}${c.dollarsPerMonth.toFixed(2).padStart(9)}${`${Math.round(c.cpuShareUsed * 100)}%`.padStart(6)}`;
      });
      console.log(`${mode.padEnd(8)}${`${mb} MB`.padStart(8)}${cells.join('')}`);
    }
  }

  mkdirSync(OUT, { recursive: true });
  const xMax = Math.max(...results.flatMap((r) => r.backlog.map(([s]) => s)));
  const series = (pick: (r: CaseResult) => Array<[number, number]>): Series[] =>
    results.map((r) => ({ label: `${r.mode}, ${r.rate}/s`, color: COLORS[r.mode] ?? '#333', dash: r.rate === Math.min(...RATES) ? '5 3' : undefined, points: pick(r) }));
  const svg = lineChart(
    'outbox-relay: event latency and backlog, exit vs linger mode',
    [`created_at → broker append time; schedule every ${PERIOD_MS / 1000} s (EventBridge's 60 s compressed), timeout ${TIMEOUT_MS / 1000} s, wake=${values.wake}`, `${SECONDS} s of load per case, one run on ${machine}`],
    Math.ceil(xMax),
    [
      { title: 'Latency: the slowest event created in each second', unit: 'ms', min: 1, max: 30_000, ticks: [[1, '1 ms'], [10, '10 ms'], [100, '100 ms'], [1_000, '1 s'], [10_000, '10 s']], series: series((r) => r.latencyBySecond.map(([s, ms]) => [s, ms])) },
      { title: 'Backlog: pending rows', unit: 'rows', min: 1, max: 100_000, ticks: [[1, '≤1'], [10, '10'], [100, '100'], [1_000, '1k'], [10_000, '10k'], [100_000, '100k']], series: series((r) => r.backlog) },
    ],
  );
  writeFileSync(`${OUT}/latency.svg`, svg);
  writeFileSync(
    `${OUT}/latency.json`,
    `${JSON.stringify({ machine, commit: COMMIT, smoke: values.smoke, date: new Date().toISOString(), periodS: PERIOD_MS / 1000, timeoutS: TIMEOUT_MS / 1000, marginS: MARGIN_MS / 1000, seconds: SECONDS, wake: values.wake, emptyInvocationS: emptyS, results: results.map((r) => ({ ...r, maxBacklog: Math.max(...r.backlog.map(([, n]) => n)) })), costs }, null, 2)}\n`,
  );
  console.log(`\nwrote ${OUT}/latency.svg and latency.json`);
}

main()
  .catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(() => sql.end());
