// The README's first command: a demo producer writes order events into the outbox in
// transactions (with enqueue()), the local schedule (the EventBridge stand-in) relays them, and
// a consumer shows they arrived on Kafka, per order in the order they were written.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import kafkajs from 'kafkajs';
import postgres from 'postgres';
import { enqueue } from '../src/outbox/enqueue.ts';

const { Kafka, logLevel } = kafkajs;
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox';
const KAFKA_BROKERS = process.env.KAFKA_BROKERS ?? '127.0.0.1:9092';
const ORDERS = 25;
const STEPS = ['OrderCreated', 'OrderPaid', 'OrderPacked', 'OrderShipped'];
const TOPIC = 'outbox.event.order';
const say = (s: string) => process.stdout.write(s + '\n');

// the CLI's EMF metrics record (a long JSON line per invocation, on stderr) would bury the demo's
// own lines; the summary it prints carries the same figures
const env = { ...process.env, DATABASE_URL, KAFKA_BROKERS, OUTBOX_LOG_LEVEL: 'warn', OUTBOX_METRICS: 'off', KAFKAJS_NO_PARTITIONER_WARNING: '1' };
const cli = (args: string[]) => spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'src', 'cli', 'main.ts'), ...args], { env, stdio: ['ignore', 'pipe', 'inherit'] });

async function main(): Promise<void> {
  say('1. migrate: create the outbox table (idempotent)');
  await new Promise<void>((resolve, reject) => cli(['migrate']).on('close', (c) => (c === 0 ? resolve() : reject(new Error(`migrate exited ${c}`)))));

  const kafka = new Kafka({ clientId: 'demo', brokers: KAFKA_BROKERS.split(','), logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  if (!(await admin.listTopics()).includes(TOPIC)) {
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic: TOPIC, numPartitions: 3, replicationFactor: 1 }] });
    say(`2. created topic ${TOPIC} (3 partitions; auto-creation is off)`);
  } else say(`2. topic ${TOPIC} exists`);
  const start = await admin.fetchTopicOffsets(TOPIC);
  await admin.disconnect();

  say(`3. the demo application writes ${ORDERS * STEPS.length} events for ${ORDERS} orders, each in its own transaction with its business row`);
  const sql = postgres(DATABASE_URL, { onnotice: () => undefined });
  await sql`CREATE TABLE IF NOT EXISTS demo_orders (id text PRIMARY KEY, status text NOT NULL)`;
  const runId = Date.now().toString(36);
  const written = new Map<string, string[]>();
  for (const step of STEPS) {
    for (let o = 0; o < ORDERS; o++) {
      const orderId = `order-${runId}-${o}`;
      await sql.begin(async (tx) => {
        await tx`INSERT INTO demo_orders (id, status) VALUES (${orderId}, ${step}) ON CONFLICT (id) DO UPDATE SET status = excluded.status`;
        const id = await enqueue(tx, { aggregatetype: 'order', aggregateid: orderId, type: step, payload: { orderId, status: step, at: new Date().toISOString() } });
        written.set(orderId, [...(written.get(orderId) ?? []), id]);
      });
    }
  }
  await sql.end();

  say('4. consumer subscribed; starting `outbox-relay schedule --every 2000` (the local EventBridge)');
  const consumer = kafka.consumer({ groupId: `demo-${runId}`, maxWaitTimeInMs: 200 });
  await consumer.connect();
  await consumer.subscribe({ topic: TOPIC, fromBeginning: true });
  const received = new Map<string, Array<{ id: string; type: string }>>();
  let count = 0;
  let resolveAll: () => void = () => undefined;
  const all = new Promise<void>((r) => (resolveAll = r));
  const startOffsets = new Map(start.map((p) => [p.partition, Number(p.high)]));
  await consumer.run({
    // eslint-disable-next-line @typescript-eslint/require-await -- kafkajs wants a promise-returning handler
    eachMessage: async ({ partition, message }) => {
      if (Number(message.offset) < (startOffsets.get(partition) ?? 0)) return; // earlier demo runs
      const key = message.key!.toString();
      const id = message.headers!.id!.toString();
      const type = message.headers!.type!.toString();
      const list = received.get(key) ?? [];
      if (!list.some((m) => m.id === id)) list.push({ id, type });
      received.set(key, list);
      if (++count === ORDERS * STEPS.length) resolveAll();
    },
  });

  const schedule = cli(['schedule', '--every', '2000', '--timeout', '10000']);
  schedule.stdout.on('data', (d: Buffer) => {
    for (const line of d.toString().trim().split('\n')) {
      const s = JSON.parse(line) as { published: number; batches: number; durationMs: number; stoppedBecause: string };
      say(`   invocation: published ${s.published} in ${s.batches} batch(es), ${s.durationMs} ms, stopped because ${s.stoppedBecause}`);
    }
  });
  const timeout = setTimeout(() => resolveAll(), 60_000);
  await all;
  clearTimeout(timeout);
  schedule.kill('SIGTERM');
  await new Promise((r) => schedule.on('close', r));
  await consumer.disconnect();

  say('5. what arrived on Kafka:');
  let inOrder = 0;
  for (const [orderId, ids] of written) {
    const got = received.get(orderId) ?? [];
    if (JSON.stringify(got.map((m) => m.id)) === JSON.stringify(ids)) inOrder++;
  }
  const sample = [...written.keys()][0]!;
  say(`   ${sample}: ${(received.get(sample) ?? []).map((m) => m.type).join(' → ')}`);
  say(`   ${count} of ${ORDERS * STEPS.length} events received; ${inOrder} of ${ORDERS} orders complete and in the order they were written`);
  if (inOrder !== ORDERS) {
    process.exitCode = 1;
    say('   FAILED: some events are missing or out of order');
  } else say('done: every event is on Kafka, keyed by order id, in order. `outbox-relay status` shows the table.');
}

await main();
