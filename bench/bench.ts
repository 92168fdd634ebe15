// Throughput of the relay next to its two ceilings, measured in the same run on the same rows:
//   relay     one invocation of the real loop (claim ‖ publish, mark, commit), events/s
//   producer  the Kafka client alone sending the same messages in the same batches, with the
//             relay's own producer settings (idempotent, acks=all, one request in flight)
//   sql       claim + mark + commit alone, no Kafka, with the order guard and without it
// for the default OUTBOX_SENT_ROWS=keep (rows marked sent), and relay and sql again with
// OUTBOX_SENT_ROWS=delete. relay and producer run once per Kafka client (--clients, default
// kafkajs,platformatic). ratio = relay / min(producer, sql guarded), per client. Prints a table,
// then one JSON line.
// `--smoke`: every default measurement once, on a few thousand rows, to check that the bench still
// measures what it says (.ci/run): it fails when a figure is missing, not a number, or counts fewer
// events than were sent. Not a measurement. Every run prints the commit it measured and the date.
// Opt-in, with --only (bench/retention.ts): `sustained` (retention keeping pace for --minutes at the
// relay's full rate) and `burst` (empty-claim time after 200,000 rows were relayed and pruned);
// (bench/marks.ts) `marks`: a row's whole life in Postgres per way of recording it sent;
// (bench/scale.ts) `scale`: 1, 2, 4, 8 concurrent invocations on one backlog, and a model of the ceilings;
// (bench/kafkajs-patch.ts) `kafkajsPatch`: the relay on kafkajs unpatched and patched, side by side.
// With --peer debezium (bench/compat.ts) `compat`: the relay's messages and Debezium's for the same rows, byte by byte.
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';
import kafkajs from 'kafkajs';
import postgres from 'postgres';
import { Deadline } from '../src/budget.ts';
import { loadConfig } from '../src/config/load.ts';
import { KAFKA_CLIENTS, type KafkaClientName } from '../src/config/types.ts';
import { createLanePublisher, createPublisher, kafkaClient } from '../src/kafka/clients.ts';
import { toMessage } from '../src/kafka/message.ts';
import { createLogger } from '../src/log.ts';
import { parseTableName, qualified } from '../src/outbox/identifier.ts';
import { dropOutbox, migrate } from '../src/outbox/migrate.ts';
import { OutboxStore } from '../src/outbox/store.ts';
import { runInvocation } from '../src/loop/invocation.ts';
import { benchCompat } from './compat.ts';
import { benchKafkajsPatch } from './kafkajs-patch.ts';
import { measuredCommit } from './commit.ts';
import { CpuMeter, parentPid, type CpuSample } from './cpu.ts';
import { DebeziumPeer, walLsn, type PeerCleanup, type PeerCpu } from './debezium/peer.ts';
import { peerReport } from './debezium/report.ts';
import { benchMarks } from './marks.ts';
import { benchScale, type Shape } from './scale.ts';
import { notMeasured } from './measured.ts';
import { benchBurst, benchSustained, SENT_ROWS_WAYS, type RetentionBenchContext, type SentRowsWay } from './retention.ts';
import { UnguardedStore } from './stores.ts';
import { addWaitingRows, WAITING_ROWS, type WaitingKind } from './waiting.ts';

const { Kafka, logLevel } = kafkajs;

