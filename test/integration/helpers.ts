// Shared fixtures for integration tests against the real local services (npm run services:up).
// Each test gets its own outbox table and its own topics, so tests never see each other's rows.
import { MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import { spawn, type ChildProcess } from 'node:child_process';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after } from 'node:test';
import kafkajs from 'kafkajs';
import postgres, { type Sql } from 'postgres';
import { migrate } from '../../src/outbox/migrate.ts';
import { parseTableName, qualified, sentTable } from '../../src/outbox/identifier.ts';
import { kcatPath, kcatRead } from './kcat.ts';

const { Kafka, logLevel } = kafkajs;

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const DATABASE_URL = process.env.TEST_DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox';
/** superuser, for pg_terminate_backend and ALTER ROLE */
export const ADMIN_DATABASE_URL = process.env.TEST_ADMIN_DATABASE_URL ?? 'postgres://postgres:postgres@127.0.0.1:5432/outbox';
export let KAFKA_BROKERS = process.env.TEST_KAFKA_BROKERS ?? '127.0.0.1:9092';
/** PgBouncer in transaction mode in front of the same database (scripts/services/pgbouncer.sh) */
export const POOLER_DATABASE_URL = process.env.TEST_POOLER_DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:6432/outbox';
/**
 * TEST_VIA_POOLER=1 (scripts/test.sh's second run of the guarantee tests): every relay a fixture
 * configures connects through the pooler, as most Lambda deployments do, with named prepared
 * statements off as the README tells such deployments. The tests' own statements (creating
 * tables, inserting, checking) stay direct.
 */
export const VIA_POOLER = process.env.TEST_VIA_POOLER === '1';
export const AWS_ENDPOINT_URL = process.env.TEST_AWS_ENDPOINT_URL ?? 'http://127.0.0.1:4566';
/** the local services' CA and certificates (scripts/services/tls.sh) */
export const TLS_DIR = join(ROOT, '.cache', 'tls');
export const TLS_CA = join(TLS_DIR, 'ca.pem');
/** the shared broker's SSL listener (scripts/services/kafka.sh) */
export const KAFKA_SSL_BROKERS = '127.0.0.1:9099';
/**
 * TEST_VIA_TLS=1 (scripts/run-tests.ts' platformatic pass of the guarantee files): every relay a
 * fixture configures reaches Postgres with DATABASE_SSL=verify-full and the shared broker on its
 * SSL listener, trusting the local CA: NODE_EXTRA_CA_CERTS is in the env of the relays a test
 * runs as a process, and the pass gives it to the test file's own process for the in-process ones.
 */
export const VIA_TLS = process.env.TEST_VIA_TLS === '1';
/**
 * TEST_OUTBOX_SHAPE=partitioned (scripts/run-tests.ts' pgbouncer pass of the guarantee files):
 * every fixture's outbox, once migrate has made it, is rebuilt as a table partitioned by RANGE
 * (created_at) with two partitions (partitionByRange), as a team does to drop old rows by
 * partition. The relay then names rows whose tableoid is a partition's, not the table's, and whose
 * ctids repeat across partitions; the table has no primary key or unique seq (a partitioned
 * table's unique indexes must include the partition key). The sent table stays plain.
 */
export const OUTBOX_SHAPE = process.env.TEST_OUTBOX_SHAPE ?? 'plain';
if (OUTBOX_SHAPE !== 'plain' && OUTBOX_SHAPE !== 'partitioned') throw new Error(`TEST_OUTBOX_SHAPE=${OUTBOX_SHAPE}: plain or partitioned`);
export const PARTITIONED = OUTBOX_SHAPE === 'partitioned';
/**
 * TEST_DELIVERY=exactly-once (scripts/run-tests.ts' eos pass of the guarantee files): every relay a
 * fixture configures runs OUTBOX_DELIVERY=exactly-once. The tests' consumers read read_committed
 * (kafkajs' default), so a batch the relay aborted is not seen.
 */
