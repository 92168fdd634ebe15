// services: postgres, kafka
// A time-partitioned outbox made by `migrate` (OUTBOX_PARTITION_WIDTH; docs/schema.md,
// "Partitioned outboxes"): the tables it makes, that a second run changes nothing, that the relay
// relays on them, and the maintenance function (src/outbox/partitioned.sql) the relay calls once
// per invocation: partitions ahead, the sent table's old partitions dropped for retention, the
// outbox's old ones only when empty, callable by a role that owns nothing.
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config/load.ts';
import { createLogger } from '../../src/log.ts';
import { loadMigrations, migrate, render } from '../../src/outbox/migrate.ts';
import { parseTableName } from '../../src/outbox/identifier.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import {
  ADMIN_DATABASE_URL, DATABASE_URL, consumeAll, copiesById, db, fileDb, firstCopyOrder, fixture, insertEvents, isSorted, outboxTableOf,
  runCli, seqsById, sentTableOf, uniqueName, type Fixture,
} from './helpers.ts';

const sql = fileDb();
const admin = db(ADMIN_DATABASE_URL);
after(() => admin.end());

const DAY_S = 86_400;
const DAY_MS = DAY_S * 1000;

/** A fresh outbox, partitioned by day by migrate. */
const partitioned = (name: string, aggregatetypes?: string[]) => fixture(sql, name, aggregatetypes, 3, { partitionWidthS: DAY_S });

interface Partition {
  name: string;
  bound: string;
  options: string[];
}

/** The partitions of a table, by name, with their bounds and storage options. */
async function partitionsOf(table: string): Promise<Partition[]> {
  return sql.unsafe<Partition[]>(
    `SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound, coalesce(c.reloptions, '{}') AS options
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass ORDER BY c.relname`,
    [table],
  );
}

/** Today's lower bound (a width counted from the epoch, as the function counts), shifted by `days`. */
async function dayStart(days: number): Promise<string> {
  const [r] = await sql<{ t: string }[]>`SELECT (to_timestamp(floor(extract(epoch FROM now()) / ${DAY_S}) * ${DAY_S}) + ${days} * interval '1 day')::text AS t`;
  return r!.t;
}

/** The name maintenance gives the partition of `base` starting `days` from today's start (UTC). */
async function partName(base: string, days: number): Promise<string> {
  const [r] = await sql<{ n: string }[]>`SELECT to_char((to_timestamp(floor(extract(epoch FROM now()) / ${DAY_S}) * ${DAY_S}) + ${days} * interval '1 day') AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MI') AS n`;
  return `${base}_p${r!.n}`;
}

/** A partition made by hand over [from, to) days from today's start. */
async function handPartition(parent: string, name: string, from: number, to: number): Promise<void> {
  await sql.unsafe(`CREATE TABLE "${name}" PARTITION OF ${parent} FOR VALUES FROM ('${await dayStart(from)}') TO ('${await dayStart(to)}')`);
}

async function exists(name: string): Promise<boolean> {
  const [r] = await sql<{ e: boolean }[]>`SELECT to_regclass(${`"${name}"`}) IS NOT NULL AS e`;
  return r!.e;
}

function warm(env: Record<string, string>, logs: string[] = []): Runtime {
  return new Runtime(loadConfig({ ...env, OUTBOX_LOG_LEVEL: 'info' }), createLogger('info', {}, (l) => logs.push(l)));
}

async function invokeOnce(env: Record<string, string>, logs: string[] = []): Promise<Summary> {
  const rt = warm(env, logs);
  try {
    return await rt.invoke(20_000);
  } finally {
    await rt.close();
  }
}

/** The columns as a table's producers and the relay see them (name, type, default, nullability, identity, generation). */
async function columnsOf(table: string): Promise<unknown[]> {
  return sql.unsafe(
    `SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull, a.attidentity, a.attgenerated,
            pg_get_expr(d.adbin, d.adrelid) AS expr
     FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`,
    [table],
  );
}

