// Throughput of the relay next to its two ceilings, measured in the same run on the same rows:
//   relay     one invocation of the real loop (claim ‖ publish, mark, commit), events/s
//   producer  the Kafka client alone sending the same messages in the same batches, with the
//             relay's own producer settings (idempotent, acks=all, one request in flight)
//   sql       claim + mark + commit alone, no Kafka, with the order guard and without it
// for the default OUTBOX_SENT_ROWS=keep (rows marked sent), and relay and sql again with
// OUTBOX_SENT_ROWS=delete. relay and producer run once per Kafka client (--clients, default
// kafkajs,platformatic). ratio = relay / min(producer, sql guarded), per client. Prints a table,
// then one JSON line.
// Opt-in, with --only (bench/retention.ts): `sustained` (retention keeping pace for --minutes at the
// relay's full rate) and `burst` (empty-claim time after 200,000 rows were relayed and pruned).
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';
import kafkajs from 'kafkajs';
import postgres from 'postgres';
import { Deadline } from '../src/budget.ts';
import { KAFKA_CLIENTS, loadConfig, type KafkaClientName } from '../src/config.ts';
import { createPublisher, kafkaClient } from '../src/kafka/clients.ts';
import { toMessage } from '../src/kafka/message.ts';
import { createLogger } from '../src/log.ts';
import { parseTableName, qualified } from '../src/outbox/identifier.ts';
import { migrate } from '../src/outbox/migrate.ts';
import { OutboxStore } from '../src/outbox/store.ts';
import { runInvocation } from '../src/relay.ts';
import { CpuMeter, type CpuSample } from './cpu.ts';
import { benchBurst, benchSustained, type RetentionBenchContext } from './retention.ts';

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
    // --only burst: rows in the burst, empty claims timed per state
    'burst-events': { type: 'string', default: '200000' },
    claims: { type: 'string', default: '20' },
  },
});
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
  OUTBOX_RETAIN_SENT_MS: '0',
  OUTBOX_LOG_LEVEL: 'warn',
  OUTBOX_SAFETY_MARGIN_MS: '0',
};
let run = Date.now().toString(36);
const sql = postgres(env.DATABASE_URL, { max: 4, onnotice: () => undefined });
const logger = createLogger((process.env.BENCH_LOG_LEVEL ?? 'warn') as 'warn');
const kafka = new Kafka({ clientId: 'bench', brokers: env.KAFKA_BROKERS.split(','), logLevel: logLevel.NOTHING });
const pad = 'x'.repeat(Math.max(0, PAYLOAD - 40));

