// Debezium as the bench's CDC peer (npm run bench -- --peer debezium): the same outbox table
// shape (migrated by the project's own migrate()), the same broker, the same rows, relayed by
// Kafka Connect + Debezium's Postgres connector (pgoutput) + the Outbox Event Router: one topic
// per aggregatetype, key = aggregateid, the row's id (and type, like the relay) as headers.
//
// One measurement is a backlog, Debezium's own speed without Postgres's commit rate in the way:
// the connector starts (creating its slot), is stopped, the N rows are inserted, and the clock
// runs from its resume until the topic's end offsets reach N. Then every message is read back
// and checked against the table: none lost, none twice, the right key and headers.
import { setTimeout as sleep } from 'node:timers/promises';
import type kafkajs from 'kafkajs';
import type { Sql } from 'postgres';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { processCpu, threadCpu, type CpuMeter, type CpuSample } from '../cpu.ts';
import { ConnectWorker } from './connect.ts';
import { checkReplication, createPublication, dropLeftovers, dropReplication, replicationName } from './replication.ts';

export interface PeerContext {
  sql: Sql;
  kafka: kafkajs.Kafka;
  databaseUrl: string;
  brokers: string;
  meter: CpuMeter;
  /** .cache/debezium */
  dir: string;
  /** a migrated, empty table named after `name` and the run; returns its name */
  createTable(name: string): Promise<string>;
  /** the bench's rows (the relay's), then VACUUM ANALYZE */
  fillTable(table: string, events: number): Promise<void>;
  createTopic(topic: string): Promise<void>;
  dropTable(table: string): Promise<void>;
}

/** CPU seconds of Debezium's parties during one measurement */
export interface PeerCpu extends CpuSample {
  /** the Connect JVM (Debezium's streaming, the router, the converters and the producer) */
  connect: number;
  /** the walsender backend decoding the WAL for the slot (pgoutput); `postgres` is the rest */
  walsender: number;
}

export interface PeerResult {
  name: string;
  events: number;
  ms: number;
  perSec: number;
  cpu?: PeerCpu;
  /** the same run counted from the resume: the task's restart included */
  fromResume?: { events: number; ms: number; perSec: number; cpu?: PeerCpu };
  /** WAL written from the resume to the last message (the server's, all sessions) */
  walBytes?: number;
  /** messages read back from the topic, each matched to its row once (verify) */
  readBack: number;
  /** the table's cleanup Debezium needs, measured after the read-back (see cleanup()) */
  cleanup?: PeerCleanup;
  note?: string;
}

/** a connector of stream(), streaming until stop() */
export interface StreamingConnector {
  topic: string;
  /** the Connect JVM */
  jvm: number;
  /** the walsender decoding the WAL for the connector's slot */
  walsender: number;
  /** the slot's walsender now (null: none): another pid than `walsender` means its CPU was missed */
  slotHolder(): Promise<number | null>;
  stop(): Promise<void>;
}

/**
 * Debezium leaves every row in the table: its outbox documentation has the application delete the
 * row it inserts, or a job prune the table. The bench measures the job, one DELETE of the relayed
 * rows then a VACUUM, until the walsender has decoded the deletes (they are in the WAL it reads,
 * whatever the publication sends on) and is idle again. CPU seconds of the backend that ran them
 * (and autovacuum, if it ran), of the walsender, of Connect, and the WAL they wrote.
 */
export interface PeerCleanup {
  postgres: number;
  walsender: number;
  connect: number;
  walBytes: number;
  events: number;
}

interface ConnectorStatus {
  connector: { state: string; trace?: string };
  tasks: Array<{ state: string; trace?: string }>;
}

export class DebeziumPeer {
  private readonly connect: ConnectWorker;
  /** what to undo if the bench is interrupted in the middle of a measurement */
  private pending?: () => Promise<void>;

  constructor(private readonly ctx: PeerContext) {
    this.connect = new ConnectWorker({ dir: ctx.dir, brokers: ctx.brokers, port: Number(process.env.BENCH_CONNECT_PORT ?? 18083) });
  }

