// The application of the latency bench (bench/latency.ts), in a worker thread: `rate` events per
// second for `seconds`, in small transactions (one every TICK_MS, rate/100 events each at 10 ms),
// each event written with the project's enqueue helper. It keeps to the wall clock: a tick that
// ran late is caught up by the next, so the rate holds on average. Committed events are counted
// in shared memory. At the end it posts the CPU its own Postgres backends spent (born with it, so
// from 0): the application's inserts, the same whichever relays them, taken out of Postgres's CPU.
import { parentPort, workerData } from 'node:worker_threads';
import postgres from 'postgres';
import { enqueue } from '../src/outbox/enqueue.ts';
import { processCpu } from './cpu.ts';

/** what the worker posts before it exits */
export interface RateProducerDone {
  written: number;
  /** CPU seconds of its Postgres backends (0 when Postgres runs elsewhere) */
  postgresCpu: number;
}

export interface RateProducerData {
  url: string;
  table: string;
  rate: number;
  seconds: number;
  aggregates: number;
  payloadBytes: number;
  /** BigInt64Array over a SharedArrayBuffer: [0] events committed */
  committed: SharedArrayBuffer;
}

const TICK_MS = 10;
const d = workerData as RateProducerData;
const committed = new BigInt64Array(d.committed);
// two connections: a commit that waits on the disk does not hold the next tick back
const APP = `outbox-bench-producer-${process.pid}`;
const sql = postgres(d.url, { max: 2, onnotice: () => undefined, connection: { application_name: APP } });
const pad = 'x'.repeat(Math.max(0, d.payloadBytes - 40));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)));

async function main(): Promise<void> {
  const started = performance.now();
  const total = Math.round(d.rate * d.seconds);
  let written = 0;
  const inFlight = new Set<Promise<void>>();
  while (written < total) {
    // events due by now, at the configured rate
    const due = Math.min(total, Math.floor(((performance.now() - started) / 1000) * d.rate));
    const n = due - written;
    if (n > 0) {
      const first = written;
      written = due;
      const tx = sql
        .begin(async (t) => {
          for (let i = first; i < first + n; i++) {
            await enqueue(t, { aggregatetype: 'bench', aggregateid: `agg-${i % d.aggregates}`, type: 'Happened', payload: { i, pad } }, { table: d.table });
          }
        })
        .then(() => {
          Atomics.add(committed, 0, BigInt(n));
        });
      inFlight.add(tx);
      void tx.finally(() => inFlight.delete(tx));
      // at most two transactions at a time (the pool's two connections)
      if (inFlight.size >= 2) await Promise.race(inFlight);
    }
    await sleep(TICK_MS - ((performance.now() - started) % TICK_MS));
  }
  await Promise.all(inFlight);
  const backends = await sql<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE application_name = ${APP}`;
  const postgresCpu = backends.reduce((s, b) => s + processCpu(b.pid), 0);
  await sql.end();
  parentPort!.postMessage({ written, postgresCpu } satisfies RateProducerDone);
}

main().catch((err: unknown) => {
  throw err;
});