const { values } = parseArgs({
  options: {
    events: { type: 'string', default: process.env.BENCH_EVENTS ?? '50000' },
    batch: { type: 'string', default: process.env.BENCH_BATCH ?? '500' },
    payload: { type: 'string', default: process.env.BENCH_PAYLOAD_BYTES ?? '1000' },
    aggregates: { type: 'string', default: process.env.BENCH_AGGREGATES ?? '1000' },
    partitions: { type: 'string', default: '6' },
    clients: { type: 'string', default: process.env.BENCH_CLIENTS ?? KAFKA_CLIENTS.join(',') },
    repeat: { type: 'string', default: process.env.BENCH_REPEAT ?? '3' },
    // comma-separated subset of the measurements, e.g. --only relay,producer (for profiling)
    only: { type: 'string' },
    // --only sustained: its length, the invocations' (EventBridge's minute compressed), the
    // retention window, the baseline run without retention, the backlog the producer keeps
    minutes: { type: 'string', default: '4' },
    'invoke-seconds': { type: 'string', default: '20' },
    'retain-seconds': { type: 'string', default: '30' },
    'baseline-seconds': { type: 'string', default: '60' },
    backlog: { type: 'string', default: '4' },
    producers: { type: 'string', default: '2' },
    // --only sustained: the ways of recording sent rows to compare, in this order (keep, delete,
    // mark-in-place: the UPDATE of pre-release versions, before the sent table,)
    'sent-rows': { type: 'string', default: 'keep' },
    // --only burst: rows in the burst, empty claims timed per state
    'burst-events': { type: 'string', default: '200000' },
    claims: { type: 'string', default: '20' },
    // --peer debezium: Kafka Connect + Debezium relaying the same rows, in the same run (bench/debezium/)
    peer: { type: 'string' },
    // events relayed by the peer before it is measured, in runs of at most --events: a fresh JVM
    // costs 3-5x the CPU per event, and its JIT compiler (C2) still took 40-45% of Connect's CPU
    // in the 50,000 events after 10,000 or 150,000 warm-up events, 25% after 200,000-250,000
    'peer-warmup': { type: 'string', default: '250000' },
    // --only scale: events per case, concurrent invocations, the hot case's aggregates and invocations
    'scale-events': { type: 'string', default: '60000' },
    'scale-aggregates': { type: 'string', default: '10000' },
    'scale-invocations': { type: 'string', default: '1,2,4,8' },
    'scale-hot': { type: 'string', default: '8' },
    'scale-hot-invocations': { type: 'string', default: '1,4' },
    'scale-shapes': { type: 'string', default: 'plain' },
    // --only kafkajsPatch: how long each variant's relay sits connected and idle after its drain
    'idle-ms': { type: 'string', default: '3000' },
    smoke: { type: 'boolean', default: false },
    // the plain run's JSON record, also written here (not by --smoke or --only runs)
    out: { type: 'string', default: 'bench/results/throughput.json' },
  },
});
if (values.smoke) {
  Object.assign(values, { events: '3000', repeat: '1', aggregates: '100', 'peer-warmup': '0' });
  // the opt-in ones (--only sustained,burst,marks), in seconds too
  Object.assign(values, { minutes: '0.25', 'invoke-seconds': '5', 'retain-seconds': '3', 'baseline-seconds': '5', 'burst-events': '5000', claims: '5' });
  // --only scale: 1 and 2 invocations, and 2 on the hot aggregates, on both outboxes
  Object.assign(values, { 'scale-events': '3000', 'scale-aggregates': '100' });
  Object.assign(values, { 'scale-invocations': '1,2', 'scale-hot-invocations': '2', 'scale-shapes': 'plain,partitioned' });
  Object.assign(values, { 'idle-ms': '500' });
}

/** The dotted paths of the figures in `record` that are not numbers (NaN, Infinity): a bench that measured nothing. */
function notNumbers(record: unknown, path = ''): string[] {
  if (typeof record === 'number') return Number.isFinite(record) ? [] : [`${path}: ${record}`];
  if (record === null || typeof record !== 'object') return [];
  return Object.entries(record).flatMap(([k, v]) => notNumbers(v, path ? `${path}.${k}` : k));
}
/** rows waiting behind failed rows in the sqlWaiting* measurements */
const WAITING = values.smoke ? 10_000 : WAITING_ROWS;
/** the commit measured, as every published figure names it */
const COMMIT = measuredCommit();
const N = Number(values.events);
const BATCH = Number(values.batch);
const PAYLOAD = Number(values.payload);
const AGGREGATES = Number(values.aggregates);
const REPEAT = Math.max(1, Number(values.repeat));
const CLIENTS = values.clients.split(',').map((c) => c.trim()) as KafkaClientName[];
for (const c of CLIENTS) if (!KAFKA_CLIENTS.includes(c)) throw new Error(`--clients: unknown client ${c}; choose from ${KAFKA_CLIENTS.join(', ')}`);

const env = {
  DATABASE_URL: process.env.DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox',
  KAFKA_BROKERS: process.env.KAFKA_BROKERS ?? '127.0.0.1:9092',
  OUTBOX_BATCH_SIZE: String(BATCH),
  OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0',
  OUTBOX_LOG_LEVEL: 'warn',
};
let run = Date.now().toString(36);
const sql = postgres(env.DATABASE_URL, { max: 4, onnotice: () => undefined });
const logger = createLogger((process.env.BENCH_LOG_LEVEL ?? 'warn') as 'warn');
const kafka = new Kafka({ clientId: 'bench', brokers: env.KAFKA_BROKERS.split(','), logLevel: logLevel.NOTHING });
const pad = 'x'.repeat(Math.max(0, PAYLOAD - 40));

/** a migrated, empty outbox table for one measurement of this run */
async function createTable(name: string, shape: Shape = 'plain'): Promise<string> {
  const table = `bench_${name}_${run}`;
  // partitioned: a day's partitions (OUTBOX_PARTITION_WIDTH=1 day), as migrate makes them
  await migrate(sql, parseTableName(table), undefined, shape === 'partitioned' ? { partitionWidthS: 86_400 } : {});
  return table;
}