  async start(): Promise<void> {
    const url = new URL(this.ctx.databaseUrl);
    await checkReplication(this.ctx.sql, `${url.hostname}:${url.port || 5432}`);
    process.stderr.write(`  debezium: starting Kafka Connect standalone on ${this.connect.url} (log ${this.connect.logFile})\n`);
    const t = Date.now();
    await this.connect.start();
    // slots of benches killed before they could drop them retain WAL: after a JVM left over by such a bench is stopped
    const dropped = await dropLeftovers(this.ctx.sql);
    if (dropped.length) process.stderr.write(`  debezium: dropped slots/publications left by earlier benches: ${dropped.join(', ')}\n`);
    process.stderr.write(`  debezium: Kafka Connect up in ${((Date.now() - t) / 1000).toFixed(1)} s (pid ${this.connect.pid})\n`);
  }

  /** Deletes what a measurement in progress created, then stops the JVM. For the end and for signals. */
  async close(): Promise<void> {
    try {
      await this.pending?.();
    } finally {
      await this.connect.stop();
    }
  }

  killNow(): void {
    this.connect.killNow();
  }

  async measure(run: string, events: number, label = 'Debezium, backlog'): Promise<PeerResult> {
    const { sql, kafka } = this.ctx;
    const name = replicationName(run);
    const table = `bench_debezium_${run}`; // what createTable names it
    const topic = `bench.${run}.debezium.bench`; // the router's topic for aggregatetype 'bench'
    let connectorCreated = false;
    // every step on its own: a failed one must not keep the slot (WAL retained forever) from going
    const cleanup = async () => {
      this.pending = undefined;
      const errors: unknown[] = [];
      const step = (p: Promise<unknown>) => p.catch((e: unknown) => errors.push(e));
      if (connectorCreated) await step(this.connect.request('DELETE', `/connectors/${name}`));
      await step(dropReplication(sql, name));
      await step(this.ctx.dropTable(table));
      const admin = kafka.admin();
      await step(admin.connect().then(() => admin.deleteTopics({ topics: [topic] })));
      await admin.disconnect();
      if (errors.length) process.stderr.write(`  debezium: cleanup of ${name}: ${errors.map(String).join('; ')}\n`);
    };
    this.pending = cleanup;
    try {
      if ((await this.ctx.createTable('debezium')) !== table) throw new Error('the bench names its tables bench_<name>_<run>');
      const qualifiedTable = qualified(parseTableName(table));
      await this.ctx.createTopic(topic);
      await createPublication(sql, name, qualifiedTable);
      connectorCreated = true;
      await this.connect.request('POST', '/connectors', { name, config: this.connectorConfig(name, table, run) });
      // running and streaming: the slot exists (created at the connector's first start) and a walsender holds it
      await this.waitFor(name, 'the connector to stream', async (s) => s.connector.state === 'RUNNING' && s.tasks[0]?.state === 'RUNNING' && (await this.slotPid(name)) !== null);
      await this.connect.request('PUT', `/connectors/${name}/stop`);
      await this.waitFor(name, 'the connector to stop', async (s) => s.connector.state === 'STOPPED' && (await this.slotPid(name)) === null);
      await this.ctx.fillTable(table, events);

      const admin = kafka.admin();
      await admin.connect();
      const jvm = this.connect.pid!;
      let walsender: number | null = null;
      // absolute CPU counters now; the walsender is born after the resume, so it counts from 0
      const snapshot = (done: number): Snapshot => ({
        at: performance.now(),
        done,
        jvm: processCpu(jvm),
        threads: threadCpu(jvm),
        walsender: walsender === null ? 0 : processCpu(walsender),
        meter: this.ctx.meter.available ? this.ctx.meter.sample() : undefined,
      });
      const walResumed = await walLsn(sql);
      const resumed = snapshot(0);
      await this.connect.request('PUT', `/connectors/${name}/resume`);
      let first: Snapshot | undefined;
      let done = 0;
      const deadline = Date.now() + Math.max(120_000, events * 10); // ≥ 100 events/s, or something is wrong
      for (;;) {
        // the walsender's pid is looked up until it shows (a query per poll, counted as Postgres CPU)
        walsender ??= await this.slotPid(name);
        done = await endOffsets(admin, topic);
        if (done > 0) first ??= snapshot(done);
        if (done >= events) break;
        if (Date.now() > deadline) {
          const s = await this.connect.request<ConnectorStatus>('GET', `/connectors/${name}/status`).catch((e: Error) => e.message);
          throw new Error(`Debezium delivered ${done} of ${events} events in ${Math.round((performance.now() - resumed.at) / 1000)} s; status ${JSON.stringify(s)}; Connect's log: ${this.connect.logFile}\n${this.connect.tail()}`);
        }
        // fine-grained where it decides the clock (the first and the last messages), coarse between
        await sleep(first === undefined || done > events * 0.9 ? 10 : 50);
      }
      const ended = snapshot(done);
      const walEnded = await walLsn(sql);
      await admin.disconnect();
      const checked = await this.verify(name, topic, table, events);
      const cleanup = walsender === null ? undefined : await this.cleanup(qualified(parseTableName(table)), walsender, events);
      // The figures: from the first message on, Debezium's streaming speed through a backlog, as
      // it catches up after falling behind. From the resume they include the task's restart
      // (connections, slot checks, the producer's first metadata), a cost of stop/start only.
      const streaming = window(first!, ended);
      const whole = window(resumed, ended);
      const r: PeerResult = { name: label, events: streaming.events, ms: streaming.ms, perSec: rate(streaming), cpu: streaming.cpu, fromResume: { ...whole, perSec: rate(whole) }, readBack: checked.count, cleanup };
      r.walBytes = Number(walEnded - walResumed);
      const total = (c?: PeerCpu) => (c ? `, ${Math.round(((c.connect + c.walsender + c.postgres + c.broker) * 1e6) / events)} ms CPU per 1k events` : '');
      r.note = `Connect's threads (ms CPU per 1k events): ${topThreads(first!, ended, streaming.events)}\n      counted from the first message (${Math.round(first!.at - resumed.at)} ms after the resume, ${first!.done} events in); from the resume: ${rate(whole)} events/s${total(whole.cpu)}; ${checked.text}`;
      return r;
    } finally {
      await cleanup();
    }
  }

