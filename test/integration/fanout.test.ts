// services: postgres, kafka, build-dir alone
// Fan-out on backlog as deployed (issue 28): the packaged zip under the Lambda Runtime Interface
// Emulator, invoked through a small Lambda Invoke API (lambda-invoke-api.ts) that the relay's own
// @aws-sdk/client-lambda calls to start its helpers (AWS_ENDPOINT_URL_LAMBDA). The API's pool of
// emulators stands for the function's reserved concurrency: one emulator per concurrent
// invocation, reused warm, 429 TooManyRequestsException when every one is busy. Ticks are the
// schedule's events, sent as EventBridge sends them (asynchronously); a backlog sized so that one
// short invocation (a 4 s timeout) stops on its budget with more rows left than it moved.
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { helperMarker } from '../../src/lambda/fanout.ts';
import { consumeAll, copiesById, counts, db, firstCopyOrder, fixture, insertEvents, isSorted, runCli, seqsById, type Fixture } from './helpers.ts';
import { Emulator, packagedFunction, scheduledEvent } from './lambda-emulator.ts';
import { LambdaInvokeApi, type Recorded } from './lambda-invoke-api.ts';

/** the function's timeout (s) and safety margin: each invocation relays for about two seconds */
const TIMEOUT_S = 4;
const SHORT = { OUTBOX_SAFETY_MARGIN_MS: '2000', OUTBOX_BATCH_SIZE: '200' };
/**
 * Rows in each test's backlog: more than twice what one tick moves on an idle machine (a 4 s tick
 * moved over 15,000 rows, more than half of the 30,000 these tests had, and then wanted no helper),
 * so that the first tick wants one however fast the machine; and the ticks to drain it, enough for
 * a busy one (a single invocation at a third of that rate).
 */
const BACKLOG = 100_000;
const MAX_TICKS = 40;

let sql: Sql;
let taskRoot: string;
let handler: string;
const apis: LambdaInvokeApi[] = [];

before(() => {
  sql = db();
  ({ taskRoot, handler } = packagedFunction('lambda-task-fanout-'));
});

after(async () => {
  await Promise.all(apis.map((a) => a.stop()));
  await sql.end();
  rmSync(taskRoot, { recursive: true, force: true });
});

/** The function behind a Lambda Invoke API whose pool holds `concurrency` emulators. */
async function deployed(f: Fixture, concurrency: number, env: Record<string, string>): Promise<LambdaInvokeApi> {
  const api = await LambdaInvokeApi.start(concurrency, (apiEnv) => Emulator.start(taskRoot, handler, TIMEOUT_S, { ...f.env, ...SHORT, ...env, ...apiEnv }));
  apis.push(api);
  return api;
}

/** One tick of the schedule; resolves when it and every invocation it started have ended. */
async function tick(api: LambdaInvokeApi): Promise<Recorded> {
  const event = scheduledEvent();
  const res = await api.invoke(event);
  assert.equal(res.status, 202, `the tick was not taken: ${res.status} ${res.body}`);
  await api.settled();
  return api.invocations.find((i) => i.event.id === event.id)!;
}

type FullSummary = { stoppedBecause: string; claimed: number; claims: number; published: number; durationMs: number; waitedMs: { idle: number } };
const summaryOf = (r: Recorded, api: LambdaInvokeApi): FullSummary => {
  assert.equal(r.outcome?.outcome, 'ok', `invocation failed: ${JSON.stringify(r.outcome)}\n${api.output()}`);
  return (r.outcome as { summary: unknown }).summary as FullSummary;
};
const helpers = (api: LambdaInvokeApi) => api.invocations.filter((i) => helperMarker(i.event));

/** The sum of a metric over the EMF records the function printed (Lambda's stdout). */
function metricSum(api: LambdaInvokeApi, name: string): number {
  return api
    .jsonLines()
    .filter((l) => '_aws' in l)
    .reduce((n, r) => n + (typeof r[name] === 'number' ? r[name] : 0), 0);
}

async function backlogOf(f: Fixture, n: number, aggregates: number): Promise<string[]> {
  return insertEvents(sql, f.table, Array.from({ length: n }, (_, i) => ({ aggregateid: `a-${i % aggregates}`, payload: { i } })));
}