/** `events` rows: one statement per 10k rows; ~PAYLOAD-byte JSON payloads, `aggregates` interleaved aggregates */
async function fillTable(table: string, events = N, aggregates = AGGREGATES): Promise<void> {
  const t = qualified(parseTableName(table));
  for (let i = 0; i < events; i += 10_000) {
    const n = Math.min(10_000, events - i);
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'bench', 'agg-' || ((g * 7919) % $2), 'Benchmarked', jsonb_build_object('n', g, 'pad', $3::text)
       FROM generate_series($1::int, $1::int + $4::int - 1) g ORDER BY g`,
      [i, aggregates, pad, n],
    );
  }
  await sql.unsafe(`VACUUM ANALYZE ${t}`);
}

/** every topic this run created, deleted when it ends: a broker that keeps them restarts slowly */
const created: string[] = [];

async function deleteCreatedTopics(): Promise<void> {
  if (created.length === 0) return;
  const admin = kafka.admin();
  try {
    await admin.connect();
    // the Debezium peer deletes its own topics; a missing one would fail the whole request
    const existing = new Set(await admin.listTopics());
    const topics = created.filter((t) => existing.has(t));
    if (topics.length) await admin.deleteTopics({ topics, timeout: 30_000 });
  } catch (e) {
    console.error(`bench: could not delete its ${created.length} topics (${String(e)}); they stay on the broker`);
  } finally {
    await admin.disconnect();
  }
}

async function createTopic(topic: string): Promise<void> {
  created.push(topic);
  const admin = kafka.admin();
  await admin.connect();
  try {
    // a busy shared broker may answer the leader wait with UNKNOWN_TOPIC_OR_PARTITION for a moment
    for (let attempt = 1; ; attempt++) {
      try {
        await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: Number(values.partitions), replicationFactor: 1 }] });
        break;
      } catch (e) {
        if (attempt >= 5 || !(e as { retriable?: boolean }).retriable) throw e;
        await new Promise((r) => setTimeout(r, 500 * attempt));
      }
    }
  } finally {
    await admin.disconnect();
  }
}

/** `before`: rows written ahead of the measured ones (bench/waiting.ts) */
async function prepare(name: string, before?: (t: string) => Promise<void>): Promise<{ table: string; topic: string; template: string }> {
  const table = await createTable(name);
  await before?.(qualified(parseTableName(table)));
  await fillTable(table);
  const topic = `bench.${run}.${name}`;
  await createTopic(topic);
  return { table, topic, template: topic };
}

async function drop(table: string): Promise<void> {
  await dropOutbox(sql, parseTableName(table));
}

interface Result {
  name: string;
  events: number;
  ms: number;
  perSec: number;
  /** CPU seconds per party during the measurement (the Debezium peer's: Connect and walsender too) */
  cpu?: CpuSample | PeerCpu;
  /** the Debezium peer's run counted from the connector's resume (the headline counts from its first message) */
  fromResume?: { events: number; ms: number; perSec: number; cpu?: PeerCpu };
  /** WAL the server wrote during the measurement (all sessions': the bench runs alone under the lock) */
  walBytes?: number;
  /** the Debezium peer's table cleanup (bench/debezium/peer.ts PeerCleanup) */
  cleanup?: PeerCleanup;
  /** the Debezium peer's messages read back and matched to the table (bench/measured.ts) */
  readBack?: number;
  note?: string;
}
const runDir = new URL('../.cache/run', import.meta.url).pathname;
let meter = new CpuMeter(runDir);
let cpuStart: CpuSample | undefined;
let walStart = 0n;
// BENCH_CPU_PROFILE=dir writes a V8 CPU profile of each measurement (only the timed part) there
const profileDir = process.env.BENCH_CPU_PROFILE;
let profiler: Session | undefined;

/** starts a measurement's clock and CPU counters */
async function startClock(): Promise<number> {
  if (profileDir) {
    profiler = new Session();
    profiler.connect();
    await profiler.post('Profiler.enable');
    await profiler.post('Profiler.start');
  }
  walStart = await walLsn(sql);
  cpuStart = meter.available ? meter.sample() : undefined;
  return performance.now();
}
async function result(name: string, events: number, start: number): Promise<Result> {
  const ms = performance.now() - start;
  const cpu = cpuStart ? CpuMeter.diff(cpuStart, meter.sample()) : undefined;
  const walBytes = Number((await walLsn(sql)) - walStart);
  if (profiler) {
    const { profile } = await profiler.post('Profiler.stop');
    const file = `${profileDir}/${run}-${name.replace(/[^a-z0-9]+/gi, '-')}.cpuprofile`;
    writeFileSync(file, JSON.stringify(profile));
    profiler.disconnect();
    profiler = undefined;
    process.stderr.write(`  profile: ${file}\n`);
  }
  return { name, events, ms, perSec: Math.round((events / ms) * 1000), cpu, walBytes };
}

/** `named`: named prepared statements (DATABASE_PREPARE=true, the default), or unnamed ones only */
/** `exactlyOnce`: OUTBOX_DELIVERY=exactly-once, each batch a Kafka transaction of a leased lane (its producer connects inside the measurement, as in every invocation of the mode). */
async function benchRelay(client: KafkaClientName, sentRows: 'keep' | 'delete', named = true, exactlyOnce = false): Promise<Result> {
  const { table, template } = await prepare(`relay${sentRows}${client}${named ? '' : 'unnamed'}${exactlyOnce ? 'eos' : ''}`);
  const delivery = exactlyOnce ? 'exactly-once' : 'at-least-once';
  const config = loadConfig({ ...env, OUTBOX_TABLE: table, OUTBOX_TOPIC_TEMPLATE: template, OUTBOX_SENT_ROWS: sentRows, OUTBOX_KAFKA_CLIENT: client, OUTBOX_DELIVERY: delivery });
  const store = new OutboxStore(sql, config.outbox.table, config.outbox.parkedPolicy, { sentRows, prepare: named, lanes: exactlyOnce });
  const options = { kafka: config.kafka, logger, maxMessageBytes: config.outbox.maxMessageBytes };
  const publisher = createPublisher(options);
  // warm the producer and the topic metadata, as a warm Lambda container would be
  await publisher.publish([], new Deadline(Date.now() + 10_000));
  await publisher.maxMessageBytes(template, new Deadline(Date.now() + 10_000));
  const lanes = store.lanes && { lanes: store.lanes, publisherFor: (lease: { transactionalId: string }, ms: number) => createLanePublisher(options, lease.transactionalId, ms), logger };
  const start = await startClock();
  const summary = await runInvocation({ store, publisher, config: config.outbox, logger, ...(lanes ? { exactlyOnce: lanes } : {}) }, new Deadline(Date.now() + 600_000));
  const r = await result(`relay ${client}, one invocation (${sentRows}${named ? '' : ', unnamed statements'}${exactlyOnce ? ', exactly-once' : ''})`, summary.published, start);
  const per = (ms: number) => (ms / summary.batches).toFixed(1);
  r.note = `${summary.batches} batches, ${summary.heldBack} rows held back; per batch waited: claim ${per(summary.waitedMs.claim)} ms, publish ${per(summary.waitedMs.publish)} ms, commit ${per(summary.waitedMs.commit)} ms`;
  await publisher.close();
  if (summary.published !== N) throw new Error(`relay published ${summary.published} of ${N}: ${JSON.stringify(summary)}`);
  await drop(table);
  return r;
}

async function benchProducer(client: KafkaClientName): Promise<Result> {
  const { table, topic } = await prepare(`producer${client}`);
  const rows = await sql.unsafe<{ seq: string; id: string; aggregatetype: string; aggregateid: string; type: string; payload: string }[]>(
    `SELECT seq, id, aggregatetype, aggregateid, type, payload::text AS payload FROM ${qualified(parseTableName(table))} ORDER BY seq`,
  );
  const messages = rows.map((r) => toMessage({ ...r, topic: null, headers: null, attempts: 0 }, topic));
  // the relay's own producer of that client (src/kafka/kafkajs.ts, platformatic.ts), without the relay
  const config = loadConfig({ ...env, OUTBOX_KAFKA_CLIENT: client });
  const producer = await kafkaClient(config.kafka, logger).connect(undefined);
  await producer.send(topic, [{ ...messages[0]!, key: 'warmup' }], 30_000);
  const start = await startClock();
  for (let i = 0; i < messages.length; i += BATCH) await producer.send(topic, messages.slice(i, i + BATCH), 30_000);
  const r = await result(`${client} producer alone`, messages.length, start);
  await producer.close();
  await drop(table);
  return r;
}

async function benchSql(guard: boolean, sentRows: 'keep' | 'delete' = 'keep', waiting?: WaitingKind, named = true): Promise<Result> {
  const { table } = await prepare(`sql${guard ? 'guard' : 'plain'}${sentRows}${waiting ?? ''}${named ? '' : 'unnamed'}`, waiting && ((t) => addWaitingRows(sql, t, waiting, pad, WAITING)));
  const config = loadConfig({ ...env, OUTBOX_TABLE: table });
  // without the guard: the relay's store with the plain SKIP LOCKED claim (bench/sql.ts)
  const store = new (guard ? OutboxStore : UnguardedStore)(sql, config.outbox.table, config.outbox.parkedPolicy, { sentRows, prepare: named });
  const deadline = new Deadline(Date.now() + 600_000);
  let note: string | undefined;
  if (waiting) {
    // what the first invocation does alongside its loop (markWaiting), then what autovacuum does
    // within a minute; the claim rate is measured after both, as it stays from then on
    const t0 = performance.now();
    const marked = await store.markWaiting(deadline);
    note = `${WAITING.toLocaleString('en-US')} rows waiting (${waiting}); marking them took ${Math.round(performance.now() - t0)} ms, once (${marked} marked)`;
    await sql.unsafe(`VACUUM ANALYZE ${qualified(parseTableName(table))}`);
  }
  let done = 0;
  const start = await startClock();
  for (;;) {
    const tx = await store.begin(deadline);
    const rows = await tx.claim(BATCH);
    const ok = rows.filter((r) => r.publishable).map((r) => r.seq);
    await tx.markAndCommit(ok, []);
    done += ok.length;
    if (rows.length < BATCH) break;
  }
  const r = await result(`claim+mark SQL, ${guard ? 'order guard' : 'no guard'} (${sentRows}${named ? '' : ', unnamed statements'})${waiting ? `, ${WAITING / 1000}k rows waiting (${waiting})` : ''}`, done, start);
  r.note = note;
  if (done !== N) throw new Error(`sql loop marked ${done} of ${N}`);
  await drop(table);
  return r;
}

/** CPU milliseconds per 1,000 events: node / postgres / broker, and the cores busy on average */
function cpuText(r: Result): string {
  if (!r.cpu) return '';
  const per = (s: number) => ((s * 1e6) / r.events).toFixed(0).padStart(4);
  if ('connect' in r.cpu) {
    const c = r.cpu;
    const cores = (c.connect + c.walsender + c.postgres + c.broker) / (r.ms / 1000);
    return `connect ${per(c.connect)}, walsender ${per(c.walsender)}, other pg ${per(c.postgres)}, broker ${per(c.broker)} (ms/1k events)   ${cores.toFixed(2)} cores; bench's own polling ${per(c.node)}`;
  }
  const cores = (r.cpu.node + r.cpu.postgres + r.cpu.broker) / (r.ms / 1000);
  return `${per(r.cpu.node)} ${per(r.cpu.postgres)} ${per(r.cpu.broker)}   ${cores.toFixed(2)}`;
}

