// services: postgres
// Broker faults: the shared broker killed (SIGKILL) or frozen (SIGSTOP) in the middle of an
// invocation. Guarantees: G1 (nothing marked that is not on Kafka, no attempt charged, everything
// delivered once the broker is back) and G5 (a frozen broker: the invocation returns before its
// deadline). Invocations run as real child processes of the CLI. The broker is this file's own
// (private-broker.ts), so the files beside it keep theirs; each test restores it in `finally`.
import { MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import type { Summary } from '../../src/loop/invocation.ts';
import {
  consumeAll,
  counts,
  db,
  fixture,
  idsOf,
  insertEvents,
  rowStates,
  startCli,
  topicCount,
  waitForLeaders,
  waitSent,
  type Consumed,
  useKafka,
  invokeOk as invoke,
} from './helpers.ts';
import { startPrivateBroker, type PrivateBroker } from './private-broker.ts';

let sql: Sql;
let broker: PrivateBroker;
before(async () => {
  sql = db();
  broker = await startPrivateBroker();
  useKafka(broker.address);
});
after(async () => {
  await sql.end();
  await broker?.stop();
});

/** G1: every row marked sent is on Kafka. Reads everything the topics hold (duplicates included). */
async function assertMarkedOnKafka(table: string, topics: string[]): Promise<Consumed[]> {
  const total = await topicCount(topics);
  const msgs = await consumeAll(topics, total, 60_000);
  assert.equal(msgs.length, total, 'read the whole topic');
  const onKafka = new Set(idsOf(msgs));
  const missing = (await rowStates(sql, table)).filter((r) => r.sent && !onKafka.has(r.id));
  assert.equal(missing.length, 0, `${missing.length} rows are marked sent but not on Kafka (first: seq ${missing[0]?.seq})`);
  return msgs;
}

describe('broker faults: nothing is marked that is not on Kafka (G1)', () => {
  it('broker killed (SIGKILL) mid-invocation: it ends with "Kafka unavailable", nothing marked that is not on Kafka, no attempts charged; after a restart everything is delivered', async (ctx) => {
    const f = await fixture(sql, 'brokerkill');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '20' };
    const running = startCli(['invoke', '--timeout', '60000'], env);
    let res;
    try {
      // mid-invocation: some batches marked, most rows still to go (waits long: a busy machine is slow)
      const sentBefore = await waitSent(sql, f.table, 500, 60_000);
      assert.ok(sentBefore >= 500 && sentBefore < 20_000, `mid-invocation: ${sentBefore} sent`);
      process.kill(broker.pid, 'SIGKILL');
      const killedAt = Date.now();
      res = await running.result;
      const endedAfterMs = Date.now() - killedAt;
      assert.equal(res.code, 1, res.stderr.slice(-2_000));
      assert.equal(res.summary?.stoppedBecause, 'broker-unavailable');
      assert.match(res.stderr, new RegExp(`BrokerUnavailableError: Kafka unavailable at ${broker.address}`));
      assert.ok(endedAfterMs < 20_000, `ended ${endedAfterMs} ms after the kill`);
      ctx.diagnostic(`killed after ${sentBefore} rows marked; the invocation ended ${endedAfterMs} ms later: ${String(res.summary?.error)}`);
      const states = await rowStates(sql, f.table);
      assert.ok(states.some((r) => !r.sent), 'rows were left pending');
      assert.equal(Math.max(...states.map((r) => r.attempts)), 0, 'a broker outage is charged to no row');
    } finally {
      running.child.kill('SIGKILL');
      const restart = Date.now();
      await broker.start();
      await waitForLeaders([f.topic('order')]);
      ctx.diagnostic(`broker restarted in ${Date.now() - restart} ms`);
    }
    // G1 across the crash: every row marked before the kill made it to the log
    await assertMarkedOnKafka(f.table, [f.topic('order')]);

    const s = await invoke(env, 60_000);
    assert.equal(s.stoppedBecause, 'empty', JSON.stringify(s));
    assert.deepEqual(await counts(sql, f.table), { total: 20_000, sent: 20_000, parked: 0, pending: 0 });
    const msgs = await assertMarkedOnKafka(f.table, [f.topic('order')]);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids), 'every row is on Kafka');
    assert.equal(Math.max(...(await rowStates(sql, f.table)).map((r) => r.attempts)), 0);
  });

  it('broker frozen (SIGSTOP) mid-invocation with an 8 s budget: returns before the deadline, marks nothing unacked; after SIGCONT everything is delivered (G5)', async (ctx) => {
    const f = await fixture(sql, 'brokerstop');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '20', OUTBOX_SAFETY_MARGIN_MS: '2000' };
    const running = startCli(['invoke', '--timeout', '8000'], env);
    let res;
    try {
      // mid-invocation: two batches marked (the 8 s budget may end before many more on a busy machine)
      const sentBefore = await waitSent(sql, f.table, 40, 6_000);
      assert.ok(sentBefore >= 40 && sentBefore < 20_000, `mid-invocation: ${sentBefore} sent`);
      process.kill(broker.pid, 'SIGSTOP');
      res = await running.result;
    } finally {
      running.child.kill('SIGKILL');
      await broker.resume();
      await waitForLeaders([f.topic('order')]);
    }
    const summary = res.summary as unknown as Summary;
    assert.ok(summary, `a summary on stdout:\n${res.stderr.slice(-2_000)}`);
    ctx.diagnostic(`handler ${summary.durationMs} ms, process ${res.durationMs} ms, exit ${res.code}: ${summary.stoppedBecause} (${summary.error ?? ''})`);
    assert.ok(summary.durationMs < 8_000, `the handler returned after ${summary.durationMs} ms, deadline 8000`);
    assert.ok(summary.durationMs < 6_500, `…and within the safety margin (deadline - 2000 ms): ${summary.durationMs} ms`);
    // a hung broker fails the invocation (Lambda's Errors metric), like a broker that is down
    assert.equal(summary.stoppedBecause, 'broker-unavailable', JSON.stringify(summary));
    assert.notEqual(res.code, 0);
    assert.match(summary.error ?? '', /^publishing to \S+ did not finish before the invocation's deadline/, 'the cause is the broker, not the database');
    // the child also exits: connections to a frozen broker are closed with a bound (Runtime.close)
    assert.ok(res.durationMs < 8_000 + 3_000 + 2_000, `the process exited after ${res.durationMs} ms`);
    assert.equal(Math.max(...(await rowStates(sql, f.table)).map((r) => r.attempts)), 0, 'a hung broker is charged to no row');
    await assertMarkedOnKafka(f.table, [f.topic('order')]);

    const s = await invoke({ ...env, OUTBOX_SAFETY_MARGIN_MS: String(MIN_SAFETY_MARGIN_MS) }, 60_000);
    assert.equal(s.stoppedBecause, 'empty', JSON.stringify(s));
    assert.deepEqual(await counts(sql, f.table), { total: 20_000, sent: 20_000, parked: 0, pending: 0 });
    const msgs = await assertMarkedOnKafka(f.table, [f.topic('order')]);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids));
  });
});
