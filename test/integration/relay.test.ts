// The relay's guarantees (DESIGN §1), each against real Postgres and a real Kafka broker, with
// invocations run as real child processes through the same handler Lambda runs.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import {
  consumeAll,
  copiesById,
  counts,
  DATABASE_URL,
  db,
  firstCopyOrder,
  fixture,
  insertEvents,
  isSorted,
  KAFKA_BROKERS,
  markedIds,
  runCli,
  startCli,
  topicCount,
  twiceIds,
  type EventSpec,
} from './helpers.ts';

let sql: Sql;
before(() => {
  sql = db();
});
after(async () => {
  await sql.end();
});

async function seqOf(table: string): Promise<Map<string, number>> {
  const rows = await sql.unsafe<{ id: string; seq: string }[]>(`SELECT id, seq FROM ${qualified(parseTableName(table))}`);
  return new Map(rows.map((r) => [r.id, Number(r.seq)]));
}

describe('relay: delivery', () => {
  it('relays rows with key = aggregateid, value = payload, headers id and type; marks them sent', async () => {
    const f = await fixture(sql, 'basic', ['order', 'invoice']);
    const ids = await insertEvents(sql, f.table, [
      { aggregatetype: 'order', aggregateid: 'o-1', type: 'OrderCreated', payload: { total: 42 } },
      { aggregatetype: 'invoice', aggregateid: 'i-1', type: 'InvoiceIssued', payload: { n: 1 } },
      { aggregatetype: 'order', aggregateid: 'o-1', type: 'OrderPaid', payload: { total: 42, paid: true } },
    ]);
    const res = await runCli(['invoke', '--timeout', '20000'], f.env);
    assert.equal(res.code, 0, res.stderr);
    assert.equal(res.summary?.published, 3);
    assert.equal(res.summary?.stoppedBecause, 'empty');
    const msgs = await consumeAll([f.topic('order'), f.topic('invoice')], 3);
    assert.equal(msgs.length, 3);
    const created = msgs.find((m) => m.headers.id === ids[0])!;
    assert.equal(created.topic, f.topic('order'));
    assert.equal(created.key, 'o-1');
    assert.deepEqual(JSON.parse(created.value!), { total: 42 });
    assert.equal(created.headers.type, 'OrderCreated');
    assert.equal(msgs.find((m) => m.headers.id === ids[1])!.topic, f.topic('invoice'));
    assert.deepEqual(await counts(sql, f.table), { total: 3, sent: 3, parked: 0, pending: 0 });
    // nothing left: the next invocation says the queue is empty
    const again = await runCli(['invoke', '--timeout', '10000'], f.env);
    assert.equal(again.summary?.stoppedBecause, 'empty');
    assert.equal(again.summary?.published, 0);
  });

  it('accepts a Debezium-style insert of only the four columns', async () => {
    const f = await fixture(sql, 'debezium');
    await sql.unsafe(`INSERT INTO ${qualified(parseTableName(f.table))} (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4)`, ['order', 'o-9', 'OrderCreated', { a: 1 }]);
    const res = await runCli(['invoke', '--timeout', '20000'], f.env);
    assert.equal(res.summary?.published, 1, res.stderr);
    const [m] = await consumeAll([f.topic('order')], 1);
    assert.equal(m?.key, 'o-9');
    assert.match(m?.headers.id ?? '', /^[0-9a-f-]{36}$/);
  });
});