/** The median of the repetitions (each measurement runs REPEAT times, interleaved with the others). */
/** The table of medians: events/s with its range over the repetitions, and the CPU each party spent. */
function printMedians(rows: Array<ReturnType<typeof median>>): void {
  const cpuHead = meter.available ? `   cpu ms/1k events: node   pg  broker  cores busy` : '';
  console.log(`\n${'measurement (median of ' + REPEAT + ')'}`.padEnd(45) + `${'events'.padStart(8)} ${'seconds'.padStart(8)} ${'events/s'.padStart(10)}   ${'range'.padEnd(11)}${cpuHead}`);
  for (const r of rows) {
    const cpu = r.cpu ? `${' '.repeat(17)}${cpuText(r)}` : '';
    console.log(`${r.name.padEnd(44)} ${String(r.events).padStart(8)} ${(r.ms / 1000).toFixed(2).padStart(8)} ${String(r.perSec).padStart(10)}   ${`${r.min}-${r.max}`.padEnd(11)}${cpu}`);
  }
  console.log('');
}

function median(results: Result[]): Result & { min: number; max: number } {
  const sorted = [...results].sort((a, b) => a.perSec - b.perSec);
  const mid = sorted[Math.floor(sorted.length / 2)]!;
  return { ...mid, min: sorted[0]!.perSec, max: sorted[sorted.length - 1]!.perSec };
}

