// Spike for issue 36 (exactly-once for read_committed consumers), not part of `npm run bench`:
// what one Kafka transaction per batch costs with each client, and how each behaves where the mode
// will lean on it: a transactional id reused after a clean close and after a crash (a transaction
// left open), and a producer fenced by a newer one with its id.
//
//   node --import tsx bench/spike-eos.ts      (the local broker, 127.0.0.1:9092; BENCH_RECORDS, BENCH_BATCH)
//
// Plain is the relay's own producer (idempotent, acks=all, one in flight), one awaited send per
// batch; transactional adds begin, AddPartitionsToTxn and EndTxn around each batch's send.
//
// First run (d1bd0a7, the local single broker, 2 shared cores; one run, so a rough figure):
//   kafkajs              plain 59859 events/s   transactional 11921 events/s  (commit p50 1.1 ms, max 5.4 ms)
//   @platformatic/kafka  plain 71491 events/s   transactional  1142 events/s  (commit p50 1.2 ms, max 23.0 ms)
//   kafkajs logged no CONCURRENT_TRANSACTIONS retry; re-init with the same id: 9 ms after a clean
//   close, 13 ms after a close with a transaction open.
// Unfinished, for the issue to pick up:
//   - kafkajs: "NOT fenced": the older producer's commit succeeded although a newer one with its id
//     had connected. kafkajs sends InitProducerId at the first transaction(), not at connect, so
//     fencing() must begin a transaction on the newer one first; not yet changed.
//   - @platformatic/kafka: its transactional rate is a tenth of kafkajs' with the same commit time:
//     the cost is in begin or send (AddPartitionsToTxn, retries?), not measured apart yet.
//   - @platformatic/kafka: in reuse()/fencing() an InitProducerId answered PRODUCER_FENCED (code 90)
//     was thrown from its socket's data handler (init-producer-id-v5.js parseResponse) as an
//     uncaught ResponseError (code PLT_KFK_RESPONSE) wrapping ProtocolError (apiId PRODUCER_FENCED,
//     apiCode 90, canRetry false): it crashed the process instead of rejecting a promise. Which
//     call triggers it is not isolated yet.
import { randomUUID } from 'node:crypto';
import { Producer as PProducer, stringSerializers } from '@platformatic/kafka';
import { Kafka, logLevel, type LogEntry } from 'kafkajs';
import { measuredCommit } from './commit.ts';

const BROKERS = (process.env.BENCH_KAFKA_BROKERS ?? '127.0.0.1:9092').split(',');
const RECORDS = Number(process.env.BENCH_RECORDS ?? 20_000);
const BATCH = Number(process.env.BENCH_BATCH ?? 500);
const PARTITIONS = 3;
const topic = `bench.eos_${randomUUID().slice(0, 8)}.order`;

/** kafkajs' retries, by error type, as it logs them: the only place they are visible */
const kafkajsRetries = new Map<string, number>();
const kafka = new Kafka({
  clientId: 'spike-eos',
  brokers: BROKERS,
  logLevel: logLevel.WARN,
  logCreator: () => (entry: LogEntry) => {
    const err = `${(entry.log as { error?: string }).error ?? ""} ${entry.log.message}`;
    for (const type of ['CONCURRENT_TRANSACTIONS', 'COORDINATOR_LOAD_IN_PROGRESS', 'NOT_COORDINATOR']) {
      if (err.includes(type) || err.includes(type.toLowerCase().replace(/_/g, ' '))) kafkajsRetries.set(type, (kafkajsRetries.get(type) ?? 0) + 1);
    }
  },
});

type Msg = { key: string; value: string };
const payload = 'x'.repeat(200);
const batches: Msg[][] = [];
for (let i = 0; i < RECORDS; i += BATCH) {
  batches.push(Array.from({ length: Math.min(BATCH, RECORDS - i) }, (_, j) => ({ key: `order-${(i + j) % 997}`, value: `{"n":${i + j},"p":"${payload}"}` })));
}

