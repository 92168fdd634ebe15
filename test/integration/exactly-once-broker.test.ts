// services: postgres
// Exactly-once delivery across a broker restart: the broker (this file's own, private-broker.ts)
// is killed with SIGKILL while a batch's Kafka transaction is open (acked, not committed). Whether
// the commit then finds the broker down or back, read_committed readers see every row once, in
// order per aggregate (kcat, as in exactly-once.test.ts).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { counts, db, fixture, useKafka, waitForLeaders } from './helpers.ts';
import { exactlyOnceKit } from './exactly-once-kit.ts';
import { startPrivateBroker, type PrivateBroker } from './private-broker.ts';

let sql: Sql;
let broker: PrivateBroker;
let kit: ReturnType<typeof exactlyOnceKit>;
before(async () => {
  sql = db();
  kit = exactlyOnceKit(sql);
  broker = await startPrivateBroker();
  useKafka(broker.address);
});
after(async () => {
  await sql.end();
  await broker?.stop();
});

describe('exactly-once delivery across a broker restart, read back by kcat read_committed', () => {
  it('the broker killed while a batch is acked but not committed, and still down at the commit: the invocation fails with the batch on record; once the broker is back, the lane\'s next holder finds it uncommitted, frees its rows, and each row is sent once', async () => {
    const f = await fixture(sql, 'eos_broker_down');
    const ids = await kit.rows(f, 60);
    // the pause (after the acks) is long enough to kill the broker in it
    const paused = await kit.startPaused(f, 'publish', 2_000);
    try {
      await broker.kill();
      const res = await paused.result;
      assert.notEqual(res.code, 0, `the commit cannot have succeeded: ${res.stderr.slice(-2_000)}`);
      assert.equal(res.summary?.stoppedBecause, 'broker-unavailable', res.stderr.slice(-2_000));
    } finally {
      paused.child.kill('SIGKILL');
      await broker.start();
      await waitForLeaders([f.topic('order')]);
    }
    assert.ok((await kit.unsettled(f)) <= 1, 'at most the batch whose commit failed is on record');
    await kit.coordinatorsLoaded(f);
    await kit.leasesRunOut(f);
    await kit.drain(f);
    assert.equal(await kit.unsettled(f), 0);
    assert.deepEqual(await counts(sql, f.table), { total: 60, sent: 60, parked: 0, pending: 0 });
    await kit.assertExactlyOnce(f, ids);
  });

  it('the broker killed and restarted while a batch is acked but not committed: the invocation\'s commit finds it back (committed, or failed and settled later); each row once', async (ctx) => {
    const f = await fixture(sql, 'eos_broker_back');
    const ids = await kit.rows(f, 60);
    // frozen in its pause (after the acks) while the broker restarts; its lease outlasts that
    const paused = await kit.startPaused(f, 'publish', 500, {}, 60_000);
    paused.child.kill('SIGSTOP');
    let res;
    try {
      await broker.kill();
      await broker.start();
      await waitForLeaders([f.topic('order')]);
      paused.child.kill('SIGCONT');
      res = await paused.result;
    } finally {
      paused.child.kill('SIGKILL');
    }
    // either way nothing is lost or doubled: a commit that failed leaves the batch on record
    const onRecord = await kit.unsettled(f);
    ctx.diagnostic(`the frozen invocation, resumed: exit ${res.code}, ${onRecord} batch on record; ${JSON.stringify(res.summary)}`);
    assert.ok(res.code === 0 || onRecord === 1, `a failed commit keeps its batch on record: exit ${res.code}, ${onRecord} on record\n${res.stderr.slice(-2_000)}`);
    await kit.coordinatorsLoaded(f);
    await kit.leasesRunOut(f);
    await kit.drain(f);
    assert.equal(await kit.unsettled(f), 0);
    await kit.assertExactlyOnce(f, ids);
  });
});
