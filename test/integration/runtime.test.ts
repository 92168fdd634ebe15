// services: postgres, kafka
// Container-scoped reuse, migrations under concurrency, enqueue() and the local schedule.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { enqueue } from '../../src/outbox/enqueue.ts';
import { createLogger } from '../../src/log.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { loadMigrations, migrate } from '../../src/outbox/migrate.ts';
import { heldGapsSql } from '../../src/outbox/sql.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { DATABASE_URL, consumeAll, counts, createTopics, fileDb, fixture, insertEvents, markedIds, sentTableOf, startCli, uniqueName } from './helpers.ts';

const sql = fileDb();

describe('warm invocations', () => {
  it('two invocations in one container reuse one database client and one producer connection', async () => {
    const f = await fixture(sql, 'warm');
    const appName = `warm-${f.table}`;
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_CLIENT_ID: appName, OUTBOX_LOG_LEVEL: 'warn' }), createLogger('warn'));
    const backends = async () =>
      new Set((await sql<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE application_name = ${appName}`).map((r) => r.pid));
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      const first = await rt.invoke(20_000);
      assert.equal(first.published, 2);
      const afterFirst = await backends();
      assert.ok(afterFirst.size >= 1);

      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'c' }]);
      const second = await rt.invoke(20_000);
      assert.equal(second.published, 2);
      const afterSecond = await backends();
      // no new database connection was opened: the same backends served both invocations
      for (const pid of afterSecond) assert.ok(afterFirst.has(pid), `backend ${pid} is new in the second invocation`);
      assert.equal(rt.publisher().connects, 1, 'the producer connected once');
      assert.equal((await consumeAll([f.topic('order')], 4)).length, 4);
    } finally {
      await rt.close();
    }
  });
});

describe('the relay\'s database client', () => {
  it('sends array parameters without asking the server for its array types, and reserves connections on a cold client (a batch\'s, the backlog figures\'): awkward text, uuids, int8 and int4 arrive intact, prepared or not', async () => {
    const awkward = ['plain', 'with "quotes"', 'back\\slash', 'a,b', '{braces}', 'NULL', '', ' spaced ', 'ünïcødé ✓', "it's"];
    const uuid = '0b5f1a8e-6a39-4a55-9d0e-2f6a1c3e4b7d';
    const table = uniqueName('arrays');
    await migrate(sql, parseTableName(table));
    for (const prepare of ['true', 'false']) {
      const rt = new Runtime(loadConfig({ DATABASE_URL, KAFKA_BROKERS: '127.0.0.1:9092', DATABASE_PREPARE: prepare, OUTBOX_TABLE: table }), createLogger('warn'));
      try {
        const client = await rt.database();
        // the backlog figures first, on a client that has opened no connection yet (without the
        // probe of DATABASE_PREPARE=true): their reserve is answered too
        assert.deepEqual(await rt.backlog(new Deadline(Date.now() + 5_000)), { oldestPendingAgeMs: 0, pendingRows: 0, pendingRowsCapped: false, parkedRows: 0, parkedRowsCapped: false });
        const [row] = await client.unsafe<{ texts: string[]; ids: string[]; seqs: string; ints: number[] }[]>(
          'SELECT array_to_json($1::text[]) AS texts, array_to_json($2::uuid[]) AS ids, array_to_json($3::bigint[])::text AS seqs, array_to_json($4::int[]) AS ints',
          [awkward, [uuid], ['9007199254740993', '1'], [0, 1]],
          { prepare: prepare === 'true' },
        );
        assert.deepEqual(row!.texts, awkward, `prepare=${prepare}`);
        assert.deepEqual(row!.ids, [uuid]);
        assert.equal(row!.seqs, '[9007199254740993,1]', 'int8 beyond 2^53 kept exactly');
        assert.deepEqual(row!.ints, [0, 1]);
        const [empty] = await client.unsafe<{ n: number }[]>('SELECT cardinality($1::text[]) AS n', [[]]);
        assert.equal(empty!.n, 0);
        // three batch transactions at once on a client that has opened no connection for them:
        // every reserve is answered (postgres.js strands one that opens a connection, see reserve)
        const store = await rt.outboxStore();
        const deadline = new Deadline(Date.now() + 10_000);
        const txs = await Promise.all([store.begin(deadline), store.begin(deadline), store.begin(deadline)]);
        await Promise.all(txs.map((tx) => tx.rollback()));
      } finally {
        await rt.close();
      }
    }
  });
});

describe('migrate', () => {
  it('is idempotent and safe when several run at once', async () => {
    const table = parseTableName(uniqueName('mig'));
    const results = await Promise.all(Array.from({ length: 4 }, () => migrate(sql, table)));
    assert.equal(results.filter((r) => r.applied.length > 0).length, 1, 'exactly one run applied the migrations');
    assert.ok(results.every((r) => r.applied.length + r.alreadyApplied.length === results[0]!.applied.length + results[0]!.alreadyApplied.length));
    const again = await migrate(sql, table);
    assert.deepEqual(again.applied, []);
  });

  it('creates a schema-qualified table', async () => {
    const schema = uniqueName('app');
    const r = await migrate(sql, parseTableName(`${schema}.events`));
    // every migration, in order, on the new table (the baseline, and any released after it)
    assert.deepEqual(r.applied, loadMigrations().map((m) => m.version));
    assert.ok(r.applied.length >= 1);
    // the schema's own objects: the sent table and the trigger functions live beside the table
    const [objects] = await sql<{ sent: string | null; fns: number }[]>`
      SELECT to_regclass(${`${schema}.events_sent`})::text AS sent,
             (SELECT count(*)::int FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ${schema}) AS fns`;
    assert.deepEqual(objects, { sent: `${schema}.events_sent`, fns: 2 });
    const [row] = await sql<{ t: string | null }[]>`SELECT to_regclass(${`${schema}.events`})::text AS t`;
    assert.equal(row?.t, `${schema}.events`);
    await sql.unsafe(`DROP SCHEMA ${schema} CASCADE`);
  });
});

describe('enqueue', () => {
  it('writes the event in the caller\'s transaction: rolled back with it, committed with it', async () => {
    const f = await fixture(sql, 'enq');
    await assert.rejects(
      sql.begin(async (tx) => {
        await enqueue(tx, { aggregatetype: 'order', aggregateid: 'o-1', type: 'OrderCreated', payload: { total: 1 } }, { table: f.table });
        throw new Error('business rule failed');
      }),
      /business rule failed/,
    );
    assert.equal((await counts(sql, f.table)).total, 0);
    const id = await sql.begin((tx) => enqueue(tx, { aggregatetype: 'order', aggregateid: 'o-1', type: 'OrderCreated', payload: { total: 1 }, headers: { traceparent: 'abc' } }, { table: f.table }));
    const [row] = await sql.unsafe<{ id: string; payload: { total: number }; headers: Record<string, string> }[]>(`SELECT id, payload, headers FROM ${qualified(parseTableName(f.table))}`);
    assert.equal(row?.id, id);
    assert.deepEqual(row?.payload, { total: 1 });
    assert.deepEqual(row?.headers, { traceparent: 'abc' });
  });
});

describe('schedule', () => {
  it('fires invocations on its interval and, on SIGTERM, lets the running one finish before exiting', async () => {
    const f = await fixture(sql, 'sched');
    await insertEvents(sql, f.table, Array.from({ length: 50 }, (_, i) => ({ aggregateid: `a-${i % 5}` })));
    const topic2 = `${f.prefix}.late`;
    await createTopics([topic2]);
    const running = startCli(['schedule', '--every', '500', '--timeout', '10000'], { ...f.env, OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '1500' });
    // the first invocation published and now sits between publish and mark
    await running.waitForStderr('test hook: pausing after publish');
    running.child.kill('SIGTERM');
    const res = await running.result;
    assert.equal(res.code, 0, res.stderr);
    assert.match(res.stderr, /stopping: waiting for running invocations/);
    // the invocation that was running finished: its rows were marked, not abandoned
    assert.equal((await counts(sql, f.table)).sent, 50);
    const summaries = res.stdout.trim().split('\n').map((l) => JSON.parse(l) as { published: number });
    assert.ok(summaries.length >= 1);
    assert.equal(summaries.reduce((n, s) => n + s.published, 0), 50);
  });
});

describe('retention', () => {
  it('keeps pace: 30,000 rows relayed with a 1 ms window, then one more invocation: no sent row is left; chunks oldest first, alongside the loop', async () => {
    const f = await fixture(sql, 'prunepace');
    await insertEvents(sql, f.table, Array.from({ length: 30_000 }, (_, i) => ({ aggregateid: `a-${i % 500}`, payload: { i } })));
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_LOG_LEVEL: 'warn', OUTBOX_RETAIN_SENT_MS: '1' }), createLogger('warn'));
    try {
      let published = 0;
      let pruned = 0;
      for (let i = 0; i < 10 && published < 30_000; i++) {
        const s = await rt.invoke(60_000);
        published += s.published;
        pruned += s.pruned;
      }
      assert.equal(published, 30_000);
      const last = await rt.invoke(60_000);
      pruned += last.pruned;
      assert.equal(last.published, 0);
      assert.equal(pruned, 30_000, 'every sent row was pruned, once');
      assert.deepEqual(await counts(sql, f.table), { total: 0, sent: 0, parked: 0, pending: 0 });
    } finally {
      await rt.close();
    }
  });

  it('deletes rows sent before OUTBOX_RETAIN_SENT_MS (in the sent table) and rows skipped before OUTBOX_RETAIN_SKIPPED_MS, each by its own window; keeps pending and recent ones', async () => {
    const f = await fixture(sql, 'prune');
    const t = qualified(parseTableName(f.table));
    const sent = sentTableOf(f.table);
    const first = await insertEvents(sql, f.table, Array.from({ length: 40 }, (_, i) => ({ aggregateid: `a-${i % 3}` })));
    const invoke = async (env: Record<string, string>) => {
      const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_LOG_LEVEL: 'warn', ...env }), createLogger('warn'));
      try {
        return await rt.invoke(20_000);
      } finally {
        await rt.close();
      }
    };
    const s1 = await invoke({});
    assert.equal(s1.published, 40);
    assert.equal(s1.pruned, 0, 'nothing is a day old yet');
    // 10 of them were sent two days ago
    await sql.unsafe(`UPDATE ${sent} SET sent_at = now() - interval '2 days' WHERE id = ANY($1::uuid[])`, [first.slice(0, 10)]);
    // of 20 more rows, 5 were skipped two days ago and 3 skipped 31 days ago; 12 are pending
    const more = await insertEvents(sql, f.table, Array.from({ length: 20 }, (_, i) => ({ aggregateid: `b-${i % 3}` })));
    await sql.unsafe(`UPDATE ${t} SET skipped_at = now() - interval '2 days' WHERE id = ANY($1::uuid[])`, [more.slice(0, 5)]);
    await sql.unsafe(`UPDATE ${t} SET skipped_at = now() - interval '31 days' WHERE id = ANY($1::uuid[])`, [more.slice(5, 8)]);
    const s2 = await invoke({});
    assert.equal(s2.published, 12);
    assert.equal(s2.pruned, 13, 'the rows sent more than a day ago, and those skipped more than 30 days ago (the defaults)');
    assert.deepEqual(await counts(sql, f.table), { total: 47, sent: 42, parked: 0, pending: 0 });
    assert.deepEqual(await markedIds(sql, f.table), new Set([...first.slice(10), ...more.slice(8)]));
    const skipped = async () => (await sql.unsafe<{ id: string }[]>(`SELECT id FROM ${t} WHERE skipped_at IS NOT NULL ORDER BY seq`)).map((r) => r.id);
    assert.deepEqual(await skipped(), more.slice(0, 5), 'skipped two days ago: kept');

    await new Promise((r) => setTimeout(r, 10));
    // each window on its own: sent rows go, skipped ones stay, and the other way round
    assert.equal((await invoke({ OUTBOX_RETAIN_SENT_MS: '1' })).pruned, 42);
    assert.deepEqual(await counts(sql, f.table), { total: 5, sent: 0, parked: 0, pending: 0 });
    assert.equal((await invoke({ OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '1' })).pruned, 5);
    assert.equal((await counts(sql, f.table)).total, 0);
  });
});

describe('OUTBOX_SENT_ROWS=delete', () => {
  it('deletes rows in the batch transaction once the broker acked them; failed rows stay', async () => {
    const f = await fixture(sql, 'delmode');
    const ids = await insertEvents(sql, f.table, [
      ...Array.from({ length: 30 }, (_, i) => ({ aggregateid: `a-${i % 4}`, payload: { i } })),
      { aggregateid: 'poison', topic: 'illegal topic!' },
    ]);
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_SENT_ROWS: 'delete', OUTBOX_LOG_LEVEL: 'error' }), createLogger('error'));
    try {
      const s = await rt.invoke(30_000);
      assert.equal(s.published, 30);
    } finally {
      await rt.close();
    }
    const left = await sql.unsafe<{ id: string; attempts: number }[]>(`SELECT id, attempts FROM ${qualified(parseTableName(f.table))}`);
    assert.deepEqual(left.map((r) => r.id), [ids[30]], 'only the row that could not be sent is left');
    assert.ok(left[0]!.attempts >= 1);
    const msgs = await consumeAll([f.topic('order')], 30);
    assert.deepEqual(new Set(msgs.map((m) => m.headers.id)), new Set(ids.slice(0, 30)));
  });
});

describe('one invocation drains the table', () => {
  for (const sentRows of ['keep', 'delete'] as const) {
    it(`with OUTBOX_SENT_ROWS=${sentRows}, 20,000 rows over 1,000 aggregates in pipelined batches: all published, none left behind`, async () => {
      const f = await fixture(sql, `drain${sentRows}`, ['order'], 6);
      await insertEvents(sql, f.table, Array.from({ length: 20_000 }, (_, i) => ({ aggregateid: `agg-${(i * 7919) % 1000}`, payload: { i } })));
      const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_SENT_ROWS: sentRows, OUTBOX_BATCH_SIZE: '200', OUTBOX_LOG_LEVEL: 'warn' }), createLogger('warn'));
      try {
        // the next batch is claimed while the current one commits its marks: a row marked or
        // deleted after the claim's snapshot must not be mistaken for a foreign lock
        const s = await rt.invoke(120_000);
        assert.equal(s.published, 20_000, JSON.stringify(s));
        assert.equal(s.stoppedBecause, 'empty');
      } finally {
        await rt.close();
      }
      assert.equal((await counts(sql, f.table)).pending, 0);
    });
  }
});

describe('order guard: why a held-back row\'s gap cannot be claimed now', () => {
  it('a gap row that is gone or sent is not listed, a free one is claimable (why NULL); one another transaction holds is locked; one set not due, parked or marked waiting by hand says so', async () => {
    const f = await fixture(sql, 'gaps');
    const t = qualified(parseTableName(f.table));
    const ids = await insertEvents(sql, f.table, ['a', 'b', 'c', 'd', 'e', 'f', 'g'].map((aggregateid) => ({ aggregateid })));
    const [gone, sent, free, held, notDue, parked, waiting] = ids as [string, string, string, string, string, string, string];
    const seqOf = async (id: string) => (await sql.unsafe<{ seq: string }[]>(`SELECT seq FROM ${t} WHERE id = $1`, [id]))[0]!.seq;
    const seqs = { gone: await seqOf(gone), sent: await seqOf(sent), free: await seqOf(free), held: await seqOf(held), notDue: await seqOf(notDue), parked: await seqOf(parked), waiting: await seqOf(waiting) };
    await sql.unsafe(`DELETE FROM ${t} WHERE id = $1`, [gone]);
    await sql.unsafe(`UPDATE ${t} SET sent_at = now() WHERE id = $1`, [sent]);
    await sql.unsafe(`UPDATE ${t} SET next_attempt_at = now() + interval '1 hour' WHERE id = $1`, [notDue]);
    await sql.unsafe(`UPDATE ${t} SET parked_at = now() WHERE id = $1`, [parked]);
    await sql.unsafe(`UPDATE ${t} SET waiting = true WHERE id = $1`, [waiting]);
    const locker = await sql.reserve();
    try {
      await locker`BEGIN`;
      await locker.unsafe(`SELECT 1 FROM ${t} WHERE id = $1 FOR UPDATE`, [held]);
      const gaps = await sql.begin((tx) => tx.unsafe<{ seq: string; why: string | null }[]>(heldGapsSql(t), [Object.values(seqs)]));
      assert.deepEqual(
        new Map(gaps.map((g) => [g.seq, g.why])),
        new Map([
          [seqs.free, null],
          [seqs.held, 'locked'],
          [seqs.notDue, 'not-due'],
          [seqs.parked, 'parked'],
          [seqs.waiting, 'waiting'],
        ]),
      );
    } finally {
      await locker`ROLLBACK`;
      locker.release();
    }
  });
});
