// services: postgres, kafka
// G1/G7: a transaction is ended by the server, never by forgetting it. postgres.js pools a
// released connection as it is, open transaction included, and the next `sql.begin` on the pool
// commits what was left in it. A batch's transaction holds premarks (acked and un-acked rows moved
// to the sent table, uncommitted), so a connection released without a confirmed ROLLBACK could
// commit rows the broker never acked. Real Postgres, real connections, a backend terminated.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import postgres, { type Sql } from 'postgres';
import { BUDGET, Deadline, MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { BrokerUnavailableError, DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { backlog, UnconfirmedRollbackError } from '../../src/outbox/admin.ts';
import { CLIENT_OPTIONS } from '../../src/outbox/client.ts';
import { migrate } from '../../src/outbox/migrate.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { OutboxStore } from '../../src/outbox/store.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { startPgProxy } from './pg-proxy.ts';
import { ADMIN_DATABASE_URL, DATABASE_URL, consumeAll, db, fixture, insertEvents, sentTableOf, topicCount, uniqueName } from './helpers.ts';

let sql: Sql;
let admin: Sql;
before(() => {
  sql = db();
  admin = db(ADMIN_DATABASE_URL);
});
after(async () => {
  await sql.end();
  await admin.end();
});

async function table(name: string): Promise<{ name: string; t: string; sent: string }> {
  const n = uniqueName(name);
  await migrate(sql, parseTableName(n));
  return { name: n, t: qualified(parseTableName(n)), sent: sentTableOf(n) };
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** No backend of the relay's client is left on the server. */
async function backendsGone(appName: string): Promise<boolean> {
  const [a] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName}`;
  return a!.n === 0;
}

async function count(table: string): Promise<number> {
  return (await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${table}`))[0]!.n;
}

