// services: postgres, kafka
// Database faults, injected by real means: the relay's backends terminated (pg_terminate_backend)
// mid-batch, from the CLI and under a warm Runtime; a connection that closes while a batch waits
// for one; a batch's COMMIT refused at commit time (a deferred constraint trigger). Guarantees: G1
// (nothing lost: the next invocation delivers everything), G2 (a failed COMMIT re-sends only its
// batch), G7 (a client that lost a connection is ended, no transaction of it left open). The
// relay's transactions ended by the server: transactions.test.ts.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config/load.ts';
import { Deadline } from '../../src/budget.ts';
import { openConnections } from '../../src/outbox/client.ts';
import { DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { isConnectionLost } from '../../src/outbox/db-errors.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import {
  ADMIN_DATABASE_URL,
  consumeAll,
  copiesById,
  counts,
  db,
  fileDb,
  fixture,
  idsOf,
  insertEvents,
  markedIds,
  rowStates,
  runCli,
  sentTableOf,
  startCli,
  terminateBackends,
  topicCount,
  twiceIds,
  waitSent,
  invokeOk as invoke,
} from './helpers.ts';

const sql = fileDb();

describe('G1: the relay\'s backend terminated mid-batch', () => {
  let admin: Sql;
  before(() => {
    admin = db(ADMIN_DATABASE_URL);
  });
  after(async () => {
    await admin.end();
  });

  it('CLI: the invocation fails with a database error, marks nothing unsent; the next one delivers everything', async () => {
    const f = await fixture(sql, 'pgkill');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 6_000 }, (_, i) => ({ aggregateid: `a-${i % 40}`, payload: { i } })));
    const appName = `relay-${f.table}`;
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '10', OUTBOX_CLIENT_ID: appName };
    const running = startCli(['invoke', '--timeout', '30000'], env);
    const sentBefore = await waitSent(sql, f.table, 300);
    assert.ok(sentBefore >= 300 && sentBefore < 6_000, `mid-invocation: ${sentBefore} sent`);
    const killed = await terminateBackends(admin, { applicationName: appName });
    assert.ok(killed >= 1, 'the relay\'s backends were found and terminated');
    const res = await running.result;
    assert.equal(res.code, 1, `the invocation fails:\n${res.stderr.slice(-2_000)}`);
    assert.equal(res.summary?.stoppedBecause, 'database-error');
    // the wording depends on where the relay was (ECONNRESET, CONNECTION_CLOSED, 57P01, ...); once,
    // on a machine loaded by a benchmark, a statement on a terminated connection got no answer at
    // all and the invocation failed at its deadline instead (G5 holds either way)
    assert.match(res.stderr, /outbox-relay: DatabaseError: (database error while|a database connection closed|the database did not answer in time)/);
    const stateAfterKill = await rowStates(sql, f.table);
    assert.ok(stateAfterKill.some((r) => !r.sent), 'work was left for the next invocation');
    assert.equal(Math.max(...stateAfterKill.map((r) => r.attempts)), 0, 'a database fault is charged to no row');

    const s = await invoke(env, 30_000);
    assert.equal(s.stoppedBecause, 'empty');
    assert.deepEqual(await counts(sql, f.table), { total: 6_000, sent: 6_000, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 6_000, 60_000);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids), 'no row lost (duplicates allowed)');
  });

  it('in-process: the next invocation of the same Runtime recovers its connections and finishes the work', async () => {
    const f = await fixture(sql, 'pgkillrt');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 6_000 }, (_, i) => ({ aggregateid: `a-${i % 40}`, payload: { i } })));
    const appName = `relay-${f.table}`;
    const logs: string[] = [];
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_BATCH_SIZE: '10', OUTBOX_CLIENT_ID: appName }), createLogger('warn', {}, (l) => logs.push(l)));
    try {
      const first = rt.invoke(30_000).then(
        (summary) => ({ summary, error: undefined }),
        (error: unknown) => ({ summary: (error as { summary?: Summary }).summary, error }),
      );
      await waitSent(sql, f.table, 300);
      assert.ok((await terminateBackends(admin, { applicationName: appName })) >= 1);
      const r1 = await first;
      assert.ok(r1.error instanceof DatabaseError, `the first invocation ends with a DatabaseError, got ${String(r1.error)}`);
      assert.equal(r1.summary?.stoppedBecause, 'database-error');
      assert.ok((await counts(sql, f.table)).pending > 0, 'work was left over');

      const s2 = await rt.invoke(30_000);
      assert.equal(s2.stoppedBecause, 'empty', JSON.stringify(s2));
      assert.deepEqual(await counts(sql, f.table), { total: 6_000, sent: 6_000, parked: 0, pending: 0 });
      const [conns] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName}`;
      assert.ok(conns!.n >= 1, 'the same Runtime holds fresh connections');

      // connections killed while the (warm) Runtime is idle, the next invocation right after:
      // whether or not the client noticed the close yet, the invocation reconnects and works
      assert.ok((await terminateBackends(admin, { applicationName: appName })) >= 1);
      const [late] = await insertEvents(sql, f.table, [{ aggregateid: 'late' }]);
      const s3 = await rt.invoke(30_000);
      assert.equal(s3.published, 1, JSON.stringify(s3));
      ids.push(late!);
    } catch (err) {
      // this test failed in 2 of 12 runs before the store stopped waiting on postgres.js' stranded
      // reserve (porsager/postgres#1195, the test above): the third invocation's claim waited for
      // a connection until its deadline. If it fails, say what the Runtime logged and which
      // backends the server had for it
      const backends = await admin`SELECT pid, state, wait_event_type, wait_event, backend_start, left(query, 80) AS query FROM pg_stat_activity WHERE application_name = ${appName}`;
      console.error(`runtime logs:\n${logs.join('\n')}\nbackends of ${appName}: ${JSON.stringify(backends)}`);
      throw err;
    } finally {
      await rt.close();
    }
    const msgs = await consumeAll([f.topic('order')], 6_001, 60_000);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids));
  });
});

describe('a connection closes while a batch waits for one', () => {
  it('G7: the wait for a free connection fails at once as a lost connection, not at the deadline (postgres.js would strand it, porsager/postgres#1195), and the client is ended with no transaction left open; the same Runtime\'s next invocation reconnects and delivers', async () => {
    const f = await fixture(sql, 'pgstrand');
    const ids = await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'a' }]);
    const appName = `relay-${f.table}`;
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_CLIENT_ID: appName }), createLogger('warn', {}, () => undefined));
    const admin = db(ADMIN_DATABASE_URL);
    try {
      const store = await rt.outboxStore();
      const client = await rt.database();
      // every connection of the client (max 3) taken, so the batch's reserve has to wait in line;
      // each in a transaction, so that through a transaction pooler its server connection is tied
      // to it and a terminated backend closes it too
      // the client's connections opened first, as every reserve of the relay's is preceded (the
      // relay's client fetches no array types, and postgres.js never answers a reserve that opens
      // a connection without that fetch: src/outbox/client.ts)
      await openConnections(client);
      const held = await Promise.all([client.reserve(), client.reserve(), client.reserve()]);
      const pids = await Promise.all(
        held.map(async (c) => {
          await c`BEGIN`;
          return (await c<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`)[0]!.pid;
        }),
      );
      const started = Date.now();
      const waiting = store.begin(new Deadline(Date.now() + 20_000)).then(
        () => undefined,
        (err: unknown) => err,
      );
      await new Promise((r) => setTimeout(r, 200));
      // one held connection's backend ends: postgres.js hands the waiting reserve to its reconnect,
      // which drops it
      await admin`SELECT pg_terminate_backend(${pids[0]!})`;
      const err = await waiting;
      assert.ok(err instanceof DatabaseError, `the wait fails with a DatabaseError, got ${String(err)}`);
      assert.ok(isConnectionLost(err.cause), `as a lost connection: ${err.message}`);
      assert.ok(Date.now() - started < 10_000, `failed when the connection closed, not at the 20 s deadline (${Date.now() - started} ms)`);
      // a client known to have lost a connection is not asked for another
      const again = await store.begin(new Deadline(Date.now() + 20_000)).then(() => undefined, (e: unknown) => e);
      assert.ok(again instanceof DatabaseError && isConnectionLost(again.cause), String(again));
      // the client was ended at the close (OutboxStore.abandon): the server rolled back the
      // transactions of the held connections too, none of them is released into a pool (through
      // PgBouncer, idle server connections stay in its pool: only transactions count)
      const end = Date.now() + 10_000;
      while ((await admin`SELECT 1 FROM pg_stat_activity WHERE application_name = ${appName} AND state LIKE 'idle in transaction%'`).length > 0) {
        assert.ok(Date.now() < end, 'the held connections were closed');
        await new Promise((r) => setTimeout(r, 50));
      }

      const s = await rt.invoke(30_000);
      assert.equal(s.published, 2, JSON.stringify(s));
      assert.notEqual(await rt.database(), client, 'a new client');
    } finally {
      await rt.close();
      await admin.end();
    }
    assert.deepEqual(new Set(idsOf(await consumeAll([f.topic('order')], 2))), new Set(ids));
  });
});