export const DELIVERY = process.env.TEST_DELIVERY ?? 'at-least-once';
if (DELIVERY !== 'at-least-once' && DELIVERY !== 'exactly-once') throw new Error(`TEST_DELIVERY=${DELIVERY}: at-least-once or exactly-once`);
export const EXACTLY_ONCE_PASS = DELIVERY === 'exactly-once';
/** For a relay behind a test's proxy that reads the protocol (pg-proxy.ts, kafka-proxy.ts): plaintext in every pass. */
export const PLAINTEXT_DB = { DATABASE_SSL: 'disable' };
export const PLAINTEXT_KAFKA = { KAFKA_SSL: 'false' };
/**
 * The Kafka client the relay under test publishes with (OUTBOX_KAFKA_CLIENT in every fixture's
 * env): scripts/test.sh runs the integration suite once per client. The tests' own consumers and
 * admin clients stay kafkajs, so both relays are checked by the same reader.
 */
export const KAFKA_CLIENT = process.env.TEST_KAFKA_CLIENT ?? 'kafkajs';

const testClient = (brokers: string) => new Kafka({ clientId: 'outbox-relay-tests', brokers: brokers.split(','), logLevel: logLevel.NOTHING, retry: { retries: 3 } });
export let kafka = testClient(KAFKA_BROKERS);

/**
 * Points this file's fixtures (their KAFKA_BROKERS), consumers and admin calls at another broker:
 * a file's own (private-broker.ts), for the files that kill or pause it.
 */
export function useKafka(brokers: string): void {
  KAFKA_BROKERS = brokers;
  kafka = testClient(brokers);
}

export function db(url = DATABASE_URL): Sql {
  return postgres(url, { max: 5, onnotice: () => undefined });
}

/** A test file's own pool to the test database, ended after the file's tests (postgres.js connects on first use). */
export function fileDb(): Sql {
  const sql = db();
  after(() => sql.end());
  return sql;
}

export function uniqueName(prefix: string): string {
  return `${prefix}_${randomBytes(4).toString('hex')}`;
}

export interface Fixture {
  table: string;
  /** topic prefix; the template is `${prefix}.{aggregatetype}` */
  prefix: string;
  template: string;
  env: Record<string, string>;
  topic(aggregatetype: string): string;
}

/**
 * A migrated outbox table of its own and topics for the given aggregate types. `partitionWidthS`:
 * migrate makes it partitioned by time (OUTBOX_PARTITION_WIDTH; test/integration/partitioned-outbox.test.ts),
 * whatever TEST_OUTBOX_SHAPE says.
 */
export async function fixture(sql: Sql, name: string, aggregatetypes: string[] = ['order'], partitions = 3, { partitionWidthS }: { partitionWidthS?: number } = {}): Promise<Fixture> {
  const table = uniqueName(name);
  const prefix = `test.${table}`;
  await migrate(sql, parseTableName(table), undefined, { partitionWidthS });
  // Split at the database's clock now: every row a test inserts afterwards with created_at's
  // default (now(), its transaction's start) lands in the newer partition, so no test's rows are
  // split by timing (a split a few seconds ahead would put a test's rows in one partition or the
  // other by how fast the machine is: a failure no rerun reproduces). The older partition gets the
  // rows a test gives, or updates to, a created_at in the past (operator-commands ages rows by
  // hand: the UPDATE moves them there), at ctids the newer partition's rows have too. Every test
  // still relays through a partition's tableoid, with no primary key or unique seq behind it;
  // table-shapes.test.ts relays a table whose batches mix both partitions at the same ctids.
  if (PARTITIONED && partitionWidthS === undefined) {
    const [row] = await sql<{ split: string }[]>`SELECT now()::text AS split`;
    await partitionByRange(sql, table, 'created_at', row!.split);
  }
  const topics = aggregatetypes.map((a) => `${prefix}.${a}`);
  await createTopics(topics, partitions);
  return {
    table,
    prefix,
    template: `${prefix}.{aggregatetype}`,
    topic: (a) => `${prefix}.${a}`,
    env: {
      ...(VIA_POOLER ? { DATABASE_URL: POOLER_DATABASE_URL, DATABASE_PREPARE: 'false' } : { DATABASE_URL }),
      KAFKA_BROKERS,
      // a file's own broker (useKafka) has no SSL listener: its relays stay in plaintext
      ...(VIA_TLS ? { DATABASE_SSL: 'verify-full', NODE_EXTRA_CA_CERTS: TLS_CA } : {}),
      ...(VIA_TLS && KAFKA_BROKERS === '127.0.0.1:9092' ? { KAFKA_BROKERS: KAFKA_SSL_BROKERS, KAFKA_SSL: 'true' } : {}),
      OUTBOX_KAFKA_CLIENT: KAFKA_CLIENT,
      ...(EXACTLY_ONCE_PASS ? { OUTBOX_DELIVERY: 'exactly-once' } : {}),
      OUTBOX_TABLE: table,
      OUTBOX_TOPIC_TEMPLATE: `${prefix}.{aggregatetype}`,
      OUTBOX_SAFETY_MARGIN_MS: String(MIN_SAFETY_MARGIN_MS),
      OUTBOX_LOG_LEVEL: 'info',
    },
  };
}

