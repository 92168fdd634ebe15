// services: postgres, kafka
// Waiting marks: rows behind a blocking row of their aggregate (backing off, or
// parked under the hold policy) leave the claim index, so claims do not read them again and again;
// the marks follow the blocking rows (a failure marks, a send, retry or skip clears) and every
// invocation tidies what changed behind its back. Order (G4) must hold whatever the marks say.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BUDGET, Deadline } from '../../src/budget.ts';
import { backlog } from '../../src/outbox/admin.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { OutboxStore } from '../../src/outbox/store.ts';
import { consumeAll, db, fileDb, firstCopyOrder, fixture, insertEvents, invokeOk, isSorted, runCli, seqsById } from './helpers.ts';

const sql = fileDb();

async function waitingSeqs(table: string): Promise<number[]> {
  const rows = await sql.unsafe<{ seq: string }[]>(`SELECT seq FROM ${qualified(parseTableName(table))} WHERE waiting AND sent_at IS NULL ORDER BY seq`);
  return rows.map((r) => Number(r.seq));
}

/** Aggregate S: its first row S0 failed and backs off for an hour, S1..S3 behind it (not marked yet). */
async function blockedAggregate(table: string): Promise<{ t: string; blockingSeq: string }> {
  const t = qualified(parseTableName(table));
  await insertEvents(sql, table, [{ aggregateid: 'S', type: 'S0' }]);
  const [blocking] = await sql.unsafe<{ seq: string }[]>(
    `UPDATE ${t} SET attempts = 1, next_attempt_at = now() + interval '1 hour', last_error = 'earlier failure' RETURNING seq::text`,
  );
  await insertEvents(sql, table, Array.from({ length: 3 }, (_, i) => ({ aggregateid: 'S', type: `S${i + 1}` })));
  return { t, blockingSeq: blocking!.seq };
}

