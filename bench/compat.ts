// npm run bench -- --only compat --peer debezium: are the relay's messages Debezium's? The same
// rows (several aggregates, headers in the `headers` column, NULL payloads, unicode, a large
// payload, an extra column placed), relayed by Kafka Connect + Debezium's Postgres connector +
// the Outbox Event Router configured as its docs say, and by the relay with the settings
// docs/debezium.md maps that configuration to, each into topics of its own; then every message
// compared (bench/compat-diff.ts). Two configurations: Debezium's defaults, and additional
// placement (headers and the envelope, the payload expanded). Fails on a difference docs/debezium.md
// does not list as deliberate.
import type kafkajs from 'kafkajs';
import type { Sql } from 'postgres';
import { Deadline } from '../src/budget.ts';
import { claimColumns } from '../src/domain.ts';
import { loadConfig } from '../src/config/load.ts';
import { type KafkaClientName } from '../src/config/types.ts';
import { createPublisher } from '../src/kafka/clients.ts';
import type { Logger } from '../src/log.ts';
import { parseTableName, qualified } from '../src/outbox/identifier.ts';
import { dropOutbox, migrate } from '../src/outbox/migrate.ts';
import { OutboxStore } from '../src/outbox/store.ts';
import { runInvocation } from '../src/loop/invocation.ts';
import { compareMessages, differenceTable, groupDifferences, undocumented, type CompatMessage, type Deliberate } from './compat-diff.ts';
import { ConnectWorker } from './debezium/connect.ts';
import { checkReplication, createPublication, dropLeftovers, dropReplication, replicationName } from './debezium/replication.ts';

export interface CompatContext {
  sql: Sql;
  kafka: kafkajs.Kafka;
  env: { DATABASE_URL: string; KAFKA_BROKERS: string };
  logger: Logger;
  /** .cache/debezium */
  dir: string;
  run: string;
  events: number;
  partitions: number;
  clients: KafkaClientName[];
}

/** One documented configuration: the router's options, and the relay settings docs/debezium.md maps them to. */
interface Configuration {
  name: string;
  router: Record<string, string>;
  relay: Record<string, string>;
}

export const CONFIGURATIONS: Configuration[] = [
  {
    // the router's defaults (route.by.field aggregatetype, key aggregateid, no placement), the
    // payload as the String converter writes it
    name: 'default',
    router: {},
    relay: { OUTBOX_ADDITIONAL_PLACEMENT: 'none' },
  },
  {
    name: 'additional placement',
    router: {
      'table.fields.additional.placement': 'type:header:eventType,tenant:header:tenant,aggregatetype:envelope:aggregateType',
      'table.expand.json.payload': 'true',
      // an envelope and an expanded payload are a structure: the JSON converter writes it
      'value.converter': 'org.apache.kafka.connect.json.JsonConverter',
      'value.converter.schemas.enable': 'false',
      // and the headers too, as JSON strings
      'header.converter': 'org.apache.kafka.connect.json.JsonConverter',
      'header.converter.schemas.enable': 'false',
    },
    relay: {
      OUTBOX_ADDITIONAL_PLACEMENT: 'type:header:eventType,tenant:header:tenant,aggregatetype:envelope:aggregateType',
      OUTBOX_EXPAND_JSON_PAYLOAD: 'true',
      OUTBOX_HEADER_FORMAT: 'json',
    },
  },
];

/** The differences docs/debezium.md lists as deliberate, each with why. */
export const DELIBERATE: Deliberate[] = [
  { kind: /^header "x-[a-z]+" only in relay$/, why: "the row's headers column becomes headers; Debezium has no such column" },
];

const AGGREGATE_TYPES = ['order', 'customer', 'invoice'];

/**
 * The rows: `events` of them, deterministic, each kind of value a consumer may meet. No top-level
 * array payload: with table.expand.json.payload Debezium's task fails on one (docs/debezium.md).
 */
