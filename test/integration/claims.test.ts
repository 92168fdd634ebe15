// services: postgres, kafka
// G4 and G5 together: the order guard holds a row back behind an earlier row of its aggregate that
// it cannot take, and the loop never claims behind such a row again and again (a claim, a hold
// back, a rollback, until the budget is gone: every tick would burn its whole budget so). Claims
// per invocation are bounded by the work done. And a waiting mark is never trusted to be cleared
// on time: a row that is due is claimable, and a stale mark still holds its aggregate's later rows.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { toMessage, tooLarge } from '../../src/kafka/message.ts';
import { createLogger } from '../../src/log.ts';
import type { Publisher, Store } from '../../src/loop/ports.ts';
import { parseTableName, qualified, sentTable } from '../../src/outbox/identifier.ts';
import { runInvocation } from '../../src/loop/invocation.ts';
import { migrate } from '../../src/outbox/migrate.ts';
import { OutboxStore } from '../../src/outbox/store.ts';
import { consumeAll, fileDb, firstCopyOrder, fixture, insertEvents, invokeOk, isSorted, seqsById, uniqueName } from './helpers.ts';

const sql = fileDb();

async function table(name: string): Promise<{ store: OutboxStore; t: string; name: string }> {
  const n = uniqueName(name);
  await migrate(sql, parseTableName(n));
  return { store: new OutboxStore(sql, parseTableName(n), 'hold'), t: qualified(parseTableName(n)), name: n };
}

describe('G4/G5: claims bounded by the work done', () => {
  it('G4/G5: a row set not due by hand, that never failed, holds its aggregate back, and the loop leaves that aggregate out instead of claiming behind it until the budget is gone', async () => {
    const f = await fixture(sql, 'notdue');
    const t = qualified(parseTableName(f.table));
    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'X', type: 'X1' }, { aggregateid: 'X', type: 'X2' }, ...Array.from({ length: 5 }, (_, i) => ({ aggregateid: `o-${i}` }))]);
    await sql.unsafe(`UPDATE ${t} SET next_attempt_at = now() + interval '1 hour' WHERE id = $1`, [ids[0]!]);
    const s = await invokeOk({ ...f.env, OUTBOX_BATCH_SIZE: '10' }, 8_000);
    assert.equal(s.published, 5, JSON.stringify(s));
    assert.equal(s.heldBack, 1, 'X2 waits behind X1');
    assert.equal(s.stoppedBecause, 'behind-unclaimable-rows', 'stopped because what is left cannot be taken now, not because the budget ran out');
    // the batch, the claim that found only X2 (held back, X left out), the empty claim
    assert.ok(s.claims <= 3, `claims: ${String(s.claims)}`);
    const msgs = await consumeAll([f.topic('order')], 5);
    assert.deepEqual(new Set(msgs.map((m) => m.headers.id)), new Set(ids.slice(2)));
  });

  it('G4/G5: an aggregate behind an application\'s row lock costs one claim, not a loop, and is delivered in order once the lock goes', async () => {
    const f = await fixture(sql, 'applock');
    const t = qualified(parseTableName(f.table));
    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'X' }, { aggregateid: 'X' }, { aggregateid: 'X' }]);
    const locker = await sql.reserve();
    let s;
    try {
      await locker`BEGIN`;
      await locker.unsafe(`SELECT 1 FROM ${t} WHERE id = $1 FOR UPDATE`, [ids[0]!]);
      s = await invokeOk({ ...f.env, OUTBOX_BATCH_SIZE: '10' }, 8_000);
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    assert.equal(s.published, 0, JSON.stringify(s));
    assert.equal(s.stoppedBecause, 'behind-unclaimable-rows');
    assert.ok(s.claims <= 3, `claims: ${String(s.claims)}`);
    const next = await invokeOk(f.env);
    assert.equal(next.published, 3, JSON.stringify(next));
    const seqs = await seqsById(sql, f.table);
    const order = firstCopyOrder(await consumeAll([f.topic('order')], 3), (id) => seqs.get(id)!);
    assert.ok(isSorted(order.get('X')!), JSON.stringify([...order]));
  });
});

