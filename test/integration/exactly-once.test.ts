// services: postgres, kafka
// Exactly-once delivery (OUTBOX_DELIVERY=exactly-once, docs/DESIGN.md, "Exactly-once delivery (opt-in)"), read back by kcat
// with isolation.level=read_committed (test/integration/kcat.ts): every row once, in order per
// aggregate, whatever window an invocation dies or freezes in. It runs with each Kafka client
// (TEST_KAFKA_CLIENT), as the relay's other integration files do.
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { createLogger } from '../../src/log.ts';
import { ADMIN_DATABASE_URL, counts, createTopics, db, fixture, insertEvents, runCli, terminateBackends, uniqueName } from './helpers.ts';
import { kcatPath, kcatRead } from './kcat.ts';
import { DYING_TIMEOUT_MS, EXACTLY_ONCE, exactlyOnceKit, lanes, WINDOWS } from './exactly-once-kit.ts';

const sql = db();
const admin = db(ADMIN_DATABASE_URL);
const { rows, read, assertExactlyOnce, drain, leasesRunOut, startPaused, unsettled } = exactlyOnceKit(sql);

after(async () => {
  await Promise.all([sql.end(), admin.end()]);
});

describe('exactly-once delivery, read back by kcat read_committed', () => {
  it('invocations in a row: every row once, in order per aggregate; each lane released, nothing in flight', async () => {
    const f = await fixture(sql, 'eos_plain');
    const ids = await rows(f, 120);
    const first = await runCli(['invoke', '--timeout', '20000'], { ...f.env, ...EXACTLY_ONCE });
    assert.equal(first.code, 0, first.stderr);
    assert.equal(first.summary?.published, 120, first.stderr);
    const more = await rows(f, 30);
    const second = await runCli(['invoke', '--timeout', '20000'], { ...f.env, ...EXACTLY_ONCE });
    assert.equal(second.summary?.published, 30, second.stderr);
    const held = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${lanes(f)} WHERE holder IS NOT NULL OR in_flight IS NOT NULL`);
    assert.equal(held[0]!.n, 0, 'every lane released, nothing in flight');
    await assertExactlyOnce(f, [...ids, ...more]);
    // no batch was aborted: a read_uncommitted reader sees the same records
    assert.equal((await read(f, 'read_uncommitted')).length, 150);
  });

  it("a batch the broker refuses as a whole though each record fits (a topic limit the relay does not know): the batch once more, that topic's records one per send, committed; every row once", async () => {
    const f = await fixture(sql, 'eos_too_large');
    const small = f.topic('small');
    await createTopics([small], 3, [{ name: 'max.message.bytes', value: '2048' }]);
    // ~1.8 KB a partition in one send: over the topic's 2,048 bytes, while each record is ~100
    const ids = await insertEvents(sql, f.table, Array.from({ length: 60 }, (_, i) => ({ aggregatetype: 'small', aggregateid: `s-${i}`, payload: { i, pad: 'p'.repeat(20) } })));
    const res = await runCli(['invoke', '--timeout', '20000'], { ...f.env, ...EXACTLY_ONCE, OUTBOX_BATCH_SIZE: '100', OUTBOX_MAX_MESSAGE_BYTES: '1000000' });
    assert.equal(res.code, 0, res.stderr);
    assert.deepEqual([res.summary?.published, res.summary?.parked, res.summary?.batches], [60, 0, 1], JSON.stringify(res.summary));
    const seen = (await kcatRead(kcatPath(), small, 'read_committed', '%h\\n')).map((h) => /(?:^|,)id=([0-9a-f-]{36})/.exec(h)?.[1]);
    assert.deepEqual(seen.sort(), [...ids].sort(), 'each row once');
  });

  for (const window of ['publish', 'kafka-commit', 'committed'] as const) {
    it(`kill -9 ${WINDOWS[window]}: each row once, in order`, async () => {
      const f = await fixture(sql, `eos_kill_${window.replace('-', '_')}`);
      const ids = await rows(f, 100);
      const dying = await startPaused(f, window, 60_000);
      dying.child.kill('SIGKILL');
      assert.equal((await dying.result).signal, 'SIGKILL');
      assert.equal(await unsettled(f), window === 'publish' || window === 'committed' ? 0 : 1, 'the batch is on record from before its Kafka commit until its marks');

      // the others are sent at once by another lane; the dead lane's rows wait for its lease
      let stderr = await drain(f, { tries: 2, mustDrain: false });
      await leasesRunOut(f);
      stderr += await drain(f);
      // the dead lane leased again (first: it was never released), so fenced, whatever is left
      stderr += (await runCli(['invoke', '--timeout', '10000'], { ...f.env, ...EXACTLY_ONCE })).stderr;
      if (window === 'kafka-commit') assert.match(stderr, /its rows are marked sent, not sent again/);
      assert.equal(await unsettled(f), 0);
      await assertExactlyOnce(f, ids);
      if (window === 'publish') {
        // the dead invocation's batch was written, and aborted when its lane's next holder fenced it
        assert.ok((await read(f, 'read_uncommitted')).length > ids.length, 'a read_uncommitted reader sees the aborted batch too');
      }
    });
  }

  for (const window of ['publish', 'kafka-commit'] as const) {
    it(`a zombie (SIGSTOP ${WINDOWS[window]}) past its lease: its rows once, by the lane's next holder; resumed, it commits nothing`, async () => {
      const f = await fixture(sql, `eos_zombie_${window.replace('-', '_')}`);
      const ids = await rows(f, 20);
      const zombie = await startPaused(f, window, 1_000);
      zombie.child.kill('SIGSTOP');
      try {
        await leasesRunOut(f);
        const stderr = await drain(f);
        if (window === 'kafka-commit') assert.match(stderr, /its rows are marked sent, not sent again/);
      } finally {
        zombie.child.kill('SIGCONT');
      }
      const resumed = await zombie.result;
      assert.notEqual(resumed.code, 0, `the zombie must fail, not commit: ${resumed.stderr}`);
      assert.deepEqual(await counts(sql, f.table), { total: 20, sent: 20, parked: 0, pending: 0 });
      await assertExactlyOnce(f, ids);
    });
  }

  it("the relay's backends terminated between the Kafka commit and the marks: the invocation fails, the batch stays on record, and the lane's next holder marks it, sending nothing again", async () => {
    const f = await fixture(sql, 'eos_terminated');
    const ids = await rows(f, 40);
    const appName = uniqueName('eos-terminated');
    const dying = await startPaused(f, 'kafka-commit', 1_500, { OUTBOX_CLIENT_ID: appName });
    assert.ok((await terminateBackends(admin, { applicationName: appName })) > 0, 'the relay had backends to terminate');
    const failed = await dying.result;
    assert.notEqual(failed.code, 0, failed.stderr);
    assert.equal(await unsettled(f), 1, 'the committed batch stays on record');
    await leasesRunOut(f);
    assert.match(await drain(f), /its rows are marked sent, not sent again/);
    assert.equal(await unsettled(f), 0);
    await assertExactlyOnce(f, ids);
  });

  it('a warm container (one Runtime, several invocations): each leases a lane, settles and releases it; every row once', async () => {
    const f = await fixture(sql, 'eos_warm');
    const rt = new Runtime(loadConfig({ ...f.env, ...EXACTLY_ONCE, OUTBOX_LOG_LEVEL: 'warn' }), createLogger('warn'));
    try {
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) {
        ids.push(...(await rows(f, 25)));
        const summary = await rt.invokeUntil(new Deadline(Date.now() + 15_000));
        assert.equal(summary.published, 25, JSON.stringify(summary));
        const [held] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${lanes(f)} WHERE holder IS NOT NULL OR in_flight IS NOT NULL`);
        assert.equal(held!.n, 0, `invocation ${i + 1} released its lane`);
      }
      await assertExactlyOnce(f, ids);
    } finally {
      await rt.close();
    }
  });

  it("a warm container whose invocation lost its database connections between the two commits: the same Runtime's next invocations reconnect, hold the rows behind that batch back, and settle it by marking once its lease runs out; every row once, in order", async () => {
    const f = await fixture(sql, 'eos_warm_failed');
    const ids = await rows(f, 40);
    const appName = uniqueName('eos-warm-failed');
    const logs: string[] = [];
    const env = { ...f.env, ...EXACTLY_ONCE, OUTBOX_CLIENT_ID: appName, OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '1000', OUTBOX_TEST_PAUSE_AT: 'kafka-commit' };
    const rt = new Runtime(loadConfig(env), createLogger('warn', {}, (l) => logs.push(JSON.stringify(l))));
    try {
      const first = rt.invokeUntil(new Deadline(Date.now() + DYING_TIMEOUT_MS));
      for (let i = 0; i < 100 && !logs.some((l) => l.includes('test hook: pausing')); i++) await new Promise((r) => setTimeout(r, 50));
      assert.ok((await terminateBackends(admin, { applicationName: appName })) > 0, 'the relay had backends to terminate');
      await assert.rejects(first, 'the invocation whose connections were terminated fails');
      assert.equal(await unsettled(f), 1, 'its batch, committed in Kafka, stays on record');

      // another lane; every aggregate's later rows wait behind the rows on record (G4)
      const second = await rt.invokeUntil(new Deadline(Date.now() + 15_000));
      assert.deepEqual([second.published, second.heldBack], [0, 20], JSON.stringify(second));
      await leasesRunOut(f);
      const third = await rt.invokeUntil(new Deadline(Date.now() + 15_000));
      assert.equal(third.published, 20, `the batch on record marked, then the rows behind it sent: ${JSON.stringify(third)}`);
      assert.ok(logs.some((l) => l.includes('its rows are marked sent, not sent again')), 'the lane settled by marking');
      assert.equal(await unsettled(f), 0);
      assert.deepEqual(await counts(sql, f.table), { total: 40, sent: 40, parked: 0, pending: 0 });
      await assertExactlyOnce(f, ids);
    } finally {
      await rt.close();
    }
  });

  it('three invocations at once, each on a lane of its own, beside a row the topic-prefix rule parks: every other row once, in order; the parked row holds its aggregate back (G4, G6)', async () => {
    const f = await fixture(sql, 'eos_concurrent');
    // 200 aggregates: an invocation holds at most a few batches' heads (claimed ahead), so the
    // others always find aggregates of their own to claim, whichever starts first
    const ids = await rows(f, 600, 200);
    const [poison] = await insertEvents(sql, f.table, [{ aggregateid: 'poisoned', topic: 'elsewhere.orders' }]);
    const behind = await insertEvents(sql, f.table, [{ aggregateid: 'poisoned' }, { aggregateid: 'poisoned' }]);
    // each batch pauses once committed, so the three overlap for seconds
    const env = { ...f.env, ...EXACTLY_ONCE, OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '300', OUTBOX_TEST_PAUSE_AT: 'committed' };
    const results = await Promise.all([0, 1, 2].map(() => runCli(['invoke', '--timeout', '30000'], env)));
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    assert.equal(results.reduce((sum, r) => sum + Number(r.summary?.published ?? 0), 0), 600, JSON.stringify(results.map((r) => r.summary)));
    const [used] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${lanes(f)} WHERE batch_no > 0`);
    assert.ok(used!.n >= 2, `the invocations overlapped on lanes of their own: ${used!.n} lane(s) used; ${JSON.stringify(results.map((r) => r.summary))}`);
    const [parked] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${qualified(parseTableName(f.table))} WHERE parked_at IS NOT NULL AND id = $1`, [poison!]);
    assert.equal(parked!.n, 1, 'the row outside the topic prefix is parked');
    assert.deepEqual(await counts(sql, f.table), { total: 603, sent: 600, parked: 1, pending: 2 }, `the two rows behind it wait (${behind.join(', ')})`);
    assert.equal(await unsettled(f), 0);
    await assertExactlyOnce(f, ids);
  });
});