async function fillRows(sql: Sql, table: string, events: number): Promise<void> {
  await sql.unsafe(
    `INSERT INTO ${table} (aggregatetype, aggregateid, type, payload, headers, tenant)
     SELECT ($2::text[])[1 + g % 3],
       CASE WHEN g % 7 = 0 THEN 'kunde-ü-✓-' || (g % 50) ELSE 'agg-' || (g % 200) END,
       (ARRAY['Created', 'Updated', 'Geändert ✓'])[1 + g % 3],
       CASE WHEN g % 97 = 0 THEN NULL
            WHEN g = $1::int / 2 THEN jsonb_build_object('big', repeat('ä€😀', 60000))
            WHEN g % 101 = 0 THEN to_jsonb('a string payload ✓'::text)
            WHEN g % 11 = 0 THEN jsonb_build_object('n', g, 'none', NULL::text, 'small', 0.0001, 'large', 10000000.0, 'neg', -2.5e3,
              'inner', jsonb_build_object('z', NULL::text, 'y', 1.0))
            ELSE jsonb_build_object('n', g, 'text', E'héllo ✓ 😀 "quoted" \\\\ back\\ttab', 'price', 12.50,
              'nested', jsonb_build_object('list', jsonb_build_array(1, 2, 3), 'flag', g % 2 = 0), 'words', jsonb_build_array('x', 'ÿ')) END,
       CASE WHEN g % 3 = 0 THEN jsonb_build_object('x-source', 'bench ✓', 'x-n', g) END,
       CASE WHEN g % 10 = 0 THEN NULL ELSE 'tenant-' || (g % 5) END
     FROM generate_series(1, $1::int) g ORDER BY g`,
    [events, AGGREGATE_TYPES],
  );
}

export async function benchCompat(ctx: CompatContext): Promise<Record<string, unknown>> {
  const url = new URL(ctx.env.DATABASE_URL);
  await checkReplication(ctx.sql, `${url.hostname}:${url.port || 5432}`);
  const connect = new ConnectWorker({ dir: ctx.dir, brokers: ctx.env.KAFKA_BROKERS, port: Number(process.env.BENCH_CONNECT_PORT ?? 18083) });
  const stop = () => connect.killNow();
  process.once('exit', stop);
  const results: Record<string, unknown> = {};
  let failed = 0;
  try {
    await connect.start();
    await dropLeftovers(ctx.sql);
    for (const [i, configuration] of CONFIGURATIONS.entries()) {
      const groups = await compareOnce(ctx, connect, configuration, `${ctx.run}c${i}`);
      const bad = undocumented(groups);
      failed += bad.length;
      console.log(`\ncompat, ${configuration.name} (${ctx.events} rows, ${new Date().toISOString().slice(0, 10)}):\n${differenceTable(groups)}`);
      results[configuration.name] = { kinds: groups.length, undocumented: bad.length, differences: groups.reduce((n, g) => n + g.count, 0) };
    }
  } finally {
    await connect.stop();
    process.removeListener('exit', stop);
  }
  if (failed) throw new Error(`compat: ${failed} kind(s) of difference not listed as deliberate in docs/debezium.md (the tables above)`);
  return results;
}