async function prepare(name: string): Promise<{ table: string; topic: string; template: string }> {
  const table = `bench_${name}_${run}`;
  await migrate(sql, parseTableName(table));
  const t = qualified(parseTableName(table));
  // one statement per 10k rows; ~PAYLOAD-byte JSON payloads, AGGREGATES interleaved aggregates
  for (let i = 0; i < N; i += 10_000) {
    const n = Math.min(10_000, N - i);
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'bench', 'agg-' || ((g * 7919) % $2), 'Benchmarked', jsonb_build_object('n', g, 'pad', $3::text)
       FROM generate_series($1::int, $1::int + $4::int - 1) g ORDER BY g`,
      [i, AGGREGATES, pad, n],
    );
  }
  await sql.unsafe(`VACUUM ANALYZE ${t}`);
  const topic = `bench.${run}.${name}`;
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: Number(values.partitions), replicationFactor: 1 }] });
  await admin.disconnect();
  return { table, topic, template: topic };
}

async function drop(table: string): Promise<void> {
  await sql.unsafe(`DROP TABLE IF EXISTS ${qualified(parseTableName(table))}`);
  await sql`DELETE FROM outbox_relay_migrations WHERE target = ${table}`;
}

interface Result {
  name: string;
  events: number;
  ms: number;
  perSec: number;
  /** CPU seconds per party during the measurement */
  cpu?: CpuSample;
  note?: string;
}
const meter = new CpuMeter(new URL('../.cache/run', import.meta.url).pathname);
let cpuStart: CpuSample | undefined;
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
  cpuStart = meter.available ? meter.sample() : undefined;
  return performance.now();
}
async function result(name: string, events: number, start: number): Promise<Result> {
  const ms = performance.now() - start;
  const cpu = cpuStart ? CpuMeter.diff(cpuStart, meter.sample()) : undefined;
  if (profiler) {
    const { profile } = await profiler.post('Profiler.stop');
    const file = `${profileDir}/${run}-${name.replace(/[^a-z0-9]+/gi, '-')}.cpuprofile`;
    writeFileSync(file, JSON.stringify(profile));
    profiler.disconnect();
    profiler = undefined;
    process.stderr.write(`  profile: ${file}\n`);
  }
  return { name, events, ms, perSec: Math.round((events / ms) * 1000), cpu };
}

async function benchRelay(client: KafkaClientName, sentRows: 'keep' | 'delete'): Promise<Result> {
  const { table, template } = await prepare(`relay${sentRows}${client}`);
  const config = loadConfig({ ...env, OUTBOX_TABLE: table, OUTBOX_TOPIC_TEMPLATE: template, OUTBOX_SENT_ROWS: sentRows, OUTBOX_KAFKA_CLIENT: client });
  const store = new OutboxStore(sql, config.outbox.table, config.outbox.parkedPolicy, { sentRows });
  const publisher = createPublisher({ kafka: config.kafka, logger, maxMessageBytes: config.outbox.maxMessageBytes });
  // warm the producer and the topic metadata, as a warm Lambda container would be
  await publisher.publish([], new Deadline(Date.now() + 10_000));
  await publisher.maxMessageBytes(template, new Deadline(Date.now() + 10_000));
  const start = await startClock();
  const summary = await runInvocation({ store, publisher, config: config.outbox, logger }, new Deadline(Date.now() + 600_000));
  const r = await result(`relay ${client}, one invocation (${sentRows})`, summary.published, start);
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

async function benchSql(guard: boolean, sentRows: 'keep' | 'delete' = 'keep'): Promise<Result> {
  const { table } = await prepare(`sql${guard ? 'guard' : 'plain'}${sentRows}`);
  const config = loadConfig({ ...env, OUTBOX_TABLE: table });
  const store = new OutboxStore(sql, config.outbox.table, config.outbox.parkedPolicy, { guard, sentRows });
  const deadline = new Deadline(Date.now() + 600_000);
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
  const r = await result(`claim+mark SQL, ${guard ? 'order guard' : 'no guard'} (${sentRows})`, done, start);
  if (done !== N) throw new Error(`sql loop marked ${done} of ${N}`);
  await drop(table);
  return r;
}

/** CPU milliseconds per 1,000 events: node / postgres / broker, and the cores busy on average */
function cpuText(r: Result): string {
  if (!r.cpu) return '';
  const per = (s: number) => ((s * 1e6) / r.events).toFixed(0).padStart(4);
  const cores = (r.cpu.node + r.cpu.postgres + r.cpu.broker) / (r.ms / 1000);
  return `${per(r.cpu.node)} ${per(r.cpu.postgres)} ${per(r.cpu.broker)}   ${cores.toFixed(2)}`;
}

/** The median of the repetitions (each measurement runs REPEAT times, interleaved with the others). */
function median(results: Result[]): Result & { min: number; max: number } {
  const sorted = [...results].sort((a, b) => a.perSec - b.perSec);
  const mid = sorted[Math.floor(sorted.length / 2)]!;
  return { ...mid, min: sorted[0]!.perSec, max: sorted[sorted.length - 1]!.perSec };
}

function retentionContext(): RetentionBenchContext {
  return { sql, kafka, env, logger, meter, run, batch: BATCH, payloadBytes: PAYLOAD, aggregates: AGGREGATES, partitions: Number(values.partitions) };
}

async function main(): Promise<void> {
  // per client: producer:<client>, relay:<client>, relayDelete:<client> (--only producer picks every client's)
  const perClient = (key: string, phase: (c: KafkaClientName) => Promise<Result>): Array<[string, () => Promise<Result>]> => CLIENTS.map((c) => [`${key}:${c}`, () => phase(c)]);
  const phases: Array<[string, () => Promise<Result>]> = [
    ...perClient('producer', benchProducer),
    ['sqlGuarded', () => benchSql(true)],
    ['sqlPlain', () => benchSql(false)],
    ...perClient('relay', (c) => benchRelay(c, 'keep')),
    ['sqlDelete', () => benchSql(true, 'delete')],
    ...perClient('relayDelete', (c) => benchRelay(c, 'delete')),
  ];
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
        }),
    ],
    ['burst', () => benchBurst(retentionContext(), Number(values['burst-events']), Math.max(1, Number(values.claims)))],
  ];
  const only = values.only?.split(',').map((s) => s.trim());
  const known = [...phases, ...extras].map(([k]) => k);
  const selected = (key: string) => !only || only.includes(key) || only.includes(key.split(':')[0]!);
  const unknown = only?.filter((k) => !known.some((key) => key === k || key.split(':')[0] === k));
  if (unknown?.length) throw new Error(`--only: unknown measurement ${unknown.join(', ')}; choose from ${known.join(', ')}`);
  if (!only || phases.some(([k]) => selected(k))) {
    process.stderr.write(`bench: ${N} events, ~${PAYLOAD}-byte payloads, batch ${BATCH}, ${AGGREGATES} aggregates, clients ${CLIENTS.join(', ')}, ${REPEAT} repetitions (medians)\n`);
  }
  const all = new Map<string, Result[]>(phases.map(([k]) => [k, []]));
  for (let i = 0; i < REPEAT; i++) {
    run = `${Date.now().toString(36)}r${i}`;
    for (const [key, phase] of phases) {
      if (!selected(key)) continue;
      const r = await phase();
      all.get(key)!.push(r);
      process.stderr.write(`  run ${i + 1}/${REPEAT} ${r.name}: ${r.perSec} events/s${r.cpu ? `  cpu ${cpuText(r)}` : ''}${r.note ? `\n      ${r.note}` : ''}\n`);
    }
  }
  const extraResults: Record<string, unknown> = {};
  for (const [key, extra] of extras) {
    if (!only?.includes(key)) continue;
    run = `${Date.now().toString(36)}x`;
    extraResults[key] = await extra();
  }
  if (only) {
    if (Object.keys(extraResults).length) console.log(`\n${JSON.stringify({ cores: availableParallelism(), ...extraResults })}`);
    return;
  }
  const m = (k: string) => median(all.get(k)!);
  const [sqlGuarded, sqlPlain, sqlDelete] = ['sqlGuarded', 'sqlPlain', 'sqlDelete'].map(m) as [ReturnType<typeof m>, ReturnType<typeof m>, ReturnType<typeof m>];
  const byClient = CLIENTS.map((client) => {
    const [producer, relay, relayDelete] = ['producer', 'relay', 'relayDelete'].map((k) => m(`${k}:${client}`)) as [ReturnType<typeof m>, ReturnType<typeof m>, ReturnType<typeof m>];
    const ceiling = Math.min(producer.perSec, sqlGuarded.perSec);
    const ceilingDelete = Math.min(producer.perSec, sqlDelete.perSec);
    return { client, producer, relay, relayDelete, ceiling, ratio: relay.perSec / ceiling, ceilingDelete, ratioDelete: relayDelete.perSec / ceilingDelete };
  });
  const rows = [...byClient.flatMap((c) => [c.relay, c.producer]), sqlGuarded, sqlPlain, ...byClient.map((c) => c.relayDelete), sqlDelete];
  const guardCost = 1 - sqlGuarded.perSec / sqlPlain.perSec;
  const cpuHead = meter.available ? `   cpu ms/1k events: node   pg  broker  cores busy` : '';
  console.log(`\n${'measurement (median of ' + REPEAT + ')'}`.padEnd(45) + `${'events'.padStart(8)} ${'seconds'.padStart(8)} ${'events/s'.padStart(10)}   ${'range'.padEnd(11)}${cpuHead}`);
  for (const r of rows) {
    const cpu = r.cpu ? `${' '.repeat(17)}${cpuText(r)}` : '';
    console.log(`${r.name.padEnd(44)} ${String(r.events).padStart(8)} ${(r.ms / 1000).toFixed(2).padStart(8)} ${String(r.perSec).padStart(10)}   ${`${r.min}-${r.max}`.padEnd(11)}${cpu}`);
  }
  console.log('');
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
      producerNodeCpuMsPer1k: c.producer.cpu ? Number(((c.producer.cpu.node * 1e6) / c.producer.events).toFixed(0)) : undefined,
      cpuBoundEventsPerSec: cpuBound,
    };
  }
  console.log(`the order guard costs ${(guardCost * 100).toFixed(1)}% of the unguarded claim+mark rate`);
  console.log('');
  console.log(
    JSON.stringify({
      events: N,
      batchSize: BATCH,
      payloadBytes: PAYLOAD,
      aggregates: AGGREGATES,
      sqlEventsPerSec: sqlGuarded.perSec,
      sqlUnguardedEventsPerSec: sqlPlain.perSec,
      guardCost: Number(guardCost.toFixed(3)),
      sqlDeleteEventsPerSec: sqlDelete.perSec,
      cores,
      clients: json,
    }),
  );
}

try {
  await main();
} finally {
  await sql.end({ timeout: 5 });
}