describe('G4: waiting marks that cannot strand a row or be passed', () => {
  it('a failed row is never marked waiting: behind a blocking row it waits by the claim\'s own filter, and once the rows before it go and it is due, the next claim takes it (it was marked, and stranded until the next invocation)', async () => {
    const { store, t } = await table('nomarkfailed');
    // aggregate X: P failed and backs off, F failed and backs off behind it, L never failed
    for (const type of ['P', 'F', 'L']) await sql.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'X', $1, '{}')`, [type]);
    await sql.unsafe(`UPDATE ${t} SET attempts = 1, next_attempt_at = now() + interval '1 hour', last_error = 'failed' WHERE type IN ('P', 'F')`);
    const deadline = new Deadline(Date.now() + 20_000);
    assert.equal(await store.markWaiting(deadline), 1, 'only L is marked');
    const marked = await sql.unsafe<{ type: string }[]>(`SELECT type FROM ${t} WHERE waiting`);
    assert.deepEqual(marked.map((r) => r.type), ['L']);
    // P goes (sent by another relay, or deleted by hand), and F's backoff ends
    await sql.unsafe(`DELETE FROM ${t} WHERE type = 'P'`);
    await sql.unsafe(`UPDATE ${t} SET next_attempt_at = now() WHERE type = 'F'`);
    const tx = await store.begin(deadline);
    const rows = await tx.claim(10);
    await tx.rollback();
    assert.deepEqual(rows.map((r) => [r.type, r.publishable]), [['F', true]], 'F is claimed and publishable; L still waits (its mark goes with F\'s send)');
  });

  it('stale marks with no failed row in their aggregate (a removal the trigger did not see: triggers disabled, two removals at once): a newer row of that aggregate is held back, not published ahead of them', async () => {
    const { store, t } = await table('stalemark');
    for (const type of ['W1', 'W2', 'N']) await sql.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'X', $1, '{}')`, [type]);
    await sql.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'Y', 'Y1', '{}')`);
    // W1, W2 marked, and nothing in X failed: the blocking row that justified them went unseen
    await sql.unsafe(`UPDATE ${t} SET waiting = true WHERE type IN ('W1', 'W2')`);
    const deadline = new Deadline(Date.now() + 20_000);
    const tx = await store.begin(deadline);
    const rows = await tx.claim(10);
    await tx.rollback();
    const byType = new Map(rows.map((r) => [r.type, r]));
    assert.equal(byType.get('Y1')?.publishable, true);
    assert.equal(byType.get('N')?.publishable, false, 'N must not pass the waiting W1, W2');
    assert.equal(byType.get('N')?.behindStaleMark, true, 'and it is known to wait on a stale mark');
  });

  it('stale marks met mid-invocation (set after its sweep before the first claim): the loop clears them once and delivers the aggregate in order, in the same invocation, with a bounded number of claims', async () => {
    const { store, t, name } = await table('stalerun');
    for (const type of ['W1', 'W2', 'N']) await sql.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'X', $1, '{}')`, [type]);
    await sql.unsafe(`UPDATE ${t} SET waiting = true WHERE type IN ('W1', 'W2')`);
    // the real store, whose sweep before the first claim ran just before the marks were set: the
    // first call finds nothing, later ones are the store's own
    let sweeps = 0;
    const late: Store = Object.assign(Object.create(store) as OutboxStore, {
      clearStaleMarks: (d: Deadline) => (sweeps++ === 0 ? Promise.resolve({ cleared: 0, blocked: false }) : store.clearStaleMarks(d)),
    });
    const published: string[] = [];
    const publisher: Publisher = {
      toMessage,
      tooLarge,
      connects: 1,
      maxMessageBytes: () => Promise.resolve(1_000_000),
      publish: (messages) => {
        published.push(...messages.map((m) => m.seq));
        return Promise.resolve({ acked: messages.map((m) => m.seq), rejected: [], backedOff: [] });
      },
      close: () => Promise.resolve(),
    };
    const config = loadConfig({ DATABASE_URL: 'postgres://unused', KAFKA_BROKERS: '127.0.0.1:1', OUTBOX_TABLE: name, OUTBOX_BATCH_SIZE: '10' }).outbox;
    const s = await runInvocation({ store: late, publisher, config, logger: createLogger('error', {}, () => undefined) }, new Deadline(Date.now() + 8_000));
    assert.equal(s.published, 3, JSON.stringify(s));
    assert.equal(sweeps, 2, 'one sweep before the first claim, one when the stale marks were met');
    assert.ok(s.claims <= 4, `claims: ${s.claims}`);
    const seqs = (await sql.unsafe<{ seq: string }[]>(`SELECT seq::text FROM ${qualified(sentTable(parseTableName(name)))} ORDER BY seq`)).map((r) => r.seq);
    assert.deepEqual(published, seqs, 'published in seq order, each once');
  });
});