describe('waiting marks', () => {
  it('a parked row: the rows behind it are marked waiting in the same commit, counted as pending, and freed in order by `parked retry` (G4)', async () => {
    const f = await fixture(sql, 'wait_parked');
    const t = qualified(parseTableName(f.table));
    const env = { ...f.env, OUTBOX_MAX_ATTEMPTS: '1' };
    // aggregate P: its first row cannot be sent (an illegal topic name), 30 good rows behind it
    await insertEvents(sql, f.table, [{ aggregateid: 'P', topic: `${f.prefix}.illegal!`, type: 'P0' }]);
    await insertEvents(sql, f.table, [
      ...Array.from({ length: 30 }, (_, i) => ({ aggregateid: 'P', type: `P${i + 1}` })),
      ...Array.from({ length: 40 }, (_, i) => ({ aggregateid: `other-${i % 8}` })),
    ]);
    const first = await invokeOk(env);
    assert.equal(first.published, 40, JSON.stringify(first));
    assert.equal(first.parked, 1);
    const waiting = await waitingSeqs(f.table);
    assert.equal(waiting.length, 30, 'the 30 rows behind the parked row are marked waiting');
    // the backlog figures still count them (they are pending, only outside the claim index)
    const b = await backlog(sql, parseTableName(f.table), new Deadline(Date.now() + 5_000));
    assert.equal(b.pendingRows, 30);
    assert.equal(b.parkedRows, 1);
    assert.ok(b.oldestPendingAgeMs > 0, `the age of the oldest waiting row: ${b.oldestPendingAgeMs}`);
    // a second invocation finds nothing to claim: the waiting rows are not even read
    const second = await invokeOk(env);
    assert.equal(second.claimed, 0, JSON.stringify(second));
    assert.equal(second.stoppedBecause, 'behind-failed-rows');

    // the operator repairs the row and puts it back: the marks are cleared in the same transaction
    await sql.unsafe(`UPDATE ${t} SET topic = NULL WHERE type = 'P0'`);
    const retried = await runCli(['parked', 'retry', '--all', '--reason', 'topic fixed'], env);
    assert.equal(retried.code, 0, retried.stderr);
    assert.deepEqual(await waitingSeqs(f.table), [], 'no row waits any more');
    const third = await invokeOk(env);
    assert.equal(third.published, 31, JSON.stringify(third));
    const messages = await consumeAll([f.topic('order')], 71);
    const seqs = await seqsById(sql, f.table);
    const p = firstCopyOrder(messages, (id) => seqs.get(id)!).get('P')!;
    assert.equal(p.length, 31);
    assert.ok(isSorted(p), `P's rows in seq order: ${p.join(',')}`);
  });

  for (const [how, change] of [
    ['deleted', 'DELETE FROM {t} WHERE seq = $1'],
    ['reset to attempts 0', "UPDATE {t} SET attempts = 0, next_attempt_at = '-infinity' WHERE seq = $1"],
  ] as const) {
    it(`a blocking row ${how} by hand, mid-invocation: the marks behind it go in the same statement (the unwait trigger), so the next claim takes its aggregate's rows in order (G4)`, async () => {
      const f = await fixture(sql, 'wait_hand');
      const { t, blockingSeq } = await blockedAggregate(f.table);
      const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
      const deadline = new Deadline(Date.now() + 10_000);
      assert.equal(await store.markWaiting(deadline), 3);
      // written after the marking: not marked, held back by the blocking row alone
      await insertEvents(sql, f.table, Array.from({ length: 2 }, (_, i) => ({ aggregateid: 'S', type: `S${i + 4}` })));

      await sql.unsafe(change.replace('{t}', t), [blockingSeq]);
      assert.deepEqual(await waitingSeqs(f.table), [], 'the marks outlived their blocking row');

      // the claim sees every row of S, in order: none jumps the rows that were marked
      const tx = await store.begin(deadline);
      const rows = await tx.claim(100, { aggregates: [], inFlight: [], topics: [], topicTemplate: f.template });
      await tx.rollback();
      const expected = how === 'deleted' ? ['S1', 'S2', 'S3', 'S4', 'S5'] : ['S0', 'S1', 'S2', 'S3', 'S4', 'S5'];
      assert.deepEqual(rows.map((r) => [r.type, r.publishable]), expected.map((type) => [type, true]));

      const s = await invokeOk(f.env);
      assert.equal(s.published, expected.length, JSON.stringify(s));
      const messages = await consumeAll([f.topic('order')], expected.length);
      const seqs = await seqsById(sql, f.table);
      assert.deepEqual(firstCopyOrder(messages, (id) => seqs.get(id)!).get('S'), [...seqs.values()].sort((a, b) => a - b), 'S in seq order');
    });
  }

  for (const [how, policy, change] of [
    // its backoff ends: time passing does this without a statement, so no trigger runs
    ['due again', 'hold', "UPDATE {t} SET next_attempt_at = now() - interval '1 second' WHERE attempts > 0"],
    // parked while the relay ran under hold, then redeployed with skip: the row stays, and no longer blocks
    ['parked, the policy now skip', 'skip', 'UPDATE {t} SET parked_at = now(), next_attempt_at = now() WHERE attempts > 0'],
  ] as const) {
    it(`stale marks behind a failed row that no longer blocks (${how}): the claim probes its aggregate and holds back the rows after the marks (G4)`, async () => {
      const f = await fixture(sql, 'wait_unblocked');
      const { t } = await blockedAggregate(f.table);
      const deadline = new Deadline(Date.now() + 10_000);
      assert.equal(await new OutboxStore(sql, parseTableName(f.table), 'hold').markWaiting(deadline), 3);
      // the failed row stays, so its marks stay until the relay sends or tidies them; a row written now is not marked
      await sql.unsafe(change.replace('{t}', t));
      await insertEvents(sql, f.table, [{ aggregateid: 'S', type: 'S4' }]);
      assert.equal((await waitingSeqs(f.table)).length, 3);

      const store = new OutboxStore(sql, parseTableName(f.table), policy);
      const tx = await store.begin(deadline);
      const rows = await tx.claim(100, { aggregates: [], inFlight: [], topics: [], topicTemplate: f.template });
      await tx.rollback();
      assert.deepEqual(
        rows.map((r) => [r.type, r.publishable]),
        [...(policy === 'hold' ? [['S0', true]] : []), ['S4', false]],
        'S4 went ahead of the waiting S1..S3',
      );

      // the invocation sends S0 (due) or tidies the marks (skip) first, and the rest follows in order
      const sent = policy === 'hold' ? 5 : 4;
      const s = await invokeOk({ ...f.env, OUTBOX_PARKED_POLICY: policy });
      assert.equal(s.published, sent, JSON.stringify(s));
      const messages = await consumeAll([f.topic('order')], sent);
      const seqs = await seqsById(sql, f.table);
      const expected = [...seqs.values()].sort((a, b) => a - b).slice(policy === 'hold' ? 0 : 1);
      assert.deepEqual(firstCopyOrder(messages, (id) => seqs.get(id)!).get('S'), expected, 'S in seq order');
    });
  }

  it('marking beside a DELETE by hand of the blocking row: the DELETE waits for the marks to commit, then clears them', async () => {
    const f = await fixture(sql, 'wait_race');
    const { t, blockingSeq } = await blockedAggregate(f.table);
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    const other = db();
    let release: (() => void) | undefined;
    try {
      const released = new Promise<void>((resolve) => (release = resolve));
      let marked!: (n: number) => void;
      const markedRows = new Promise<number>((resolve) => (marked = resolve));
      // a marking pass, open: its marks are not visible to anyone else yet
      const marking = sql.begin(async (tx) => {
        marked((await tx.unsafe(store.markWaitingText, [null, 10_000])).count);
        await released;
      });
      assert.equal(await markedRows, 3);
      // (postgres.js sends a query when it is awaited; execute() sends it now)
      const deleting = other.unsafe(`DELETE FROM ${t} WHERE seq = $1`, [blockingSeq]).execute();
      // the DELETE waits on the marking's lock of the row it deletes
      const waitingOnLock = async () =>
        (await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM%'`)[0]!.n;
      const until = Date.now() + 5_000;
      while ((await waitingOnLock()) === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      const waited = await waitingOnLock();
      release?.();
      await marking;
      await deleting;
      assert.equal(waited, 1, 'the DELETE did not wait for the marking pass');
      assert.deepEqual(await waitingSeqs(f.table), [], 'marks committed beside the DELETE outlived their blocking row');
    } finally {
      release?.();
      await other.end();
    }
  });

  it('backing-off aggregates: the rows written behind them are marked by the next invocation, and freed as each backoff ends and its row is sent, within the same invocation, each aggregate in order (G4)', async () => {
    const f = await fixture(sql, 'wait_backoff');
    const t = qualified(parseTableName(f.table));
    // 20 aggregates whose first row failed once and backs off for an hour, 10 rows behind each
    await insertEvents(sql, f.table, Array.from({ length: 20 }, (_, i) => ({ aggregateid: `B${i}`, type: 'B0' })));
    await sql.unsafe(`UPDATE ${t} SET attempts = 1, next_attempt_at = now() + interval '1 hour', last_error = 'earlier failure'`);
    await insertEvents(sql, f.table, [
      ...Array.from({ length: 200 }, (_, i) => ({ aggregateid: `B${i % 20}`, type: `B${1 + Math.floor(i / 20)}` })),
      ...Array.from({ length: 50 }, (_, i) => ({ aggregateid: `free-${i % 5}` })),
    ]);
    const first = await invokeOk(f.env);
    assert.equal(first.published, 50, JSON.stringify(first));
    assert.equal((await waitingSeqs(f.table)).length, 200, 'the invocation marked the 200 rows behind the backing-off rows');

    // the backoffs end while an invocation runs (it lingers, so it is still there): each blocking
    // row is sent, and its aggregate's marks are cleared with it, in the same transaction; the
    // invocation's own tidying, at its start, still saw them blocked
    await sql.unsafe(`UPDATE ${t} SET next_attempt_at = now() + interval '1500 milliseconds' WHERE attempts > 0`);
    const second = await invokeOk({ ...f.env, OUTBOX_IDLE: 'linger' }, 7_000);
    assert.equal(second.published, 220, JSON.stringify(second));
    assert.deepEqual(await waitingSeqs(f.table), []);
    const messages = await consumeAll([f.topic('order')], 270);
    const seqs = await seqsById(sql, f.table);
    for (const [agg, order] of firstCopyOrder(messages, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `${agg} out of order: ${order.join(',')}`);
  });
  it('G6: an application holding a lock on one waiting row does not strand the others: the stale marks of every other aggregate are cleared (the locked row keeps its mark for a later pass) and their rows delivered in order', async () => {
    const f = await fixture(sql, 'wait_locked');
    const t = qualified(parseTableName(f.table));
    // aggregates S and T: each first row parked under hold, three rows behind it marked waiting
    await insertEvents(sql, f.table, [{ aggregateid: 'S', type: 'S0' }, { aggregateid: 'T', type: 'T0' }]);
    await sql.unsafe(`UPDATE ${t} SET attempts = 1, parked_at = now(), last_error = 'earlier failure'`);
    await insertEvents(sql, f.table, ['S', 'T'].flatMap((a) => [1, 2, 3].map((i) => ({ aggregateid: a, type: `${a}${i}` }))));
    assert.equal(await new OutboxStore(sql, parseTableName(f.table), 'hold').markWaiting(new Deadline(Date.now() + 10_000)), 6);
    const [locked] = await sql.unsafe<{ seq: string }[]>(`SELECT seq::text FROM ${t} WHERE type = 'S2'`);

    // redeployed with skip: the parked rows no longer block, every mark is stale; an application holds S2
    const app = db();
    let release: (() => void) | undefined;
    const holding = new Promise<void>((resolve) => (release = resolve));
    let held!: () => void;
    const isHeld = new Promise<void>((resolve) => (held = resolve));
    const tx = app.begin(async (a) => {
      await a.unsafe(`SELECT 1 FROM ${t} WHERE seq = $1 FOR UPDATE`, [locked!.seq]);
      held();
      await holding;
    });
    try {
      await isHeld;
      const first = await invokeOk({ ...f.env, OUTBOX_PARKED_POLICY: 'skip' });
      assert.equal(first.published, 4, `T1..T3 and S1, not S2 (locked, still marked) nor S3 behind it: ${JSON.stringify(first)}`);
      assert.deepEqual(await waitingSeqs(f.table), [Number(locked!.seq)], 'only the locked row keeps its mark');
    } finally {
      release?.();
      await tx;
      await app.end();
    }
    const second = await invokeOk({ ...f.env, OUTBOX_PARKED_POLICY: 'skip' });
    assert.equal(second.published, 2, JSON.stringify(second));
    const messages = await consumeAll([f.topic('order')], 6);
    const seqs = await seqsById(sql, f.table);
    const order = firstCopyOrder(messages, (id) => seqs.get(id)!);
    for (const a of ['S', 'T']) assert.ok(isSorted(order.get(a)!) && order.get(a)!.length === 3, `${a}: ${order.get(a)!.join(',')}`);
  });

  it('G5: the waiting-mark pass stops within its budget: with more rows to mark than the deadline allows, it returns before the deadline after whole chunks, leaves the client usable, and the next pass goes on where it stopped', async (ctx) => {
    const f = await fixture(sql, 'wait_budget');
    const t = qualified(parseTableName(f.table));
    await insertEvents(sql, f.table, [{ aggregateid: 'BIG', type: 'B0' }]);
    await sql.unsafe(`UPDATE ${t} SET attempts = 1, next_attempt_at = now() + interval '1 hour', last_error = 'earlier failure'`);
    const behind = 300_000;
    await sql.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) SELECT 'order', 'BIG', 'B', '{}'::jsonb FROM generate_series(1, ${behind})`);
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    const deadline = new Deadline(Date.now() + 1_500);
    const marked = await store.markWaiting(deadline);
    const left = deadline.remaining();
    ctx.diagnostic(`marked ${marked} of ${behind} rows (${marked / 10_000} chunks) in a 1,500 ms budget, returned ${left} ms before the deadline`);
    assert.ok(left > 0, "returned at or past its deadline");
    assert.equal(store.poisoned, false, 'no chunk was cut at the deadline (that abandons the client)');
    assert.ok(marked > 0 && marked < behind && marked % 10_000 === 0, `whole chunks, not all of them: ${marked}`);
    assert.equal((await waitingSeqs(f.table)).length, marked);
    assert.equal(await store.markWaiting(new Deadline(Date.now() + 120_000)), behind - marked, 'the next pass marks the rest');
  });

  it('G5: a chunk slower than the pass expected (a trigger sleeps 2 s per UPDATE) is timed out by the server, not by the client\'s race: the pass returns by its deadline with nothing marked, the client still usable', async (ctx) => {
    const f = await fixture(sql, 'wait_slow');
    const t = qualified(parseTableName(f.table));
    await insertEvents(sql, f.table, [{ aggregateid: 'SLOW', type: 'S0' }]);
    await sql.unsafe(`UPDATE ${t} SET attempts = 1, next_attempt_at = now() + interval '1 hour', last_error = 'earlier failure'`);
    await insertEvents(sql, f.table, Array.from({ length: 20 }, (_, i) => ({ aggregateid: 'SLOW', type: `S${i + 1}` })));
    const fn = `${f.table.replace(/\W/g, '_')}_slow`;
    await sql.unsafe(`CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$`);
    await sql.unsafe(`CREATE TRIGGER slow BEFORE UPDATE ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${fn}()`);
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    // a budget the first chunk is expected to fit (nothing measured yet), which the trigger overruns
    const deadline = new Deadline(Date.now() + 1_000);
    const marked = await store.markWaiting(deadline);
    const late = Date.now() - deadline.at;
    ctx.diagnostic(`returned ${-late} ms before the deadline`);
    assert.equal(marked, 0);
    assert.equal(store.poisoned, false, 'the client lost its race with the deadline and was abandoned');
    assert.ok(late <= BUDGET.rollbackGraceMs.min, `returned ${late} ms past the deadline`);
    assert.deepEqual(await waitingSeqs(f.table), [], 'the chunk was rolled back');
    await sql.unsafe(`DROP TRIGGER slow ON ${t}`);
    assert.equal(await store.markWaiting(new Deadline(Date.now() + 60_000)), 20, 'the same client marks them on the next pass');
  });
});