describe('G1/G2: a crash between the broker ack and the mark', () => {
  it('re-sends only that batch, with the same id headers; nothing is lost', async () => {
    const f = await fixture(sql, 'crash');
    const events: EventSpec[] = Array.from({ length: 250 }, (_, i) => ({ aggregateid: `a-${i % 20}`, payload: { i } }));
    const ids = await insertEvents(sql, f.table, events);
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '100', OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '60000' };
    const running = startCli(['invoke', '--timeout', '60000'], env);
    await running.waitForStderr('test hook: pausing after publish');
    // acked, and its marks already written (premarked while the batch was on its way), but not
    // committed: to every other session the batch is still pending (G1)
    assert.equal((await counts(sql, f.table)).sent, 0, 'uncommitted marks are visible to no one');
    running.child.kill('SIGKILL');
    const killed = await running.result;
    assert.equal(killed.signal, 'SIGKILL');

    // the first batch (100 rows) reached Kafka, none of it was marked
    assert.equal(await topicCount([f.topic('order')]), 100);
    assert.equal((await counts(sql, f.table)).sent, 0);

    const res = await runCli(['invoke', '--timeout', '30000'], f.env);
    assert.equal(res.code, 0, res.stderr);
    assert.equal(res.summary?.published, 250);
    assert.deepEqual(await counts(sql, f.table), { total: 250, sent: 250, parked: 0, pending: 0 });

    const msgs = await consumeAll([f.topic('order')], 350);
    assert.equal(msgs.length, 350, 'exactly the one batch is duplicated');
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'every row arrived, under its own id');
    assert.equal([...copies.values()].filter((n) => n === 2).length, 100);
    // the duplicated rows are exactly the first batch in seq order
    assert.deepEqual(new Set(ids.slice(0, 100)), twiceIds(copies));
    const seqs = await seqOf(f.table);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} out of order`);
  });
});

describe('G2: a crash after a batch\'s COMMIT went out, while the next batch is in flight', () => {
  it('re-sends only the batch in flight: the database commits the COMMIT it received', async () => {
    const f = await fixture(sql, 'crash2');
    // 200 aggregates: batch 2 is claimed (rows 100-199) while batch 1 is in flight, so it is
    // published right after batch 1's COMMIT was written, without waiting for its answer
    const ids = await insertEvents(sql, f.table, Array.from({ length: 250 }, (_, i) => ({ aggregateid: `a-${i % 200}`, payload: { i } })));
    // the hook pauses after every batch's acks
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '100', OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '1500' };
    const running = startCli(['invoke', '--timeout', '60000'], env);
    // second pause: batch 1's COMMIT was written (not awaited) before batch 2 was published
    await running.waitForStderr('test hook: pausing after publish', 30_000, 2);
    running.child.kill('SIGKILL');
    assert.equal((await running.result).signal, 'SIGKILL');

    assert.equal(await topicCount([f.topic('order')]), 200, 'two batches reached Kafka');
    assert.deepEqual(await markedIds(sql, f.table), new Set(ids.slice(0, 100)), 'exactly batch 1 is marked');

    const res = await runCli(['invoke', '--timeout', '30000'], f.env);
    assert.equal(res.code, 0, res.stderr);
    assert.equal(res.summary?.published, 150);
    const msgs = await consumeAll([f.topic('order')], 350);
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'every row arrived');
    assert.deepEqual(twiceIds(copies), new Set(ids.slice(100, 200)), 'only batch 2 is duplicated');
    const seqs = await seqOf(f.table);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} out of order`);
  });
});

