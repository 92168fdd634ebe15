// services: postgres, kafka, build-dir alone
// The deployed artifact under a real Lambda runtime: the zip scripts/build.mjs builds (the step
// `npm run package` runs first), unzipped as Lambda unzips it into its task root, run by AWS's
// Runtime Interface Emulator with AWS's Node runtime interface client (scripts/lambda-runtime.sh
// installs both into .cache), invoked over HTTP with an EventBridge scheduled event. What the
// CLI-driven tests never exercise: the handler resolved from the bundle by name, the context and
// getRemainingTimeInMillis coming from the runtime, a warm runtime process reused, and the
// function killed at its timeout. One test needs the crash-window pause, which every build
// leaves out (src/test-hooks.ts): it runs the same bundle built with the test hooks on
// (scripts/build.mjs --test-hooks), and another shows that the deployed zip cannot be paused.
// And the zip's code splitting: a cold start loads only the configured Kafka client's chunks, and
// the X-Ray tracer's only with OUTBOX_TRACING=true.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Sql } from 'postgres';
import { consumeAll, copiesById, counts, db, fixture, insertEvents, ROOT, type Fixture } from './helpers.ts';
import { Emulator, packagedFunction, type Invocation } from './lambda-emulator.ts';

/** the Lambda bundle with the test hooks on (scripts/build.mjs --test-hooks): never deployed */
const TEST_HOOKS_BUNDLE = join(ROOT, '.build', 'relay-test-hooks');

let sql: Sql;
let taskRoot: string;
/** a task root holding the bundle with the test hooks on, in place of the zip's */
let testHooksRoot: string;
let handler: string;
const emulators: Emulator[] = [];
/** files a test wrote beside the task roots */
const recorders: string[] = [];

before(() => {
  sql = db();
  ({ taskRoot, handler } = packagedFunction('lambda-task-'));
  // the same bundle with the test hooks on, in a task root of its own laid out as the zip's
  const hooks = spawnSync(process.execPath, [join(ROOT, 'scripts', 'build.mjs'), '--test-hooks'], { cwd: ROOT, encoding: 'utf8', timeout: 180_000 });
  assert.equal(hooks.status, 0, `scripts/build.mjs --test-hooks failed:\n${hooks.stdout}${hooks.stderr}`);
  testHooksRoot = mkdtempSync(join(ROOT, '.cache', 'lambda-task-hooks-'));
  // laid out as the zip (handler.mjs, chunks/, THIRD-PARTY-NOTICES.txt), chunks named by their own content
  cpSync(TEST_HOOKS_BUNDLE, testHooksRoot, { recursive: true });
  assert.deepEqual(readdirSync(testHooksRoot).sort(), readdirSync(taskRoot).sort(), 'the test-hooks bundle is laid out as the zip');
});

after(async () => {
  await Promise.all(emulators.map((e) => e.stop()));
  await sql.end();
  rmSync(taskRoot, { recursive: true, force: true });
  rmSync(testHooksRoot, { recursive: true, force: true });
  for (const file of recorders) rmSync(file, { force: true });
});

/** `root`: the task root, the deployed zip's unless a test needs the test hooks (testHooksRoot) */
async function emulator(f: Fixture, timeoutSeconds: number, env: Record<string, string> = {}, root = taskRoot): Promise<Emulator> {
  const e = await Emulator.start(root, handler, timeoutSeconds, { ...f.env, ...env });
  emulators.push(e);
  return e;
}

/** The packages of the X-Ray tracer, which src/lambda/handler.ts imports only with OUTBOX_TRACING=true. */
const TRACER = ['@aws-lambda-powertools/tracer', 'aws-xray-sdk-core'];

/**
 * The environment that has the runtime process record every module it loads into `loads`, by a
 * load hook preloaded into it (node:module registerHooks).
 */
function recordingLoads(loads: string): Record<string, string> {
  const recorder = join(taskRoot, '..', `${basename(taskRoot)}-record-loads.mjs`);
  writeFileSync(
    recorder,
    "import { appendFileSync } from 'node:fs';\nimport { registerHooks } from 'node:module';\nregisterHooks({ load(url, context, next) { appendFileSync(process.env.RECORD_LOADS_TO, url + '\\n'); return next(url, context); } });\n",
  );
  recorders.push(recorder, loads);
  return { NODE_OPTIONS: `--enable-source-maps --import ${pathToFileURL(recorder).href}`, RECORD_LOADS_TO: loads };
}

