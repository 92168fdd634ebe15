// Latency of an event, from its row's created_at to its append on the broker (and to its receipt by
// a read_committed consumer), in exit, linger and exactly-once linger modes (`npm run
// bench:latency`). For each mode and rate:
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
// `--peer debezium`: linger mode next to Kafka Connect + Debezium + the Outbox Event Router
// streaming the same producer's rows (bench/debezium/), tuned for latency and with Debezium's
// defaults, each rate's cases in turn (the order reversed at the next rate, so drift hits all);
// each event's latency to the broker and to the consumer, and each party's CPU per 1,000 events;
// written to latency-debezium.json and .svg.
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
import { CpuMeter, processCpu, type CpuSample } from './cpu.ts';
import { DebeziumPeer, type StreamingConnector } from './debezium/peer.ts';
import { msPer1k, pairLatencies, percentile } from './latency-stats.ts';
import type { RateProducerData, RateProducerDone } from './rate-producer-worker.ts';
import type { RelayWorkerAnswer, RelayWorkerRequest } from './relay-worker.ts';

const { Kafka, logLevel } = kafkajs;

const { values } = parseArgs({
  options: {
    rates: { type: 'string', default: '200,2000' },
    // exit,linger,linger-eos; with --peer debezium: linger,debezium,debezium-defaults
    modes: { type: 'string' },
    seconds: { type: 'string', default: '40' },
    period: { type: 'string', default: '10' },
    timeout: { type: 'string', default: '12' },
    margin: { type: 'string', default: '1.25' },
    wake: { type: 'string', default: 'notify' },
    payload: { type: 'string', default: '1000' },
    aggregates: { type: 'string', default: '1000' },
    partitions: { type: 'string', default: '6' },
    out: { type: 'string' },
    // Kafka Connect + Debezium streaming the same rows (bench/debezium/); modes default to
    // linger,debezium,debezium-defaults then. Tuned for latency (docs/latency.md): the connector's
    // poll interval and batch, the Connect producer's linger; debezium-defaults: 500 ms, 2,048, 5 ms
    peer: { type: 'string' },
    'peer-warmup': { type: 'string', default: '100000' },
    'debezium-poll-ms': { type: 'string', default: '100' },
    'debezium-batch': { type: 'string', default: '2048' },
    'debezium-linger-ms': { type: 'string', default: '5' },
    // a few seconds per case, results to a temporary folder: that the bench still measures (CI)
    smoke: { type: 'boolean', default: false },
  },
});
if (values.smoke) {
  Object.assign(values, { rates: '50', seconds: '3', period: '2', timeout: '4', aggregates: '50', 'peer-warmup': '0' });
}
if (values.peer !== undefined && values.peer !== 'debezium') {
  throw new Error(`--peer: unknown peer '${values.peer}'; the one there is: debezium`);
}
const PEER = values.peer === 'debezium';
const OUT: string = values.out ?? (values.smoke ? `${tmpdir()}/outbox-relay-bench-smoke` : new URL('./results', import.meta.url).pathname);
/** the commit measured, as every published figure names it */
const COMMIT = measuredCommit();
const RATES = values.rates.split(',').map(Number);
// linger-eos: linger with OUTBOX_DELIVERY=exactly-once (a record is visible to the read_committed
// consumer once its batch's transaction commits: its latency to the consumer is the one to read)
type Mode = 'exit' | 'linger' | 'linger-eos' | 'debezium' | 'debezium-defaults';
const ALL_MODES: Mode[] = ['exit', 'linger', 'linger-eos', 'debezium', 'debezium-defaults'];
const isDebezium = (m: Mode) => m.startsWith('debezium');
const MODES = (values.modes ?? (PEER ? 'linger,debezium,debezium-defaults' : 'exit,linger,linger-eos')).split(',') as Mode[];
for (const m of MODES) {
  if (!ALL_MODES.includes(m)) throw new Error(`--modes: unknown mode '${m}'; choose from ${ALL_MODES.join(', ')}`);
  if (isDebezium(m) && !PEER) throw new Error(`--modes ${m} needs --peer debezium (it starts Kafka Connect)`);
}
/** the connector's config over measure()'s, per Debezium mode: the two tunings compared */
const TUNING: Record<string, Record<string, string>> = {
  debezium: {
    'poll.interval.ms': values['debezium-poll-ms'],
    'max.batch.size': values['debezium-batch'],
    'producer.override.linger.ms': values['debezium-linger-ms'],
  },
  // Debezium 3.6's and Kafka 4.3's producer's own defaults, stated
  'debezium-defaults': { 'poll.interval.ms': '500', 'max.batch.size': '2048', 'producer.override.linger.ms': '5' },
};
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
  mode: Mode;
  rate: number;
  /** events the producer committed */
  sent: number;
  /** the rate the producer achieved, events/s: below `rate`, the machine could not hold it */
  producedRate: number;
  events: number;
  duplicates: number;
  /** created_at → the broker's append time, ms */
  p50: number;
  p95: number;
  p99: number;
  max: number;
  /** created_at → the consumer's receipt, ms */
  consumer: { p50: number; p95: number; p99: number; max: number };
  /** pending rows (with the peer: events committed, not on the broker) sampled every SAMPLE_MS: [seconds, rows] */
  backlog: Array<[number, number]>;
  /** the latest event's latency per second of creation: [seconds, ms] */
  latencyBySecond: Array<[number, number]>;
  invocations: number;
  failedInvocations: number;
  /** sum of the invocations' durations, seconds: what Lambda bills */
  billedSeconds: number;
  /** the relay's own threads' CPU per event, seconds (Debezium: the Connect JVM's) */
  relayCpuPerEvent: number;
  cpu?: CpuSample;
  /** CPU ms per 1,000 events of each party relaying them (from /proc) */
  parties?: Parties;
  wakeups: { notified: number; probe: number; reclaim: number };
}