describe('G3 and G4 under concurrency', () => {
  it('G3: 10,000 rows, 300 aggregates, 6 concurrent invocations: each row exactly once, in order per aggregate', async () => {
    const f = await fixture(sql, 'g3', ['order'], 6);
    const events: EventSpec[] = Array.from({ length: 10_000 }, (_, i) => ({ aggregateid: `agg-${(i * 7919) % 300}`, payload: { i } }));
    const ids = await insertEvents(sql, f.table, events);
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '100' };
    const results = await Promise.all(Array.from({ length: 6 }, () => runCli(['invoke', '--timeout', '60000'], env)));
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    // more than one invocation did real work (they shared the queue through row locks)
    const published = results.map((r) => Number(r.summary?.published ?? 0));
    assert.equal(published.reduce((a, b) => a + b, 0), 10_000, `summaries: ${results.map((r) => JSON.stringify(r.summary)).join('\n')}`);
    assert.ok(published.filter((n) => n > 0).length >= 2, `work was shared: ${published.join(',')}`);
    assert.deepEqual(await counts(sql, f.table), { total: 10_000, sent: 10_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 10_000, 60_000);
    assert.equal(msgs.length, 10_000, 'no duplicates without faults');
    assert.equal(new Set(msgs.map((m) => m.headers.id)).size, 10_000);
    assert.deepEqual(new Set(msgs.map((m) => m.headers.id)), new Set(ids));
    const seqs = await seqOf(f.table);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} out of order`);
  });

  it('G4: while another transaction holds an aggregate\'s earliest row, none of its later rows is published', async () => {
    const f = await fixture(sql, 'g4');
    const t = qualified(parseTableName(f.table));
    const events: EventSpec[] = [];
    for (let i = 0; i < 40; i++) events.push({ aggregateid: 'held', payload: { i } }, { aggregateid: `free-${i % 5}`, payload: { i } });
    const ids = await insertEvents(sql, f.table, events);
    const heldIds = ids.filter((_, i) => i % 2 === 0);

    const locker = await sql.reserve();
    try {
      await locker`BEGIN`;
      await locker.unsafe(`SELECT seq FROM ${t} WHERE id = $1 FOR UPDATE`, [heldIds[0]!]);
      const env = { ...f.env, OUTBOX_BATCH_SIZE: '10' };
      const results = await Promise.all(Array.from({ length: 3 }, () => runCli(['invoke', '--timeout', '20000'], env)));
      for (const r of results) assert.equal(r.code, 0, r.stderr);
      const msgs = await consumeAll([f.topic('order')], 40);
      assert.equal(msgs.filter((m) => m.key === 'held').length, 0, 'no later row of the held aggregate was published');
      assert.equal(msgs.filter((m) => m.key?.startsWith('free-')).length, 40, 'other aggregates kept flowing');
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    const res = await runCli(['invoke', '--timeout', '20000'], f.env);
    assert.equal(res.code, 0, res.stderr);
    const msgs = await consumeAll([f.topic('order')], 80);
    const held = msgs.filter((m) => m.key === 'held').map((m) => m.headers.id);
    assert.deepEqual(held, heldIds, 'the held aggregate arrived complete and in seq order');
  });

  it('G4: a row held by another transaction between two claimable rows of the same aggregate', async () => {
    const f = await fixture(sql, 'g4gap');
    const t = qualified(parseTableName(f.table));
    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'x', payload: { n: 1 } }, { aggregateid: 'x', payload: { n: 2 } }, { aggregateid: 'x', payload: { n: 3 } }]);
    const locker = await sql.reserve();
    try {
      await locker`BEGIN`;
      await locker.unsafe(`SELECT seq FROM ${t} WHERE id = $1 FOR UPDATE`, [ids[1]!]);
      const res = await runCli(['invoke', '--timeout', '15000'], f.env);
      assert.equal(res.code, 0, res.stderr);
      assert.equal(res.summary?.published, 1, 'only the row before the gap');
      assert.equal(res.summary?.heldBack, 1);
      const msgs = await consumeAll([f.topic('order')], 1);
      assert.deepEqual(msgs.map((m) => m.headers.id), [ids[0]]);
      // a claim whose rows are all held back is not an empty queue
      const again = await runCli(['invoke', '--timeout', '15000'], f.env);
      assert.equal(again.summary?.published, 0);
      assert.notEqual(again.summary?.stoppedBecause, 'empty');
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    const res = await runCli(['invoke', '--timeout', '15000'], f.env);
    assert.equal(res.summary?.published, 2);
    const msgs = await consumeAll([f.topic('order')], 3);
    assert.deepEqual(msgs.map((m) => m.headers.id), ids);
  });

  it('commit order ≠ seq order: a smaller seq committed after a larger one is still relayed', async () => {
    const f = await fixture(sql, 'commitorder');
    const t = qualified(parseTableName(f.table));
    const early = await sql.reserve();
    let earlyId = '';
    try {
      await early`BEGIN`;
      const inserted = await early.unsafe<{ id: string }[]>(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'First', '{}') RETURNING id`);
      earlyId = inserted[0]!.id;
      const [lateId] = await insertEvents(sql, f.table, [{ aggregateid: 'b', type: 'Second' }]);
      const res = await runCli(['invoke', '--timeout', '15000'], f.env);
      assert.equal(res.summary?.published, 1, res.stderr);
      assert.deepEqual((await consumeAll([f.topic('order')], 1)).map((m) => m.headers.id), [lateId]);
      await early`COMMIT`;
    } finally {
      early.release();
    }
    const res = await runCli(['invoke', '--timeout', '15000'], f.env);
    assert.equal(res.summary?.published, 1, 'the late-committed smaller seq is not skipped');
    const msgs = await consumeAll([f.topic('order')], 2);
    assert.ok(msgs.some((m) => m.headers.id === earlyId));
  });
});