async function compareOnce(ctx: CompatContext, connect: ConnectWorker, configuration: Configuration, run: string): Promise<ReturnType<typeof groupDifferences>> {
  const { sql, kafka } = ctx;
  const name = replicationName(run);
  const source = `compat_${run}`;
  const tables = [source, ...ctx.clients.map((c) => `compat_${run}_${c}`)];
  const prefixes = { debezium: `compat.${run}.dbz.`, ...Object.fromEntries(ctx.clients.map((c) => [c, `compat.${run}.${c}.`])) } as Record<string, string>;
  const topics = Object.values(prefixes).flatMap((p) => AGGREGATE_TYPES.map((t) => p + t));
  let connector = false;
  try {
    const admin = kafka.admin();
    await admin.connect();
    await admin.createTopics({ waitForLeaders: true, topics: topics.map((topic) => ({ topic, numPartitions: ctx.partitions, replicationFactor: 1 })) });
    await admin.disconnect();
    for (const t of tables) {
      await migrate(sql, parseTableName(t));
      // a column of the application's, bounded like the table's own
      await sql.unsafe(`ALTER TABLE ${qualified(parseTableName(t))} ADD COLUMN tenant text CONSTRAINT tenant_max CHECK (char_length(tenant) <= 255)`);
    }
    await createPublication(sql, name, qualified(parseTableName(source)));
    connector = true;
    await connect.request('POST', '/connectors', { name, config: connectorConfig(ctx.env.DATABASE_URL, name, source, prefixes.debezium!, configuration.router) });
    await waitStreaming(ctx, connect, name);
    await fillRows(sql, qualified(parseTableName(source)), ctx.events);
    // the relays' tables: the same rows, ids included
    for (const t of tables.slice(1)) {
      await sql.unsafe(`INSERT INTO ${qualified(parseTableName(t))} (id, aggregatetype, aggregateid, type, payload, headers, tenant)
        SELECT id, aggregatetype, aggregateid, type, payload, headers, tenant FROM ${qualified(parseTableName(source))} ORDER BY seq`);
    }
    await waitCount(ctx, AGGREGATE_TYPES.map((t) => prefixes.debezium + t), ctx.events, connect, name);
    await connect.request('DELETE', `/connectors/${name}`);
    connector = false;
    for (const [i, client] of ctx.clients.entries()) await relay(ctx, tables[i + 1]!, `${prefixes[client]}{aggregatetype}`, client, configuration.relay);
    const read = async (side: string) => readAll(kafka, AGGREGATE_TYPES.map((t) => prefixes[side] + t), prefixes[side]!, `${name}-${side.replace(/[^a-z]/g, '')}`);
    const peer = await read('debezium');
    const groups = [];
    for (const client of ctx.clients) {
      const ours = await read(client);
      // one table per client; a kind seen with one client only is named with it
      for (const g of groupDifferences(compareMessages(ours, peer), DELIBERATE)) groups.push(ctx.clients.length > 1 ? { ...g, kind: `${g.kind} [${client}]` } : g);
      process.stderr.write(`  compat ${configuration.name}: ${ours.length} relay (${client}) and ${peer.length} Debezium messages compared\n`);
    }
    return groups;
  } finally {
    if (connector) await connect.request('DELETE', `/connectors/${name}`).catch(() => undefined);
    await dropReplication(sql, name).catch((e: unknown) => process.stderr.write(`  compat: ${String(e)}\n`));
    for (const t of tables) await dropOutbox(sql, parseTableName(t)).catch(() => undefined);
    const admin = kafka.admin();
    await admin.connect();
    await admin.deleteTopics({ topics, timeout: 30_000 }).catch(() => undefined);
    await admin.disconnect();
  }
}

function connectorConfig(databaseUrl: string, name: string, table: string, prefix: string, router: Record<string, string>): Record<string, string> {
  const url = new URL(databaseUrl);
  const t = parseTableName(table);
  const transform = Object.fromEntries(Object.entries(router).filter(([k]) => !k.includes('converter')).map(([k, v]) => [`transforms.outbox.${k}`, v]));
  const converters = Object.fromEntries(Object.entries(router).filter(([k]) => k.includes('converter')));
  return {
    'connector.class': 'io.debezium.connector.postgresql.PostgresConnector',
    'tasks.max': '1',
    'plugin.name': 'pgoutput',
    'database.hostname': url.hostname,
    'database.port': url.port || '5432',
    'database.user': decodeURIComponent(url.username),
    'database.password': decodeURIComponent(url.password),
    'database.dbname': decodeURIComponent(url.pathname.slice(1)),
    'topic.prefix': name,
    'slot.name': name,
    'publication.name': name,
    'publication.autocreate.mode': 'disabled',
    'table.include.list': `${t.schema ?? 'public'}.${t.name}`,
    'snapshot.mode': 'no_data',
    'extended.headers.enabled': 'false',
    'tombstones.on.delete': 'false',
    transforms: 'outbox',
    'transforms.outbox.type': 'io.debezium.transforms.outbox.EventRouter',
    'transforms.outbox.route.topic.replacement': `${prefix}\${routedByValue}`,
    ...transform,
    ...converters,
  };
}

interface Status {
  connector: { state: string; trace?: string };
  tasks: Array<{ state: string; trace?: string }>;
}