  /**
   * A connector streaming `table` as rows are committed (bench/latency.ts): the same connector as
   * measure()'s with `tuning` over its config. Resolves once its slot is held, with the pids whose
   * CPU is Debezium's and `stop`, which deletes the connector, its slot and its publication.
   */
  async stream(run: string, table: string, tuning: Record<string, string>): Promise<StreamingConnector> {
    const { sql } = this.ctx;
    const name = replicationName(run);
    const topic = `bench.${run}.debezium.bench`; // the router's topic for aggregatetype 'bench'
    const stop = async () => {
      this.pending = undefined;
      await this.connect
        .request('DELETE', `/connectors/${name}`)
        .catch((e: unknown) => process.stderr.write(`  debezium: deleting ${name}: ${String(e)}\n`));
      await dropReplication(sql, name);
    };
    this.pending = stop;
    await this.ctx.createTopic(topic);
    await createPublication(sql, name, qualified(parseTableName(table)));
    const config = { ...this.connectorConfig(name, table, run), ...tuning };
    await this.connect.request('POST', '/connectors', { name, config });
    const streaming = async (s: ConnectorStatus) =>
      s.connector.state === 'RUNNING' && s.tasks[0]?.state === 'RUNNING' && (await this.slotPid(name)) !== null;
    await this.waitFor(name, 'the connector to stream', streaming);
    const walsender = (await this.slotPid(name))!;
    return { topic, jvm: this.connect.pid!, walsender, slotHolder: () => this.slotPid(name), stop };
  }