/**
 * The files of the zip the runtime loaded so far, and the packages their source maps name. By
 * real path: the runtime records them so, and .cache may be a symlink (a git worktree's).
 */
function loadedFrom(loads: string): { files: string[]; packages: Set<string> } {
  const root = realpathSync(taskRoot);
  const files = readFileSync(loads, 'utf8')
    .split('\n')
    .filter((u) => u.startsWith('file:'))
    .map((u) => realpathSync(fileURLToPath(u)))
    .filter((file) => file.startsWith(`${root}/`))
    .map((file) => file.slice(root.length + 1));
  const packages = new Set(
    files.flatMap((file) =>
      (JSON.parse(readFileSync(join(root, `${file}.map`), 'utf8')) as { sources: string[] }).sources.flatMap((src) => {
        const m = /node_modules\/((?:@[^/]+\/)?[^/]+)\/(?!.*node_modules\/)/.exec(src);
        return m ? [m[1]!] : [];
      }),
    ),
  );
  return { files, packages };
}

/** Waits until `n` rows are marked sent while the invocation runs; says what happened if it ended first. */
async function untilSent(table: string, n: number, invocation: Promise<Invocation>, e: Emulator): Promise<void> {
  let ended: Invocation | undefined;
  void invocation.then((r) => (ended = r));
  const until = Date.now() + 20_000;
  while ((await counts(sql, table)).sent < n) {
    assert.ok(!ended && Date.now() < until, `the invocation did not get going (${ended ? `it ended: ${JSON.stringify(ended).slice(0, 1_000)}` : 'still running after 20 s'})\n--- emulator log (tail) ---\n${e.output().slice(-3_000)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function backendPids(appName: string): Promise<number[]> {
  return (await sql<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE application_name = ${appName} ORDER BY pid`).map((r) => r.pid);
}

describe('the packaged zip under the Lambda Runtime Interface Emulator', () => {
  it('a scheduled event: the bundled handler relays 2,000 rows, each once, and answers with the summary; a warm second invocation reuses the runtime process and its database connections; no Node warning in its output (the bundled kafkajs is the patched one)', async () => {
    const f = await fixture(sql, 'rie');
    const appName = `rie-${f.table}`;
    const ids = await insertEvents(sql, f.table, Array.from({ length: 2_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const e = await emulator(f, 30, { OUTBOX_CLIENT_ID: appName });

    const first = await e.invokeOk();
    assert.equal(first.published, 2_000, JSON.stringify(first));
    assert.equal(first.stoppedBecause, 'empty');
    assert.deepEqual(await counts(sql, f.table), { total: 2_000, sent: 2_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 2_000, 30_000);
    assert.equal(msgs.length, 2_000, 'each row once');
    assert.deepEqual(new Set(copiesById(msgs).keys()), new Set(ids));
    // the Lambda context reached the handler through the runtime client: Powertools' fields
    const finished = e.jsonLines().filter((l) => l.message === 'invocation finished');
    assert.equal(finished.length, 1, e.output().slice(-3_000));
    assert.equal(finished[0]!.function_name, 'outbox-relay-test-relay');
    assert.equal(finished[0]!.cold_start, true);
    assert.match(String(finished[0]!.function_request_id), /^[0-9a-f-]{36}$/);

    const runtime = e.runtimePids();
    assert.equal(runtime.length, 1, 'one runtime process');
    const backends = await backendPids(appName);
    assert.ok(backends.length >= 1, 'the warm runtime keeps its connections');

    await insertEvents(sql, f.table, Array.from({ length: 300 }, (_, i) => ({ aggregateid: `b-${i % 7}`, payload: { i } })));
    const second = await e.invokeOk();
    assert.equal(second.published, 300, JSON.stringify(second));
    assert.deepEqual(e.runtimePids(), runtime, 'the same runtime process served both');
    const after2 = await backendPids(appName);
    for (const pid of after2) assert.ok(backends.includes(pid), `backend ${pid} is new in the warm invocation (before: ${backends.join(',')})`);
    const finished2 = e.jsonLines().filter((l) => l.message === 'invocation finished');
    assert.equal(finished2.at(-1)!.cold_start, false);
    assert.equal((await consumeAll([f.topic('order')], 2_300, 30_000)).length, 2_300);
    // esbuild bundled node_modules as patches/ left it: unpatched, kafkajs' request queue makes
    // Node print a TimeoutNegativeWarning at every cold start
    assert.deepEqual(e.output().split('\n').filter((l) => /[A-Za-z]Warning\b/.test(l)), [], 'a Node warning in the function\'s output');
  });

  it("only the configured Kafka client is loaded: a cold start with kafkajs loads no code of @platformatic/kafka, and one with platformatic none of kafkajs (and with fan-out off, none of @aws-sdk/client-lambda); the first invocation loads the configured one even with nothing to publish (while the database connects), and each relays its rows from the zip", async () => {
    const library = { kafkajs: 'kafkajs', platformatic: '@platformatic/kafka' } as const;
    for (const client of ['kafkajs', 'platformatic'] as const) {
      const other = client === 'kafkajs' ? 'platformatic' : 'kafkajs';
      const f = await fixture(sql, `rieclient_${client}`);
      const loads = `${taskRoot}-loads.${client}.txt`;
      const e = await emulator(f, 30, { OUTBOX_KAFKA_CLIENT: client, ...recordingLoads(loads) });

      // a cold start with nothing to publish: no producer connects, yet the client loads (it was
      // started with the invocation; it may finish just after the answer)
      assert.equal((await e.invokeOk()).published, 0);
      const until = Date.now() + 10_000;
      while (!loadedFrom(loads).packages.has(library[client])) {
        assert.ok(Date.now() < until, `${client}: the first invocation did not load its library; loaded: ${loadedFrom(loads).files.join(', ')}`);
        await new Promise((r) => setTimeout(r, 50));
      }

      await insertEvents(sql, f.table, Array.from({ length: 50 }, (_, i) => ({ aggregateid: `a-${i % 5}`, payload: { i } })));
      const summary = await e.invokeOk();
      assert.equal(summary.published, 50, JSON.stringify(summary));
      assert.equal((await consumeAll([f.topic('order')], 50, 30_000)).length, 50);
      const { files, packages } = loadedFrom(loads);
      assert.ok(files.includes('handler.mjs'), `the handler was loaded: ${files.join(', ')}`);
      assert.ok(!packages.has(library[other]), `${client}: no code of ${library[other]} was loaded; loaded: ${files.join(', ')}`);
      // tracing is off by default: none of the tracer's code either
      assert.ok(!TRACER.some((p) => packages.has(p)) && !files.some((file) => file.startsWith('chunks/tracing-')), `${client}: no tracer code without OUTBOX_TRACING; loaded: ${files.join(', ')}`);
      // fan-out is off by default: none of the Lambda client's code (src/lambda/fanout-invoke.ts) either
      assert.ok(!packages.has('@aws-sdk/client-lambda'), `${client}: no @aws-sdk/client-lambda code without OUTBOX_FANOUT_MAX; loaded: ${files.join(', ')}`);
      await e.stop();
    }
  });

  it('X-Ray tracing is loaded only when it is on: a cold start with OUTBOX_TRACING=true loads the tracing chunk, Powertools Tracer and the X-Ray SDK, and relays its rows (no X-Ray daemon here)', async () => {
    const f = await fixture(sql, 'rietracing');
    const loads = `${taskRoot}-loads.tracing.txt`;
    const e = await emulator(f, 30, { OUTBOX_TRACING: 'true', ...recordingLoads(loads) });
    await insertEvents(sql, f.table, Array.from({ length: 20 }, (_, i) => ({ aggregateid: `a-${i % 5}`, payload: { i } })));
    const summary = await e.invokeOk();
    assert.equal(summary.published, 20, JSON.stringify(summary));
    assert.equal((await consumeAll([f.topic('order')], 20, 30_000)).length, 20);
    const { files, packages } = loadedFrom(loads);
    assert.ok(files.some((file) => file.startsWith('chunks/tracing-')), `the tracing chunk was loaded: ${files.join(', ')}`);
    for (const p of TRACER) assert.ok(packages.has(p), `${p} was loaded; loaded packages: ${[...packages].join(', ')}`);
    await e.stop();
  });

  it('G1/G2: killed at the function timeout between a batch\'s ack and its COMMIT ("Task timed out", a failure): the next invocation re-sends exactly that batch and delivers the rest', async () => {
    const f = await fixture(sql, 'riewindow');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 1_000 }, (_, i) => ({ aggregateid: `a-${i % 20}`, payload: { i } })));
    const batch = 100;
    // the relay's test hook holds the first batch in the crash window (acked, marks not committed)
    // past the 5 s function timeout: the emulator kills the runtime there. The deployed zip has no
    // such hook (the test after this one): the same bundle built with the test hooks on
    const e = await emulator(f, 5, { OUTBOX_BATCH_SIZE: String(batch), OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '60000' }, testHooksRoot);
    const started = Date.now();
    const killed = await e.invoke();
    assert.equal(killed.outcome, 'timed-out', JSON.stringify(killed));
    assert.ok(Date.now() - started < 5_000 + 3_000, 'killed at the timeout');
    assert.ok(e.output().includes('test hook: pausing after publish'), 'it was killed in the window');
    assert.equal((await counts(sql, f.table)).sent, 0, 'the killed batch was not marked');

    // the next tick (a new runtime process, cold), the deployed zip without the hook: a second
    // emulator is the same function after a deployment, so its own runtime starts clean
    const next = await emulator(f, 30, { OUTBOX_BATCH_SIZE: String(batch) });
    const summary = await next.invokeOk();
    assert.equal(summary.published, 1_000, JSON.stringify(summary));
    assert.deepEqual(await counts(sql, f.table), { total: 1_000, sent: 1_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 1_100, 30_000);
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'every row is on Kafka');
    const twice = new Set([...copies].filter(([, n]) => n === 2).map(([id]) => id));
    assert.equal(msgs.length, 1_000 + batch, 'exactly one batch sent twice');
    assert.deepEqual(twice, new Set(ids.slice(0, batch)), 'the batch in the window, and only it');
  });

  it('the deployed zip cannot be paused in the crash window: OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS set on the function changes nothing', async () => {
    const f = await fixture(sql, 'rienohook');
    await insertEvents(sql, f.table, Array.from({ length: 300 }, (_, i) => ({ aggregateid: `a-${i % 20}`, payload: { i } })));
    // with the hook, the first batch would pause for a minute and the function be killed at 30 s
    const e = await emulator(f, 30, { OUTBOX_BATCH_SIZE: '100', OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '60000' });
    const summary = await e.invokeOk();
    assert.equal(summary.published, 300, JSON.stringify(summary));
    assert.equal(summary.stoppedBecause, 'empty');
    assert.ok(!e.output().includes('test hook'), e.output().slice(-3_000));
    assert.deepEqual(await counts(sql, f.table), { total: 300, sent: 300, parked: 0, pending: 0 });
  });

  it('G1/G2/G7: the function frozen at an arbitrary point (its runtime process SIGSTOPped) is killed by the emulator at the timeout, leaving no transaction open; the next tick, a cold start, recovers: nothing lost, at most one batch sent twice', async (t) => {
    const f = await fixture(sql, 'rietimeout');
    const appName = `rietimeout-${f.table}`;
    const ids = await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const batch = 100;
    const e = await emulator(f, 8, { OUTBOX_CLIENT_ID: appName, OUTBOX_BATCH_SIZE: String(batch) });
    const invocation = e.invoke();
    // mid-invocation (some batches marked, most rows pending), the function stops running: frozen
    // as a process is when its CPU share runs out or it hangs in native code; it cannot return,
    // so the emulator's timer is what ends it
    await untilSent(f.table, 500, invocation, e);
    const [runtime] = e.runtimePids();
    assert.ok(runtime, 'the runtime process');
    process.kill(runtime, 'SIGSTOP');
    const sentAtFreeze = (await counts(sql, f.table)).sent;
    const [open] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName} AND xact_start IS NOT NULL`;
    t.diagnostic(`frozen after ${sentAtFreeze} rows marked, with ${open!.n} transaction(s) of it open`);
    const killed = await invocation;
    assert.equal(killed.outcome, 'timed-out', JSON.stringify(killed));
    assert.ok(sentAtFreeze < 20_000);
    // the runtime was killed, and with it its connections: no transaction of it is left open
    // (Postgres ends a backend whose client went away, rolling its batch back)
    const gone = Date.now() + 10_000;
    while ((await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName} AND xact_start IS NOT NULL`)[0]!.n > 0) {
      assert.ok(Date.now() < gone, 'the killed invocation left a transaction open');
      await new Promise((r) => setTimeout(r, 100));
    }

    // the next tick: a new runtime (the emulator restarts it, a cold start, as Lambda does)
    const { atDeadline } = await e.drain();
    assert.deepEqual(await counts(sql, f.table), { total: 20_000, sent: 20_000, parked: 0, pending: 0 });
    assert.notDeepEqual(e.runtimePids(), [runtime], 'a new runtime process');
    const msgs = await consumeAll([f.topic('order')], 20_000, 60_000);
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'every row is on Kafka');
    // the batch acked but not committed when the function froze, if any: at most one batch sent
    // again; and one more for each recovering invocation that ended at its deadline on a loaded
    // machine (whose batch may be the same rows again)
    const extra = msgs.length - 20_000;
    assert.ok([...copies.values()].every((n) => n <= 2 + atDeadline), `no row more than ${2 + atDeadline} times`);
    assert.ok(extra <= batch * (1 + atDeadline), `${extra} copies too many; a batch is ${batch}, ${atDeadline} invocation(s) after the kill ended at their deadline`);
    t.diagnostic(`${extra} copies too many; ${atDeadline} invocation(s) after the kill ended at their deadline`);
  });

  it("G5: the database frozen mid-invocation (the relay's own backends SIGSTOPped): the handler fails before the function timeout, with the deadline the runtime gave it, not killed by the emulator", async (t) => {
    const f = await fixture(sql, 'riedbstop');
    const appName = `riedbstop-${f.table}`;
    // enough that the invocation is still busy when the test freezes the database after 500 rows
    await insertEvents(sql, f.table, Array.from({ length: 5_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    // 8 s function, the relay's margin 2 s: it must give up by ~6 s on its own
    const e = await emulator(f, 8, { OUTBOX_CLIENT_ID: appName, OUTBOX_BATCH_SIZE: '20', OUTBOX_SAFETY_MARGIN_MS: '2000' });
    const started = Date.now();
    const invocation = e.invoke();
    const frozen: number[] = [];
    let result: Invocation;
    try {
      await untilSent(f.table, 500, invocation, e);
      for (const pid of await backendPids(appName)) {
        process.kill(pid, 'SIGSTOP');
        frozen.push(pid);
      }
      assert.ok(frozen.length > 0, "the relay's backends");
      result = await invocation;
    } finally {
      for (const pid of frozen) process.kill(pid, 'SIGCONT');
    }
    const tookMs = Date.now() - started;
    t.diagnostic(`answered after ${tookMs} ms: ${JSON.stringify(result).slice(0, 300)}`);
    // a failed invocation (Lambda's Errors metric), named by the relay, not the emulator's kill
    assert.equal(result.outcome, 'error', JSON.stringify(result));
    assert.equal((result as { errorType?: string }).errorType, 'DatabaseError', JSON.stringify(result));
    assert.match(String((result as { errorMessage?: string }).errorMessage), /the database did not answer in time/);
    assert.ok(tookMs < 8_000, `answered after ${tookMs} ms; the function timeout is 8 s`);
    // and the same warm runtime carries on once the database is back (batches of 20 on a busy
    // machine: it may take more than one 6 s invocation)
    const runtime = e.runtimePids();
    const { atDeadline } = await e.drain();
    t.diagnostic(`${atDeadline} invocation(s) after the thaw ended at their deadline`);
    assert.deepEqual(e.runtimePids(), runtime, 'the same runtime process');
    assert.deepEqual(await counts(sql, f.table), { total: 5_000, sent: 5_000, parked: 0, pending: 0 });
  });
});