/** The CHECK constraints, named without the table's prefix, and the non-unique indexes' definitions, the table's name taken out. */
async function checksAndIndexes(table: string, prefix: string): Promise<{ checks: unknown[]; indexes: string[]; triggers: string[] }> {
  const checks = await sql.unsafe(
    `SELECT replace(conname, $2, '') AS name, pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c' ORDER BY 1`,
    [table, prefix],
  );
  const indexes = await sql.unsafe<{ def: string }[]>(
    `SELECT pg_get_indexdef(indexrelid) AS def FROM pg_index WHERE indrelid = $1::regclass AND NOT indisunique ORDER BY 1`,
    [table],
  );
  const triggers = await sql.unsafe<{ def: string }[]>(
    `SELECT pg_get_triggerdef(oid) AS def FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal ORDER BY tgname`,
    [table],
  );
  const strip = (s: string) => s.replaceAll(prefix, '').replace(/ ON (ONLY )?/, ' ON ');
  return { checks, indexes: indexes.map((i) => strip(i.def)), triggers: triggers.map((t) => strip(t.def)) };
}

describe('migrate with OUTBOX_PARTITION_WIDTH', () => {
  it('makes the outbox partitioned by created_at and the sent table by sent_at: the partitions of today and the next 3 days and a DEFAULT one, each with the autovacuum settings', async () => {
    const f = await partitioned('pmake');
    const t = outboxTableOf(f.table);
    const s = sentTableOf(f.table);
    const kinds = await sql.unsafe<{ kind: string; key: string }[]>(
      `SELECT c.relkind::text AS kind, pg_get_partkeydef(c.oid) AS key FROM unnest(ARRAY[$1::regclass, $2::regclass]) r JOIN pg_class c ON c.oid = r ORDER BY c.relname`,
      [t, s],
    );
    assert.deepEqual([...kinds], [{ kind: 'p', key: 'RANGE (created_at)' }, { kind: 'p', key: 'RANGE (sent_at)' }]);
    for (const [parent, base] of [[t, f.table], [s, `${f.table}_sent`]] as const) {
      const parts = await partitionsOf(parent);
      const expected = [`${base}_default`];
      for (let d = 0; d <= 3; d++) expected.push(await partName(base, d));
      assert.deepEqual(parts.map((p) => p.name).sort(), expected.sort(), parent);
      for (const p of parts) {
        assert.ok(p.options.includes('autovacuum_vacuum_scale_factor=0.0') && p.options.includes('autovacuum_vacuum_threshold=5000'), `${p.name}: ${p.options.join(',')}`);
      }
      assert.ok(parts.some((p) => p.bound === 'DEFAULT'));
    }
    const [pk] = await sql.unsafe<{ def: string }[]>(`SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`, [t]);
    assert.equal(pk?.def, 'PRIMARY KEY (id, created_at)');
  });

  it('a table name too long for its partitions\' names: they keep a hash of it, and the outbox\'s and the sent table\'s stay apart', async () => {
    const f = await fixture(sql, `plong_${'x'.repeat(45)}`, ['order'], 3, { partitionWidthS: DAY_S });
    for (const parent of [outboxTableOf(f.table), sentTableOf(f.table)]) {
      const parts = await partitionsOf(parent);
      assert.equal(parts.length, 5, `${parent}: ${parts.map((p) => p.name).join(', ')}`);
      for (const p of parts) assert.ok(p.name.length <= 63, p.name);
    }
  });

  it("has the plain table's columns, defaults, identity, checks, non-unique indexes and triggers", async () => {
    const plain = await fixture(sql, 'pplain');
    const parted = await partitioned('pshape');
    assert.deepEqual(await columnsOf(outboxTableOf(parted.table)), await columnsOf(outboxTableOf(plain.table)));
    assert.deepEqual(await columnsOf(sentTableOf(parted.table)), await columnsOf(sentTableOf(plain.table)));
    assert.deepEqual(await checksAndIndexes(outboxTableOf(parted.table), parted.table), await checksAndIndexes(outboxTableOf(plain.table), plain.table));
    assert.deepEqual(await checksAndIndexes(sentTableOf(parted.table), parted.table), await checksAndIndexes(sentTableOf(plain.table), plain.table));
  });

  it('is idempotent: a second run applies nothing, creates no partition, and leaves the catalogs as they were', async () => {
    const f = await partitioned('pidem');
    const snapshot = async () => ({
      outbox: await partitionsOf(outboxTableOf(f.table)),
      sent: await partitionsOf(sentTableOf(f.table)),
      shape: await checksAndIndexes(outboxTableOf(f.table), f.table),
      versions: await sql`SELECT version, name FROM outbox_relay_migrations WHERE target = ${f.table} ORDER BY version`,
    });
    const before = await snapshot();
    for (const width of [DAY_S, undefined]) {
      const again = await migrate(sql, parseTableName(f.table), undefined, { partitionWidthS: width });
      assert.deepEqual(again.applied, []);
      assert.deepEqual(again.partitions, { created: 0, dropped: 0, busy: 0 });
      assert.deepEqual(await snapshot(), before);
    }
  });

  it('`outbox-relay migrate` reads OUTBOX_PARTITION_WIDTH: 6-hour partitions, what the maintenance made in its JSON; a width it cannot use is refused', async () => {
    const table = uniqueName('pcli');
    const env = { DATABASE_URL, KAFKA_BROKERS: '127.0.0.1:9092', OUTBOX_TABLE: table };
    const res = await runCli(['migrate'], { ...env, OUTBOX_PARTITION_WIDTH: '6 hours' });
    assert.equal(res.code, 0, res.stderr);
    assert.deepEqual(res.summary, { table, applied: loadMigrations().map((m) => m.version), alreadyApplied: [], partitions: { created: 8, dropped: 0, busy: 0 } });
    const bounds = (await partitionsOf(outboxTableOf(table))).filter((p) => p.bound !== 'DEFAULT');
    const [width] = await sql.unsafe<{ s: number }[]>(
      `SELECT DISTINCT extract(epoch FROM (substring($1 FROM 'TO \\(''([^'']+)''\\)'))::timestamptz - (substring($1 FROM 'FROM \\(''([^'']+)''\\)'))::timestamptz)::int AS s`,
      [bounds[0]!.bound],
    );
    assert.equal(width!.s, 6 * 3_600);
    const bad = await runCli(['migrate'], { ...env, OUTBOX_TABLE: uniqueName('pcli'), OUTBOX_PARTITION_WIDTH: '1 month' });
    assert.equal(bad.code, 2, bad.stderr);
    assert.match(bad.stderr, /OUTBOX_PARTITION_WIDTH="1 month" is not a partition width/);
  });

  it('run again with another width: no partition of the new width over a range the old ones cover, and no lock asked for', async () => {
    const f = await partitioned('pwidth');
    const before = await partitionsOf(outboxTableOf(f.table));
    const again = await migrate(sql, parseTableName(f.table), undefined, { partitionWidthS: 6 * 3_600 });
    assert.deepEqual(again.partitions, { created: 0, dropped: 0, busy: 0 }, 'the days made cover the next 6-hour widths');
    assert.deepEqual(await partitionsOf(outboxTableOf(f.table)), before);
  });

  it('refuses to partition a plain table that exists, and changes nothing', async () => {
    // under TEST_OUTBOX_SHAPE=partitioned the fixture's outbox is partitioned by hand: its sent table is still plain
    const f = await fixture(sql, 'prefuse');
    const kinds = () => sql.unsafe<{ kind: string }[]>(`SELECT relkind::text AS kind FROM pg_class WHERE oid IN ($1::regclass, $2::regclass) ORDER BY relname`, [outboxTableOf(f.table), sentTableOf(f.table)]);
    const before = [...(await kinds())];
    await assert.rejects(migrate(sql, parseTableName(f.table), undefined, { partitionWidthS: DAY_S }), /OUTBOX_PARTITION_WIDTH is set and ("[^"]+" and )?"[^"]+" (is a plain table|are plain tables): migrate makes an outbox partitioned only when it creates it/);
    assert.deepEqual([...(await kinds())], before);
    assert.ok(before.some((k) => k.kind === 'r'));
  });
});

describe('relaying a partitioned outbox', () => {
  it('two concurrent warm relays: every row once on Kafka, in order per aggregate, each moved once, from today\'s, a later and the DEFAULT partition', async () => {
    const f = await partitioned('prelay');
    const n = 3_000;
    const ids = await insertEvents(sql, f.table, Array.from({ length: n }, (_, i) => ({ aggregateid: `agg-${i % 40}`, payload: { i } })));
    // rows of a later day and rows no partition covers (they go to the DEFAULT partition), seq after the others
    await sql.unsafe(`INSERT INTO ${outboxTableOf(f.table)} (aggregatetype, aggregateid, type, payload, created_at)
      SELECT 'order', 'agg-' || (i % 40), 'Happened', jsonb_build_object('i', i), CASE WHEN i % 2 = 0 THEN now() + interval '2 days' ELSE now() - interval '30 days' END
      FROM generate_series(${n}, ${n + 199}) i`);
    const [spread] = await sql.unsafe<{ parts: number; in_default: number }[]>(
      `SELECT count(DISTINCT tableoid)::int AS parts, count(*) FILTER (WHERE tableoid = $1::regclass)::int AS in_default FROM ${outboxTableOf(f.table)}`,
      [`"${f.table}_default"`],
    );
    assert.deepEqual(spread, { parts: 3, in_default: 100 });
    const total = n + 200;
    const env = { ...f.env, OUTBOX_BATCH_SIZE: '100' };
    const relays = [warm(env), warm(env)];
    try {
      const drain = async (rt: Runtime) => {
        let published = 0;
        for (let i = 0; i < 30; i++) {
          const [r] = await sql.unsafe<{ left: number }[]>(`SELECT count(*)::int AS left FROM ${outboxTableOf(f.table)}`);
          if (r!.left === 0) break;
          published += (await rt.invoke(5_000)).published;
        }
        return published;
      };
      const published = await Promise.all(relays.map(drain));
      assert.ok(published.every((n) => n > 0), `both relays published: ${published.join(', ')}`);
    } finally {
      await Promise.all(relays.map((r) => r.close()));
    }
    const [moved] = await sql.unsafe<{ rows: number; ids: number }[]>(`SELECT count(*)::int AS rows, count(DISTINCT id)::int AS ids FROM ${sentTableOf(f.table)}`);
    assert.deepEqual(moved, { rows: total, ids: total }, 'each row moved once');
    const msgs = await consumeAll([f.topic('order')], total, 60_000);
    const copies = copiesById(msgs);
    assert.equal(copies.size, total);
    assert.ok([...copies.values()].every((c) => c === 1), 'every row once on Kafka');
    assert.ok(ids.every((id) => copies.has(id)));
    const seqs = await seqsById(sql, f.table);
    for (const [key, order] of firstCopyOrder(msgs, (id) => seqs.get(id)!)) assert.ok(isSorted(order), `aggregate ${key} in seq order`);
  });
});

describe('partition maintenance', () => {
  /** Rows in the sent table at these sent_at (as SQL expressions). */
  async function sentRows(f: Fixture, sentAt: string[]): Promise<void> {
    for (const at of sentAt) {
      await sql.unsafe(`INSERT INTO ${sentTableOf(f.table)} (id, aggregatetype, aggregateid, type, seq, created_at, sent_at, attempts)
        VALUES (gen_random_uuid(), 'order', 'a', 'Happened', 0, ${at}, ${at}, 0)`);
    }
  }

  it('retention drops the sent partitions wholly older than OUTBOX_RETAIN_SENT_MS, and no row of the others (not even one older than the window), nor the DEFAULT one\'s', async () => {
    const f = await partitioned('pretain');
    const s = sentTableOf(f.table);
    await handPartition(s, `${f.table}_old`, -3, -2);
    await handPartition(s, `${f.table}_yesterday`, -1, 0);
    const today = await dayStart(0);
    await sentRows(f, [
      `'${await dayStart(-3)}'::timestamptz + interval '1 hour'`, // the old partition
      `'${today}'::timestamptz - interval '1 second'`, // yesterday's: older than the window, its partition not
      'now()', // today's
      `now() - interval '30 days'`, // no partition: the DEFAULT one
    ]);
    const logs: string[] = [];
    const summary = await invokeOnce({ ...f.env, OUTBOX_RETAIN_SENT_MS: String(DAY_MS) }, logs);
    assert.equal(await exists(`${f.table}_old`), false, 'the old partition dropped');
    assert.equal(await exists(`${f.table}_yesterday`), true, 'yesterday\'s kept: its upper bound is within the window');
    assert.equal(await exists(await partName(`${f.table}_sent`, 0)), true, 'today\'s kept');
    assert.equal(await exists(`${f.table}_sent_default`), true, 'the DEFAULT one kept');
    const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${s}`);
    assert.equal(r!.n, 3, 'only the old partition\'s row is gone: no row deleted one by one');
    assert.equal(summary.pruned, 0);
    assert.ok(logs.some((l) => l.includes('partitions maintained') && l.includes('"dropped":1')), logs.join('\n'));
  });

  it("drops the outbox's partitions before today's that hold no row, never one holding a parked row", async () => {
    const f = await partitioned('pold', ['order']);
    const t = outboxTableOf(f.table);
    await handPartition(t, `${f.table}_empty`, -3, -2);
    await handPartition(t, `${f.table}_parked`, -2, -1);
    await sql.unsafe(`INSERT INTO ${t} (aggregatetype, aggregateid, type, payload, created_at, attempts, parked_at)
      VALUES ('order', 'p', 'Happened', '{}', '${await dayStart(-2)}'::timestamptz + interval '1 hour', 10, now())`);
    await invokeOnce(f.env);
    assert.equal(await exists(`${f.table}_empty`), false, 'the empty old partition dropped');
    assert.equal(await exists(`${f.table}_parked`), true, 'the partition holding a parked row kept');
    const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t} WHERE parked_at IS NOT NULL`);
    assert.equal(r!.n, 1);
  });

  it('a relay role that owns nothing, with the documented grants, makes the partitions ahead and drops the old ones through the SECURITY DEFINER function; without EXECUTE it relays and warns', async () => {
    const f = await partitioned('prole');
    const t = outboxTableOf(f.table);
    const s = sentTableOf(f.table);
    const fn = `${render('{{partitions_fn}}', parseTableName(f.table))}(bigint)`;
    const role = uniqueName('relay_part');
    await admin.unsafe(`CREATE ROLE ${role} LOGIN PASSWORD 'pw'`);
    try {
      for (const g of [`GRANT SELECT, UPDATE, DELETE ON ${t} TO ${role}`, `GRANT SELECT, INSERT, DELETE ON ${s} TO ${role}`, `GRANT SELECT ON outbox_relay_migrations TO ${role}`]) {
        await admin.unsafe(g);
      }
      const env = { ...f.env, DATABASE_URL: DATABASE_URL.replace(/\/\/[^@]+@/, `//${role}:pw@`) };
      // tomorrow's partition missing (maintenance lagged), an old empty one left over
      const tomorrow = await partName(f.table, 1);
      await sql.unsafe(`DROP TABLE "${tomorrow}"`);
      await handPartition(t, `${f.table}_stale`, -3, -2);
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);

      const logs: string[] = [];
      assert.equal((await invokeOnce(env, logs)).published, 2, logs.join('\n'));
      const messages = logs.map((l) => (JSON.parse(l) as { message: string }).message);
      assert.ok(messages.some((m) => m.includes('may not EXECUTE its partition maintenance function') && m.includes(`GRANT EXECUTE ON FUNCTION ${fn} TO ${role}`)), logs.join('\n'));
      assert.equal(await exists(tomorrow), false, 'without EXECUTE nothing is made');

      await admin.unsafe(`GRANT EXECUTE ON FUNCTION ${fn} TO ${role}`);
      await insertEvents(sql, f.table, [{ aggregateid: 'c' }]);
      const logs2: string[] = [];
      assert.equal((await invokeOnce(env, logs2)).published, 1, logs2.join('\n'));
      assert.equal(await exists(tomorrow), true, 'the partition ahead made');
      assert.equal(await exists(`${f.table}_stale`), false, 'the old empty partition dropped');
      assert.ok(!logs2.some((l) => l.includes('"level":"WARN"') || l.includes('"level":"warn"')), logs2.join('\n'));
      // the role may not drop the partitions itself
      const relay = db(env.DATABASE_URL);
      try {
        await assert.rejects(relay.unsafe(`DROP TABLE "${f.table}_default"`), /must be owner/);
      } finally {
        await relay.end();
      }
    } finally {
      await admin.unsafe(`DROP OWNED BY ${role}`).catch(() => undefined);
      await admin.unsafe(`DROP ROLE IF EXISTS ${role}`);
    }
  });

  it('a lock not had within its lock_timeout (a claim in flight) leaves the partitions for the next call, which makes and drops them', async () => {
    const f = await partitioned('plock');
    const t = outboxTableOf(f.table);
    const fn = render('{{partitions_fn}}', parseTableName(f.table));
    await handPartition(t, `${f.table}_idle`, -3, -2);
    const tomorrow = await partName(f.table, 1);
    await sql.unsafe(`DROP TABLE "${tomorrow}"`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    // a claim's locks, held by an open transaction
    const claim = await sql.reserve();
    try {
      await claim`BEGIN`;
      await claim.unsafe(`SELECT 1 FROM ${t} FOR UPDATE SKIP LOCKED`);
      const started = Date.now();
      const [busy] = await sql.unsafe<{ done: string }[]>(`SELECT ${fn}(NULL)::text AS done`);
      const waitedMs = Date.now() - started;
      // tomorrow's and the two after it (one wait: the parent held for one is held for the next), and the drop
      assert.deepEqual(JSON.parse(busy!.done), { created: 0, dropped: 0, busy: 4 });
      assert.ok(waitedMs >= 350 && waitedMs < 1_000, `waited ${waitedMs} ms: twice its lock_timeout (200 ms), not the claim's end`);
      assert.equal(await exists(`${f.table}_idle`), true);
    } finally {
      await claim`ROLLBACK`;
      claim.release();
    }
    const [done] = await sql.unsafe<{ done: string }[]>(`SELECT ${fn}(NULL)::text AS done`);
    assert.deepEqual(JSON.parse(done!.done), { created: 1, dropped: 1, busy: 0 });
    assert.equal(await exists(`${f.table}_idle`), false);
    assert.equal(await exists(tomorrow), true);
  });

  it('a maintenance that fails is a warning: the invocation relays every row', async () => {
    const f = await partitioned('pfail');
    const fn = render('{{partitions_fn}}', parseTableName(f.table));
    await sql.unsafe(`CREATE OR REPLACE FUNCTION ${fn}(retain_sent_ms bigint) RETURNS jsonb LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'maintenance broken'; END $$`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }, { aggregateid: 'a' }]);
    const logs: string[] = [];
    const summary = await invokeOnce(f.env, logs);
    assert.equal(summary.published, 3);
    assert.ok(logs.some((l) => l.includes('maintaining the partitions failed') && l.includes('maintenance broken')), logs.join('\n'));
    const [r] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${sentTableOf(f.table)}`);
    assert.equal(r!.n, 3);
  });

  it('calls at once (fan-out helpers, warm relays, migrate) never fail each other: one makes the partitions, the others find them made or leave them', async () => {
    const f = await partitioned('pmany');
    const fn = render('{{partitions_fn}}', parseTableName(f.table));
    for (let round = 0; round < 5; round++) {
      await sql.unsafe(`DROP TABLE "${await partName(f.table, 1)}", "${await partName(`${f.table}_sent`, 2)}"`);
      await handPartition(outboxTableOf(f.table), `${f.table}_gone`, -3, -2);
      const pool = db();
      try {
        const answers = await Promise.all(Array.from({ length: 6 }, () => pool.unsafe<{ done: string }[]>(`SELECT ${fn}(${DAY_MS})::text AS done`)));
        const done = answers.map(([r]) => JSON.parse(r!.done) as { created: number; dropped: number; busy: number });
        assert.equal(done.reduce((n, d) => n + d.created, 0), 2, JSON.stringify(done));
        assert.equal(done.reduce((n, d) => n + d.dropped, 0), 1, JSON.stringify(done));
      } finally {
        await pool.end();
      }
      assert.equal(await exists(await partName(f.table, 1)), true);
      assert.equal(await exists(`${f.table}_gone`), false);
    }
  });

  it('no window, however given, reaches the current sent partition or those ahead', async () => {
    const f = await partitioned('pwindow');
    const fn = render('{{partitions_fn}}', parseTableName(f.table));
    const before = await partitionsOf(sentTableOf(f.table));
    for (const ms of [0, -30 * DAY_MS]) {
      const [r] = await sql.unsafe<{ done: string }[]>(`SELECT ${fn}(${ms})::text AS done`);
      assert.deepEqual(JSON.parse(r!.done), { created: 0, dropped: 0, busy: 0 }, String(ms));
    }
    assert.deepEqual(await partitionsOf(sentTableOf(f.table)), before);
  });

  it('costs one round trip when there is nothing to do', async () => {
    const f = await partitioned('pcost');
    const fn = render('{{partitions_fn}}', parseTableName(f.table));
    const conn: Sql = sql;
    await conn.unsafe(`SELECT ${fn}(${DAY_MS})`);
    const started = performance.now();
    const runs = 200;
    for (let i = 0; i < runs; i++) {
      const [r] = await conn.unsafe<{ done: string }[]>(`SELECT ${fn}(${DAY_MS})::text AS done`);
      assert.equal(r!.done, '{"busy": 0, "created": 0, "dropped": 0}');
    }
    const perCallMs = (performance.now() - started) / runs;
    console.log(`partition maintenance with nothing to do: ${perCallMs.toFixed(3)} ms per call (round trip included)`);
    assert.ok(perCallMs < 20, `${perCallMs} ms`);
  });
});