/**
 * app: the relay's threads or the Connect JVM; postgres: every backend but the producer's (whose
 * inserts are the same whichever relays them) and Debezium's walsender; broker: the relay's or
 * Connect's sends and the bench consumer's fetches.
 */
interface Parties {
  app: number;
  postgres: number;
  walsender?: number;
  broker: number;
  total: number;
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

/** a topic stamping each record with the broker's append time */
async function createTopic(topic: string): Promise<void> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.createTopics({
      waitForLeaders: true,
      topics: [{ topic, numPartitions: Number(values.partitions), replicationFactor: 1, configEntries: [{ name: 'message.timestamp.type', value: 'LogAppendTime' }] }],
    });
  } finally {
    await admin.disconnect();
  }
}

/** a fresh outbox table, and the relay's topic (Debezium's connector creates its own through createTopic) */
async function freshCase(name: string, withTopic = true): Promise<{ table: string; t: string; topic: string }> {
  const table = `bench_lat_${name}_${run}`;
  await migrate(sql, parseTableName(table));
  const topic = `bench.${run}.lat.${name}`;
  if (withTopic) await createTopic(topic);
  return { table, t: qualified(parseTableName(table)), topic };
}

async function dropCase(table: string, topic: string): Promise<void> {
  await dropOutbox(sql, parseTableName(table));
  const admin = kafka.admin();
  await admin.connect();
  await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
  await admin.disconnect();
}

/** CPU counters of the parties, read together */
interface CpuMark {
  meter?: CpuSample;
  jvm: number;
  walsender: number;
}