describe('G7: short transactions', () => {
  it('no relay transaction lives longer than a batch during a long invocation', async () => {
    const f = await fixture(sql, 'g7');
    await insertEvents(sql, f.table, Array.from({ length: 30_000 }, (_, i) => ({ aggregateid: `a-${i % 97}`, payload: { i, pad: 'x'.repeat(200) } })));
    const appName = `relay-g7-${f.table}`;
    const running = startCli(['invoke', '--timeout', '60000'], { ...f.env, OUTBOX_BATCH_SIZE: '20', OUTBOX_CLIENT_ID: appName });
    let maxAgeMs = 0;
    let samples = 0;
    let done = false;
    void running.result.then(() => (done = true));
    while (!done) {
      const rows = await sql<{ age_ms: number | null }[]>`
        SELECT extract(epoch FROM now() - xact_start) * 1000 AS age_ms
        FROM pg_stat_activity WHERE application_name = ${appName} AND xact_start IS NOT NULL`;
      for (const r of rows) {
        samples++;
        maxAgeMs = Math.max(maxAgeMs, Number(r.age_ms));
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    const res = await running.result;
    assert.equal(res.code, 0, res.stderr);
    assert.ok(Number(res.summary?.batches) > 100, `a long invocation: ${JSON.stringify(res.summary)}`);
    assert.ok(samples > 10, 'transactions were observed');
    // a batch of 20 takes milliseconds; the invocation took seconds. A transaction held across
    // batches would show an age close to the invocation's duration.
    assert.ok(maxAgeMs < Math.min(2_000, Number(res.summary?.durationMs) / 4), `oldest transaction ${maxAgeMs} ms during a ${String(res.summary?.durationMs)} ms invocation`);
    // after the invocation, nothing of it is left open
    const [left] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName}`;
    assert.equal(left?.n, 0);
  });
});

describe('G5: the budget holds when the database hangs', () => {
  it('the relay\'s own backends frozen (SIGSTOP) mid-invocation: returns before the deadline; nothing lost after they resume', async () => {
    const f = await fixture(sql, 'dbstop');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `a-${i % 50}`, payload: { i } })));
    const appName = `relay-dbstop-${f.table}`;
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '20', OUTBOX_SAFETY_MARGIN_MS: '2000', OUTBOX_CLIENT_ID: appName };
    const running = startCli(['invoke', '--timeout', '8000'], env);
    const frozen: number[] = [];
    let res;
    try {
      for (let sent = 0; sent < 500; ) {
        await new Promise((r) => setTimeout(r, 50));
        sent = (await counts(sql, f.table)).sent;
      }
      const backends = await sql<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE application_name = ${appName}`;
      assert.ok(backends.length > 0);
      for (const { pid } of backends) {
        process.kill(pid, 'SIGSTOP');
        frozen.push(pid);
      }
      res = await running.result;
    } finally {
      running.child.kill('SIGKILL');
      for (const pid of frozen) process.kill(pid, 'SIGCONT');
    }
    const summary = res.summary as { durationMs: number; stoppedBecause: string; published: number };
    assert.ok(summary, res.stderr.slice(-2_000));
    assert.ok(summary.durationMs < 6_500, `returned after ${summary.durationMs} ms; deadline 8000 - 2000 margin`);
    // a hung database fails the invocation (Lambda's Errors metric), naming the database
    assert.notEqual(res.code, 0);
    assert.equal(summary.stoppedBecause, 'database-error');
    assert.match(res.stderr, /the database did not answer in time/);
    assert.ok(res.durationMs < 8_000 + 3_000 + 2_000, `the process exited after ${res.durationMs} ms`);
    // every row marked sent is on Kafka (G1), and the next invocation delivers the rest
    const next = await runCli(['invoke', '--timeout', '60000'], { ...env, OUTBOX_BATCH_SIZE: '500' });
    assert.equal(next.code, 0, next.stderr);
    assert.deepEqual(await counts(sql, f.table), { total: 20_000, sent: 20_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 20_000, 60_000);
    assert.deepEqual(new Set(msgs.map((m) => m.headers.id)), new Set(ids));
  });
});

describe('G8: clear failures', () => {
  it('a wrong database password: exit non-zero, names the cause, marks nothing', async () => {
    const f = await fixture(sql, 'badpw');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const res = await runCli(['invoke', '--timeout', '10000'], { ...f.env, DATABASE_URL: DATABASE_URL.replace('outbox:outbox@', 'outbox:wrong@') });
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /database rejected the credentials/);
    assert.doesNotMatch(res.stderr, /wrong/, 'the password is not printed');
    assert.equal((await counts(sql, f.table)).sent, 0);
  });

  it('an unreachable broker: exit non-zero, names the broker, marks nothing', async () => {
    const f = await fixture(sql, 'nobroker');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    const res = await runCli(['invoke', '--timeout', '15000'], { ...f.env, KAFKA_BROKERS: '127.0.0.1:1' });
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /Kafka unavailable at 127\.0\.0\.1:1/);
    assert.equal(res.summary?.stoppedBecause, 'broker-unavailable');
    assert.deepEqual(await counts(sql, f.table), { total: 2, sent: 0, parked: 0, pending: 2 });
    const [row] = await sql.unsafe<{ attempts: number }[]>(`SELECT max(attempts) AS attempts FROM ${qualified(parseTableName(f.table))}`);
    assert.equal(row?.attempts, 0, 'a broker outage is not charged to the rows');
  });

  it('a hostile OUTBOX_TABLE is refused before any SQL runs; tables intact', async () => {
    await sql`CREATE TABLE IF NOT EXISTS x (n int)`;
    const res = await runCli(['invoke', '--timeout', '10000'], { DATABASE_URL, KAFKA_BROKERS, OUTBOX_TABLE: 'outbox; drop table x' });
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /OUTBOX_TABLE: "outbox; drop table x" is not a valid table name/);
    const [exists] = await sql<{ t: string | null }[]>`SELECT to_regclass('x')::text AS t`;
    assert.equal(exists?.t, 'x');
  });

  it('missing configuration names each variable', async () => {
    const res = await runCli(['invoke'], {});
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /DATABASE_URL or DATABASE_SECRET_ID is required/);
    assert.match(res.stderr, /KAFKA_BROKERS is required/);
  });
});
