// services: postgres, kafka
// The relay's guarantees (README "Guarantees"; docs/DESIGN.md says why each holds), each against
// real Postgres and a real Kafka broker, with invocations run as real child processes through the
// same handler Lambda runs, or as warm Runtimes in this process where that is the point.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Sql } from 'postgres';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { type Config } from '../../src/config/types.ts';
import { createLogger } from '../../src/log.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { RuntimeWith, UnguardedStore } from '../../bench/stores.ts';
import { startPgProxy, type PgProxyConnection } from './pg-proxy.ts';
import {
  ADMIN_DATABASE_URL,
  consumeAll,
  copiesById,
  counts,
  DATABASE_URL,
  db,
  fileDb,
  firstCopyOrder,
  fixture,
  insertEvents,
  isSorted,
  KAFKA_BROKERS,
  PLAINTEXT_DB,
  runCli,
  sentTableOf,
  seqsById,
  startCli,
  topicCount,
  twiceIds,
  uniqueName,
  type EventSpec,
  VIA_POOLER,
} from './helpers.ts';

const sql = fileDb();

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
    const seqs = await seqsById(sql, f.table);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} out of order`);
  });
});

describe('under concurrency', () => {
  it('G3/G4: 10,000 rows, 300 aggregates, 6 invocations at once (warm Runtimes, each its own connections and producer): they overlapped, shared the work, each row exactly once, in order per aggregate', async () => {
    const f = await fixture(sql, 'g3', ['order'], 6);
    const events: EventSpec[] = Array.from({ length: 10_000 }, (_, i) => ({ aggregateid: `agg-${(i * 7919) % 300}`, payload: { i } }));
    const ids = await insertEvents(sql, f.table, events);
    const runtimes = Array.from({ length: 6 }, (_, i) => new Runtime(loadConfig({ ...f.env, OUTBOX_BATCH_SIZE: '100', OUTBOX_CLIENT_ID: `g3-${i}` }), createLogger('error')));
    let runs: Array<{ summary: Summary; start: number; end: number }>;
    try {
      // connected first, so the intervals below are the invocations' own work
      await Promise.all(runtimes.map(async (rt) => (await rt.database(), await rt.publisher().maxMessageBytes(f.topic('order'), new Deadline(Date.now() + 10_000)))));
      // all settled before the runtimes close, even when one fails
      const settled = await Promise.allSettled(
        runtimes.map(async (rt) => {
          const start = performance.now();
          const summary = await rt.invoke(60_000);
          return { summary, start, end: performance.now() };
        }),
      );
      runs = settled.map((r) => {
        if (r.status === 'rejected') throw r.reason;
        return r.value;
      });
    } finally {
      await Promise.all(runtimes.map((rt) => rt.close()));
    }
    const working = runs.filter((r) => r.summary.published > 0);
    const detail = runs.map((r) => `${r.summary.published} rows in ${Math.round(r.start)}-${Math.round(r.end)} ms`).join('; ');
    assert.equal(runs.reduce((n, r) => n + r.summary.published, 0), 10_000, detail);
    assert.ok(working.length >= 2, `work was shared: ${detail}`);
    // every two invocations that published were running at the same time
    for (const a of working) for (const b of working) assert.ok(a.start < b.end && b.start < a.end, `intervals overlap: ${detail}`);
    assert.deepEqual(await counts(sql, f.table), { total: 10_000, sent: 10_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 10_000, 60_000);
    assert.equal(msgs.length, 10_000, 'no duplicates without faults');
    assert.deepEqual(new Set(msgs.map((m) => m.headers.id)), new Set(ids));
    const seqs = await seqsById(sql, f.table);
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
      assert.equal(again.summary?.stoppedBecause, 'behind-unclaimable-rows');
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    const res = await runCli(['invoke', '--timeout', '15000'], f.env);
    assert.equal(res.summary?.published, 2);
    const msgs = await consumeAll([f.topic('order')], 3);
    assert.deepEqual(msgs.map((m) => m.headers.id), ids);
  });

  it('G4, one aggregate written by two transactions at once: published in the order the rows became visible (commit order), none lost', async () => {
    const f = await fixture(sql, 'commitorder');
    const t = qualified(parseTableName(f.table));
    const early = await sql.reserve();
    let firstSeq = '';
    let lateId = '';
    let earlyId = '';
    try {
      // writer 1 takes the smaller seq and has not committed yet; writer 2 commits a later row of the same aggregate
      await early`BEGIN`;
      const inserted = await early.unsafe<{ id: string; seq: string }[]>(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'First', '{}') RETURNING id, seq`);
      earlyId = inserted[0]!.id;
      firstSeq = inserted[0]!.seq;
      [lateId] = (await insertEvents(sql, f.table, [{ aggregateid: 'a', type: 'Second' }])) as [string];
      const res = await runCli(['invoke', '--timeout', '15000'], f.env);
      assert.equal(res.summary?.published, 1, res.stderr);
      await early`COMMIT`;
    } finally {
      early.release();
    }
    const res = await runCli(['invoke', '--timeout', '15000'], f.env);
    assert.equal(res.summary?.published, 1, 'the late-committed smaller seq is not skipped');
    const msgs = (await consumeAll([f.topic('order')], 2)).filter((m) => m.key === 'a').sort((x, y) => Number(x.offset) - Number(y.offset));
    assert.deepEqual(msgs.map((m) => m.headers.id), [lateId, earlyId], 'commit order: the row committed first went first');
    const seqs = await seqsById(sql, f.table);
    assert.ok(seqs.get(lateId)! > Number(firstSeq), 'which is not seq order: writers that do not serialize per aggregate get commit order');
  });

  it('G4, writers that serialize per aggregate (a lock on the aggregate, as aggregate stores do): commit order is seq order, and so is Kafka\'s, with a second relay claiming while the first holds the aggregate\'s earliest rows', async (ctx) => {
    const run = await serializedWriters(sql, { guard: true });
    ctx.diagnostic(run.detail);
    assert.ok(isSorted(run.kafkaSeqs), `Kafka order is seq order: ${run.kafkaSeqs.join(',')} (${run.detail})`);
    assert.ok(run.bRuns > 1, `relay B claimed again and again while A held its batch (${run.detail})`);
    assert.equal(run.bPublished, 0, `relay B took no row of the aggregate while A held its first rows (${run.detail})`);
  });

  it('the same scenario with the unguarded claim (SKIP LOCKED alone, the benchmark\'s comparison): relay B publishes later rows first, so the test above can fail', async (ctx) => {
    const run = await serializedWriters(sql, { guard: false });
    ctx.diagnostic(run.detail);
    assert.ok(run.bPublished > 0, `relay B took later rows of the aggregate while A held its first ones (${run.detail})`);
    assert.ok(!isSorted(run.kafkaSeqs), `Kafka order is not seq order: ${run.kafkaSeqs.join(',')} (${run.detail})`);
  });
});