/**
 * Rebuilds `table` (made by migrate) as a table partitioned by RANGE (`key`), as a team does to drop
 * old partitions: the same columns, defaults, identity and checks, the relay's non-unique indexes
 * and triggers, two partitions split at `split` (`${table}_a` before it, `${table}_b` from it).
 * Unique indexes are left out: a partitioned table's must include the partition key.
 */
export async function partitionByRange(db: Sql, table: string, key: string, split: string): Promise<string[]> {
  return repartition(db, table, `RANGE (${key})`, [[`${table}_a`, `FROM (MINVALUE) TO ('${split}')`], [`${table}_b`, `FROM ('${split}') TO (MAXVALUE)`]]);
}

/**
 * Rebuilds `table` (made by migrate) as partitioned `by` (`RANGE (created_at)`, `HASH (seq)`), its
 * partitions named with their bounds (`FOR VALUES …`): the same columns, defaults, identity and
 * checks, the non-unique indexes under their names, the triggers. Returns the partitions' names.
 */
export async function repartition(db: Sql, table: string, by: string, partitions: Array<[name: string, bound: string]>): Promise<string[]> {
  const t = qualified(parseTableName(table));
  const old = `${table}_plain`;
  await db.begin(async (x) => {
    const indexes = await x.unsafe<{ def: string }[]>(
      `SELECT pg_get_indexdef(i.indexrelid) AS def FROM pg_index i WHERE i.indrelid = $1::regclass AND NOT i.indisunique`, [t]);
    const triggers = await x.unsafe<{ def: string }[]>(
      `SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal`, [t]);
    await x.unsafe(`ALTER TABLE ${t} RENAME TO "${old}"`);
    await x.unsafe(`CREATE TABLE ${t} (LIKE "${old}" INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED INCLUDING CONSTRAINTS) PARTITION BY ${by}`);
    for (const [name, bound] of partitions) await x.unsafe(`CREATE TABLE "${name}" PARTITION OF ${t} FOR VALUES ${bound}`);
    const onOld = new RegExp(` ON (?:public\\.)?"?${old}"? `);
    // the index names are the old table's: rename those first, so the rebuilt ones keep them
    for (const { def } of indexes) {
      const name = /INDEX (\S+) ON/.exec(def)![1]!;
      await x.unsafe(`ALTER INDEX ${name} RENAME TO "${name.replaceAll('"', '')}_plain"`);
      await x.unsafe(def.replace(onOld, ` ON ${t} `));
    }
    await x.unsafe(`DROP TABLE "${old}"`);
    for (const { def } of triggers) await x.unsafe(def.replace(onOld, ` ON ${t} `));
  });
  return partitions.map(([name]) => name);
}

export async function createTopics(topics: string[], partitions = 3, configEntries?: Array<{ name: string; value: string }>): Promise<void> {
  // noted first, so that a creation that fails halfway leaves nothing behind either
  noteTopics(topics);
  const admin = kafka.admin();
  await admin.connect();
  try {
    // a busy broker may answer the leader wait with UNKNOWN_TOPIC_OR_PARTITION for a moment (kafkajs
    // retries only LEADER_NOT_AVAILABLE); creating again is a no-op for the topics that exist
    for (let attempt = 1; ; attempt++) {
      try {
        await admin.createTopics({ waitForLeaders: true, topics: topics.map((topic) => ({ topic, numPartitions: partitions, replicationFactor: 1, configEntries })) });
        return;
      } catch (err) {
        if (attempt >= 5 || !(err as { retriable?: boolean }).retriable) throw err;
        await new Promise((r) => setTimeout(r, 500 * attempt));
      }
    }
  } finally {
    await admin.disconnect();
  }
}

/**
 * Notes topics a test creates in the file scripts/run-tests.ts names (TEST_TOPICS_FILE), which
 * deletes them when the test file ends: a broker that keeps every test's topics recovers
 * thousands of partitions after each kill and restart (minutes instead of seconds).
 */