  private connectorConfig(name: string, table: string, run: string): Record<string, string> {
    const url = new URL(this.ctx.databaseUrl);
    const t = parseTableName(table);
    return {
      'connector.class': 'io.debezium.connector.postgresql.PostgresConnector',
      'tasks.max': '1',
      // pgoutput is built into Postgres 10+: nothing to install on the server
      'plugin.name': 'pgoutput',
      'database.hostname': url.hostname,
      'database.port': url.port || '5432',
      'database.user': decodeURIComponent(url.username),
      'database.password': decodeURIComponent(url.password),
      'database.dbname': decodeURIComponent(url.pathname.slice(1)),
      'topic.prefix': name, // required; the router replaces every record's topic anyway
      'slot.name': name,
      // the bench creates (and drops) the publication for exactly this table
      'publication.name': name,
      'publication.autocreate.mode': 'disabled',
      'table.include.list': `${t.schema ?? 'public'}.${t.name}`,
      // a backlog of rows inserted after the slot was created: stream them, snapshot nothing
      'snapshot.mode': 'no_data',
      // a walsender of the previous task may still hold the slot when the task resumes; retry after 1 s, not 10 s
      'slot.retry.delay.ms': '1000',
      // no Debezium context headers: the messages carry what the relay's carry
      'extended.headers.enabled': 'false',
      'tombstones.on.delete': 'false',
      transforms: 'outbox',
      'transforms.outbox.type': 'io.debezium.transforms.outbox.EventRouter',
      // the defaults read the outbox columns: id (→ the `id` header), aggregateid (→ the key),
      // payload (→ the value), aggregatetype (→ the topic, like the relay's {aggregatetype})
      'transforms.outbox.route.topic.replacement': `bench.${run}.debezium.\${routedByValue}`,
      'transforms.outbox.table.fields.additional.placement': 'type:header:type',
    };
  }

  /** The prune job's DELETE and VACUUM of the relayed rows, until the walsender has sent past them (PeerCleanup). */
  private async cleanup(t: string, walsender: number, events: number): Promise<PeerCleanup | undefined> {
    const { sql, meter } = this.ctx;
    if (!meter.available) return undefined;
    const pg0 = meter.sample().postgres;
    const w0 = processCpu(walsender);
    const jvm0 = processCpu(this.connect.pid!);
    const lsn0 = await walLsn(sql);
    await sql.unsafe(`DELETE FROM ${t}`);
    await sql.unsafe(`VACUUM ${t}`);
    const lsn1 = await walLsn(sql);
    // the walsender has decoded the deletes once its CPU stops moving (1 s without a clock tick)
    const deadline = Date.now() + 60_000;
    for (let last = processCpu(walsender), still = 0; still < 4; ) {
      await sleep(250);
      const now = processCpu(walsender);
      still = now === last ? still + 1 : 0;
      last = now;
      if (Date.now() > deadline) throw new Error(`Debezium's walsender (pid ${walsender}) was still busy 60 s after the cleanup`);
    }
    const walsenderCpu = processCpu(walsender) - w0;
    return {
      postgres: Math.max(0, meter.sample().postgres - pg0 - walsenderCpu),
      walsender: walsenderCpu,
      connect: processCpu(this.connect.pid!) - jvm0,
      walBytes: Number(lsn1 - lsn0),
      events,
    };
  }

  private async slotPid(name: string): Promise<number | null> {
    const [row] = await this.ctx.sql<{ active_pid: number | null }[]>`SELECT active_pid FROM pg_replication_slots WHERE slot_name = ${name}`;
    return row?.active_pid ?? null;
  }

  private async waitFor(name: string, what: string, ok: (s: ConnectorStatus) => Promise<boolean>, ms = 60_000): Promise<void> {
    const deadline = Date.now() + ms;
    for (;;) {
      const s = await this.connect.request<ConnectorStatus>('GET', `/connectors/${name}/status`).catch(() => undefined);
      const failed = [s?.connector, ...(s?.tasks ?? [])].find((x) => x?.state === 'FAILED');
      if (failed) throw new Error(`Debezium failed while waiting for ${what}: ${failed.trace?.split('\n').slice(0, 8).join('\n')}\nConnect's log: ${this.connect.logFile}`);
      if (s && (await ok(s))) return;
      if (Date.now() > deadline) throw new Error(`timed out after ${ms / 1000} s waiting for ${what} (status ${JSON.stringify(s)}); Connect's log: ${this.connect.logFile}\n${this.connect.tail()}`);
      await sleep(100);
    }
  }