/**
 * 4 writers at once write 40 rows of aggregate 'a', each row its own transaction that first takes
 * the aggregate's lock (pg_advisory_xact_lock stands in for SELECT … FOR UPDATE on the aggregate's
 * row), so rows commit in seq order. Two relays (warm Runtimes) claim concurrently, in batches of 5:
 * A claims the earliest rows, and the answer to its claim is held by a proxy (its transaction is
 * open on the server, holding what it claimed) while B is invoked again and again, until the
 * writers are done; then A goes on. Whatever B publishes meanwhile reaches the broker before A's
 * rows. `guard` false: both relays claim with SKIP LOCKED alone (bench/sql.ts claimUnguardedSql).
 */
async function serializedWriters(sql: Sql, { guard }: { guard: boolean }): Promise<{ kafkaSeqs: number[]; bRuns: number; bPublished: number; detail: string }> {
  const f = await fixture(sql, 'serialized');
  const t = qualified(parseTableName(f.table));
  const ROWS = 40;
  // relay A connects through a proxy that holds every answer on the connection of its first claim
  let held: PgProxyConnection | undefined;
  const proxy = await startPgProxy({
    listenPort: 0,
    targetPort: Number(new URL(f.env.DATABASE_URL!).port || 5432),
    onStatement: (text, connection) => {
      if (held || !/LIMIT \$1\s+FOR UPDATE (OF r )?SKIP LOCKED/.test(text)) return;
      held = connection;
      connection.holdAnswers();
    },
  });
  const urlA = new URL(f.env.DATABASE_URL!);
  urlA.port = String(proxy.port);
  const env = { ...f.env, OUTBOX_BATCH_SIZE: '5', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0', OUTBOX_LOG_LEVEL: 'error' };
  const relay = (config: Config) => (guard ? new Runtime(config, createLogger('error')) : new RuntimeWith(UnguardedStore, config, createLogger('error')));
  const a = relay(loadConfig({ ...env, DATABASE_URL: urlA.toString(), ...PLAINTEXT_DB }));
  const b = relay(loadConfig(env));
  let bRuns = 0;
  let bPublished = 0;
  let aSummary: Summary | undefined;
  let invocationA: Promise<Summary> | undefined;
  let writing: Promise<unknown> | undefined;
  const aClaimed = Promise.withResolvers<void>();
  try {
    // connected first, so that the relays claim while the writers write
    await Promise.all([a, b].map(async (rt) => (await rt.database(), await rt.publisher().maxMessageBytes(f.topic('order'), new Deadline(Date.now() + 10_000)))));
    let written = 0;
    // past the first 10 rows, the writers wait for A's claim, then go on while B claims
    const writers = Array.from({ length: 4 }, async (_, w) => {
      for (let i = 0; i < ROWS / 4; i++) {
        if (written >= 10) await aClaimed.promise;
        await sql.begin(async (tx) => {
          await tx`SELECT pg_advisory_xact_lock(hashtext(${`agg:${f.table}:a`}))`;
          await tx.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'W', $1::jsonb)`, [JSON.stringify({ w, i })]);
        });
        written++;
        await sleep(50);
      }
    });
    writing = Promise.all(writers);
    let writersDone = false;
    writing.then(
      () => (writersDone = true),
      () => (writersDone = true),
    );
    for (const until = Date.now() + 10_000; written < 10; await sleep(5)) if (Date.now() > until) assert.fail(`the writers wrote ${written} rows in 10 s`);
    invocationA = a.invoke(30_000);
    invocationA.catch(() => undefined);
    // A's claim has run on the server (its answer, held, says SELECT 5): the rows it took are
    // locked by its open transaction
    for (const until = Date.now() + 10_000; !held?.heldCommands.some((c) => c.startsWith('SELECT ')); await sleep(10)) {
      if (Date.now() > until) assert.fail(`relay A did not claim within 10 s (${held ? `answers held: ${held.heldCommands.join(', ')}` : 'no claim seen'})`);
    }
    aClaimed.resolve();
    // B, again and again while the writers write, and once after
    for (let last = false; !last; ) {
      last = writersDone;
      bPublished += (await b.invoke(10_000)).published;
      bRuns++;
      await sleep(10);
    }
    await writing;
    held.releaseAnswers();
    aSummary = await invocationA;
  } finally {
    aClaimed.resolve();
    held?.releaseAnswers();
    await invocationA?.catch(() => undefined);
    await writing?.catch(() => undefined);
    await Promise.all([a.close(), b.close()]);
    await proxy.close();
  }
  const res = await runCli(['invoke', '--timeout', '15000'], f.env);
  assert.equal(res.code, 0, res.stderr);
  const seqs = await seqsById(sql, f.table);
  const msgs = (await consumeAll([f.topic('order')], ROWS)).sort((x, y) => Number(x.offset) - Number(y.offset));
  assert.equal(msgs.length, ROWS, 'every row once, no duplicate');
  assert.equal(new Set(msgs.map((m) => m.headers.id)).size, ROWS);
  return { kafkaSeqs: msgs.map((m) => seqs.get(m.headers.id!)!), bRuns, bPublished, detail: `A published ${aSummary?.published}, B ${bPublished} in ${bRuns} invocations, the last ${String(res.summary?.published)}` };
}

describe('stop reasons say what is true', () => {
  it('empty; behind failed rows (a parked row holds its aggregate); locked (the only due row held by another transaction)', async () => {
    const f = await fixture(sql, 'stops');
    const t = qualified(parseTableName(f.table));
    const invoke = async (env: Record<string, string> = f.env) => {
      const res = await runCli(['invoke', '--timeout', '15000'], env);
      assert.equal(res.code, 0, res.stderr);
      return res.summary!;
    };
    assert.equal((await invoke()).stoppedBecause, 'empty', 'a new table');

    // a row that can never be sent, parked at its first attempt, with a later row of its aggregate
    await insertEvents(sql, f.table, [{ aggregateid: 'p', topic: 'illegal topic!' }, { aggregateid: 'p' }]);
    const parked = await invoke({ ...f.env, OUTBOX_MAX_ATTEMPTS: '1' });
    assert.equal(parked.parked, 1, JSON.stringify(parked));
    assert.equal((await invoke()).stoppedBecause, 'behind-failed-rows', 'the only pending row waits behind the parked one');

    const [free] = await insertEvents(sql, f.table, [{ aggregateid: 'q' }]);
    const locker = await sql.reserve();
    try {
      await locker`BEGIN`;
      await locker.unsafe(`SELECT seq FROM ${t} WHERE id = $1 FOR UPDATE`, [free!]);
      const s = await invoke();
      assert.deepEqual([s.published, s.stoppedBecause], [0, 'locked'], JSON.stringify(s));
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
    const s = await invoke();
    assert.deepEqual([s.published, s.stoppedBecause], [1, 'behind-failed-rows'], JSON.stringify(s));
    await sql.unsafe(`UPDATE ${t} SET skipped_at = now() WHERE parked_at IS NOT NULL`);
    const last = await invoke();
    assert.deepEqual([last.published, last.stoppedBecause], [1, 'empty'], JSON.stringify(last));
  });
});

describe('G7: short transactions', () => {
  it('G7: no relay transaction lives across batches during a long invocation', async (t) => {
    const f = await fixture(sql, 'g7');
    const table = qualified(parseTableName(f.table));
    await insertEvents(sql, f.table, Array.from({ length: 30_000 }, (_, i) => ({ aggregateid: `a-${i % 97}`, payload: { i, pad: 'x'.repeat(200) } })));
    const appName = `relay-g7-${f.table}`;
    const batchSize = 20;
    const running = startCli(['invoke', '--timeout', '60000'], { ...f.env, OUTBOX_BATCH_SIZE: String(batchSize), OUTBOX_CLIENT_ID: appName });
    // A transaction is known by its backend and its start. Each sample also counts the rows still in
    // the outbox (sent rows leave it, moved or deleted): how many rows were sent while a
    // transaction was open says how many batches it outlived, whatever the machine's speed.
    const seen = new Map<string, { first: number; last: number; ageMs: number }>();
    let done = false;
    void running.result.then(() => (done = true));
    while (!done) {
      const rows = await sql<{ tx: string; age_ms: number; left: number }[]>`
        SELECT pid || '@' || xact_start AS tx, extract(epoch FROM now() - xact_start) * 1000 AS age_ms,
          (SELECT count(*)::int FROM ${sql.unsafe(table)}) AS left
        FROM pg_stat_activity WHERE application_name = ${appName} AND xact_start IS NOT NULL`;
      for (const r of rows) {
        const tx = seen.get(r.tx) ?? { first: r.left, last: r.left, ageMs: 0 };
        tx.last = r.left;
        tx.ageMs = Math.max(tx.ageMs, Number(r.age_ms));
        seen.set(r.tx, tx);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    const res = await running.result;
    assert.equal(res.code, 0, res.stderr);
    assert.ok(Number(res.summary?.batches) > 100, `a long invocation: ${JSON.stringify(res.summary)}`);
    assert.ok(seen.size > 10, `transactions were observed: ${seen.size}`);
    // A batch's transaction is open while the batch ahead of it is published and committed (G7's
    // "at most two"): it sees one other batch's rows leave, two when a sample straddles a COMMIT.
    // A transaction held across batches would see thousands. No bound in milliseconds: a COMMIT
    // waiting on a busy disk took 6 s here, three test files at once (the server's log).
    const [longest] = [...seen.entries()].map(([tx, v]) => ({ tx, sentMeanwhile: v.first - v.last, ageMs: Math.round(v.ageMs) })).sort((a, b) => b.sentMeanwhile - a.sentMeanwhile);
    t.diagnostic(`${seen.size} transactions seen in ${String(res.summary?.batches)} batches; the most rows sent while one was open: ${longest!.sentMeanwhile} (it lived ${longest!.ageMs} ms at least)`);
    assert.ok(longest!.sentMeanwhile <= 3 * batchSize, `a transaction was open while ${longest!.sentMeanwhile} rows were sent (batches of ${batchSize}): ${JSON.stringify(longest)}`);
    // after the invocation, nothing of it is left open: no connection at all when the relay
    // connects straight to Postgres; through a pooler, which keeps its server connections (they
    // still carry the relay's application_name), none of them in a transaction
    const [left] = await sql<{ n: number }[]>`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE application_name = ${appName} AND (${!VIA_POOLER} OR xact_start IS NOT NULL OR state <> 'idle')`;
    assert.equal(left?.n, 0);
  });
});

describe('G5: the budget holds when the database hangs', () => {
  it('the relay\'s own backends frozen (SIGSTOP) mid-invocation: returns before the deadline; nothing lost after they resume (G1)', async (ctx) => {
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
    ctx.diagnostic(`returned after ${summary.durationMs} ms (deadline at 6000), the process exited after ${res.durationMs} ms`);
    assert.ok(summary.durationMs < 6_500, `returned after ${summary.durationMs} ms; deadline 8000 - 2000 margin; ${JSON.stringify(summary)}\n${res.stderr.slice(-3_000)}`);
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

  it('keep mode on a relay upgraded without `migrate` (no sent table): fails before publishing, says to migrate; migrate fixes it', async () => {
    const f = await fixture(sql, 'nosent');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }, { aggregateid: 'c' }]);
    // an outbox made before the sent table existed, its migrations not recorded
    await sql.unsafe(`DROP TABLE ${sentTableOf(f.table)}`);
    await sql`DELETE FROM outbox_relay_migrations WHERE target = ${f.table}`;
    const res = await runCli(['invoke', '--timeout', '10000'], f.env);
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /no migration of the outbox table "[^"]+" is recorded in outbox_relay_migrations: .* Run `outbox-relay migrate`/);
    assert.equal(res.summary?.published, 0);
    assert.equal(await topicCount([f.topic('order')]), 0, 'nothing was published that could not be moved');
    const [left] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${qualified(parseTableName(f.table))} WHERE sent_at IS NULL AND attempts = 0`);
    assert.equal(left!.n, 3, 'every row still pending, none charged');

    assert.equal((await runCli(['migrate'], f.env)).code, 0);
    const s = await runCli(['invoke', '--timeout', '10000'], f.env);
    assert.equal(s.summary?.published, 3, s.stderr);
    assert.equal(await topicCount([f.topic('order')]), 3);
    assert.deepEqual(await counts(sql, f.table), { total: 3, sent: 3, parked: 0, pending: 0 });
  });

  it('a warm process whose invocation failed for a missing sent table checks again: after `migrate`, the next invocation in the same process relays', async () => {
    const f = await fixture(sql, 'nosentwarm');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    await sql.unsafe(`DROP TABLE ${sentTableOf(f.table)}`);
    await sql`DELETE FROM outbox_relay_migrations WHERE target = ${f.table}`;
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_LOG_LEVEL: 'error' }), createLogger('error'));
    try {
      await assert.rejects(rt.invoke(10_000), /no migration of the outbox table .* is recorded/);
      await assert.rejects(rt.invoke(10_000), /no migration of the outbox table .* is recorded/, 'still failing: nothing was remembered as checked');
      assert.equal(await topicCount([f.topic('order')]), 0);
      assert.equal((await runCli(['migrate'], f.env)).code, 0);
      assert.equal((await rt.invoke(10_000)).published, 2);
      assert.deepEqual(await counts(sql, f.table), { total: 2, sent: 2, parked: 0, pending: 0 });
    } finally {
      await rt.close();
    }
  });

  it('a role that may not INSERT into the sent table: fails before publishing and says what to GRANT; with the grants the README lists, relays and prunes', async () => {
    const f = await fixture(sql, 'sentgrant');
    const admin = db(ADMIN_DATABASE_URL);
    const role = uniqueName('relay_grant');
    try {
      await admin.unsafe(`CREATE ROLE ${role} LOGIN PASSWORD 'pw'`);
      await admin.unsafe(`GRANT SELECT, UPDATE, DELETE ON ${qualified(parseTableName(f.table))} TO ${role}`);
      await admin.unsafe(`GRANT SELECT ON outbox_relay_migrations TO ${role}`);
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      // direct: a role of its own is not in the pooler's auth file
      const env = { ...f.env, DATABASE_URL: DATABASE_URL.replace(/\/\/[^@]+@/, `//${role}:pw@`), DATABASE_PREPARE: 'true' };
      const res = await runCli(['invoke', '--timeout', '10000'], env);
      assert.notEqual(res.code, 0);
      assert.match(res.stderr, new RegExp(`the database role ${role} may not INSERT into the sent table "[^"]+_sent", where acked rows are moved: GRANT SELECT, INSERT, DELETE ON "[^"]+_sent" TO ${role}`));
      assert.equal(await topicCount([f.topic('order')]), 0, 'nothing was published that could not be moved');

      await admin.unsafe(`GRANT SELECT, INSERT, DELETE ON ${sentTableOf(f.table)} TO ${role}`);
      assert.equal((await runCli(['invoke', '--timeout', '10000'], env)).summary?.published, 2);
      await new Promise((r) => setTimeout(r, 10));
      const pruned = await runCli(['invoke', '--timeout', '10000'], { ...env, OUTBOX_RETAIN_SENT_MS: '1' });
      assert.equal(pruned.summary?.pruned, 2, `retention needs no more than those grants:\n${pruned.stderr}`);
      assert.equal((await counts(sql, f.table)).total, 0);
    } finally {
      await admin.unsafe(`DROP OWNED BY ${role}`).catch(() => undefined);
      await admin.unsafe(`DROP ROLE IF EXISTS ${role}`);
      await admin.end();
    }
  });

  it('missing configuration names each variable', async () => {
    const res = await runCli(['invoke'], {});
    assert.notEqual(res.code, 0);
    assert.match(res.stderr, /DATABASE_URL or DATABASE_SECRET_ID is required/);
    assert.match(res.stderr, /KAFKA_BROKERS is required/);
  });
});
