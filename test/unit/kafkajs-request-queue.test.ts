// kafkajs 2.2.4's request queue as patches/kafkajs+2.2.4.patch leaves it (the real module in
// node_modules, patched by `npm ci`'s prepare step): no timer once nothing is pending, where
// 2.2.4 armed one for a negative delay after every response (TimeoutNegativeWarning on Node 24,
// and a 1 ms loop per connection, upstream issue #1751), while a throttled or full queue still
// sends what it holds.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { describe, it } from 'node:test';

interface Entry {
  correlationId: number;
  apiName: string;
  apiKey: number;
  apiVersion: number;
  resolve(v: unknown): void;
  reject(e: unknown): void;
}
interface RequestQueue {
  throttleCheckTimeoutId: unknown;
  pending: unknown[];
  push(r: { entry: Entry; expectResponse: boolean; sendRequest(): void }): void;
  fulfillRequest(r: { correlationId: number; payload: Buffer; size: number }): void;
  maybeThrottle(ms: number): void;
  destroy(): void;
}
type RequestQueueClass = new (o: Record<string, unknown>) => RequestQueue;

const RequestQueue = createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js') as RequestQueueClass;
const silent = { debug: () => undefined, info: () => undefined, warn: () => undefined, error: () => undefined };
const queue = (maxInFlightRequests: number | null = null) =>
  new RequestQueue({ maxInFlightRequests, requestTimeout: 10_000, enforceRequestTimeout: false, clientId: 'test', broker: 'b:9092', logger: silent });

let ids = 0;
/** a request to push, and the correlation ids sent so far */
function request(sent: number[]) {
  const correlationId = ++ids;
  const entry: Entry = { correlationId, apiName: 'Produce', apiKey: 0, apiVersion: 7, resolve: () => undefined, reject: () => undefined };
  return { correlationId, pushed: { entry, expectResponse: true, sendRequest: () => void sent.push(correlationId) } };
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("kafkajs' request queue, patched (patches/kafkajs+2.2.4.patch)", () => {
  it('a response that leaves nothing pending arms no timer: no TimeoutNegativeWarning, no 1 ms polling loop', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => void warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    const q = queue();
    try {
      const sent: number[] = [];
      for (let i = 0; i < 3; i++) {
        const r = request(sent);
        q.push(r.pushed);
        q.fulfillRequest({ correlationId: r.correlationId, payload: Buffer.alloc(0), size: 0 });
        assert.equal(q.throttleCheckTimeoutId, null, `a timer armed after response ${i + 1} with nothing pending`);
      }
      assert.equal(sent.length, 3);
      // process warnings are emitted on the next tick
      await sleep(20);
      assert.deepEqual(warnings.filter((w) => w.startsWith('TimeoutNegativeWarning')), []);
    } finally {
      q.destroy();
      process.off('warning', onWarning);
    }
  });

  it('a throttled queue holds a request and sends it when the throttle ends, then arms nothing', async () => {
    const q = queue();
    try {
      const sent: number[] = [];
      q.maybeThrottle(40);
      const r = request(sent);
      q.push(r.pushed);
      assert.deepEqual(sent, [], 'sent while throttled');
      assert.notEqual(q.throttleCheckTimeoutId, null, 'no check armed for the end of the throttle');
      for (let waited = 0; sent.length === 0 && waited < 2_000; waited += 10) await sleep(10);
      assert.deepEqual(sent, [r.correlationId], 'not sent after the throttle ended');
      q.fulfillRequest({ correlationId: r.correlationId, payload: Buffer.alloc(0), size: 0 });
      assert.equal(q.throttleCheckTimeoutId, null);
    } finally {
      q.destroy();
    }
  });

  it('one request in flight (the relay\'s producer setting): the next waits, and goes at the first response', () => {
    const q = queue(1);
    try {
      const sent: number[] = [];
      const [a, b] = [request(sent), request(sent)];
      q.push(a.pushed);
      q.push(b.pushed);
      assert.deepEqual(sent, [a.correlationId]);
      q.fulfillRequest({ correlationId: a.correlationId, payload: Buffer.alloc(0), size: 0 });
      assert.deepEqual(sent, [a.correlationId, b.correlationId]);
      assert.equal(q.pending.length, 0);
    } finally {
      q.destroy();
    }
  });
});