  /**
   * Reads the topic back: exactly one message per row (none lost, none twice), keyed by the row's
   * aggregateid, with its id and type headers. Outside the clock.
   */
  private async verify(name: string, topic: string, table: string, events: number): Promise<{ count: number; text: string }> {
    const rows = await this.ctx.sql.unsafe<{ id: string; aggregateid: string }[]>(`SELECT id::text, aggregateid FROM ${qualified(parseTableName(table))}`);
    const keyOf = new Map(rows.map((r) => [r.id, r.aggregateid]));
    const seen = new Set<string>();
    const headerNames = new Set<string>();
    const problems: string[] = [];
    const problem = (text: string) => {
      if (problems.length < 5) problems.push(text);
    };
    let count = 0;
    const groupId = `${name}-verify`;
    const consumer = this.ctx.kafka.consumer({ groupId, maxBytes: 50 * 1024 * 1024 });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const all = new Promise<void>((resolve) => {
      void consumer.run({
        autoCommit: false,
        eachBatch: ({ batch }) => {
          for (const m of batch.messages) {
            count++;
            for (const h of Object.keys(m.headers ?? {})) headerNames.add(h);
            const id = m.headers?.id?.toString();
            if (!id || !keyOf.has(id)) problem(`a message with id header ${id} that is no row's`);
            else if (seen.has(id)) problem(`row ${id} twice`);
            else if (m.key?.toString() !== keyOf.get(id)) problem(`row ${id} keyed ${m.key?.toString()}, not its aggregateid ${keyOf.get(id)}`);
            else if (m.headers?.type?.toString() !== 'Benchmarked') problem(`row ${id} without its type header`);
            if (id) seen.add(id);
          }
          if (count >= events) resolve();
          return Promise.resolve();
        },
      });
    });
    const timeout = sleep(60_000).then(() => 'timeout' as const);
    const outcome = await Promise.race([all, timeout]);
    await consumer.disconnect();
    const admin = this.ctx.kafka.admin();
    await admin.connect();
    const end = await endOffsets(admin, topic); // again, a moment later: nothing arrived after N
    await admin.deleteGroups([groupId]).catch(() => undefined);
    await admin.disconnect();
    if (outcome === 'timeout') problems.push(`read back only ${count} of ${events} messages within 60 s`);
    if (end !== events) problems.push(`the topic holds ${end} messages for ${events} rows`);
    if (seen.size !== events) problems.push(`${seen.size} distinct rows of ${events}`);
    if (problems.length) throw new Error(`Debezium's messages do not match the table: ${problems.join('; ')}`);
    return { count, text: `read back: ${count} messages = ${events} rows, each once, key = aggregateid; headers: ${[...headerNames].join(', ')}` };
  }
}

interface Snapshot {
  at: number;
  /** messages on the topic */
  done: number;
  jvm: number;
  /** the JVM's CPU per thread name, to say where it goes */
  threads: Map<string, number>;
  walsender: number;
  meter?: CpuSample;
}

/** the JVM threads that used the most CPU between two snapshots, in ms per 1,000 events */
function topThreads(a: Snapshot, b: Snapshot, events: number, n = 5): string {
  return [...b.threads]
    .map(([name, s]) => [name, s - (a.threads.get(name) ?? 0)] as const)
    .sort((x, y) => y[1] - x[1])
    .slice(0, n)
    .map(([name, s]) => `${name} ${Math.round((s * 1e6) / events)}`)
    .join(', ');
}

function window(a: Snapshot, b: Snapshot): { events: number; ms: number; cpu?: PeerCpu } {
  const w = b.walsender - a.walsender;
  const cpu =
    a.meter && b.meter
      ? // the postmaster's children include the walsender; clock ticks make the rest -0.01 s at times
        { node: b.meter.node - a.meter.node, postgres: Math.max(0, b.meter.postgres - a.meter.postgres - w), broker: b.meter.broker - a.meter.broker, connect: b.jvm - a.jvm, walsender: w }
      : undefined;
  return { events: b.done - a.done, ms: b.at - a.at, cpu };
}

const rate = (w: { events: number; ms: number }) => Math.round((w.events / w.ms) * 1000);

/** an LSN (X/Y) as a number of bytes */
function lsnNumber(lsn: string): bigint {
  const [hi, lo] = lsn.split('/');
  return (BigInt(`0x${hi}`) << 32n) + BigInt(`0x${lo}`);
}

/** where the server's WAL ends now (every session's) */
export async function walLsn(sql: Sql): Promise<bigint> {
  const [row] = await sql<{ lsn: string }[]>`SELECT pg_current_wal_insert_lsn()::text AS lsn`;
  return lsnNumber(row!.lsn);
}

async function endOffsets(admin: kafkajs.Admin, topic: string): Promise<number> {
  const offsets = await admin.fetchTopicOffsets(topic);
  return offsets.reduce((sum, p) => sum + Number(p.high), 0);
}