function sentRowsModes(list: string): SentRowsWay[] {
  const modes = list.split(',').map((m) => m.trim()).filter(Boolean);
  for (const m of modes) {
    if (!(SENT_ROWS_WAYS as readonly string[]).includes(m)) throw new Error(`--sent-rows: unknown way '${m}'; one or more of ${SENT_ROWS_WAYS.join(', ')}, comma-separated`);
  }
  if (modes.length === 0) throw new Error(`--sent-rows: name one or more of ${SENT_ROWS_WAYS.join(', ')}`);
  return modes as SentRowsWay[];
}

function retentionContext(): RetentionBenchContext {
  return { sql, kafka, env, logger, meter, run, batch: BATCH, payloadBytes: PAYLOAD, aggregates: AGGREGATES, partitions: Number(values.partitions) };
}

/** The postmaster of the server DATABASE_URL reaches: its backends' parent (when it runs on this machine). */
async function postmaster(): Promise<number | undefined> {
  const [row] = await sql<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
  return parentPid(row!.pid);
}

async function startPeer(name: string): Promise<DebeziumPeer> {
  if (name !== 'debezium') throw new Error(`--peer: unknown peer '${name}'; the one there is: debezium`);
  const peer = new DebeziumPeer({
    sql,
    kafka,
    databaseUrl: env.DATABASE_URL,
    brokers: env.KAFKA_BROKERS,
    meter,
    dir: new URL('../.cache/debezium', import.meta.url).pathname,
    createTable,
    fillTable,
    createTopic,
    dropTable: drop,
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
  } catch (e) {
    await peer.close();
    throw e;
  }
  return peer;
}

/** measurements that are not counted: a fresh JVM interprets, then compiles, the hot paths */
async function warmUp(peer: DebeziumPeer): Promise<void> {
  for (let left = Number(values['peer-warmup']), i = 0; left > 0; left -= N, i++) {
    const events = Math.min(N, left);
    run = `${Date.now().toString(36)}w${i}`;
    const r = await peer.measure(run, events, 'Debezium warm-up');
    process.stderr.write(`  warm-up (not counted) ${events} events: ${r.perSec} events/s${r.cpu ? `  cpu ${cpuText(r)}` : ''}\n`);
  }
}

/** a measurement picked by --only: by its key (relay:kafkajs) or its name (relay, every client's) */
function selected(only: string[] | undefined, key: string): boolean {
  return !only || only.includes(key) || only.includes(key.split(':')[0]!);
}

async function main(): Promise<void> {
  meter = new CpuMeter(runDir, { postmaster: await postmaster() });
  // per client: producer:<client>, relay:<client>, relayDelete:<client> (--only producer picks every client's)
  const perClient = (key: string, phase: (c: KafkaClientName) => Promise<Result>): Array<[string, () => Promise<Result>]> => CLIENTS.map((c) => [`${key}:${c}`, () => phase(c)]);
  const phases: Array<[string, () => Promise<Result>]> = [
    ...perClient('producer', benchProducer),
    ['sqlGuarded', () => benchSql(true)],
    ['sqlPlain', () => benchSql(false)],
    ...perClient('relay', (c) => benchRelay(c, 'keep')),
    ['sqlDelete', () => benchSql(true, 'delete')],
    ...perClient('relayDelete', (c) => benchRelay(c, 'delete')),
    // OUTBOX_DELIVERY=exactly-once, next to relay:<client>
    ...perClient('relayEos', (c) => benchRelay(c, 'keep', true, true)),
    // the claim with rows waiting behind failed rows (bench/waiting.ts), next to sqlGuarded
    ['sqlWaitingParked', () => benchSql(true, 'keep', 'parked')],
    ['sqlWaitingBackoff', () => benchSql(true, 'keep', 'backoff')],
  ];
  // opt-in, named in --only: the same with unnamed statements only (DATABASE_PREPARE=false), next
  // to sqlGuarded and relay:<client>, to price named prepared statements
  const optIn: Array<[string, () => Promise<Result>]> = [['sqlUnnamed', () => benchSql(true, 'keep', undefined, false)], ...perClient('relayUnnamed', (c) => benchRelay(c, 'keep', false))];
  const only = values.only?.split(',').map((s) => s.trim());
  phases.push(...optIn.filter(([k]) => only?.some((o) => o === k || o === k.split(':')[0])));
  // long-running, each run once and only when named in --only (bench/retention.ts)
  const extras: Array<[string, () => Promise<Record<string, unknown>>]> = [
    [
      'sustained',
      () =>
        benchSustained(retentionContext(), {
          minutes: Number(values.minutes),
          invokeSeconds: Number(values['invoke-seconds']),
          retainSeconds: Number(values['retain-seconds']),
          baselineSeconds: Number(values['baseline-seconds']),
          backlogBatches: Number(values.backlog),
          producers: Math.max(1, Number(values.producers)),
          sentRows: sentRowsModes(values['sent-rows']),
        }),
    ],
    ['burst', () => benchBurst(retentionContext(), Number(values['burst-events']), Math.max(1, Number(values.claims)))],
    [
      'marks',
      () =>
        benchMarks({
          sql,
          meter,
          events: N,
          batch: BATCH,
          repeat: REPEAT,
          prepare: async (name) => {
            const table = await createTable(name);
            await fillTable(table);
            return table;
          },
          drop,
        }),
    ],
    [
      'scale',
      () =>
        benchScale(
          {
            sql, kafka, env, meter, createTable, fillTable, createTopic, drop, run: () => run,
            // --smoke: one client (the plain smoke run covers both)
            clients: values.smoke ? CLIENTS.slice(0, 1) : CLIENTS,
            commit: values.smoke ? `${COMMIT} (smoke: not a measurement)` : COMMIT,
          },
          {
            events: Number(values['scale-events']),
            concurrency: values['scale-invocations'].split(',').map(Number),
            aggregates: Number(values['scale-aggregates']),
            hot: Number(values['scale-hot']),
            hotConcurrency: values['scale-hot-invocations'].split(',').filter(Boolean).map(Number),
            repeat: REPEAT,
            shapes: values['scale-shapes'].split(',') as Shape[],
          },
        ),
    ],
    [
      'kafkajsPatch',
      () =>
        benchKafkajsPatch(
          { sql, kafka, env, meter, createTable, fillTable, createTopic, drop, run: () => run },
          { events: N, aggregates: AGGREGATES, repeat: REPEAT, idleMs: Number(values['idle-ms']) },
        ),
    ],
  ];
  // --only compat --peer debezium: the relay's messages compared with Debezium's, byte by byte (bench/compat.ts)
  if (only?.includes('compat')) {
    if (values.peer !== 'debezium' || only.length > 1) throw new Error('--only compat runs alone and needs --peer debezium: npm run bench -- --only compat --peer debezium');
    process.stderr.write(`bench: commit ${COMMIT}, ${new Date().toISOString()}: compat, ${values.smoke ? 1000 : 10_000} rows\n`);
    const figures = await benchCompat({
      sql, kafka, env, logger, run, dir: new URL('../.cache/debezium', import.meta.url).pathname,
      events: values.smoke ? 1_000 : 10_000, partitions: Number(values.partitions), clients: CLIENTS,
    });
    console.log(`\n${JSON.stringify({ commit: COMMIT, compat: figures })}`);
    return;
  }
  const known = [...phases, ...optIn, ...extras].map(([k]) => k).concat(values.peer ? ['debezium', 'compat'] : []);
  const unknown = only?.filter((k) => !known.some((key) => key === k || key.split(':')[0] === k));
  if (unknown?.length) throw new Error(`--only: unknown measurement ${unknown.join(', ')}; choose from ${known.join(', ')}`);
  if (!only || values.peer || phases.some(([k]) => selected(only, k))) {
    process.stderr.write(`bench: commit ${COMMIT}, ${new Date().toISOString()}${values.smoke ? ' (smoke: not a measurement)' : ''}\n`);
    process.stderr.write(`bench: ${N} events, ~${PAYLOAD}-byte payloads, batch ${BATCH}, ${AGGREGATES} aggregates, clients ${CLIENTS.join(', ')}, ${REPEAT} repetitions (medians)\n`);
  }
  const peer = values.peer ? await startPeer(values.peer) : undefined;
  try {
    if (peer) await warmUp(peer);
    await measureAll(phases, only, peer, extras);
  } finally {
    await peer?.close();
  }
}

async function measureAll(
  phases: Array<[string, () => Promise<Result>]>,
  only: string[] | undefined,
  peer: DebeziumPeer | undefined,
  extras: Array<[string, () => Promise<Record<string, unknown>>]>,
): Promise<void> {
  // the peer runs with whatever --only picked, interleaved with the relay's measurements
  if (peer) phases = [...phases, ['debezium', () => peer.measure(run, N)]];
  const all = new Map<string, Result[]>(phases.map(([k]) => [k, []]));
  for (let i = 0; i < REPEAT; i++) {
    run = `${Date.now().toString(36)}r${i}`;
    for (const [key, phase] of phases) {
      // the peer runs with whatever --only picked
      if (key !== 'debezium' && !selected(only, key)) continue;
      const r = await phase();
      // a figure that is missing or not a number, or fewer events than were sent: the bench no
      // longer measures what it says (never print NaN)
      const problem = notMeasured(r, N);
      if (problem) throw new Error(problem);
      all.get(key)!.push(r);
      process.stderr.write(`  run ${i + 1}/${REPEAT} ${r.name}: ${r.perSec} events/s${r.cpu ? `  cpu ${cpuText(r)}` : ''}${r.note ? `\n      ${r.note}` : ''}\n`);
    }
  }
  const extraResults: Record<string, unknown> = {};
  for (const [key, extra] of extras) {
    if (!only?.includes(key)) continue;
    run = `${Date.now().toString(36)}x`;
    const figures = await extra();
    const bad = notNumbers(figures);
    if (bad.length) throw new Error(`${key}: figures that are not numbers: ${bad.join(', ')}`);
    extraResults[key] = figures;
  }
  const m = (k: string) => median(all.get(k)!);
  // Debezium next to each client's relay
  const sides = peer ? CLIENTS.map((c) => peerReport([`relay:${c}`, `relayDelete:${c}`, 'debezium'].map((k) => (all.get(k)?.length ? m(k) : undefined)) as Parameters<typeof peerReport>[0], REPEAT)) : [];
  if (only) {
    // the medians of what was measured, in the order measured (none for the experiments that
    // print their own: marks, sustained, burst)
    const measured = [...all.keys()].filter((k) => all.get(k)?.length).map(m);
    if (measured.length) printMedians(measured);
    sides.forEach((side, i) => console.log(`\n${CLIENTS[i]}:${side.text}`));
    if (Object.keys(extraResults).length || sides.length) console.log(`\n${JSON.stringify({ commit: COMMIT, date: new Date().toISOString(), cores: availableParallelism(), ...extraResults, ...(sides.length ? { peer: Object.fromEntries(sides.map((x, i) => [CLIENTS[i]!, x.json])) } : {}) })}`);
    return;
  }
  const [sqlGuarded, sqlPlain, sqlDelete] = ['sqlGuarded', 'sqlPlain', 'sqlDelete'].map(m) as [ReturnType<typeof m>, ReturnType<typeof m>, ReturnType<typeof m>];
  const [waitingParked, waitingBackoff] = ['sqlWaitingParked', 'sqlWaitingBackoff'].map(m) as [ReturnType<typeof m>, ReturnType<typeof m>];
  const byClient = CLIENTS.map((client) => {
    const [producer, relay, relayDelete] = ['producer', 'relay', 'relayDelete'].map((k) => m(`${k}:${client}`)) as [ReturnType<typeof m>, ReturnType<typeof m>, ReturnType<typeof m>];
    const ceiling = Math.min(producer.perSec, sqlGuarded.perSec);
    const ceilingDelete = Math.min(producer.perSec, sqlDelete.perSec);
    return { client, producer, relay, relayDelete, ceiling, ratio: relay.perSec / ceiling, ceilingDelete, ratioDelete: relayDelete.perSec / ceilingDelete };
  });
  const rows = [...byClient.flatMap((c) => [c.relay, c.producer, m(`relayEos:${c.client}`)]), sqlGuarded, sqlPlain, ...byClient.map((c) => c.relayDelete), sqlDelete, waitingParked, waitingBackoff];
  const guardCost = 1 - sqlGuarded.perSec / sqlPlain.perSec;
  printMedians(rows);
  // When Node, Postgres and the broker share this machine, the relay can go no faster than all
  // its cores spent on the CPU it needs per event (all three parties), however well it overlaps.
  const cores = availableParallelism();
  const json: Record<string, Record<string, number | undefined>> = {};
  for (const c of byClient) {
    console.log(`${c.client}, keep (default): ceiling = min(producer, guarded SQL) = ${c.ceiling} events/s; relay / ceiling = ${c.ratio.toFixed(2)}`);
    console.log(`${c.client}, delete: ceiling = ${c.ceilingDelete} events/s; relay / ceiling = ${c.ratioDelete.toFixed(2)}`);
    const cpuPerEvent = c.relay.cpu ? (c.relay.cpu.node + c.relay.cpu.postgres + c.relay.cpu.broker) / c.relay.events : undefined;
    const cpuBound = cpuPerEvent ? Math.round(cores / cpuPerEvent) : undefined;
    if (cpuBound) {
      console.log(
        `${c.client}, CPU bound on this ${cores}-core machine: the relay (keep) needs ${(cpuPerEvent! * 1e6).toFixed(0)} µs of CPU per event (node+pg+broker) → at most ${cpuBound} events/s with every core busy (${(cpuBound / c.ceiling).toFixed(2)} of the ceiling)`,
      );
    }
    json[c.client] = {
      relayEventsPerSec: c.relay.perSec,
      producerEventsPerSec: c.producer.perSec,
      ratio: Number(c.ratio.toFixed(3)),
      relayDeleteEventsPerSec: c.relayDelete.perSec,
      ratioDelete: Number(c.ratioDelete.toFixed(3)),
      relayNodeCpuMsPer1k: c.relay.cpu ? Number(((c.relay.cpu.node * 1e6) / c.relay.events).toFixed(0)) : undefined,
      relayCpuMsPer1k: cpuPerEvent ? Math.round(cpuPerEvent * 1e6) : undefined,
      producerNodeCpuMsPer1k: c.producer.cpu ? Number(((c.producer.cpu.node * 1e6) / c.producer.events).toFixed(0)) : undefined,
      cpuBoundEventsPerSec: cpuBound,
    };
  }
  const cpuPer1k = (x: ReturnType<typeof m>) => (x.cpu ? Math.round(((x.cpu.node + x.cpu.postgres + x.cpu.broker) * 1e6) / x.events) : undefined);
  for (const { client, relay: alo } of byClient) {
    const eos = m(`relayEos:${client}`);
    console.log(
      `${client}, exactly-once (OUTBOX_DELIVERY): ${eos.perSec} events/s, ${(eos.perSec / alo.perSec).toFixed(2)} of at-least-once's ${alo.perSec}; CPU per 1,000 events (node+pg+broker) ${cpuPer1k(eos) ?? '?'} ms against ${cpuPer1k(alo) ?? '?'}`,
    );
    json[client] = { ...json[client], relayExactlyOnceEventsPerSec: eos.perSec, exactlyOnceRatio: Number((eos.perSec / alo.perSec).toFixed(3)), relayExactlyOnceCpuMsPer1k: cpuPer1k(eos) };
  }
  console.log(`the order guard costs ${(guardCost * 100).toFixed(1)}% of the unguarded claim+mark rate`);
  // goal: with 100,000 rows waiting behind failed rows, claims stay within 15% of the clean rate
  const waitingRatios = [waitingParked, waitingBackoff].map((w) => w.perSec / sqlGuarded.perSec);
  console.log(`with ${WAITING.toLocaleString('en-US')} rows waiting: claim+mark at ${waitingRatios.map((r) => r.toFixed(2)).join(' (parked) and ')} (backoff) of the clean rate (goal ≥ 0.85)`);
  for (const w of [waitingParked, waitingBackoff]) if (w.note) console.log(`  ${w.note}`);
  sides.forEach((side, i) => console.log(`\n${CLIENTS[i]}:${side.text}`));
  console.log('');
  const record = JSON.stringify({
    commit: COMMIT,
    date: new Date().toISOString(),
    smoke: values.smoke,
    repeat: REPEAT,
    events: N,
    batchSize: BATCH,
    payloadBytes: PAYLOAD,
    aggregates: AGGREGATES,
    sqlEventsPerSec: sqlGuarded.perSec,
    sqlUnguardedEventsPerSec: sqlPlain.perSec,
    guardCost: Number(guardCost.toFixed(3)),
    sqlDeleteEventsPerSec: sqlDelete.perSec,
    waitingParkedRatio: Number(waitingRatios[0]!.toFixed(3)),
    waitingBackoffRatio: Number(waitingRatios[1]!.toFixed(3)),
    cores,
    clients: json,
    ...(sides.length ? { peer: Object.fromEntries(sides.map((x, i) => [CLIENTS[i]!, x.json])) } : {}),
  });
  console.log(record);
  // what `npm run bench:publish` quotes in the README (scripts/bench-publish.ts); never a smoke
  // run's, which CI makes and which measures nothing
  if (!values.smoke && values.out) {
    writeFileSync(values.out, record + '\n');
    process.stderr.write(`bench: wrote ${values.out}; npm run bench:publish -- ${values.out} quotes it in README.md and docs/benchmarks/README.md\n`);
  }
}

try {
  await main();
} finally {
  await deleteCreatedTopics();
  await sql.end({ timeout: 5 });
}
