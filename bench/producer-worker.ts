// The application side of `--only sustained` (bench/retention.ts), in a worker thread so that the
// relay's event loop (kafkajs encodes batches synchronously, tens of milliseconds each) cannot
// slow it down: `connections` loops, each inserting a 500-row transaction whenever fewer than
// `target` rows are pending, else sleeping 10 ms. Committed rows are counted in `inserted`
// (shared memory), after each COMMIT has been answered.
import { parentPort, workerData } from 'node:worker_threads';
import postgres from 'postgres';

export interface ProducerWorkerData {
  url: string;
  /** the quoted table name */
  t: string;
  target: number;
  rowsPerTx: number;
  aggregates: number;
  payloadBytes: number;
  connections: number;
  /** BigInt64Array over a SharedArrayBuffer: [0] rows committed */
  inserted: SharedArrayBuffer;
}

const d = workerData as ProducerWorkerData;
const inserted = new BigInt64Array(d.inserted);
const sql = postgres(d.url, { max: d.connections, onnotice: () => undefined, connection: { application_name: 'outbox-bench-producer' } });
const pad = 'x'.repeat(Math.max(0, d.payloadBytes - 40));
let stopped = false;
let next = 0;
parentPort!.on('message', () => {
  stopped = true;
});

async function work(): Promise<void> {
  while (!stopped) {
    const [p] = await sql.unsafe<{ n: number }[]>(
      `SELECT count(*)::int AS n FROM (SELECT 1 FROM ${d.t} WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL LIMIT $1) p`,
      [d.target],
    );
    if (p!.n >= d.target) {
      await new Promise((r) => setTimeout(r, 10));
      continue;
    }
    const from = next;
    next += d.rowsPerTx;
    // one statement, one transaction; many aggregates, interleaved as in bench.ts
    await sql.unsafe(
      `INSERT INTO ${d.t} (aggregatetype, aggregateid, type, payload)
       SELECT 'bench', 'agg-' || ((g * 7919) % $2), 'Benchmarked', jsonb_build_object('n', g, 'pad', $3::text)
       FROM generate_series($1::bigint, $1::bigint + $4::int - 1) g`,
      [from, d.aggregates, pad, d.rowsPerTx],
    );
    Atomics.add(inserted, 0, BigInt(d.rowsPerTx));
  }
}

try {
  await Promise.all(Array.from({ length: d.connections }, work));
} finally {
  await sql.end({ timeout: 5 });
  // the message listener would keep the thread alive
  parentPort!.close();
}
