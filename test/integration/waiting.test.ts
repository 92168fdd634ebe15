// Waiting marks (migration 004): rows behind a blocking row of their aggregate (backing off, or
// parked under the hold policy) leave the claim index, so claims do not read them again and again;
// the marks follow the blocking rows (a failure marks, a send, retry or skip clears) and every
// invocation tidies what changed behind its back. Order (G4) must hold whatever the marks say.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { Deadline } from '../../src/budget.ts';
import { backlog } from '../../src/outbox/admin.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { OutboxStore } from '../../src/outbox/store.ts';
import { consumeAll, counts, db, firstCopyOrder, fixture, insertEvents, invokeOk, isSorted, runCli, seqsById } from './helpers.ts';

let sql: Sql;
before(() => {
  sql = db();
});
after(async () => {
  await sql.end();
});

async function waitingSeqs(table: string): Promise<number[]> {
  const rows = await sql.unsafe<{ seq: string }[]>(`SELECT seq FROM ${qualified(parseTableName(table))} WHERE waiting AND sent_at IS NULL ORDER BY seq`);
  return rows.map((r) => Number(r.seq));
}

describe('waiting marks', () => {
  it('a parked row: the rows behind it are marked waiting in the same commit, counted as pending, and freed in order by `parked retry`', async () => {
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
    const retried = await runCli(['parked', 'retry', '--all'], env);
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

  it('stale marks (a blocking row deleted by hand): a claim holds back the rows after them (G4), and the next invocation clears them and delivers all in order', async () => {
    const f = await fixture(sql, 'wait_stale');
    const t = qualified(parseTableName(f.table));
    await insertEvents(sql, f.table, Array.from({ length: 3 }, (_, i) => ({ aggregateid: 'S', type: `S${i}` })));
    // as if a blocking row had marked them, then been deleted by hand: nothing blocks S any more
    await sql.unsafe(`UPDATE ${t} SET waiting = true`);
    await insertEvents(sql, f.table, Array.from({ length: 3 }, (_, i) => ({ aggregateid: 'S', type: `S${i + 3}` })));

    // the claim itself: S3..S5 are claimable, S0..S2 are outside the claim index, yet a gap
    const store = new OutboxStore(sql, parseTableName(f.table), 'hold');
    const tx = await store.begin(new Deadline(Date.now() + 10_000));
    const rows = await tx.claim(100, { aggregates: [], inFlight: [], topics: [], topicTemplate: f.template });
    await tx.rollback();
    assert.deepEqual(
      rows.map((r) => [r.type, r.publishable]),
      [
        ['S3', false],
        ['S4', false],
        ['S5', false],
      ],
      'the rows after the stale waiting rows are held back',
    );

    const s = await invokeOk(f.env);
    assert.equal(s.published, 6, JSON.stringify(s));
    assert.deepEqual(await counts(sql, f.table), { total: 6, sent: 6, parked: 0, pending: 0 });
    const messages = await consumeAll([f.topic('order')], 6);
    const seqs = await seqsById(sql, f.table);
    assert.deepEqual(
      firstCopyOrder(messages, (id) => seqs.get(id)!).get('S'),
      [...seqs.values()].sort((a, b) => a - b),
      'S0..S5 in seq order',
    );
  });

  it('backing-off aggregates: the rows written behind them are marked by the next invocation, and freed as each backoff ends and its row is sent, within the same invocation', async () => {
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
});
