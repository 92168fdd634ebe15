// services: postgres, kafka
// Linger mode (OUTBOX_IDLE=linger): an invocation that found nothing to send waits for new rows
// until its budget is spent, woken by NOTIFY (the insert trigger) or by polling. Real
// Postgres, real broker; the invocations run in-process on a Runtime (a warm container) so the
// test can write rows while one lingers.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { enqueue } from '../../src/outbox/enqueue.ts';
import { createLogger } from '../../src/log.ts';
import { notifyChannel, parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { loadMigrations, migrate, render } from '../../src/outbox/migrate.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { startPgProxy } from './pg-proxy.ts';
import { ADMIN_DATABASE_URL, counts, db, DATABASE_URL, firstCopyOrder, fixture, isSorted, seqsById, startWatching, uniqueName, type Fixture } from './helpers.ts';

/** the bound asserted for an event written while an invocation lingers: generous, far below a schedule's minute */
const LATENCY_BOUND_MS = 3_000;

let sql: Sql;
/** a superuser: roles are created and dropped with it */
let admin: Sql;
before(() => {
  sql = db();
  admin = db(ADMIN_DATABASE_URL);
});
after(async () => {
  await Promise.all([sql.end(), admin.end()]);
});

async function createRole(grants: string): Promise<{ role: string; url: string; drop(): Promise<void> }> {
  const role = uniqueName('role');
  await admin.unsafe(`CREATE ROLE ${role} LOGIN PASSWORD 'pw'`);
  await admin.unsafe(grants.replaceAll('{role}', role));
  return {
    role,
    url: DATABASE_URL.replace(/\/\/[^@]+@/, `//${role}:pw@`),
    drop: async () => {
      await admin.unsafe(`DROP OWNED BY ${role}`);
      await admin.unsafe(`DROP ROLE ${role}`);
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function runtime(f: Fixture, env: Record<string, string>): Runtime {
  // retention off: nothing to prune, and no second connection the LISTEN test would have to allow for
  return new Runtime(loadConfig({ ...f.env, OUTBOX_IDLE: 'linger', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0', OUTBOX_LOG_LEVEL: 'warn', ...env }), createLogger('warn'));
}

/** Write `n` events, one transaction each, `gapMs` apart, through the enqueue helper; the commit time of each. */
async function produce(f: Fixture, n: number, gapMs: number, producer: Sql = sql): Promise<Map<string, number>> {
  const committed = new Map<string, number>();
  for (let i = 0; i < n; i++) {
    await sleep(gapMs);
    const id = await producer.begin((tx) => enqueue(tx, { aggregatetype: 'order', aggregateid: `o-${i % 3}`, type: 'Placed', payload: { i } }, { table: f.table }));
    committed.set(id, Date.now());
  }
  return committed;
}

function latencies(committed: Map<string, number>, arrivals: Map<string, number>): number[] {
  return [...committed].map(([id, at]) => (arrivals.get(id) ?? Infinity) - at);
}

async function lingerCase(wake: 'notify' | 'poll'): Promise<{ summary: Summary; lat: number[]; lastCommitMs: number }> {
  const f = await fixture(sql, `linger_${wake}`);
  // a pooler in between (DATABASE_PREPARE=false) is what makes a lingering invocation poll
  const rt = runtime(f, { DATABASE_PREPARE: String(wake === 'notify'), OUTBOX_POLL_MS: '100' });
  const watching = await startWatching([f.topic('order')]);
  try {
    const startedAt = Date.now();
    const invocation = rt.invoke(12_000);
    // the table is empty: the invocation claims nothing and lingers; events arrive meanwhile
    const committed = await produce(f, 6, 900);
    const lastCommitMs = Date.now() - startedAt;
    const summary = await invocation;
    const until = Date.now() + 5_000;
    while (watching.arrivals.size < committed.size && Date.now() < until) await sleep(50);
    assert.equal(summary.published, 6, JSON.stringify(summary));
    return { summary, lat: latencies(committed, watching.arrivals), lastCommitMs };
  } finally {
    await watching.stop();
    await rt.close();
  }
}

describe('linger mode', () => {
  it(`NOTIFY: events written while an invocation lingers are on Kafka within ${LATENCY_BOUND_MS} ms, woken by the notification`, async (ctx) => {
    const { summary, lat, lastCommitMs } = await lingerCase('notify');
    ctx.diagnostic(`latencies ${lat.join(', ')} ms; wakeups ${JSON.stringify(summary.wakeups)}; idle ${summary.waitedMs.idle} ms of ${summary.durationMs}`);
    for (const l of lat) assert.ok(l < LATENCY_BOUND_MS, `an event took ${l} ms to reach Kafka (latencies ${lat.join(', ')})`);
    // woken by NOTIFY, not by the periodic claim (RECLAIM_MS), which also keeps within the bound.
    // On a busy machine a periodic claim may take a row just committed before its notification
    // wakes the wait (3 of them in 11 s here): each transaction woke the wait one way or the
    // other, and most by their notification
    const { notified, reclaim } = summary.wakeups;
    assert.ok(notified + reclaim >= 6 && notified >= 3, `woken by ${notified} notifications (and ${reclaim} periodic claims) for 6 transactions: ${JSON.stringify(summary.wakeups)}`);
    assert.equal(summary.wakeups.probe, 0);
    assert.equal(summary.stoppedBecause, 'empty');
    // it lingered through every event (the table was empty when it started) and ended before its
    // budget (12 s - 1 s margin). How long it waited after the last event depends on the batch
    // reserve (2 x the slowest recent batch + 500 ms), which a loaded machine stretches: it ended
    // 0.4 s after a last event committed at 7.5 s in a fresh-clone run
    assert.ok(summary.durationMs > lastCommitMs && summary.durationMs < 11_000, `lingered ${summary.durationMs} ms, the last event committed at ${lastCommitMs} ms`);
  });

  it(`polling (DATABASE_PREPARE=false: a pooler in between): the probe finds each new row, on Kafka within ${LATENCY_BOUND_MS} ms`, async (ctx) => {
    const { summary, lat } = await lingerCase('poll');
    ctx.diagnostic(`latencies ${lat.join(', ')} ms; wakeups ${JSON.stringify(summary.wakeups)}`);
    for (const l of lat) assert.ok(l < LATENCY_BOUND_MS, `an event took ${l} ms to reach Kafka (latencies ${lat.join(', ')})`);
    assert.equal(summary.wakeups.notified, 0, 'polling does not LISTEN');
    assert.ok(summary.wakeups.probe >= 6, `the probe woke the invocation ${summary.wakeups.probe} times for 6 transactions: ${JSON.stringify(summary.wakeups)}`);
  });

  it('a warm container lingers again in its next invocation, and keeps no LISTEN connection between invocations', async () => {
    const f = await fixture(sql, 'linger_warm');
    const appName = `warm-${f.table}`;
    const rt = runtime(f, { OUTBOX_CLIENT_ID: appName });
    const listening = async () => (await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${appName} AND query ILIKE 'LISTEN%'`)[0]!.n;
    const watching = await startWatching([f.topic('order')]);
    try {
      for (let round = 0; round < 2; round++) {
        const invocation = rt.invoke(5_000);
        await sleep(1_500);
        assert.equal(await listening(), 1, `round ${round}: the lingering invocation LISTENs on one connection`);
        const committed = await produce(f, 1, 0);
        const summary = await invocation;
        assert.equal(summary.published, 1, JSON.stringify(summary));
        assert.ok(summary.wakeups.notified >= 1, JSON.stringify(summary.wakeups));
        assert.equal(await listening(), 0, `round ${round}: the LISTEN connection is closed when the invocation returns`);
        const id = [...committed.keys()][0]!;
        const until = Date.now() + 5_000;
        while (!watching.arrivals.has(id) && Date.now() < until) await sleep(50);
        assert.ok(watching.arrivals.has(id), `round ${round}: the event is on Kafka`);
      }
    } finally {
      await watching.stop();
      await rt.close();
    }
  });

  it('LISTEN refused (a proxy in front of Postgres closes the connection that sends it): the invocation polls instead and still delivers within the bound', async (ctx) => {
    const f = await fixture(sql, 'linger_nolisten');
    // every connection of the relay goes through the proxy; the one that LISTENs is cut
    let refused = 0;
    const proxy = await startPgProxy({
      listenPort: 0,
      targetPort: Number(new URL(DATABASE_URL).port || 5432),
      onStatement: (text) => {
        if (!/^\s*LISTEN\b/i.test(text)) return undefined;
        refused++;
        return 'drop';
      },
    });
    const url = new URL(DATABASE_URL);
    url.port = String(proxy.port);
    const warnings: string[] = [];
    const rt = new Runtime(
      loadConfig({ ...f.env, DATABASE_URL: url.toString(), OUTBOX_IDLE: 'linger', OUTBOX_POLL_MS: '100', OUTBOX_RETAIN_SENT_MS: '0', OUTBOX_RETAIN_SKIPPED_MS: '0' }),
      createLogger('warn', {}, (line) => warnings.push(line)),
    );
    const watching = await startWatching([f.topic('order')]);
    try {
      const invocation = rt.invoke(8_000);
      const committed = await produce(f, 4, 900);
      const summary = await invocation;
      const until = Date.now() + 5_000;
      while (watching.arrivals.size < committed.size && Date.now() < until) await sleep(50);
      const lat = latencies(committed, watching.arrivals);
      ctx.diagnostic(`latencies ${lat.join(', ')} ms; wakeups ${JSON.stringify(summary.wakeups)}`);
      assert.equal(refused, 1, 'one LISTEN, refused');
      assert.equal(summary.published, 4, JSON.stringify(summary));
      for (const l of lat) assert.ok(l < LATENCY_BOUND_MS, `an event took ${l} ms (latencies ${lat.join(', ')})`);
      // the rows are found by probes (now and then by the claim every 2 s that came first); on a
      // loaded machine one wake-up's claim can take two rows (3 wake-ups for 4 rows, seen twice),
      // so what is counted is that the probe, not NOTIFY, did the finding
      assert.equal(summary.wakeups.notified, 0, JSON.stringify(summary.wakeups));
      assert.ok(summary.wakeups.probe >= 2 && summary.wakeups.probe + summary.wakeups.reclaim >= 3, JSON.stringify(summary.wakeups));
      assert.ok(
        warnings.some((w) => /LISTEN failed; this invocation polls/.test(w)),
        `a warning says LISTEN failed and why:\n${warnings.join('\n')}`,
      );
    } finally {
      await watching.stop();
      await rt.close();
      await proxy.close();
    }
  });

  it('polling while an application holds an aggregate\'s first row: no claim or wake-up again and again without a new row; it lingers until only a batch\'s reserve is left', async () => {
    const f = await fixture(sql, 'linger_held');
    // budget 2.5 s less the fixture's margin (MIN_SAFETY_MARGIN_MS), below RECLAIM_MS: no periodic claim either
    const rt = runtime(f, { DATABASE_PREPARE: 'false', OUTBOX_POLL_MS: '20' });
    await produce(f, 1, 0);
    await produce(f, 1, 0);
    const holder = await sql.reserve();
    try {
      await holder`BEGIN`;
      await holder.unsafe(`SELECT 1 FROM ${qualified(parseTableName(f.table))} WHERE seq = (SELECT min(seq) FROM ${qualified(parseTableName(f.table))}) FOR UPDATE`);
      const t0 = Date.now();
      const summary = await rt.invoke(2_500);
      const tookMs = Date.now() - t0;
      assert.equal(summary.published, 0, JSON.stringify(summary));
      assert.equal(summary.stoppedBecause, 'behind-unclaimable-rows');
      assert.deepEqual(summary.wakeups, { notified: 0, probe: 0, reclaim: 0 }, 'no row came: nothing woke the wait');
      // the claim that took the second row (held back) and the claim without its aggregate
      assert.ok(summary.claims <= 3, `${summary.claims} claims`);
      // it waited until the smallest batch reserve (2 x 50 ms + 500 ms) was left of its budget
      const budgetMs = 2_500 - MIN_SAFETY_MARGIN_MS;
      assert.ok(tookMs >= budgetMs - 600 - 30, `returned after ${tookMs} ms of a ${budgetMs} ms budget: it did not linger`);
    } finally {
      await holder`ROLLBACK`.catch(() => undefined);
      holder.release();
      await rt.close();
    }
  });

  it('G3/G4: two overlapping lingering invocations (a timeout longer than the period) deliver a steady stream exactly once, in order per aggregate', async (ctx) => {
    const f = await fixture(sql, 'linger_overlap');
    const a = runtime(f, { OUTBOX_BATCH_SIZE: '50' });
    const b = runtime(f, { OUTBOX_BATCH_SIZE: '50' });
    const watching = await startWatching([f.topic('order')]);
    try {
      // the schedule, compressed: a new invocation every 3 s, each with 4 s, so every second is
      // covered by one and some by two; containers alternate as Lambda's would. The last has 5 s:
      // its wait must outlast the application's last commit (at 8 s, later on a busy machine; with
      // 4 s it ended ~1 s after it, and a transaction committed late once stayed pending)
      const invocations = [0, 1, 2].map(async (k) => {
        await sleep(k * 3_000);
        return (k % 2 === 0 ? a : b).invoke(k === 2 ? 5_000 : 4_000);
      });
      // the application: 20 aggregates, a transaction of 5 events every 20 ms for 8 s
      const producing = (async () => {
        let n = 0;
        const stopAt = Date.now() + 8_000;
        while (Date.now() < stopAt) {
          await sql.begin(async (tx) => {
            for (let i = 0; i < 5; i++, n++) await enqueue(tx, { aggregatetype: 'order', aggregateid: `o-${n % 20}`, type: 'Placed', payload: { n } }, { table: f.table });
          });
          await sleep(20);
        }
        return n;
      })();
      const written = await producing;
      const summaries = await Promise.all(invocations);
      ctx.diagnostic(`${written} events; ${summaries.map((s) => `${s.published} published, wakeups ${JSON.stringify(s.wakeups)}`).join('; ')}`);
      assert.deepEqual(await counts(sql, f.table), { total: written, sent: written, parked: 0, pending: 0 });
      const until = Date.now() + 10_000;
      while (watching.messages.length < written && Date.now() < until) await sleep(100);
      await sleep(500);
      assert.equal(watching.messages.length, written, 'each event on Kafka exactly once');
      assert.equal(summaries.reduce((s, x) => s + x.published, 0), written);
      const seqOf = await seqsById(sql, f.table);
      for (const [agg, seqs] of firstCopyOrder(watching.messages, (id) => seqOf.get(id)!)) assert.ok(isSorted(seqs), `aggregate ${agg} out of order`);
      assert.ok(summaries.every((s) => s.published > 0), 'every invocation took its share');
    } finally {
      await watching.stop();
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe('the insert trigger (linger mode\'s NOTIFY)', () => {
  it('is idempotent, notifies once per transaction, and leaves producers\' inserts unchanged (a role that may only INSERT, the Debezium-shaped insert)', async () => {
    const table = parseTableName(uniqueName('notify'));
    const t = qualified(table);
    await migrate(sql, table);
    // applied twice by hand as well: the SQL itself is idempotent, not only its bookkeeping
    for (const m of loadMigrations()) await sql.unsafe(render(m.sql, table));
    assert.deepEqual((await migrate(sql, table)).applied, []);
    // one insert trigger (the unwait triggers, on DELETE and UPDATE, inserts never fire)
    const triggers = await sql<{ tgtype: number }[]>`SELECT tgtype FROM pg_trigger WHERE tgrelid = ${t}::regclass AND NOT tgisinternal AND tgname = ${`${table.name}_notify`}`;
    assert.equal(triggers.length, 1, 'one notify trigger');
    // tgtype bit 0 is TRIGGER_TYPE_ROW: a row-level trigger would run pg_notify once per row; bit 2 is INSERT
    assert.equal(triggers[0]!.tgtype & 1, 0, 'statement-level');
    const onInsert = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_trigger WHERE tgrelid = ${t}::regclass AND NOT tgisinternal AND tgtype & 4 <> 0`;
    assert.equal(onInsert[0]!.n, 1, 'one trigger on INSERT');

    const role = await createRole(`GRANT INSERT ON ${t} TO {role}`);
    const producer = db(role.url);
    const listener = db();
    const heard: string[] = [];
    try {
      await listener.listen(notifyChannel(table), (payload) => heard.push(payload));
      // Debezium's outbox shape: the four columns, the id given; two statements in one transaction
      await producer.begin(async (tx) => {
        await tx.unsafe(`INSERT INTO ${t} (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'o-1', 'Placed', '{"a":1}')`);
        await tx.unsafe(`INSERT INTO ${t} (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'o-1', 'Paid', '{"a":2}'), (gen_random_uuid(), 'order', 'o-2', 'Placed', '{"a":3}')`);
      });
      // a rolled-back transaction notifies no one
      await producer.begin(async (tx) => {
        await tx.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'o-3', 'Placed', '{}')`);
        throw new Error('rollback');
      }).catch(() => undefined);
      await sleep(300);
      assert.deepEqual(heard, [''], 'one notification for one committed transaction of two statements');
      const rows = await sql.unsafe<{ type: string; payload: unknown; seq: string }[]>(`SELECT type, payload, seq FROM ${t} ORDER BY seq`);
      assert.deepEqual(rows.map((r) => [r.type, r.payload]), [['Placed', { a: 1 }], ['Paid', { a: 2 }], ['Placed', { a: 3 }]]);
    } finally {
      await producer.end();
      await listener.end();
      await role.drop();
    }
  });

});