/** Each transaction's commit, in ms: the EndTxn round trip, which the mode adds to every batch. */
const commitMs: Record<string, number[]> = {};

interface Client {
  name: string;
  plain(): Promise<{ send(m: Msg[]): Promise<void>; close(): Promise<void> }>;
  transactional(id: string): Promise<TxProducer>;
}
interface TxProducer {
  begin(): Promise<{ send(m: Msg[]): Promise<void>; commit(): Promise<void>; abort(): Promise<void> }>;
  close(): Promise<void>;
}

const kafkajsClient: Client = {
  name: 'kafkajs',
  async plain() {
    const p = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
    await p.connect();
    return { send: async (m) => void (await p.send({ topic, acks: -1, messages: m })), close: () => p.disconnect() };
  },
  async transactional(id) {
    const p = kafka.producer({ transactionalId: id, idempotent: true, maxInFlightRequests: 1 });
    await p.connect();
    return {
      async begin() {
        const tx = await p.transaction();
        return { send: async (m) => void (await tx.send({ topic, acks: -1, messages: m })), commit: () => tx.commit(), abort: () => tx.abort() };
      },
      close: () => p.disconnect(),
    };
  },
};

function platformaticProducer(transactionalId?: string) {
  return new PProducer({
    clientId: 'spike-eos',
    bootstrapBrokers: BROKERS,
    idempotent: true,
    maxInflights: 1,
    acks: -1,
    autocreateTopics: false,
    serializers: stringSerializers,
    ...(transactionalId ? { transactionalId } : {}),
  });
}

const platformaticClient: Client = {
  name: '@platformatic/kafka',
  async plain() {
    const p = platformaticProducer();
    await p.initIdempotentProducer({});
    return { send: async (m) => void (await p.send({ messages: m.map((x) => ({ topic, ...x })) })), close: () => p.close() };
  },
  async transactional(id) {
    const p = platformaticProducer(id);
    await p.initIdempotentProducer({});
    return {
      async begin() {
        const tx = await p.beginTransaction();
        return { send: async (m) => void (await tx.send({ messages: m.map((x) => ({ topic, ...x })) })), commit: () => tx.commit(), abort: () => tx.abort() };
      },
      close: () => p.close(),
    };
  },
};