export function noteTopics(topics: string[]): void {
  const file = process.env.TEST_TOPICS_FILE;
  if (file && topics.length > 0) appendFileSync(file, topics.map((t) => `${t}\n`).join(''));
}

export interface EventSpec {
  aggregatetype?: string;
  aggregateid: string;
  type?: string;
  payload?: unknown;
  topic?: string | null;
}

/** Insert events in one statement (one transaction), in array order. Returns ids in order. */
export async function insertEvents(sql: Sql, table: string, events: EventSpec[]): Promise<string[]> {
  const ids: string[] = [];
  const t = qualified(parseTableName(table));
  for (let i = 0; i < events.length; i += 5_000) {
    const chunk = events.slice(i, i + 5_000);
    const rows = await sql.unsafe<{ id: string }[]>(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload, topic)
       SELECT a, b, c, d, e FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[]) WITH ORDINALITY AS u(a, b, c, d, e, n)
       ORDER BY n
       RETURNING id`,
      [
        chunk.map((e) => e.aggregatetype ?? 'order'),
        chunk.map((e) => e.aggregateid),
        chunk.map((e) => e.type ?? 'Happened'),
        chunk.map((e) => (e.payload ?? { n: 0 }) as never),
        chunk.map((e) => e.topic ?? null),
      ],
    );
    ids.push(...rows.map((r) => r.id));
  }
  return ids;
}

export interface Consumed {
  topic: string;
  partition: number;
  offset: string;
  key: string | null;
  value: string | null;
  headers: Record<string, string>;
  /** the record's timestamp, ms since the epoch (CreateTime: the producer's) */
  timestamp: string;
}

/** Read every message currently on the topics (from the beginning) until `expected` arrived or it times out. */
export async function consumeAll(topics: string[], expected: number, timeoutMs = 20_000): Promise<Consumed[]> {
  const consumer = kafka.consumer({ groupId: uniqueName('test'), maxWaitTimeInMs: 200 });
  const out: Consumed[] = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topics, fromBeginning: true });
    let resolveDone: () => void = () => undefined;
    const done = new Promise<void>((r) => (resolveDone = r));
    await consumer.run({
      // eslint-disable-next-line @typescript-eslint/require-await -- kafkajs wants a promise-returning handler
      eachMessage: async ({ topic, partition, message }) => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = Buffer.isBuffer(v) ? v.toString() : String(v);
        out.push({ topic, partition, offset: message.offset, key: message.key?.toString() ?? null, value: message.value?.toString() ?? null, headers, timestamp: message.timestamp });
        if (out.length >= expected) resolveDone();
      },
    });
    if (expected === 0) resolveDone();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([done, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    // linger briefly so extra (duplicate) messages beyond `expected` are seen too
    await new Promise((r) => setTimeout(r, 500));
  } finally {
    await consumer.disconnect();
  }
  return out;
}

/**
 * Total messages on the topics (sum of high watermarks), without consuming. In the eos pass, the
 * records a read_committed reader sees (kcat): the offsets also count the transactions' markers
 * and the aborted batches' records.
 */
export async function topicCount(topics: string[]): Promise<number> {
  if (EXACTLY_ONCE_PASS) {
    const kcat = kcatPath();
    const counts = await Promise.all(topics.map(async (t) => (await kcatRead(kcat, t, 'read_committed', '%o\\n')).length));
    return counts.reduce((a, b) => a + b, 0);
  }
  const admin = kafka.admin();
  await admin.connect();
  try {
    let n = 0;
    for (const t of topics) for (const p of await admin.fetchTopicOffsets(t)) n += Number(p.high) - Number(p.low);
    return n;
  } finally {
    await admin.disconnect();
  }
}

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  durationMs: number;
  /** the last JSON line on stdout */
  summary?: Record<string, unknown>;
}

export interface RunningCli {
  child: ChildProcess;
  result: Promise<CliResult>;
  /** resolves when stderr contains the text (`times` times) */
  waitForStderr(text: string, timeoutMs?: number, times?: number): Promise<void>;
}

/** Run the outbox-relay CLI in a child process with exactly the given environment (plus PATH/HOME). */
export function startCli(args: string[], env: Record<string, string>): RunningCli {
  const started = Date.now();
  const child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'src', 'cli', 'main.ts'), ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', AWS_REGION: 'us-east-1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  const waiters: Array<{ text: string; times: number; resolve: () => void }> = [];
  const seen = (text: string, times: number) => stderr.split(text).length - 1 >= times;
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => {
    stderr += d.toString();
    for (const w of [...waiters]) if (seen(w.text, w.times)) w.resolve();
  });
  const result = new Promise<CliResult>((resolve) => {
    child.on('close', (code, signal) => {
      const last = stdout.trim().split('\n').filter((l) => l.startsWith('{')).pop();
      let summary: Record<string, unknown> | undefined;
      try {
        summary = last ? (JSON.parse(last) as Record<string, unknown>) : undefined;
      } catch {
        summary = undefined;
      }
      resolve({ code, signal, stdout, stderr, durationMs: Date.now() - started, summary });
    });
  });
  return {
    child,
    result,
    waitForStderr: (text, timeoutMs = 30_000, times = 1) =>
      new Promise<void>((resolve, reject) => {
        if (seen(text, times)) return resolve();
        const timer = setTimeout(() => reject(new Error(`timed out waiting for ${JSON.stringify(text)} ×${times} on stderr; got:\n${stderr}`)), timeoutMs);
        waiters.push({ text, times, resolve: () => (clearTimeout(timer), resolve()) });
      }),
  };
}

export function runCli(args: string[], env: Record<string, string>): Promise<CliResult> {
  return startCli(args, env).result;
}

/** One `invoke` through the CLI that must succeed; its summary. */
export async function invokeOk(env: Record<string, string>, timeoutMs = 20_000): Promise<Record<string, unknown> & { published: number; retried: number; parked: number; claimed: number; stoppedBecause: string; topicsBackedOff: string[]; pruned: number; batches: number; claims: number; heldBack: number; durationMs: number }> {
  const res = await runCli(['invoke', '--timeout', String(timeoutMs)], env);
  if (res.code !== 0) throw new Error(`invoke failed (exit ${String(res.code)}):\n${res.stderr}`);
  return res.summary as never;
}

/** The quoted name of an outbox table's sent table (where `keep` moves acked rows). */
export function sentTableOf(table: string): string {
  return qualified(sentTable(parseTableName(table)));
}

/**
 * Rows in the outbox and its sent table. `sent` counts both the rows moved to the sent table and
 * any marked sent in place (what pre-release versions, before the sent table, did; tests set some up by hand).
 */
export async function counts(sql: Sql, table: string): Promise<{ total: number; sent: number; parked: number; pending: number }> {
  const t = qualified(parseTableName(table));
  const [r] = await sql.unsafe<{ total: string; sent: string; parked: string; pending: string }[]>(
    `SELECT count(*) + (SELECT count(*) FROM ${sentTableOf(table)}) AS total,
            count(sent_at) + (SELECT count(*) FROM ${sentTableOf(table)}) AS sent,
            count(parked_at) FILTER (WHERE sent_at IS NULL) AS parked,
            count(*) FILTER (WHERE sent_at IS NULL AND parked_at IS NULL AND skipped_at IS NULL) AS pending
     FROM ${t}`,
  );
  return { total: Number(r!.total), sent: Number(r!.sent), parked: Number(r!.parked), pending: Number(r!.pending) };
}

/** Ids of the rows sent: in the sent table, or marked sent in the outbox. */
export async function markedIds(sql: Sql, table: string): Promise<Set<string>> {
  const rows = await sql.unsafe<{ id: string }[]>(
    `SELECT id FROM ${sentTableOf(table)} UNION ALL SELECT id FROM ${qualified(parseTableName(table))} WHERE sent_at IS NOT NULL`,
  );
  return new Set(rows.map((r) => r.id));
}

/** Every row's seq by its id, whether still in the outbox or moved to its sent table. */
export async function seqsById(sql: Sql, table: string): Promise<Map<string, number>> {
  const rows = await sql.unsafe<{ id: string; seq: string }[]>(
    `SELECT id, seq FROM ${qualified(parseTableName(table))} UNION ALL SELECT id, seq FROM ${sentTableOf(table)}`,
  );
  return new Map(rows.map((r) => [r.id, Number(r.seq)]));
}

/** The quoted name of an outbox table (schema-qualified when it is). */
export function outboxTableOf(table: string): string {
  return qualified(parseTableName(table));
}

/** A row of an outbox as a test sees it, whether still in the outbox or moved to its sent table. */
export interface RowState {
  seq: number;
  id: string;
  aggregateid: string;
  topic: string | null;
  attempts: number;
  last_error: string | null;
  /** next_attempt_at - now(), in ms (negative: due) */
  due_in_ms: number | null;
  parked: boolean;
  sent: boolean;
  skipped: boolean;
}

/** Every row of the outbox and of its sent table, in seq order. */
export async function rowStates(sql: Sql, table: string): Promise<RowState[]> {
  const rows = await sql.unsafe<(Omit<RowState, 'seq' | 'due_in_ms'> & { seq: string; due_in_ms: string | null })[]>(
    `SELECT seq, id, aggregateid, topic, attempts, last_error,
            CASE WHEN isfinite(next_attempt_at) THEN extract(epoch FROM next_attempt_at - now()) * 1000 END AS due_in_ms,
            parked_at IS NOT NULL AS parked, sent_at IS NOT NULL AS sent, skipped_at IS NOT NULL AS skipped
     FROM ${outboxTableOf(table)}
     UNION ALL
     SELECT seq, id, aggregateid, topic, attempts, NULL, NULL, false, true, false FROM ${sentTableOf(table)}
     ORDER BY seq`,
  );
  return rows.map((r) => ({ ...r, seq: Number(r.seq), due_in_ms: r.due_in_ms === null ? null : Number(r.due_in_ms) }));
}

export async function rowById(sql: Sql, table: string, id: string): Promise<RowState> {
  const row = (await rowStates(sql, table)).find((r) => r.id === id);
  assert.ok(row, `row ${id} exists`);
  return row;
}

/** Bring every backing-off row due now, so the next invocation retries it (instead of waiting). */
export async function makeDue(sql: Sql, table: string): Promise<void> {
  await sql.unsafe(`UPDATE ${outboxTableOf(table)} SET next_attempt_at = now() WHERE sent_at IS NULL AND attempts > 0 AND next_attempt_at > now()`);
}

/** Resolves once at least `n` rows of the table are marked sent (or the deadline passes). */
export async function waitSent(sql: Sql, table: string, n: number, timeoutMs = 20_000): Promise<number> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const { sent } = await counts(sql, table);
    if (sent >= n || Date.now() > until) return sent;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Terminate every backend of the relay (found by its application_name = OUTBOX_CLIENT_ID), or of a role; returns how many. */
export async function terminateBackends(admin: Sql, where: { applicationName?: string; user?: string }): Promise<number> {
  const rows = where.applicationName
    ? await admin<{ ok: boolean }[]>`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = ${where.applicationName} AND pid <> pg_backend_pid()`
    : await admin<{ ok: boolean }[]>`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE usename = ${where.user!} AND pid <> pg_backend_pid()`;
  return rows.filter((r) => r.ok).length;
}

/** The `id` headers of the messages, in their order. */
export function idsOf(msgs: Consumed[]): string[] {
  return msgs.map((m) => m.headers.id!);
}

/** Whether the broker has the topic (the relay never creates one). */
export async function topicExists(topic: string): Promise<boolean> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    return (await admin.listTopics()).includes(topic);
  } finally {
    await admin.disconnect();
  }
}

/** How many copies of each row (by its `id` header) arrived. */
export function copiesById(messages: Consumed[]): Map<string, number> {
  const copies = new Map<string, number>();
  for (const m of messages) copies.set(m.headers.id!, (copies.get(m.headers.id!) ?? 0) + 1);
  return copies;
}

/** The ids that arrived exactly twice. */
export function twiceIds(copies: Map<string, number>): Set<string> {
  return new Set([...copies].filter(([, n]) => n === 2).map(([id]) => id));
}

/** Per aggregate, the seqs (or any order key) in the order their first copies appear. */
export function firstCopyOrder(messages: Consumed[], orderOf: (id: string) => number): Map<string, number[]> {
  const seen = new Set<string>();
  const byKey = new Map<string, number[]>();
  // within one partition, offsets give the order in which the broker appended messages
  const sorted = [...messages].sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition || Number(a.offset) - Number(b.offset));
  for (const m of sorted) {
    const id = m.headers.id!;
    if (seen.has(id)) continue;
    seen.add(id);
    const list = byKey.get(m.key ?? '') ?? [];
    list.push(orderOf(id));
    byKey.set(m.key ?? '', list);
  }
  return byKey;
}

export function isSorted(xs: number[]): boolean {
  return xs.every((x, i) => i === 0 || xs[i - 1]! < x);
}

// The broker's other listeners (scripts/services/kafka.sh): SASL/SCRAM, and the two whose advertised
// address is a test proxy's (test/integration/kafka-proxy.ts): start the proxy on KAFKA_PROXY_PORT →
// KAFKA_PROXIED_PORT (or KAFKA_SASL_PROXY_PORT → KAFKA_SASL_PROXIED_PORT) and bootstrap at the proxy.
export const KAFKA_SASL_BROKERS = '127.0.0.1:9094';
export const KAFKA_PROXIED_PORT = 9095;
export const KAFKA_PROXY_PORT = 9096;
export const KAFKA_SASL_PROXIED_PORT = 9097;
export const KAFKA_SASL_PROXY_PORT = 9098;
/** the SCRAM user services.sh up creates (and resets to this password on every up) */
export const KAFKA_SCRAM_USER = 'relay';
export const KAFKA_SCRAM_PASSWORD = 'relay-secret';

/**
 * Create or change a SCRAM credential on the local broker (scripts/services/KafkaScram.java, which
 * resolves once a login with the new password succeeds on KAFKA_SASL_BROKERS). A test that rotates
 * the password should put KAFKA_SCRAM_PASSWORD back in a finally; `services.sh up` also does.
 */
export async function setScramPassword(user: string, password: string, mechanism: 'SCRAM-SHA-256' | 'SCRAM-SHA-512' | 'both' = 'both'): Promise<void> {
  const args = ['-XX:TieredStopAtLevel=1', '-XX:+UseSerialGC', '-cp', join(ROOT, '.cache', 'kafka', 'libs', '*'), join(ROOT, 'scripts', 'services', 'KafkaScram.java')];
  args.push('--bootstrap', KAFKA_BROKERS.split(',')[0]!, '--user', user, '--password', password, '--mechanism', mechanism, '--verify', KAFKA_SASL_BROKERS);
  const child = spawn('java', args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on('error', reject); // e.g. no java on PATH
    child.on('close', resolve);
  });
  if (code !== 0) throw new Error(`setScramPassword(${user}, ${mechanism}) failed (exit ${code}): ${output.trim()}`);
}

/** After a restart or a pause, partitions may be leaderless for a few seconds (KRaft fences a
 * broker whose heartbeats stopped): wait until the topics answer again. */
export async function waitForLeaders(topics: string[], timeoutMs = 60_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    try {
      await topicCount(topics);
      return;
    } catch (err) {
      if (Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

/** A consumer that stays subscribed and notes when each row (by its `id` header) first arrived. */
export async function startWatching(topics: string[]): Promise<{ arrivals: Map<string, number>; messages: Consumed[]; stop(): Promise<void> }> {
  const consumer = kafka.consumer({ groupId: uniqueName('watch'), maxWaitTimeInMs: 50 });
  const arrivals = new Map<string, number>();
  const messages: Consumed[] = [];
  await consumer.connect();
  await consumer.subscribe({ topics, fromBeginning: true });
  const joined = new Promise<void>((resolve) => consumer.on(consumer.events.GROUP_JOIN, () => resolve()));
  await consumer.run({
    // eslint-disable-next-line @typescript-eslint/require-await -- kafkajs wants a promise-returning handler
    eachMessage: async ({ topic, partition, message }) => {
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = Buffer.isBuffer(v) ? v.toString() : String(v);
      messages.push({ topic, partition, offset: message.offset, key: message.key?.toString() ?? null, value: message.value?.toString() ?? null, headers, timestamp: message.timestamp });
      if (!arrivals.has(headers.id!)) arrivals.set(headers.id!, Date.now());
    },
  });
  await joined;
  return { arrivals, messages, stop: () => consumer.disconnect() };
}

/** Each row's copies on Kafka: every marked row at least once (G1), none more than `maxCopies`. */
export function assertCopies(msgs: Consumed[], marked: Set<string>, maxCopies: number): Map<string, number> {
  const copies = copiesById(msgs);
  const lost = [...marked].filter((id) => !copies.has(id));
  assert.equal(lost.length, 0, `${lost.length} rows are marked sent but not on Kafka`);
  const over = [...copies].filter(([, n]) => n > maxCopies);
  assert.equal(over.length, 0, `${over.length} rows arrived more than ${maxCopies} times (first: ${over[0]?.join(' ×')})`);
  return copies;
}