describe('a batch\'s COMMIT fails', () => {
  it('G1/G2: the invocation fails; the batch in flight still commits its acks; only the failed batch is re-sent, nothing is lost', async () => {
    const f = await fixture(sql, 'commitfail');
    // one aggregate per row, so batch 2 is claimed while batch 1 is in flight, and is published
    // before batch 1's COMMIT has answered
    const ids = await insertEvents(sql, f.table, Array.from({ length: 300 }, (_, i) => ({ aggregateid: `c-${i}`, payload: { i } })));
    // a real commit-time failure: a deferred constraint trigger rejects moving row i=50 to the sent table
    await sql.unsafe(`CREATE FUNCTION ${f.table}_fail() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.payload->>'i' = '50' THEN RAISE EXCEPTION 'injected commit failure'; END IF; RETURN NEW; END $$`);
    await sql.unsafe(`CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON ${sentTableOf(f.table)} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ${f.table}_fail()`);
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '100' };
    const res = await runCli(['invoke', '--timeout', '30000'], env);
    assert.equal(res.code, 1, `the invocation fails:\n${res.stderr.slice(-2_000)}`);
    assert.equal(res.summary?.stoppedBecause, 'database-error');
    assert.match(String(res.summary?.error), /injected commit failure/);
    assert.equal(res.summary?.published, 100, 'batch 2 was committed, batch 1 was not');
    assert.deepEqual(await markedIds(sql, f.table), new Set(ids.slice(100, 200)));
    assert.equal(await topicCount([f.topic('order')]), 200, 'batch 3 was not published');

    await sql.unsafe(`DROP TRIGGER fail_at_commit ON ${sentTableOf(f.table)}`);
    const s = await invoke(env, 30_000);
    assert.equal(s.published, 200);
    assert.deepEqual(await counts(sql, f.table), { total: 300, sent: 300, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 400);
    const copies = copiesById(msgs);
    assert.deepEqual(new Set(copies.keys()), new Set(ids), 'nothing lost');
    assert.deepEqual(twiceIds(copies), new Set(ids.slice(0, 100)), 'only batch 1 is duplicated');
  });
});