async function waitStreaming(ctx: CompatContext, connect: ConnectWorker, name: string): Promise<void> {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const s = await connect.request<Status>('GET', `/connectors/${name}/status`).catch(() => undefined);
    const failedPart = [s?.connector, ...(s?.tasks ?? [])].find((x) => x?.state === 'FAILED');
    if (failedPart) throw new Error(`Debezium failed to start: ${failedPart.trace?.split('\n').slice(0, 8).join('\n')}\nConnect's log: ${connect.logFile}`);
    const [slot] = await ctx.sql<{ active_pid: number | null }[]>`SELECT active_pid FROM pg_replication_slots WHERE slot_name = ${name}`;
    if (s?.tasks[0]?.state === 'RUNNING' && slot?.active_pid != null) return;
    if (Date.now() > deadline) throw new Error(`Debezium did not stream within 120 s (status ${JSON.stringify(s)}); Connect's log: ${connect.logFile}\n${connect.tail()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function endOffsets(admin: kafkajs.Admin, topics: string[]): Promise<number> {
  let sum = 0;
  for (const topic of topics) for (const p of await admin.fetchTopicOffsets(topic)) sum += Number(p.high);
  return sum;
}

async function waitCount(ctx: CompatContext, topics: string[], events: number, connect: ConnectWorker, name: string): Promise<void> {
  const admin = ctx.kafka.admin();
  await admin.connect();
  try {
    const deadline = Date.now() + Math.max(180_000, events * 20);
    for (;;) {
      const done = await endOffsets(admin, topics);
      if (done >= events) return;
      const s = await connect.request<Status>('GET', `/connectors/${name}/status`).catch(() => undefined);
      const failedPart = [s?.connector, ...(s?.tasks ?? [])].find((x) => x?.state === 'FAILED');
      if (failedPart) throw new Error(`Debezium failed after ${done} of ${events}: ${failedPart.trace?.split('\n').slice(0, 12).join('\n')}`);
      if (Date.now() > deadline) throw new Error(`Debezium delivered ${done} of ${events}; Connect's log: ${connect.logFile}\n${connect.tail()}`);
      await new Promise((r) => setTimeout(r, 250));
    }
  } finally {
    await admin.disconnect();
  }
}

async function relay(ctx: CompatContext, table: string, template: string, client: KafkaClientName, settings: Record<string, string>): Promise<void> {
  const config = loadConfig({ ...ctx.env, OUTBOX_TABLE: table, OUTBOX_TOPIC_TEMPLATE: template, OUTBOX_KAFKA_CLIENT: client, OUTBOX_SENT_ROWS: 'delete', OUTBOX_LOG_LEVEL: 'warn', ...settings });
  const metadata = config.outbox.metadata;
  const store = new OutboxStore(ctx.sql, config.outbox.table, config.outbox.parkedPolicy, { sentRows: 'delete', columns: claimColumns(metadata) });
  const publisher = createPublisher({ kafka: config.kafka, logger: ctx.logger, metadata, maxMessageBytes: config.outbox.maxMessageBytes });
  try {
    const summary = await runInvocation({ store, publisher, config: config.outbox, logger: ctx.logger }, new Deadline(Date.now() + 300_000));
    if (summary.published !== ctx.events) throw new Error(`the relay (${client}) published ${summary.published} of ${ctx.events}: ${JSON.stringify(summary)}`);
  } finally {
    await publisher.close();
  }
}

/** Every message of `topics`, from the start to their end offsets now. */
async function readAll(kafka: kafkajs.Kafka, topics: string[], prefix: string, groupId: string): Promise<CompatMessage[]> {
  const admin = kafka.admin();
  await admin.connect();
  const total = await endOffsets(admin, topics);
  const messages: CompatMessage[] = [];
  const consumer = kafka.consumer({ groupId, maxBytes: 50 * 1024 * 1024 });
  await consumer.connect();
  await consumer.subscribe({ topics, fromBeginning: true });
  const all = new Promise<void>((resolve) => {
    void consumer.run({
      autoCommit: false,
      eachBatch: ({ batch }) => {
        for (const m of batch.messages) {
          const headers = Object.entries(m.headers ?? {}).flatMap(([k, v]) => (Array.isArray(v) ? v : [v]).map((x) => [k, toBuffer(x)] as const));
          const id = headers.find(([k]) => k === 'id')?.[1]?.toString() ?? '';
          messages.push({
            rowId: id.startsWith('"') ? (JSON.parse(id) as string) : id,
            topic: batch.topic.slice(prefix.length),
            partition: batch.partition,
            offset: Number(m.offset),
            key: m.key ?? null,
            value: m.value ?? null,
            headers,
          });
        }
        if (messages.length >= total) resolve();
        return Promise.resolve();
      },
    });
  });
  const timedOut = await Promise.race([all.then(() => false), new Promise<boolean>((r) => setTimeout(() => r(true), 120_000).unref())]);
  await consumer.disconnect();
  await admin.deleteGroups([groupId]).catch(() => undefined);
  await admin.disconnect();
  if (timedOut) throw new Error(`read ${messages.length} of ${total} messages of ${prefix}* within 120 s`);
  return messages;
}

function toBuffer(v: Buffer | string | undefined | null): Buffer | null {
  if (v === undefined || v === null) return null;
  return typeof v === 'string' ? Buffer.from(v) : v;
}
