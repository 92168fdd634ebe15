// One Lambda container of the latency bench (bench/latency.ts): a warm Runtime in a worker thread
// of its own, so that containers never share an event loop with each other, the producer or the
// consumer, as they would not on Lambda. The parent sends `{ invoke: remainingMs }`, the worker
// answers with the summary (or the error) and the CPU its own thread spent on that invocation.
import { readFileSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { loadConfig } from '../src/config/load.ts';
import { createLogger } from '../src/log.ts';
import { Runtime } from '../src/lambda/runtime.ts';

export type RelayWorkerRequest = { invoke: number } | { close: true };
export interface RelayWorkerAnswer {
  summary?: Record<string, unknown>;
  error?: string;
  startedAt: number;
  endedAt: number;
  /** CPU seconds this thread spent during the invocation */
  cpu: number;
}

/** utime + stime of the calling thread, seconds (Linux; 0 elsewhere) */
function threadCpu(): number {
  try {
    const s = readFileSync('/proc/thread-self/stat', 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return 0;
  }
}

const runtime = new Runtime(loadConfig(workerData as Record<string, string>), createLogger('warn'));

parentPort!.on('message', (req: RelayWorkerRequest) => {
  if ('close' in req) {
    void runtime.close().then(() => process.exit(0));
    return;
  }
  const startedAt = Date.now();
  const cpu0 = threadCpu();
  const answer = (a: Partial<RelayWorkerAnswer>) => parentPort!.postMessage({ ...a, startedAt, endedAt: Date.now(), cpu: threadCpu() - cpu0 } satisfies RelayWorkerAnswer);
  runtime.invoke(req.invoke).then(
    (summary) => answer({ summary: summary as unknown as Record<string, unknown> }),
    (err: unknown) => answer({ error: err instanceof Error ? err.message : String(err) }),
  );
});