async function timed(fn: () => Promise<void>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

async function measurePlain(c: Client): Promise<number> {
  const p = await c.plain();
  await p.send(batches[0]!.slice(0, 1)); // connections and metadata, outside the timing
  const ms = await timed(async () => {
    for (const b of batches) await p.send(b);
  });
  await p.close();
  return ms;
}

async function measureTransactional(c: Client): Promise<number> {
  const p = await c.transactional(`spike-eos-${c.name}-${randomUUID()}`);
  const warm = await p.begin();
  await warm.send(batches[0]!.slice(0, 1));
  await warm.commit();
  const commits: number[] = (commitMs[c.name] = []);
  const ms = await timed(async () => {
    for (const b of batches) {
      const tx = await p.begin();
      await tx.send(b);
      commits.push(await timed(() => tx.commit()));
    }
  });
  await p.close();
  return ms;
}

/** What an error looks like to the caller: class, name, code/type, retriable, and one level of what it wraps. */
function describeError(err: unknown): string {
  const one = (e: unknown): string => {
    if (!(e instanceof Error)) return String(e);
    const x = e as Error & { code?: unknown; type?: unknown; retriable?: unknown; canRetry?: unknown; apiCode?: unknown; apiId?: unknown };
    const fields = Object.entries({ code: x.code, type: x.type, apiCode: x.apiCode, apiId: x.apiId, retriable: x.retriable, canRetry: x.canRetry })
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${k}=${String(v)}`);
    return `${e.constructor.name}(name=${e.name}${fields.length ? ', ' + fields.join(', ') : ''}): ${e.message}`;
  };
  const inner = [...((err as { errors?: unknown[] }).errors ?? []), ...((err as { cause?: unknown }).cause ? [(err as { cause: unknown }).cause] : [])];
  return [one(err), ...inner.slice(0, 3).map((e) => `  wraps ${one(e)}`)].join('\n');
}

/** Two producers with one id: the newer one's init fences the older, whose commit must then fail. */
async function fencing(c: Client): Promise<string> {
  const id = `spike-eos-fence-${c.name}-${randomUUID()}`;
  const older = await c.transactional(id);
  const tx = await older.begin();
  await tx.send(batches[0]!.slice(0, 5));
  const newer = await c.transactional(id);
  let out: string;
  try {
    await tx.commit();
    out = 'the older producer committed: NOT fenced';
  } catch (err) {
    out = describeError(err);
  }
  // the newer one works at once: its init already aborted the older one's transaction
  const t = await newer.begin();
  await t.send(batches[0]!.slice(0, 5));
  await t.commit();
  await older.close().catch(() => {});
  await newer.close();
  return out;
}

/** The same id again: after a clean close, and after a "crash" (a transaction left open, the producer dropped). */
async function reuse(c: Client): Promise<string[]> {
  const lines: string[] = [];
  const id = `spike-eos-reuse-${c.name}-${randomUUID()}`;
  const first = await c.transactional(id);
  const t1 = await first.begin();
  await t1.send(batches[0]!.slice(0, 5));
  await t1.commit();
  await first.close();
  let second: TxProducer | undefined;
  const initClean = await timed(async () => void (second = await c.transactional(id)));
  const t2 = await second!.begin();
  await t2.send(batches[0]!.slice(0, 5));
  // crash: close with the transaction open (a Lambda timed out mid-batch)
  await second!.close().catch(() => {});
  let third: TxProducer | undefined;
  let initAfterCrash: string;
  try {
    initAfterCrash = `${(await timed(async () => void (third = await c.transactional(id)))).toFixed(0)} ms`;
  } catch (err) {
    initAfterCrash = `failed: ${describeError(err)}`;
  }
  if (third) {
    const t3 = await third.begin();
    await t3.send(batches[0]!.slice(0, 5));
    await t3.commit();
    await third.close();
  }
  lines.push(`re-init after a clean close: ${initClean.toFixed(0)} ms`);
  lines.push(`re-init after a close with a transaction open: ${initAfterCrash}`);
  return lines;
}

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
}

async function main(): Promise<void> {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: PARTITIONS, replicationFactor: 1 }] });
  console.log(`spike-eos at ${measuredCommit()}: ${RECORDS} records of ~${batches[0]![0]!.value.length} bytes, batches of ${BATCH}, ${PARTITIONS} partitions, one run each, in turn`);
  try {
    for (const c of [kafkajsClient, platformaticClient]) {
      const plain = await measurePlain(c);
      const tx = await measureTransactional(c);
      const commits = commitMs[c.name]!;
      console.log(
        `${c.name.padEnd(20)} plain ${((RECORDS / plain) * 1000).toFixed(0).padStart(7)} events/s   transactional ${((RECORDS / tx) * 1000).toFixed(0).padStart(7)} events/s` +
          `   (${((tx / plain - 1) * 100).toFixed(0)}% more time; commit p50 ${pct(commits, 50).toFixed(1)} ms, max ${Math.max(...commits).toFixed(1)} ms)`,
      );
    }
    console.log(`kafkajs retries logged: ${kafkajsRetries.size ? [...kafkajsRetries].map(([k, v]) => `${k} ×${v}`).join(', ') : 'none'}`);
    for (const c of [kafkajsClient, platformaticClient]) {
      console.log(`\n${c.name}, id reuse:\n  ${(await reuse(c)).join('\n  ')}`);
      console.log(`${c.name}, the fenced producer's commit:\n  ${(await fencing(c)).replace(/\n/g, '\n  ')}`);
    }
    console.log(`kafkajs retries logged, in all: ${kafkajsRetries.size ? [...kafkajsRetries].map(([k, v]) => `${k} ×${v}`).join(', ') : 'none'}`);
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => {});
    await admin.disconnect();
  }
}

await main();