describe('fan-out, as deployed', () => {
  it('G1/G3/G4: a backlog: ticks out of budget start helpers, at most OUTBOX_FANOUT_MAX at once, none by a helper; each row once, in order', async () => {
    const f = await fixture(sql, 'fanout');
    const ids = await backlogOf(f, BACKLOG, 100);
    // a pool larger than the bound: the bound is the relay's, not the pool's
    const api = await deployed(f, 6, { OUTBOX_FANOUT_MAX: '3' });
    const ticks: Recorded[] = [];
    for (let i = 0; i < MAX_TICKS && (await counts(sql, f.table)).pending > 0; i++) ticks.push(await tick(api));

    assert.equal((await counts(sql, f.table)).pending, 0, `not drained in ${ticks.length} ticks\n${api.output()}`);
    const first = summaryOf(ticks[0]!, api);
    assert.equal(first.stoppedBecause, 'budget', JSON.stringify(first));
    const started = helpers(api);
    assert.ok(started.length >= 1, `helpers were started: ${api.invocations.length} invocations`);
    assert.ok(api.maxRunning <= 3, `at most OUTBOX_FANOUT_MAX = 3 invocations at once: ${api.maxRunning}`);
    assert.ok(started.length <= 2 * ticks.length, `at most 2 helpers per tick, none by a helper: ${started.length} helpers for ${ticks.length} ticks`);
    assert.equal(api.throttled.length, 0);
    for (const h of started) {
      const s = summaryOf(h, api);
      // a helper ends on its budget, or when it finds nothing claimable
      assert.ok(['budget', 'empty', 'locked'].includes(s.stoppedBecause), JSON.stringify(s));
    }
    assert.ok(started.some((h) => summaryOf(h, api).stoppedBecause !== 'budget'), 'some helper ended finding nothing');
    assert.equal(metricSum(api, 'HelpersStarted'), started.length, 'HelpersStarted counts them');
    assert.equal(metricSum(api, 'HelpersNotStarted'), 0);
    // the function's own ARN, from its Lambda context
    assert.match(started[0]!.functionName, /^arn:aws:lambda:us-east-1:\d{12}:function:outbox-relay-test-relay$/);

    await arrivedOnceInOrder(f, ids);
  });

  it('a full pool (429 TooManyRequestsException): the tick that wanted a helper succeeds, logs and counts it (HelpersNotStarted), and the rows go with the next ticks, each once', async () => {
    const f = await fixture(sql, 'fanoutfull');
    const ids = await backlogOf(f, BACKLOG, 50);
    // one execution environment: the tick holds it while it starts its helper
    const api = await deployed(f, 1, { OUTBOX_FANOUT_MAX: '2' });
    const first = summaryOf(await tick(api), api);
    assert.equal(first.stoppedBecause, 'budget', JSON.stringify(first));
    assert.equal(api.throttled.length, 1, 'its helper was throttled');
    assert.ok(helperMarker(api.throttled[0]!.event), "the throttled call was a helper's");
    assert.equal(metricSum(api, 'HelpersNotStarted'), 1);
    assert.equal(metricSum(api, 'HelpersStarted'), 0);
    const warning = api.jsonLines().find((l) => l.message === 'helpers not started: their rows stay claimable for the next tick');
    assert.match(JSON.stringify(warning), /TooManyRequestsException/);
    for (let i = 0; i < MAX_TICKS && (await counts(sql, f.table)).pending > 0; i++) summaryOf(await tick(api), api);
    assert.deepEqual(await counts(sql, f.table), { total: BACKLOG, sent: BACKLOG, parked: 0, pending: 0 });
    assert.equal(helpers(api).length, 0, 'no helper ever ran');
    await arrivedOnceInOrder(f, ids);
  });

  it('fan-out off (the default): a tick that stops on its budget with a backlog starts no helper', async () => {
    const f = await fixture(sql, 'fanoutoff');
    await backlogOf(f, BACKLOG, 50);
    const api = await deployed(f, 3, {});
    const first = summaryOf(await tick(api), api);
    assert.equal(first.stoppedBecause, 'budget', JSON.stringify(first));
    assert.equal(api.invocations.length, 1, 'the tick alone');
    assert.ok((await counts(sql, f.table)).pending > first.claimed, 'more rows left than it moved');
    assert.equal(api.throttled.length, 0);
    assert.equal(metricSum(api, 'HelpersStarted') + metricSum(api, 'HelpersNotStarted'), 0);
  });

  it("G8: the CLI's invoke and schedule (outside Lambda) refuse fan-out: exit 2, saying to unset it", async () => {
    const f = await fixture(sql, 'fanoutcli');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    for (const args of [['invoke'], ['schedule', '--max', '1']]) {
      const res = await runCli(args, { ...f.env, OUTBOX_FANOUT_MAX: '3' });
      assert.equal(res.code, 2, res.stderr.slice(-2_000));
      assert.match(res.stderr, /ConfigError: invalid configuration:\n {2}- OUTBOX_FANOUT_MAX=3 starts helper invocations of the Lambda function, and this command runs outside Lambda: unset it here/);
    }
    assert.deepEqual(await counts(sql, f.table), { total: 1, sent: 0, parked: 0, pending: 1 });
  });

  it("linger mode: a lingering tick that stops on its budget with a backlog starts helpers, which never linger; a drained tick lingers and starts none; a helper on an empty table ends after one claim (HelpersFoundNothing)", async () => {
    const f = await fixture(sql, 'fanoutlinger');
    const ids = await backlogOf(f, BACKLOG, 50);
    const api = await deployed(f, 3, { OUTBOX_FANOUT_MAX: '2', OUTBOX_IDLE: 'linger' });
    const ticks: Recorded[] = [];
    for (let i = 0; i < MAX_TICKS && (await counts(sql, f.table)).pending > 0; i++) ticks.push(await tick(api));
    assert.equal((await counts(sql, f.table)).pending, 0, `not drained in ${ticks.length} ticks\n${api.output()}`);
    const started = helpers(api);
    const summaries = () => JSON.stringify(api.invocations.map((i) => [helperMarker(i.event) ? 'helper' : 'tick', i.outcome]));
    assert.ok(started.length >= 1, `helpers were started: ${summaries()}`);
    assert.ok(api.maxRunning <= 2, `at most 2 at once: ${api.maxRunning}`);
    for (const h of started) assert.equal(summaryOf(h, api).waitedMs.idle, 0, `a helper never waits for new rows: ${JSON.stringify(summaryOf(h, api))}`);

    // the table is empty: a lingering tick waits for new rows until its budget is spent (and then
    // reports its last claim's stop, empty), and starts none
    const before = api.invocations.length;
    const drained = summaryOf(await tick(api), api);
    assert.equal(drained.stoppedBecause, 'empty');
    assert.ok(drained.waitedMs.idle > 1_000, JSON.stringify(drained));
    assert.equal(api.invocations.length, before + 1, 'no helper');
    // a helper arriving now (started by a tick, late from Lambda's async queue) costs one claim
    const late = await api.invoke({ outboxRelay: { helper: true, startedBy: 'a-tick', at: new Date().toISOString() } });
    assert.equal(late.status, 202);
    await api.settled();
    const helper = summaryOf(api.invocations.at(-1)!, api);
    assert.deepEqual([helper.stoppedBecause, helper.claims, helper.claimed, helper.waitedMs.idle], ['empty', 1, 0, 0], JSON.stringify(helper));
    assert.equal(metricSum(api, 'HelpersFoundNothing'), 1 + started.filter((h) => summaryOf(h, api).claimed === 0).length);
    await arrivedOnceInOrder(f, ids);
  });
});

/** Read back by a consumer of the topic of its own: every row under its id, once, in seq order per aggregate. */
async function arrivedOnceInOrder(f: Fixture, ids: string[]): Promise<void> {
  const msgs = await consumeAll([f.topic('order')], ids.length, 60_000);
  const copies = copiesById(msgs);
  assert.deepEqual(new Set(copies.keys()), new Set(ids), 'every row arrived, under its stable id');
  assert.equal(msgs.length, ids.length, `each once: ${msgs.length - ids.length} extra copies`);
  const seqs = await seqsById(sql, f.table);
  for (const [key, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} out of order`);
}