async function runCase(mode: Mode, rate: number, peer: DebeziumPeer | undefined): Promise<CaseResult> {
  // a table name: linger-eos → lingereos
  const name = `${mode.replace('-defaults', 'd').replace('-', '')}_${rate}`;
  const dbz = isDebezium(mode);
  const { table, t, topic: relayTopic } = await freshCase(name, !dbz);
  const env = {
    DATABASE_URL,
    KAFKA_BROKERS,
    OUTBOX_TABLE: table,
    OUTBOX_TOPIC_TEMPLATE: relayTopic,
    OUTBOX_IDLE: mode === 'linger-eos' ? 'linger' : mode,
    ...(mode === 'linger-eos' ? { OUTBOX_DELIVERY: 'exactly-once' } : {}),
    // a pooler in between (DATABASE_PREPARE=false) is what makes a lingering invocation poll
    DATABASE_PREPARE: String(values.wake === 'notify'),
    OUTBOX_SAFETY_MARGIN_MS: String(MARGIN_MS),
    OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0',
    OUTBOX_METRICS: 'off',
    OUTBOX_LOG_LEVEL: 'warn',
    OUTBOX_CLIENT_ID: 'outbox-relay-bench',
  };
  // Debezium: a connector streaming the table from now on (its slot is held when this resolves)
  const connector: StreamingConnector | undefined = dbz
    ? await peer!.stream(`${run}${name.replace(/[^a-z0-9]/g, '')}`, table, TUNING[mode]!)
    : undefined;
  const topic = connector?.topic ?? relayTopic;
  const containers = dbz ? [] : [new Container(env), new Container(env)];
  const total = Math.round(rate * SECONDS);

  // the consumer: each record's append time (LogAppendTime) and its receipt, by row id
  const appended = new Map<string, number>();
  const received = new Map<string, number>();
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
      else {
        appended.set(id, Number(message.timestamp));
        received.set(id, Date.now());
      }
    },
  });
  await joined;

  const mark = (): CpuMark => ({
    meter: meter.available ? meter.sample() : undefined,
    jvm: connector ? processCpu(connector.jvm) : 0,
    walsender: connector ? processCpu(connector.walsender) : 0,
  });
  const started = Date.now();
  const cpu0 = mark();
  const answers: RelayWorkerAnswer[] = [];
  const invocations: Promise<void>[] = [];
  let throttled = 0;
  // the schedule: invocation k at k × period, on container k mod 2 (or the other, if still busy)
  const scheduling = (async () => {
    for (let k = 0; !dbz; k++) {
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

  // the backlog, sampled: pending rows. Debezium marks no row: with the peer, events committed and
  // not on the broker, for every mode (no query of the bench's own in Postgres's CPU then)
  const counter = new SharedArrayBuffer(8);
  const committed = new BigInt64Array(counter);
  const backlog: Array<[number, number]> = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      if (PEER) {
        backlog.push([(Date.now() - started) / 1000, Math.max(0, Number(Atomics.load(committed, 0)) - appended.size)]);
      } else {
        const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t} WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL`);
        backlog.push([(Date.now() - started) / 1000, r!.n]);
      }
      await sleep(SAMPLE_MS);
    }
  })();

  await sleep(LEAD_MS);
  const producer = new Worker(new URL('./rate-producer-worker.ts', import.meta.url), {
    workerData: { url: DATABASE_URL, table, rate, seconds: SECONDS, aggregates: Number(values.aggregates), payloadBytes: Number(values.payload), committed: counter } satisfies RateProducerData,
  });
  let producerPostgresCpu = 0;
  producer.on('message', (m: RateProducerDone) => (producerPostgresCpu = m.postgresCpu));
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
  const cpu1 = mark();
  const cpu = cpu0.meter && cpu1.meter ? CpuMeter.diff(cpu0.meter, cpu1.meter) : undefined;
  await scheduling;
  await Promise.all(invocations);
  sampling = false;
  await sampler;
  await consumer.disconnect();
  await Promise.all(containers.map((c) => c.close()));
  if (connector) {
    const holder = await connector.slotHolder();
    if (holder !== connector.walsender) {
      const changed = `${connector.walsender} → ${holder}`;
      process.stderr.write(`  ${name}: the slot's walsender changed (${changed}): its CPU is partly missed\n`);
    }
    await connector.stop();
  }

  // latency: append time (or receipt) - created_at, per event. A sent row is in the sent table
  // (keep mode, retention off here), any other still in the outbox (Debezium's, all): both are read.
  const sent = qualified(sentTable(parseTableName(table)));
  const created = await sql.unsafe<{ id: string; c: number }[]>(
    `SELECT id::text, (extract(epoch FROM created_at) * 1000)::float8 AS c FROM ${t}
     UNION ALL SELECT id::text, (extract(epoch FROM created_at) * 1000)::float8 FROM ${sent}`,
  );
  // every event sent must be measured: a bench that reads the wrong table measures nothing
  if (created.length !== total) throw new Error(`${name}: ${created.length} rows found for the ${total} events produced`);
  const toBroker = pairLatencies(created, appended);
  const toConsumer = pairLatencies(created, received);
  if (toBroker.missing > 0) {
    throw new Error(`${name}: ${toBroker.missing} of ${total} events have no append time on the broker`);
  }
  const sorted = toBroker.sorted;
  const bySecond = new Map<number, number>();
  for (const [c, l] of toBroker.latencies) {
    const s = Math.floor((c - started) / 1000);
    bySecond.set(s, Math.max(bySecond.get(s) ?? 0, l));
  }
  const summaries = answers.filter((a) => a.summary).map((a) => a.summary as { wakeups?: CaseResult['wakeups'] });
  const wakeups = { notified: 0, probe: 0, reclaim: 0 };
  for (const s of summaries) for (const k of Object.keys(wakeups) as Array<keyof typeof wakeups>) wakeups[k] += s.wakeups?.[k] ?? 0;
  await dropCase(table, topic);
  if (throttled) process.stderr.write(`  ${name}: ${throttled} scheduled invocations found both containers busy (not run)\n`);
  if (producerLate > 1) process.stderr.write(`  ${name}: the producer finished ${producerLate.toFixed(1)} s late (rate not held)\n`);
  const appCpu = dbz ? cpu1.jvm - cpu0.jvm : answers.reduce((s, a) => s + a.cpu, 0);
  const walsender = cpu1.walsender - cpu0.walsender;
  let parties: Parties | undefined;
  if (cpu) {
    // clock ticks make a difference of counters read apart -0.01 s at times
    const postgres = Math.max(0, cpu.postgres - producerPostgresCpu - walsender);
    parties = {
      app: msPer1k(appCpu, total),
      postgres: msPer1k(postgres, total),
      walsender: dbz ? msPer1k(walsender, total) : undefined,
      broker: msPer1k(cpu.broker, total),
      total: msPer1k(appCpu + postgres + walsender + cpu.broker, total),
    };
  }
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
    consumer: {
      p50: percentile(toConsumer.sorted, 50),
      p95: percentile(toConsumer.sorted, 95),
      p99: percentile(toConsumer.sorted, 99),
      max: toConsumer.sorted[toConsumer.sorted.length - 1]!,
    },
    backlog,
    latencyBySecond: [...bySecond].sort((a, b) => a[0] - b[0]),
    invocations: answers.length,
    failedInvocations: answers.filter((a) => a.error).length,
    billedSeconds: answers.reduce((s, a) => s + (a.endedAt - a.startedAt) / 1000, 0),
    relayCpuPerEvent: appCpu / total,
    cpu,
    parties,
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
const COLORS: Record<string, string> = {
  exit: '#d62728',
  linger: '#1f77b4',
  'linger-eos': '#9467bd',
  debezium: '#2ca02c',
  'debezium-defaults': '#ff7f0e',
};

/** the run measure() names its table after (bench_debezium_<run>): set before each warm-up run */
let peerRun = run;

/** Kafka Connect with Debezium's connector, started once; warmed up on a backlog (not counted) */
async function startPeer(): Promise<DebeziumPeer> {
  const pad = 'x'.repeat(Math.max(0, Number(values.payload) - 40));
  const peer = new DebeziumPeer({
    sql,
    kafka,
    databaseUrl: DATABASE_URL,
    brokers: KAFKA_BROKERS,
    meter,
    dir: new URL('../.cache/debezium', import.meta.url).pathname,
    createTable: async (name) => {
      const table = `bench_${name}_${peerRun}`;
      await migrate(sql, parseTableName(table));
      return table;
    },
    // rows like the producer's (~payload bytes, the aggregates interleaved), in one statement
    fillTable: async (table, events) => {
      await sql.unsafe(
        `INSERT INTO ${qualified(parseTableName(table))} (aggregatetype, aggregateid, type, payload)
         SELECT 'bench', 'agg-' || (g % $1), 'Benchmarked', jsonb_build_object('i', g, 'pad', $2::text)
         FROM generate_series(0, $3::int - 1) g`,
        [Number(values.aggregates), pad, events],
      );
    },
    createTopic,
    dropTable: (table) => dropOutbox(sql, parseTableName(table)),
  });
  // an interrupted bench must not leave its slot behind (it would retain WAL forever) nor its JVM
  const stop = (signal: NodeJS.Signals) => {
    process.stderr.write(`\n  debezium: ${signal}: dropping this run's slot and stopping Kafka Connect\n`);
    void peer.close().finally(() => process.exit(130));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  process.once('exit', () => peer.killNow());
  try {
    await peer.start();
    // a fresh JVM interprets, then compiles, its hot paths: 3-5x the CPU per event at first
    // (docs/benchmarks/debezium.md)
    for (let left = Number(values['peer-warmup']), i = 0; left > 0; left -= 50_000, i++) {
      peerRun = `${run}w${i}`;
      const r = await peer.measure(peerRun, Math.min(50_000, left), 'Debezium warm-up');
      process.stderr.write(`  debezium warm-up (not counted): ${r.events} events at ${r.perSec} events/s\n`);
    }
  } catch (e) {
    await peer.close();
    throw e;
  }
  return peer;
}

async function main(): Promise<void> {
  const machine = `${availableParallelism()} cores (${cpus()[0]?.model.trim() ?? 'unknown CPU'}), Node ${process.version}`;
  const setting = ([k, v]: [string, string]) => `${k.replace('producer.override.', 'producer ')}=${v}`;
  const tuning = (m: Mode) => (isDebezium(m) ? ` (${Object.entries(TUNING[m]!).map(setting).join(', ')})` : '');
  process.stderr.write(
    `bench:latency: ${MODES.join(', ')} × ${RATES.join(', ')} events/s, ${SECONDS} s each; schedule every ${PERIOD_MS / 1000} s, timeout ${TIMEOUT_MS / 1000} s, margin ${MARGIN_MS / 1000} s (EventBridge's minute compressed); wake=${values.wake}; ${machine}\n`,
  );
  for (const m of MODES.filter(isDebezium)) process.stderr.write(`  ${m}:${tuning(m)}\n`);
  const peer = PEER ? await startPeer() : undefined;
  const results: CaseResult[] = [];
  try {
    for (const [i, rate] of RATES.entries()) {
      // A B C, then C B A: a drift of the machine over the run hits every mode alike
      for (const mode of i % 2 ? [...MODES].reverse() : MODES) {
        process.stderr.write(`  ${mode} at ${rate}/s …\n`);
        const r = await runCase(mode, rate, peer);
        // a figure that is not a number means the bench measured nothing: fail, never print NaN
        const { p50, p95, p99, max, relayCpuPerEvent } = r;
        const figures = { p50, p95, p99, max, consumerP99: r.consumer.p99, relayCpuPerEvent };
        for (const [k, v] of Object.entries(figures)) {
          if (!Number.isFinite(v)) throw new Error(`${mode} at ${rate}/s: ${k} is ${v} (${r.events} events measured of ${r.sent})`);
        }
        results.push(r);
        process.stderr.write(`    p50 ${fmtMs(r.p50)}  p95 ${fmtMs(r.p95)}  p99 ${fmtMs(r.p99)}  max ${fmtMs(r.max)}  (${r.events} events, ${r.duplicates} duplicates, ${r.invocations} invocations, ${r.failedInvocations} failed)\n`);
      }
    }
  } finally {
    await peer?.close();
  }
  results.sort((a, b) => a.rate - b.rate || MODES.indexOf(a.mode) - MODES.indexOf(b.mode));
  const emptyS = MODES.includes('exit') ? await emptyInvocationSeconds() : undefined;

  console.log(`\nlatency: created_at → append on the broker (LogAppendTime); schedule every ${PERIOD_MS / 1000} s (EventBridge: 60 s), timeout ${TIMEOUT_MS / 1000} s; ${machine}`);
  console.log(`commit ${COMMIT}, ${new Date().toISOString()}${values.smoke ? ' (smoke: a few seconds per case, not a measurement)' : ''}`);
  for (const r of results) {
    const held = r.producedRate >= 0.95 * r.rate;
    console.log(`  ${r.mode} ${r.rate}/s: the producer achieved ${Math.round(r.producedRate)} events/s${held ? '' : ' — it could not hold the rate on this machine: the figures below are for a lower load'}`);
  }
  const w = PEER ? 19 : 8;
  console.log(`${'mode'.padEnd(w)}${'events/s'.padStart(9)}${'events'.padStart(9)}${'p50'.padStart(10)}${'p95'.padStart(10)}${'p99'.padStart(10)}${'max'.padStart(10)}${'backlog max'.padStart(13)}${'invocations'.padStart(13)}${'relay cpu/event'.padStart(17)}  wakeups (notified/probe/reclaim)`);
  for (const r of results) {
    const maxBacklog = Math.max(...r.backlog.map(([, n]) => n));
    const invocations = isDebezium(r.mode) ? '-' : `${r.invocations}${r.failedInvocations ? ` (${r.failedInvocations} failed)` : ''}`;
    console.log(
      `${r.mode.padEnd(w)}${String(r.rate).padStart(9)}${String(r.events).padStart(9)}${fmtMs(r.p50).padStart(10)}${fmtMs(r.p95).padStart(10)}${fmtMs(r.p99).padStart(10)}${fmtMs(r.max).padStart(10)}${String(maxBacklog).padStart(13)}${invocations.padStart(13)}${`${(r.relayCpuPerEvent * 1e6).toFixed(0)} µs`.padStart(17)}  ${r.mode.startsWith('linger') ? `${r.wakeups.notified}/${r.wakeups.probe}/${r.wakeups.reclaim}` : '-'}`,
    );
  }
  for (const r of results) if (r.duplicates) console.log(`  ${r.mode} ${r.rate}/s: ${r.duplicates} duplicates on the broker`);
  // the consumer reads read_committed (kafkajs' default): with exactly-once, the latency that counts
  if (!PEER) for (const r of results) console.log(`  ${r.mode} ${r.rate}/s, created_at → the consumer's receipt: p50 ${fmtMs(r.consumer.p50)}, p99 ${fmtMs(r.consumer.p99)}, max ${fmtMs(r.consumer.max)}`);
  if (PEER) printSideBySide(results, tuning);

  // the cost table: each mode's CPU per event as measured at each rate (batches grow with the rate,
  // so the CPU per event falls; a lingering invocation also spends CPU on every wake)
  const relayModes = (['exit', 'linger'] as const).filter((m) => MODES.includes(m));
  const measured = (mode: 'exit' | 'linger', rate: number) => results.find((r) => r.mode === mode && r.rate === rate)?.relayCpuPerEvent;
  const inputs = (rate: number, cpuPerEvent: number): CostInputs => ({ rate, cpuPerEvent, emptyInvocationS: emptyS ?? 0, periodS: 60, lingerTimeoutS: 70, marginS: 3 });
  const costs: Array<ReturnType<typeof costRow> & { rate: number; cpuPerEvent: number }> = [];
  if (relayModes.length) {
    console.log(`\nmonthly cost on Lambda, schedule rate(1 minute): arm64 at ${PRICE.gbSecond} $/GB-s + ${PRICE.perRequest * 1e6} $/1M requests (${PRICE.source})`);
    if (emptyS !== undefined) console.log(`exit: a warm invocation that finds nothing takes ${fmtMs(emptyS * 1000)}, plus each event's CPU measured here at that rate, scaled by the function's vCPU share (memory / 1,769 MB);`);
    console.log(`linger: timeout 70 s, margin 3 s (67 s billed per invocation). cpu = the share of the function's vCPU relaying that rate takes (near 100%: it cannot keep up)`);
    console.log(`${'mode'.padEnd(8)}${'memory'.padStart(8)}${RATES.map((r) => `${`${r}/s: GB-s`.padStart(18)}${'$/month'.padStart(9)}${'cpu'.padStart(6)}`).join('')}`);
  }
  for (const mode of relayModes) {
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

  // the peer's run has files of its own: the exit/linger ones stay what docs/benchmarks/latency.md shows
  const base = PEER ? 'latency-debezium' : 'latency';
  mkdirSync(OUT, { recursive: true });
  const xMax = Math.max(...results.flatMap((r) => r.backlog.map(([s]) => s)));
  const series = (pick: (r: CaseResult) => Array<[number, number]>): Series[] =>
    results.map((r) => ({ label: `${r.mode}, ${r.rate}/s`, color: COLORS[r.mode] ?? '#333', dash: r.rate === Math.min(...RATES) ? '5 3' : undefined, points: pick(r) }));
  const svg = lineChart(
    `outbox-relay: event latency and backlog, ${MODES.join(' vs ')}`,
    [`created_at → broker append time; schedule every ${PERIOD_MS / 1000} s (EventBridge's 60 s compressed), timeout ${TIMEOUT_MS / 1000} s, wake=${values.wake}`, `${SECONDS} s of load per case, one run on ${machine}`],
    Math.ceil(xMax),
    [
      { title: 'Latency: the slowest event created in each second', unit: 'ms', min: 1, max: 30_000, ticks: [[1, '1 ms'], [10, '10 ms'], [100, '100 ms'], [1_000, '1 s'], [10_000, '10 s']], series: series((r) => r.latencyBySecond.map(([s, ms]) => [s, ms])) },
      { title: PEER ? 'Backlog: events committed, not on the broker' : 'Backlog: pending rows', unit: 'rows', min: 1, max: 100_000, ticks: [[1, '≤1'], [10, '10'], [100, '100'], [1_000, '1k'], [10_000, '10k'], [100_000, '100k']], series: series((r) => r.backlog) },
    ],
  );
  writeFileSync(`${OUT}/${base}.svg`, svg);
  const debezium = PEER ? Object.fromEntries(MODES.filter(isDebezium).map((m) => [m, TUNING[m]])) : undefined;
  writeFileSync(
    `${OUT}/${base}.json`,
    `${JSON.stringify({ machine, commit: COMMIT, smoke: values.smoke, date: new Date().toISOString(), periodS: PERIOD_MS / 1000, timeoutS: TIMEOUT_MS / 1000, marginS: MARGIN_MS / 1000, seconds: SECONDS, wake: values.wake, emptyInvocationS: emptyS ?? null, debezium, results: results.map((r) => ({ ...r, maxBacklog: Math.max(...r.backlog.map(([, n]) => n)) })), costs }, null, 2)}\n`,
  );
  console.log(`\nwrote ${OUT}/${base}.svg and ${base}.json`);
}

/** linger mode and Debezium side by side: latency to the broker and to the consumer, CPU per party */
function printSideBySide(results: CaseResult[], tuning: (m: Mode) => string): void {
  const n = (x: number | undefined) => (x === undefined ? '-' : Math.round(x).toLocaleString('en-US'));
  const cells = (widths: number[], texts: string[]) => texts.map((t, i) => t.padStart(widths[i]!)).join('');
  const ms = (a: number, b: number, c: number) => cells([8, 8, 8], [a, b, c].map(fmtMs));
  console.log(`\nside by side: created_at → broker append | → the consumer's receipt; CPU in ms per 1,000 events`);
  const head = cells([8, 8, 8], ['p50', 'p95', 'p99']);
  const cpuHead = cells([6, 6, 8, 8, 7], ['app', 'pg', 'walsnd', 'broker', 'total']);
  console.log(`${'mode'.padEnd(19)}${'events/s'.padStart(9)}${head} |${head}   ${cpuHead}`);
  for (const r of results) {
    const p = r.parties;
    const cpu = p
      ? cells([6, 6, 8, 8, 7], [p.app, p.postgres, p.walsender, p.broker, p.total].map(n))
      : "   (no CPU figures: /proc or the services' pids missing)";
    const c = r.consumer;
    const latencies = `${ms(r.p50, r.p95, r.p99)} |${ms(c.p50, c.p95, c.p99)}`;
    console.log(`${r.mode.padEnd(19)}${String(r.rate).padStart(9)}${latencies}   ${cpu}`);
  }
  for (const m of MODES.filter(isDebezium)) console.log(`${m}:${tuning(m)}`);
  console.log('app: the relay\'s threads (its invocations, whole) or the Connect JVM; pg: Postgres backends but the');
  console.log('producer\'s (its inserts are the same for all) and the walsender; walsnd: the walsender decoding the');
  console.log('WAL for Debezium\'s slot; broker: the sends and the bench consumer\'s fetches (the same for all).');
}

main()
  .catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(() => sql.end());