describe('a transaction is ended by the server, never by forgetting it', () => {
  // The library behaviour the relay guards against. If an upgrade of postgres.js changes it (a
  // released connection rolled back, or refused), this test says so, and OutboxStore.abandon may
  // become simpler.
  it('postgres.js: a connection released inside its transaction is pooled as it is, and the next sql.begin commits what was left in it', async () => {
    const { name, t } = await table('tx_lib');
    const client = postgres(DATABASE_URL, { max: 1, onnotice: () => undefined });
    try {
      const conn = await client.reserve();
      await conn`BEGIN`;
      await conn.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('a', 'leftover', 't', '{}')`);
      conn.release();
      await client.begin(async (tx) => tx`SELECT 1`);
    } finally {
      await client.end();
    }
    const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t} WHERE aggregateid = 'leftover'`);
    assert.equal(r!.n, 1, `postgres.js ${name}: the leftover INSERT was committed by an unrelated transaction`);
  });

  it('G1/G7: a batch whose ROLLBACK cannot be sent (another connection of the client closed) never commits its premarks: the client is ended, the server rolls back, the rows stay pending and unlocked', { timeout: 60_000 }, async () => {
    const { name, t, sent } = await table('tx_lost');
    await insertEvents(sql, name, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    const appName = `relay-${name}`;
    const client = postgres(DATABASE_URL, { max: 3, onnotice: () => undefined, connection: { application_name: appName }, onclose: () => store.loseConnection() });
    const store = new OutboxStore(client, parseTableName(name), 'hold');
    const deadline = new Deadline(Date.now() + 20_000);
    try {
      // another connection of the same client, idle in a transaction (as the claim ahead's is)
      const other = await client.reserve();
      await other`BEGIN`;
      const otherPid = (await other<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`)[0]!.pid;
      const tx = await store.begin(deadline);
      const rows = await tx.claim(10);
      assert.equal(rows.length, 2);
      // both rows premarked (moved to the sent table, uncommitted) while "on their way"
      tx.premark(rows.map((r) => r.seq));
      await until('the premarks are written', async () => {
        const [a] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName} AND state = 'idle in transaction' AND query LIKE '%INSERT INTO%'`;
        return a!.n === 1;
      });
      // the other connection's backend ends: the client is known bad from now on
      await admin`SELECT pg_terminate_backend(${otherPid})`;
      await until('the client saw the close', () => Promise.resolve(store.connectionLost));
      // the broker acked one row of two: the batch cannot be committed on this client
      await assert.rejects(tx.markAndCommit([rows[0]!.seq], []));
      await tx.rollback();
      // retention or the waiting marks on the same client: on today's postgres.js it would take
      // the released connection and commit its premarks
      const pruning = await store.pruneChunk('skipped', 0, 10, deadline).then(() => 'ran', () => 'refused');
      await client.begin(async (x) => x`SELECT 1`).catch(() => undefined);
      // the server rolled the batch back: nothing in the sent table, both rows pending and free
      const [moved] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${sent}`);
      assert.equal(moved!.n, 0, 'no row reached the sent table');
      assert.equal(pruning, 'refused', 'retention does not run on a client known bad');
      await until('no backend of the relay is left in a transaction', () => backendsGone(appName));
      const locked = await sql.begin(async (x) => x.unsafe<{ seq: string }[]>(`SELECT seq FROM ${t} FOR UPDATE NOWAIT`));
      assert.equal(locked.length, 2, 'both rows pending and lockable at once');
    } finally {
      await client.end({ timeout: 1 }).catch(() => undefined);
    }
  });

  it('G1/G7: a ROLLBACK that is not answered in time (the backend stopped) does not release its connection: the client is ended and the rows stay pending', { timeout: 60_000 }, async () => {
    const { name, t, sent } = await table('tx_slow');
    await insertEvents(sql, name, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    const appName = `relay-${name}`;
    const client = postgres(DATABASE_URL, { max: 2, onnotice: () => undefined, connection: { application_name: appName }, onclose: () => store.loseConnection() });
    const store = new OutboxStore(client, parseTableName(name), 'hold');
    const deadline = new Deadline(Date.now() + 20_000);
    let pid = 0;
    try {
      const tx = await store.begin(deadline);
      const rows = await tx.claim(10);
      tx.premark(rows.map((r) => r.seq));
      await until('the premarks are written', async () => {
        const [a] = await admin<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE application_name = ${appName} AND state = 'idle in transaction' AND query LIKE '%INSERT INTO%'`;
        pid = a?.pid ?? 0;
        return pid !== 0;
      });
      // the backend cannot answer (a frozen server, a network partition): its process stopped
      process.kill(pid, 'SIGSTOP');
      const started = Date.now();
      await tx.rollback();
      assert.ok(Date.now() - started < 5_000, `the rollback gave up within its grace (${Date.now() - started} ms)`);
      assert.ok(store.poisoned, 'the client is known bad');
      // the client was ended: nothing else runs on it (on a released connection, this would wait
      // behind the unanswered ROLLBACK for as long as the backend stays stopped)
      const next = await Promise.race([client`SELECT 1`.then(() => 'answered', () => 'refused'), new Promise((r) => setTimeout(r, 3_000, 'waiting'))]);
      assert.equal(next, 'refused');
    } finally {
      if (pid) process.kill(pid, 'SIGCONT');
      await client.end({ timeout: 1 }).catch(() => undefined);
    }
    await until('the server ended the relay backend', () => backendsGone(appName));
    assert.equal(await count(sent), 0, 'no row reached the sent table');
    assert.equal(await count(t), 2, 'both rows still pending');
  });

  it('G1/G5/G7: a failure at the deadline with both of the invocation\'s transactions unanswerable (the batch and the claim ahead, their backends stopped) ends within the safety margin: one short grace, then the client is ended', { timeout: 60_000 }, async (ctx) => {
    const { name, t, sent } = await table('tx_graces');
    await insertEvents(sql, name, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    const appName = `relay-${name}`;
    const client = postgres(DATABASE_URL, { max: 2, onnotice: () => undefined, connection: { application_name: appName }, onclose: () => store.loseConnection() });
    const store = new OutboxStore(client, parseTableName(name), 'hold');
    const deadline = new Deadline(Date.now() + 1_500);
    const pids: number[] = [];
    try {
      const batch = await store.begin(deadline);
      const rows = await batch.claim(1);
      const ahead = await store.begin(deadline);
      assert.equal((await ahead.claim(1)).length, 1);
      batch.premark(rows.map((r) => r.seq));
      await until('both transactions are open and idle', async () => {
        const found = await admin<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE application_name = ${appName} AND state = 'idle in transaction'`;
        pids.splice(0, pids.length, ...found.map((r) => r.pid));
        return pids.length === 2;
      });
      for (const pid of pids) process.kill(pid, 'SIGSTOP');
      await new Promise((r) => setTimeout(r, Math.max(0, deadline.remaining())));
      // as Invocation.failed ends them: the batch in hand, then the claim ahead
      const started = Date.now();
      await batch.rollback();
      await ahead.rollback();
      const spent = Date.now() - started;
      ctx.diagnostic(`both rollbacks ended ${spent} ms past the deadline (the shortest grace is ${BUDGET.rollbackGraceMs.min} ms)`);
      // the tests' safety margin is the minimum (helpers.ts fixture), which covers one short grace
      assert.ok(spent < 1_000, `both rollbacks gave up within the margin: ${spent} ms`);
      assert.ok(store.poisoned);
    } finally {
      for (const pid of pids) process.kill(pid, 'SIGCONT');
      await client.end({ timeout: 1 }).catch(() => undefined);
    }
    await until('the server ended both backends', () => backendsGone(appName));
    assert.equal(await count(sent), 0, 'no row reached the sent table');
    assert.equal(await count(t), 2);
  });
});

describe('the backlog read (status, the metrics) ends its read-only transaction confirmed', () => {
  for (const [how, fault] of [
    ['is not answered (its answer held back by a proxy)', 'hold'],
    ['fails (a proxy closes the connection as it passes)', 'drop'],
  ] as const) {
    it(`G7: when its ROLLBACK ${how}, the connection is never released: the client is ended within the rollback grace, and the server is left with no transaction`, { timeout: 60_000 }, async () => {
      const { name } = await table('tx_backlog');
      await insertEvents(sql, name, [{ aggregateid: 'a' }]);
      const proxy = await startPgProxy({
        listenPort: 0,
        targetPort: Number(new URL(DATABASE_URL).port || 5432),
        onStatement: (text, connection) => {
          if (text.trim().toUpperCase() !== 'ROLLBACK') return undefined;
          if (fault === 'drop') return 'drop';
          connection.holdAnswers();
          return undefined;
        },
      });
      const url = new URL(DATABASE_URL);
      url.port = String(proxy.port);
      const appName = `relay-${name}`;
      const client = postgres(url.toString(), { max: 1, ...CLIENT_OPTIONS, onnotice: () => undefined, connection: { application_name: appName } });
      try {
        const deadline = new Deadline(Date.now() + 15_000);
        const started = Date.now();
        await assert.rejects(backlog(client, parseTableName(name), deadline), (err: unknown) => {
          assert.ok(err instanceof UnconfirmedRollbackError, `not confirmed, and said so: ${String(err)}`);
          return true;
        });
        const spent = Date.now() - started;
        assert.ok(spent <= BUDGET.rollbackGraceMs.max + 1_000, `gave up within the rollback grace, not at the deadline: ${spent} ms`);
        // the client was ended: nothing runs on it any more (a released connection would take this)
        const next = await Promise.race([client`SELECT 1`.then(() => 'answered', () => 'refused'), new Promise((r) => setTimeout(r, 3_000, 'waiting'))]);
        assert.equal(next, 'refused');
      } finally {
        await client.end({ timeout: 1 }).catch(() => undefined);
        await proxy.close();
      }
      await until('the server ended the backend', () => backendsGone(appName));
    });
  }
});

describe('G5: how far past the deadline a failure runs (OUTBOX_SAFETY_MARGIN_MS\'s minimum)', () => {
  it('a lingering invocation whose claim and LISTEN backends stop answering fails after its deadline by less than MIN_SAFETY_MARGIN_MS: the claim lost at the deadline, then the LISTEN connection\'s close', { timeout: 60_000 }, async (ctx) => {
    const f = await fixture(sql, 'tx_overrun');
    const appName = `relay-${f.table}`;
    const rt = new Runtime(
      loadConfig({ ...f.env, OUTBOX_IDLE: 'linger', OUTBOX_CLIENT_ID: appName, OUTBOX_LOG_LEVEL: 'error' }),
      createLogger('error', {}, () => undefined),
    );
    const remainingMs = 6_000;
    const stopped: number[] = [];
    try {
      const calledAt = Date.now();
      const invocation = rt.invoke(remainingMs).then(
        () => ({ at: Date.now(), err: undefined as unknown }),
        (err: unknown) => ({ at: Date.now(), err }),
      );
      const deadlineAt = calledAt + remainingMs - MIN_SAFETY_MARGIN_MS;
      let listener = 0;
      await until('the invocation lingers on LISTEN', async () => {
        const rows = await admin<{ pid: number; query: string; state: string }[]>`SELECT pid, query, state FROM pg_stat_activity WHERE application_name = ${appName}`;
        listener = rows.find((r) => r.query.startsWith('LISTEN'))?.pid ?? 0;
        const others = rows.filter((r) => r.pid !== listener);
        if (!listener || others.length === 0 || others.some((r) => r.state !== 'idle')) return false;
        // the main client's backends stop answering (a frozen server, a partition)
        for (const r of others) process.kill(r.pid, 'SIGSTOP');
        stopped.push(...others.map((r) => r.pid));
        return true;
      });
      // the row notifies the (still answering) listener: the relay claims on a backend that cannot answer
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
      await new Promise((r) => setTimeout(r, 300));
      // then the listener stops too: its close waits for a server that never answers
      process.kill(listener, 'SIGSTOP');
      stopped.push(listener);
      const { at, err } = await invocation;
      assert.ok(err instanceof DatabaseError, `the invocation failed on the database: ${String(err)}`);
      const overrunMs = at - deadlineAt;
      ctx.diagnostic(`ran ${overrunMs} ms past the deadline (minimum safety margin ${MIN_SAFETY_MARGIN_MS} ms)`);
      assert.ok(overrunMs < MIN_SAFETY_MARGIN_MS, `returned ${overrunMs} ms past the deadline, more than the minimum margin`);
    } finally {
      for (const pid of stopped) process.kill(pid, 'SIGCONT');
      await rt.close();
    }
    await until('the server ended the relay backends', () => backendsGone(appName));
  });
});

describe('G1/G7: every mechanism at once, on the real services', () => {
  it('G1/G6: retention busy, batches mixing a topic the broker has and one it refuses, a backend of the relay terminated every 150 ms, 12 invocations of one warm Runtime: every row in the sent table is on Kafka after each; once the faults stop, every row of the existing topic is delivered and no transaction is left open', { timeout: 240_000 }, async () => {
    // 'order' has its topic; 'gone' has none (auto-creation is off): the broker refuses it, the
    // topic is backed off, its rows stay pending and uncharged, and a batch that held some of them
    // rolls back to its premark savepoint and moves only the acked rows
    const f = await fixture(sql, 'tx_all', ['order']);
    const t = qualified(parseTableName(f.table));
    const sent = sentTableOf(f.table);
    const ids = await insertEvents(sql, f.table, Array.from({ length: 3_000 }, (_, i) => ({ aggregateid: `a-${i % 60}`, aggregatetype: i % 60 < 50 ? 'order' : 'gone', payload: { i } })));
    // retention has work beside the loop: 20,000 rows sent two days ago
    await sql.unsafe(
      `INSERT INTO ${sent} (id, aggregatetype, aggregateid, type, payload, seq, created_at, sent_at, attempts)
       SELECT gen_random_uuid(), 'order', 'old', 'Old', '{}', -g, now() - interval '2 days', now() - interval '2 days', 0 FROM generate_series(1, 20000) g`,
    );
    const orderIds = new Set(ids.filter((_, i) => i % 60 < 50));
    const appName = `relay-${f.table}`;
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_BATCH_SIZE: '50', OUTBOX_CLIENT_ID: appName, OUTBOX_LOG_LEVEL: 'error' }), createLogger('error', {}, () => undefined));
    // every message on the topic (copies included: G2 allows them), by event id
    const onKafka = async () => new Set((await consumeAll([f.topic('order')], await topicCount([f.topic('order')]), 60_000)).map((m) => m.headers.id ?? ''));
    /** every row in the sent table is on Kafka (G1); returns how many are there */
    const sentRowsOnKafka = async (): Promise<number> => {
      const moved = await sql.unsafe<{ id: string }[]>(`SELECT id FROM ${sent} WHERE aggregateid <> 'old'`);
      const published = await onKafka();
      const missing = moved.filter((r) => !published.has(r.id));
      assert.equal(missing.length, 0, `${missing.length} rows in the sent table are not on Kafka`);
      return moved.length;
    };
    const failures: string[] = [];
    let kills = 0;
    const killer = setInterval(() => {
      void admin<{ ok: boolean }[]>`SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = ${appName}`.then(
        (rows) => (kills += rows.filter((r) => r.ok).length),
        () => undefined,
      );
    }, 150);
    try {
      for (let i = 0; i < 12; i++) {
        await rt.invoke(3_000).catch((err: unknown) => {
          // a fault's failure is one of the relay's typed errors, never anything else
          assert.ok(err instanceof DatabaseError || err instanceof BrokerUnavailableError, `invocation ${i} failed with ${String(err)}`);
          failures.push((err as Error).message.slice(0, 80));
        });
        await sentRowsOnKafka();
      }
    } finally {
      clearInterval(killer);
    }
    assert.ok(kills >= 10, `backends were terminated while the relay ran (${kills})`);
    assert.ok(failures.length >= 1, 'some invocation met a terminated backend');

    // the faults stop: the same warm Runtime delivers the rest
    try {
      for (let i = 0; i < 20 && (await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t} WHERE aggregatetype = 'order'`))[0]!.n > 0; i++) await rt.invoke(10_000);
      assert.equal(await sentRowsOnKafka(), orderIds.size, 'every order row was moved once');
      const published = await onKafka();
      for (const id of orderIds) assert.ok(published.has(id), `order row ${id} is not on Kafka`);
      const [left] = await sql.unsafe<{ gone: number; charged: number }[]>(`SELECT count(*) FILTER (WHERE aggregatetype = 'gone')::int AS gone, count(*) FILTER (WHERE attempts > 0)::int AS charged FROM ${t}`);
      assert.deepEqual(left, { gone: 500, charged: 0 }, "the refused topic's rows stay pending, none charged");
      assert.equal(await count(`${sent} WHERE aggregateid = 'old'`), 0, 'retention pruned the old rows');
      const [open] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName} AND state LIKE 'idle in transaction%'`;
      assert.equal(open!.n, 0, 'no transaction of the relay is left open (G7)');
    } finally {
      await rt.close();
    }
  });
});
