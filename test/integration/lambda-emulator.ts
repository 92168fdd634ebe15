// AWS's Lambda Runtime Interface Emulator running one function, as one Lambda execution
// environment: what test/integration/lambda-runtime.test.ts runs the packaged zip under, and what
// bench/cold-start.ts times cold starts with. scripts/lambda-runtime.sh installs the emulator and
// AWS's Node runtime interface client into .cache (`bash scripts/lambda-runtime.sh install`).
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { parse } from 'yaml';
import { ROOT } from './helpers.ts';
import { freePorts } from './free-ports.ts';

export const RIE = join(ROOT, '.cache', 'lambda-rie', 'bin', 'aws-lambda-rie');
export const RIC = join(ROOT, '.cache', 'lambda-ric', 'node_modules', 'aws-lambda-ric', 'index.mjs');

export const ZIP = join(ROOT, '.build', 'relay.zip');

/**
 * The function as deployed: the emulator and the runtime client installed by the project's own
 * script (a no-op once cached), the zip built as `npm run package` builds it (its serverless plugin
 * runs exactly this), unzipped as Lambda does into a task root of its own (only what is in the zip
 * is there), and the handler exactly as serverless.yml names it. The caller removes the task root.
 */
export function packagedFunction(prefix: string): { taskRoot: string; handler: string } {
  const install = spawnSync('bash', [join(ROOT, 'scripts', 'lambda-runtime.sh'), 'install'], { cwd: ROOT, encoding: 'utf8', timeout: 900_000 });
  assert.equal(install.status, 0, `scripts/lambda-runtime.sh install failed:\n${install.stdout}${install.stderr}`);
  const build = spawnSync(process.execPath, [join(ROOT, 'scripts', 'build.mjs'), '--lambda-only'], { cwd: ROOT, encoding: 'utf8', timeout: 180_000 });
  assert.equal(build.status, 0, `scripts/build.mjs --lambda-only failed:\n${build.stdout}${build.stderr}`);
  mkdirSync(join(ROOT, '.cache'), { recursive: true });
  const taskRoot = mkdtempSync(join(ROOT, '.cache', prefix));
  const unzip = spawnSync('unzip', ['-q', ZIP, '-d', taskRoot], { encoding: 'utf8' });
  assert.equal(unzip.status, 0, `unzip ${ZIP} failed: ${unzip.stderr}`);
  const sls = parse(readFileSync(join(ROOT, 'serverless.yml'), 'utf8')) as { functions: { relay: { handler: string } } };
  return { taskRoot, handler: sls.functions.relay.handler };
}

/** what EventBridge sends a function on a `rate(1 minute)` schedule */
export function scheduledEvent(): Record<string, unknown> {
  return {
    version: '0',
    id: crypto.randomUUID(),
    'detail-type': 'Scheduled Event',
    source: 'aws.events',
    account: '123456789012',
    time: new Date().toISOString().replace(/\.\d{3}Z$/, 'Z'),
    region: 'us-east-1',
    resources: ['arn:aws:events:us-east-1:123456789012:rule/outbox-relay-test-relay-schedule'],
    detail: {},
  };
}

export type Invocation =
  | { outcome: 'ok'; summary: Summary }
  | { outcome: 'timed-out'; body: string }
  | { outcome: 'error'; status: number; body: string; errorType?: string; errorMessage?: string };
export interface Summary {
  published: number;
  batches: number;
  stoppedBecause: string;
  durationMs: number;
}

