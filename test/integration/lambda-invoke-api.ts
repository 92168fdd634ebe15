// A small Lambda Invoke API for the tests: what @aws-sdk/client-lambda calls when
// AWS_ENDPOINT_URL_LAMBDA points here (POST /2015-03-31/functions/{name}/invocations), running
// each invocation through the packaged zip under the Runtime Interface Emulator
// (lambda-emulator.ts). A pool of emulators stands for the function's execution environments:
// at most `concurrency` (its reserved concurrency), one per invocation at a time, reused warm
// when idle; when every one is busy the call is throttled as Lambda throttles it: 429 with
// x-amzn-ErrorType TooManyRequestsException, which the SDK raises as TooManyRequestsException.
// InvocationType Event answers 202 and runs the invocation in the background. Every invocation
// and every throttled call is recorded, with its event, for the tests' assertions.
import http from 'node:http';
import type net from 'node:net';
import { Emulator, type Invocation } from './lambda-emulator.ts';

export interface Recorded {
  functionName: string;
  type: 'Event' | 'RequestResponse';
  event: Record<string, unknown>;
  startedAt: number;
  endedAt?: number;
  /** the invocation's outcome once it ended: its summary (the whole object the function returned) */
  outcome?: Invocation;
}

export class LambdaInvokeApi {
  readonly invocations: Recorded[] = [];
  readonly throttled: Array<{ functionName: string; event: Record<string, unknown>; at: number }> = [];
  /** the most invocations that ran at once */
  maxRunning = 0;
  private running = 0;
  private readonly idle: Emulator[] = [];
  private readonly all: Emulator[] = [];
  private slots = 0;
  private readonly background = new Set<Promise<void>>();
  private server!: http.Server;

  /** `start(env)`: a new emulator of the function, whose environment adds `env` (this endpoint, dummy credentials) */
  private constructor(
    private readonly concurrency: number,
    private readonly startEmulator: (env: Record<string, string>) => Promise<Emulator>,
  ) {}

  static async start(concurrency: number, startEmulator: (env: Record<string, string>) => Promise<Emulator>): Promise<LambdaInvokeApi> {
    const api = new LambdaInvokeApi(concurrency, startEmulator);
    api.server = http.createServer((req, res) => void api.handle(req, res));
    await new Promise<void>((resolve) => api.server.listen(0, '127.0.0.1', resolve));
    return api;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
  }

  /** What the relay under it needs: this endpoint for the SDK, and credentials to sign with. */
  env(): Record<string, string> {
    return { AWS_ENDPOINT_URL_LAMBDA: this.url, AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test' };
  }

  /** An invocation as a caller of the API makes it (EventBridge's schedule: type Event). */
  async invoke(event: Record<string, unknown>, type: 'Event' | 'RequestResponse' = 'Event', functionName = 'outbox-relay-test-relay'): Promise<{ status: number; body: string }> {
    const res = await fetch(`${this.url}/2015-03-31/functions/${encodeURIComponent(functionName)}/invocations`, {
      method: 'POST',
      headers: { 'X-Amz-Invocation-Type': type },
      body: JSON.stringify(event),
    });
    return { status: res.status, body: await res.text() };
  }

  /** Resolves when no invocation runs in the background any more (those started meanwhile included). */
  async settled(): Promise<void> {
    while (this.background.size > 0) await Promise.all([...this.background]);
  }

  /** The emulators' output, for a failing assertion's message. */
  output(): string {
    return this.all.map((e, i) => `--- emulator ${i} ---\n${e.output().slice(-3_000)}`).join('\n');
  }

  /** The JSON lines every emulator's function printed: log lines, EMF records (metrics). */
  jsonLines(): Array<Record<string, unknown>> {
    return this.all.flatMap((e) => e.jsonLines());
  }

  async stop(): Promise<void> {
    await this.settled();
    await new Promise((resolve) => this.server.close(resolve));
    await Promise.all(this.all.map((e) => e.stop()));
  }

  /** An idle emulator, else a new one's start, else undefined (all busy); decided at once, before any await. */
  private acquire(): Promise<Emulator> | undefined {
    const warm = this.idle.pop();
    if (warm) return Promise.resolve(warm);
    if (this.slots >= this.concurrency) return undefined;
    this.slots++;
    return this.startEmulator(this.env()).then((e) => (this.all.push(e), e));
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const m = /^\/2015-03-31\/functions\/([^/]+)\/invocations$/.exec(req.url ?? '');
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method !== 'POST' || !m) {
      res.writeHead(404, { 'x-amzn-ErrorType': 'ResourceNotFoundException' }).end(JSON.stringify({ message: `no route ${req.method} ${req.url}` }));
      return;
    }
    const functionName = decodeURIComponent(m[1]!);
    const event = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}') as Record<string, unknown>;
    const type = req.headers['x-amz-invocation-type'] === 'Event' ? 'Event' : 'RequestResponse';
    // a slot is taken before any await: two calls at once cannot both get the last one
    const emulator = this.acquire();
    if (!emulator) {
      this.throttled.push({ functionName, event, at: Date.now() });
      // as Lambda answers when the function's reserved concurrency is in use
      res
        .writeHead(429, { 'Content-Type': 'application/json', 'x-amzn-ErrorType': 'TooManyRequestsException', 'x-amzn-RequestId': crypto.randomUUID() })
        .end(JSON.stringify({ Reason: 'ReservedFunctionConcurrentInvocationLimitExceeded', Type: 'User', message: 'Rate Exceeded.' }));
      return;
    }
    const recorded: Recorded = { functionName, type, event, startedAt: Date.now() };
    this.invocations.push(recorded);
    this.maxRunning = Math.max(this.maxRunning, ++this.running);
    // an Event is answered at once, as Lambda queues it: the emulator (a cold start) comes after
    const run = emulator.then(async (e) => {
      const outcome = await e.invoke(event);
      recorded.outcome = outcome;
      recorded.endedAt = Date.now();
      this.running--;
      this.idle.push(e);
      return outcome;
    });
    if (type === 'Event') {
      res.writeHead(202, { 'x-amzn-RequestId': crypto.randomUUID() }).end();
      const done = run.then(() => undefined);
      this.background.add(done);
      void done.finally(() => this.background.delete(done));
      return;
    }
    const outcome = await run;
    res.writeHead(200, outcome.outcome === 'ok' ? {} : { 'X-Amz-Function-Error': 'Unhandled' }).end(JSON.stringify(outcome.outcome === 'ok' ? outcome.summary : outcome));
  }
}
