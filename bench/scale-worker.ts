// One concurrent invocation of the scale bench (bench/scale.ts): a process of its own, as a Lambda
// container is, with a warm Runtime that runs invocations back to back until told to stop. The
// relays coordinate through the table's row locks only, as concurrent invocations do.
// Parent → worker: setup, go, stop, close. Worker → parent: ready, one report per invocation, done.
import { Deadline } from '../src/budget.ts';
import { loadConfig } from '../src/config/load.ts';
import { createLogger } from '../src/log.ts';
import { Runtime } from '../src/lambda/runtime.ts';

export type ScaleWorkerRequest =
  | { setup: Record<string, string>; topic: string }
  | { go: true }
  | { stop: true }
  | { close: true };
export type ScaleWorkerReport = { ready: true } | { published: number } | { done: WorkerTotals } | { error: string };

export interface WorkerTotals {
  invocations: number;
  /** invocations that published nothing */
  empty: number;
  /** rows claimed but held back behind an earlier row of their aggregate another invocation held */
  heldBack: number;
  /** ms the invocations waited for claims, publishes and commits (Summary.waitedMs), summed */
  waitedMs: { claim: number; publish: number; commit: number };
}

/** Lambda's timeout in the shipped settings: an invocation ends on an empty table long before */
const INVOCATION_MS = 60_000;
/** after an invocation that found every claimable row held: the next one, soon (a busy schedule) */
const RETRY_MS = 10;

const send = (m: ScaleWorkerReport) => process.send!(m);
let runtime: Runtime | undefined;
let stopping = false;

async function setup(env: Record<string, string>, topic: string): Promise<void> {
  runtime = new Runtime(loadConfig(env), createLogger('warn'));
  // a warm container: connected to the database (an invocation on the still empty table) and to
  // the broker, with the topic's metadata, before the backlog is written
  await runtime.invoke(INVOCATION_MS);
  const deadline = new Deadline(Date.now() + 30_000);
  await runtime.publisher().publish([], deadline);
  await runtime.publisher().maxMessageBytes(topic, deadline);
  send({ ready: true });
}

async function work(): Promise<void> {
  const totals: WorkerTotals = { invocations: 0, empty: 0, heldBack: 0, waitedMs: { claim: 0, publish: 0, commit: 0 } };
  while (!stopping) {
    const summary = await runtime!.invoke(INVOCATION_MS);
    totals.invocations++;
    totals.heldBack += summary.heldBack;
    for (const k of ['claim', 'publish', 'commit'] as const) totals.waitedMs[k] += summary.waitedMs[k];
    send({ published: summary.published });
    if (summary.published === 0) {
      totals.empty++;
      await new Promise((r) => setTimeout(r, RETRY_MS));
    }
  }
  send({ done: totals });
}

const fail = (err: unknown) => send({ error: err instanceof Error ? (err.stack ?? err.message) : String(err) });

process.on('message', (req: ScaleWorkerRequest) => {
  if ('setup' in req) setup(req.setup, req.topic).catch(fail);
  else if ('go' in req) work().catch(fail);
  else if ('stop' in req) stopping = true;
  else void (runtime?.close() ?? Promise.resolve()).finally(() => process.exit(0));
});