/** One emulator with one function, as one Lambda execution environment: warm between invocations. */
export class Emulator {
  private log = '';
  private constructor(
    private readonly child: ChildProcess,
    private readonly port: number,
  ) {
    child.stdout!.on('data', (d: Buffer) => (this.log += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (this.log += d.toString()));
  }

  static async start(taskRoot: string, handler: string, timeoutSeconds: number, env: Record<string, string>): Promise<Emulator> {
    const [port, apiPort] = (await freePorts(2)) as [number, number];
    const child = spawn(
      RIE,
      ['--runtime-interface-emulator-address', `127.0.0.1:${port}`, '--runtime-api-address', `127.0.0.1:${apiPort}`, process.execPath, RIC, handler],
      {
        cwd: taskRoot,
        // what Lambda gives a nodejs24.x function, plus the function's own environment (serverless.yml)
        env: {
          PATH: process.env.PATH ?? '',
          HOME: '/tmp',
          LAMBDA_TASK_ROOT: taskRoot,
          AWS_LAMBDA_FUNCTION_NAME: 'outbox-relay-test-relay',
          AWS_LAMBDA_FUNCTION_MEMORY_SIZE: '512',
          AWS_LAMBDA_FUNCTION_TIMEOUT: String(timeoutSeconds),
          AWS_REGION: 'us-east-1',
          // Lambda sets it; this emulator does not, and Powertools reports cold starts only with it
          AWS_LAMBDA_INITIALIZATION_TYPE: 'on-demand',
          NODE_OPTIONS: '--enable-source-maps',
          KAFKAJS_NO_PARTITIONER_WARNING: '1',
          ...env,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    const emulator = new Emulator(child, port);
    const until = Date.now() + 10_000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`the emulator exited (${child.exitCode}):\n${emulator.log}`);
      const open = await new Promise<boolean>((resolve) => {
        const s = net.connect(port, '127.0.0.1', () => (s.destroy(), resolve(true)));
        s.on('error', () => resolve(false));
      });
      if (open) return emulator;
      if (Date.now() > until) throw new Error(`the emulator did not listen on ${port} within 10 s:\n${emulator.log}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** POST the event to the invoke endpoint, as Lambda's service does for EventBridge. */
  async invoke(event = scheduledEvent()): Promise<Invocation> {
    const res = await fetch(`http://127.0.0.1:${this.port}/2015-03-31/functions/function/invocations`, { method: 'POST', body: JSON.stringify(event) });
    const body = await res.text();
    // the emulator answers a function killed at its timeout with HTTP 200 and this text
    if (/^Task timed out after/.test(body)) return { outcome: 'timed-out', body };
    let parsed: Record<string, unknown> | undefined;
    try {
      parsed = JSON.parse(body) as Record<string, unknown>;
    } catch {
      parsed = undefined;
    }
    // a handler that throws: the runtime client posts the error, which comes back as the body
    if (res.status !== 200 || !parsed || 'errorType' in parsed || typeof parsed.stoppedBecause !== 'string') {
      return { outcome: 'error', status: res.status, body, errorType: parsed?.errorType as string | undefined, errorMessage: parsed?.errorMessage as string | undefined };
    }
    return { outcome: 'ok', summary: parsed as unknown as Summary };
  }

  async invokeOk(): Promise<Summary> {
    const r = await this.invoke();
    assert.equal(r.outcome, 'ok', `invocation failed: ${JSON.stringify(r)}\n--- emulator log (tail) ---\n${this.log.slice(-4_000)}`);
    return (r as { summary: Summary }).summary;
  }

  /**
   * Invokes until an invocation finds nothing left (stoppedBecause 'empty'), as the schedule does
   * minute after minute. On a loaded machine an invocation of a short function may end at its
   * deadline, the database or the broker slower than its budget: that is G5 at work, a failure
   * the next tick recovers from, so it is counted and the draining goes on; any other failure
   * fails the test. Each such invocation may leave its batch in flight on Kafka unmarked, to be
   * sent again: `atDeadline` bounds the copies the caller allows.
   */
  async drain(maxInvocations = 10): Promise<{ atDeadline: number; last: Summary }> {
    let atDeadline = 0;
    for (let i = 0; i < maxInvocations; i++) {
      const r = await this.invoke();
      if (r.outcome === 'ok') {
        if (r.summary.stoppedBecause === 'empty') return { atDeadline, last: r.summary };
        continue;
      }
      const failedAtDeadline = r.outcome === 'error' && /before the invocation's deadline/.test(r.errorMessage ?? '');
      assert.ok(failedAtDeadline, `invocation failed: ${JSON.stringify(r)}\n--- emulator log (tail) ---\n${this.log.slice(-4_000)}`);
      atDeadline++;
    }
    assert.fail(`not drained after ${maxInvocations} invocations\n--- emulator log (tail) ---\n${this.log.slice(-4_000)}`);
  }

  /** the runtime process (the runtime interface client running the handler), child of the emulator */
  runtimePids(): number[] {
    // the emulator is a Go program: any of its threads may have forked the runtime
    const pids: number[] = [];
    try {
      for (const task of readdirSync(`/proc/${this.child.pid}/task`)) {
        pids.push(...readFileSync(`/proc/${this.child.pid}/task/${task}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number));
      }
    } catch {
      // the emulator is gone
    }
    return pids.sort((a, b) => a - b);
  }

  /** the log lines the function printed (JSON), e.g. Powertools' "invocation finished" */
  jsonLines(): Array<Record<string, unknown>> {
    return this.log
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .flatMap((l) => {
        try {
          return [JSON.parse(l) as Record<string, unknown>];
        } catch {
          return [];
        }
      });
  }

  output(): string {
    return this.log;
  }

  /**
   * The init phase of each runtime process so far, as the emulator reports it ("INIT REPORT
   * (durationMs: …)"): the runtime client started and the handler module imported, until it asks
   * for its first event. The emulator starts the runtime at the first invoke, and its REPORT
   * line's "Init Duration" is always ~0 ms: this is the figure Lambda's REPORT line gives.
   */
  initDurationsMs(): number[] {
    return [...this.log.matchAll(/INIT REPORT\(durationMs: ([\d.]+)\)/g)].map((m) => Number(m[1]));
  }

  /** Each invocation's duration so far, from the runtime's next event to its response ("INVOKE RTDONE(…, duration: …ms)"). */
  invokeDurationsMs(): number[] {
    return [...this.log.matchAll(/INVOKE RTDONE\([^)]*duration: ([\d.]+)ms\)/g)].map((m) => Number(m[1]));
  }

  /** The runtime process's peak resident memory so far (VmHWM), in KiB; undefined when there is none. */
  runtimePeakRssKiB(): number | undefined {
    const [pid] = this.runtimePids();
    if (pid === undefined) return undefined;
    const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const runtimes = this.runtimePids();
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
    // its runtime, in case the emulator left it behind (it may be SIGSTOPped by a test)
    for (const pid of runtimes) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}
