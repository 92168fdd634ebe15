// services: postgres, kafka
// What the relay checks before it claims anything (OutboxStore.checkTables, src/outbox/schema-check.ts):
// the migrations it was built for and the privileges its OUTBOX_SENT_ROWS mode needs, once per
// client, in one statement; and retention, which prunes every place it can reach. Each against the
// real database, with roles granted exactly what each case says, invoked as warm Runtimes.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config/load.ts';
import { DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { dropOutbox, loadMigrations, migrate, render } from '../../src/outbox/migrate.ts';
import type { Summary } from '../../src/loop/invocation.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { ADMIN_DATABASE_URL, DATABASE_URL, db, fixture, insertEvents, runCli, sentTableOf, topicCount, uniqueName, type Fixture } from './helpers.ts';

let sql: Sql;
let admin: Sql;
before(() => {
  sql = db();
  admin = db(ADMIN_DATABASE_URL);
});
after(async () => {
  await Promise.all([sql.end(), admin.end()]);
});

/** what `migrate` records, which the relay reads (README, "The relay's database role") */
const READ_MIGRATIONS = 'GRANT SELECT ON outbox_relay_migrations TO {role}';

interface Role {
  name: string;
  /** the fixture's env, connecting as this role (directly: a role of its own is not in the pooler's auth file) */
  env(f: Fixture, extra?: Record<string, string>): Record<string, string>;
  drop(): Promise<void>;
}

async function createRole(grants: string[]): Promise<Role> {
  const name = uniqueName('relay_check');
  await admin.unsafe(`CREATE ROLE ${name} LOGIN PASSWORD 'pw'`);
  for (const g of grants) await admin.unsafe(g.replaceAll('{role}', name));
  return {
    name,
    env: (f, extra = {}) => ({ ...f.env, DATABASE_URL: DATABASE_URL.replace(/\/\/[^@]+@/, `//${name}:pw@`), DATABASE_PREPARE: 'true', ...extra }),
    drop: async () => {
      await admin.unsafe(`DROP OWNED BY ${name}`).catch(() => undefined);
      await admin.unsafe(`DROP ROLE IF EXISTS ${name}`);
    },
  };
}

/** One invocation in a Runtime of its own; its warnings and errors (JSON lines) go to `logs`. */
async function invoke(env: Record<string, string>, logs: string[] = []): Promise<Summary> {
  const rt = new Runtime(loadConfig({ ...env, OUTBOX_LOG_LEVEL: 'warn' }), createLogger('warn', {}, (l) => logs.push(l)));
  try {
    return await rt.invoke(20_000);
  } finally {
    await rt.close();
  }
}

/** The invocation is refused with a DatabaseError no retry fixes, whose message contains every one of `parts`. */
async function refused(env: Record<string, string>, parts: string[]): Promise<string> {
  let message = '';
  await assert.rejects(invoke(env), (err: unknown) => {
    assert.ok(err instanceof DatabaseError, String(err));
    assert.equal(err.retriable, false);
    message = err.message;
    for (const p of parts) assert.ok(message.includes(p), `expected ${JSON.stringify(p)} in:\n${message}`);
    return true;
  });
  return message;
}

/** Nothing was claimed: nothing reached the topic, every row is pending and was never charged. */
async function untouched(f: Fixture, rows: number): Promise<void> {
  assert.equal(await topicCount([f.topic('order')]), 0, 'nothing was published');
  const [r] = await sql.unsafe<{ pending: number; charged: number }[]>(
    `SELECT count(*) FILTER (WHERE sent_at IS NULL)::int AS pending, count(*) FILTER (WHERE attempts > 0)::int AS charged FROM ${qualified(parseTableName(f.table))}`,
  );
  assert.deepEqual(r, { pending: rows, charged: 0 });
}

describe('checkTables: the grants the mode needs', () => {
  for (const mode of ['keep', 'delete'] as const) {
    it(`G8 (G2: no batch published again and again): OUTBOX_SENT_ROWS=${mode}, a role without DELETE on the outbox fails before claiming, naming the role, the table and the GRANT; granted, it relays`, async () => {
      const f = await fixture(sql, `nodel${mode}`);
      const t = qualified(parseTableName(f.table));
      const role = await createRole([`GRANT SELECT, UPDATE ON ${t} TO {role}`, `GRANT SELECT, INSERT, DELETE ON ${sentTableOf(f.table)} TO {role}`, READ_MIGRATIONS]);
      try {
        await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
        const env = role.env(f, { OUTBOX_SENT_ROWS: mode });
        const message = await refused(env, [`the database role ${role.name} lacks DELETE on the outbox table ${t}`, `: GRANT DELETE ON ${t} TO ${role.name}`]);
        assert.doesNotMatch(message, /\n/, 'one problem, one line');
        await untouched(f, 2);

        await admin.unsafe(`GRANT DELETE ON ${t} TO ${role.name}`);
        assert.equal((await invoke(env)).published, 2);
        assert.equal(await topicCount([f.topic('order')]), 2, 'each row once');
      } finally {
        await role.drop();
      }
    });
  }

  it('G8: keep mode, a role that may not INSERT into the sent table fails before claiming with the GRANT of exactly that; granted, it relays', async () => {
    const f = await fixture(sql, 'noinsert');
    const t = qualified(parseTableName(f.table));
    const sent = sentTableOf(f.table);
    const role = await createRole([`GRANT SELECT, UPDATE, DELETE ON ${t} TO {role}`, `GRANT SELECT, DELETE ON ${sent} TO {role}`, READ_MIGRATIONS]);
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      const message = await refused(role.env(f), [`the database role ${role.name} may not INSERT into the sent table ${sent}, where acked rows are moved: GRANT INSERT ON ${sent} TO ${role.name}`]);
      assert.ok(!message.includes('retention'), 'retention has what it needs there: not asked for');
      await untouched(f, 2);

      await admin.unsafe(`GRANT INSERT ON ${sent} TO ${role.name}`);
      assert.equal((await invoke(role.env(f))).published, 2);
    } finally {
      await role.drop();
    }
  });

  it('G8 (G2): a role granted UPDATE on some columns of the outbox only fails before claiming, naming the columns it lacks and the GRANT of exactly those; granted, it relays and records a failed row', async () => {
    const f = await fixture(sql, 'somecols');
    const t = qualified(parseTableName(f.table));
    const sent = sentTableOf(f.table);
    const role = await createRole([`GRANT SELECT, DELETE ON ${t} TO {role}`, `GRANT UPDATE (attempts, next_attempt_at) ON ${t} TO {role}`, `GRANT SELECT, INSERT, DELETE ON ${sent} TO {role}`, READ_MIGRATIONS]);
    try {
      // two rows to send, and one that fails (an illegal topic): recording it needs the UPDATE of last_error and parked_at
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }, { aggregateid: 'c', topic: `${f.prefix}.illegal!` }]);
      const env = role.env(f, { OUTBOX_MAX_ATTEMPTS: '1' });
      const lacking = 'last_error, parked_at, waiting';
      await refused(env, [
        `the database role ${role.name} has UPDATE on some columns of the outbox table ${t} only, and lacks it on last_error, parked_at and waiting`,
        `: GRANT UPDATE (${lacking}) ON ${t} TO ${role.name}`,
      ]);
      await untouched(f, 3);

      await admin.unsafe(`GRANT UPDATE (${lacking}) ON ${t} TO ${role.name}`);
      const s = await invoke(env);
      assert.deepEqual([s.published, s.parked], [2, 1], JSON.stringify(s));
    } finally {
      await role.drop();
    }
  });

  it('G8: a role that may not read outbox_relay_migrations, and lacks UPDATE too: one failure before claiming names both GRANTs', async () => {
    const f = await fixture(sql, 'nomigread');
    const t = qualified(parseTableName(f.table));
    const role = await createRole([`GRANT SELECT, DELETE ON ${t} TO {role}`, `GRANT SELECT, INSERT, DELETE ON ${sentTableOf(f.table)} TO {role}`]);
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
      const message = await refused(role.env(f), [
        `the relay cannot run against the outbox table ${t} until these are fixed:`,
        `GRANT SELECT ON outbox_relay_migrations TO ${role.name}`,
        `GRANT UPDATE ON ${t} TO ${role.name}`,
      ]);
      assert.equal(message.split('\n  - ').length, 3, message);
      await untouched(f, 1);

      await admin.unsafe(`GRANT UPDATE ON ${t} TO ${role.name}`);
      await admin.unsafe(READ_MIGRATIONS.replace('{role}', role.name));
      assert.equal((await invoke(role.env(f))).published, 1);
    } finally {
      await role.drop();
    }
  });

  it('G8: a role that may not use the outbox\'s schema fails before claiming with the GRANT USAGE (the lookup that would raise is not run); granted, it relays', async () => {
    const f = await fixture(sql, 'inschema');
    const schema = uniqueName('chk');
    const table = parseTableName(`${schema}.events`);
    await migrate(sql, table);
    const t = qualified(table);
    const role = await createRole([`GRANT SELECT, UPDATE, DELETE ON ${t} TO {role}`, `GRANT SELECT, INSERT, DELETE ON ${sentTableOf(`${schema}.events`)} TO {role}`, READ_MIGRATIONS]);
    try {
      await insertEvents(sql, `${schema}.events`, [{ aggregateid: 'a' }]);
      const env = role.env(f, { OUTBOX_TABLE: `${schema}.events` });
      const message = await refused(env, [`the database role ${role.name} may not use the schema ${schema} of the outbox table ${t}: GRANT USAGE ON SCHEMA ${schema} TO ${role.name}`]);
      assert.doesNotMatch(message, /\n/, 'nothing else: the tables are not looked up');

      await admin.unsafe(`GRANT USAGE ON SCHEMA ${schema} TO ${role.name}`);
      assert.equal((await invoke(env)).published, 1);
    } finally {
      await role.drop();
    }
  });
});

describe('checkTables: the migrations the relay was built for', () => {
  it('G8: an outbox without a migration this relay ships is refused before claiming, naming it and `outbox-relay migrate`; after that command, it relays', async () => {
    const f = await fixture(sql, 'oldschema');
    const table = parseTableName(f.table);
    const shipped = loadMigrations();
    const last = shipped.at(-1)!;
    // a schema that lacks the relay's last migration: the ones before it and one it does not
    // know recorded (with a single migration shipped, only the one it does not know)
    await dropOutbox(sql, table);
    await migrate(sql, table, [...shipped.slice(0, -1), { version: last.version + 1, name: `${last.version + 1}_from_another_branch.sql`, sql: 'SELECT 1' }]);
    await sql.unsafe(render(last.sql, table));
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    await refused(f.env, [`the outbox table ${qualified(table)} lacks migration ${last.version} (${last.name})`, 'run `outbox-relay migrate`']);
    await untouched(f, 2);

    const migrated = await runCli(['migrate'], f.env);
    assert.equal(migrated.code, 0, migrated.stderr);
    assert.equal((await invoke(f.env)).published, 2);
  });

  it('G8: a table made by hand (no migration recorded for it) is refused before claiming, saying to run `outbox-relay migrate`, which then records them: it relays', async () => {
    const f = await fixture(sql, 'byhand');
    await sql`DELETE FROM outbox_relay_migrations WHERE target = ${f.table}`;
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    await refused(f.env, [`no migration of the outbox table ${qualified(parseTableName(f.table))} is recorded in outbox_relay_migrations`, 'Run `outbox-relay migrate`']);
    await untouched(f, 1);

    const migrated = await runCli(['migrate'], f.env);
    assert.equal(migrated.code, 0, migrated.stderr);
    assert.equal((await invoke(f.env)).published, 1);
  });

  it('G8: a table without the size check of a column (made by hand, or by an older migrate) is refused before claiming, naming the column; with the check back, it relays', async () => {
    const f = await fixture(sql, 'nosizecheck');
    const table = qualified(parseTableName(f.table));
    const constraint = `${parseTableName(f.table).name}_topic_max_249_chars`;
    await sql.unsafe(`ALTER TABLE ${table} DROP CONSTRAINT ${constraint}`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    await refused(f.env, [`the outbox table ${table} bounds no size of topic (no CHECK constraint names it)`, 'docs/schema.md']);
    await untouched(f, 1);

    await sql.unsafe(`ALTER TABLE ${table} ADD CONSTRAINT ${constraint} CHECK (char_length(topic) <= 249) NOT VALID`);
    assert.equal((await invoke(f.env)).published, 1);
  });

  it('G8: a placed column the table lacks is refused before claiming, named with its setting; added, it relays', async () => {
    const f = await fixture(sql, 'placedcolumn');
    const table = qualified(parseTableName(f.table));
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const env = { ...f.env, OUTBOX_ADDITIONAL_PLACEMENT: 'type:header:type,tenant:header:tenant' };
    await refused(env, [`the outbox table ${table} has no column tenant that the role`, 'OUTBOX_ADDITIONAL_PLACEMENT', 'GRANT SELECT (tenant)']);
    await untouched(f, 1);

    await sql.unsafe(`ALTER TABLE ${table} ADD COLUMN tenant text`);
    assert.equal((await invoke(env)).published, 1);
  });

  it('a schema newer than the relay (a rolling deploy: the next version migrated first, this one still runs) is accepted: it relays', async () => {
    const f = await fixture(sql, 'newer');
    const next = Math.max(...loadMigrations().map((m) => m.version)) + 1;
    await sql`INSERT INTO outbox_relay_migrations (target, version, name) VALUES (${f.table}, ${next}, ${`${next}_from_the_future.sql`})`;
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    assert.equal((await invoke(f.env)).published, 1);
  });
});

/** Nothing moved: nothing reached the topic, the sent table is empty, `rows` are pending (children's too) and never charged. */
async function unmoved(f: Fixture, rows: number, outbox = qualified(parseTableName(f.table))): Promise<void> {
  assert.equal(await topicCount([f.topic('order')]), 0, 'nothing was published');
  const [r] = await sql.unsafe<{ pending: number; charged: number; sent: number }[]>(
    `SELECT count(*) FILTER (WHERE sent_at IS NULL)::int AS pending, count(*) FILTER (WHERE attempts > 0)::int AS charged,
            (SELECT count(*)::int FROM ${sentTableOf(f.table)}) AS sent FROM ${outbox}`,
  );
  assert.deepEqual(r, { pending: rows, charged: 0, sent: 0 });
}

describe('checkTables: what the tables are', () => {
  for (const kind of ['VIEW', 'MATERIALIZED VIEW'] as const) {
    it(`G8: an outbox that is a ${kind.toLowerCase()} over the table is refused before claiming, naming the kind and OUTBOX_TABLE; pointed at the table, it relays`, async () => {
      const f = await fixture(sql, kind === 'VIEW' ? 'isview' : 'ismatview');
      const t = qualified(parseTableName(f.table));
      const base = `${f.table}_base`;
      await sql.unsafe(`ALTER TABLE ${t} RENAME TO ${base}`);
      await insertEvents(sql, base, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      await sql.unsafe(`CREATE ${kind} ${t} AS SELECT * FROM ${base}`);
      const message = await refused(f.env, [`the outbox table ${t} is a ${kind.toLowerCase()}, not a table`, 'Set OUTBOX_TABLE to the table itself']);
      assert.doesNotMatch(message, /\n/, 'one problem: the size checks a view cannot have are not said');
      await unmoved(f, 2, base);

      await sql.unsafe(`DROP ${kind} ${t}`);
      await sql.unsafe(`ALTER TABLE ${base} RENAME TO ${t}`);
      assert.equal((await invoke(f.env)).published, 2);
    });
  }

  it('G8: an outbox that is a foreign table (postgres_fdw) is refused before claiming, naming the kind', async () => {
    // postgres_fdw ships with the server package that scripts/services installs (Debian's postgresql-15)
    const [available] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_available_extensions WHERE name = 'postgres_fdw'`;
    assert.equal(available!.n, 1, 'postgres_fdw is not available: install the server package with its contrib modules');
    // left installed: other test files never look at it, and dropping it could race another run
    await admin.unsafe('CREATE EXTENSION IF NOT EXISTS postgres_fdw').catch((err: { code?: string }) => {
      if (err.code !== '23505' && err.code !== '42710') throw err;
    });
    const f = await fixture(sql, 'isforeign');
    const table = qualified(parseTableName(f.table));
    const base = `${f.table}_base`;
    const server = uniqueName('chk_fdw');
    await sql.unsafe(`ALTER TABLE ${table} RENAME TO ${base}`);
    await insertEvents(sql, base, [{ aggregateid: 'a' }]);
    await admin.unsafe(`CREATE SERVER ${server} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (dbname 'outbox')`);
    try {
      await admin.unsafe(`CREATE FOREIGN TABLE ${table} (id uuid, aggregatetype text, aggregateid text, type text, payload jsonb, seq bigint) SERVER ${server} OPTIONS (table_name '${base}')`);
      await admin.unsafe(`GRANT SELECT, UPDATE, DELETE ON ${table} TO outbox`);
      await refused(f.env, [`the outbox table ${table} is a foreign table, not a table`]);
      await unmoved(f, 1, base);
    } finally {
      await admin.unsafe(`DROP SERVER ${server} CASCADE`);
    }
  });

  it('G8 (G1: no rows lost): an outbox with an inheritance child and a sent table with one are refused before claiming, each named with its ALTER TABLE … NO INHERIT; detached, it relays the outbox\'s rows and leaves the child\'s', async () => {
    const f = await fixture(sql, 'haschild');
    const t = qualified(parseTableName(f.table));
    const sent = sentTableOf(f.table);
    const child = `${f.table}_child`;
    const sentChild = `${f.table}_sentchild`;
    await sql.unsafe(`CREATE TABLE ${child} () INHERITS (${t})`);
    await sql.unsafe(`CREATE TABLE ${sentChild} () INHERITS (${sent})`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    // the child's first row has the ctid (0,1), as the outbox's first row has
    await sql.unsafe(`INSERT INTO ${child} (aggregatetype, aggregateid, type, payload, seq) VALUES ('order', 'c', 'Happened', '{}', 1000000)`);
    const message = await refused(f.env, [
      `the outbox table ${t} has inheritance child ${child}:`,
      `ALTER TABLE ${child} NO INHERIT ${t}`,
      `the sent table ${sent} has inheritance child ${sentChild}:`,
      `ALTER TABLE ${sentChild} NO INHERIT ${sent}`,
    ]);
    assert.equal(message.split('\n  - ').length, 3, message);
    await unmoved(f, 3);

    await sql.unsafe(`ALTER TABLE ${child} NO INHERIT ${t}`);
    await sql.unsafe(`ALTER TABLE ${sentChild} NO INHERIT ${sent}`);
    assert.equal((await invoke(f.env)).published, 2);
    const [left] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${child} WHERE sent_at IS NULL`);
    assert.equal(left!.n, 1, "the child's row is still there");
  });

  it('G8: an outbox that is itself an inheritance child is refused before claiming, naming the parent; detached, it relays', async () => {
    const f = await fixture(sql, 'ischild');
    const t = qualified(parseTableName(f.table));
    const parent = `${f.table}_parent`;
    await sql.unsafe(`CREATE TABLE ${parent} (aggregateid text NOT NULL)`);
    await sql.unsafe(`ALTER TABLE ${t} INHERIT ${parent}`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    await refused(f.env, [`the outbox table ${t} inherits from ${parent}:`, `ALTER TABLE ${t} NO INHERIT ${parent}`]);
    await unmoved(f, 1);

    await sql.unsafe(`ALTER TABLE ${t} NO INHERIT ${parent}`);
    assert.equal((await invoke(f.env)).published, 1);
  });

  it('G8 (G2): row-level security on the outbox with a SELECT policy only is refused before claiming, naming UPDATE and DELETE and the policy that fixes it; with policies USING (true) for them, it relays', async () => {
    const f = await fixture(sql, 'rlsselect');
    const t = qualified(parseTableName(f.table));
    const role = await createRole([`GRANT SELECT, UPDATE, DELETE ON ${t} TO {role}`, `GRANT SELECT, INSERT, DELETE ON ${sentTableOf(f.table)} TO {role}`, READ_MIGRATIONS]);
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      await sql.unsafe(`ALTER TABLE ${t} ENABLE ROW LEVEL SECURITY`);
      await sql.unsafe(`CREATE POLICY read_all ON ${t} FOR SELECT TO ${role.name} USING (true)`);
      const message = await refused(role.env(f), [
        `row-level security on the outbox table ${t} applies to the database role ${role.name}`,
        'no policy lets it UPDATE and DELETE every row',
        `CREATE POLICY outbox_relay ON ${t} FOR ALL TO ${role.name} USING (true) WITH CHECK (true), or ALTER ROLE ${role.name} BYPASSRLS`,
      ]);
      assert.doesNotMatch(message, /\n/, 'one problem');
      await unmoved(f, 2);

      await sql.unsafe(`CREATE POLICY update_all ON ${t} FOR UPDATE TO ${role.name} USING (true)`);
      await sql.unsafe(`CREATE POLICY delete_all ON ${t} FOR DELETE TO PUBLIC USING (true)`);
      assert.equal((await invoke(role.env(f))).published, 2);
      assert.equal(await topicCount([f.topic('order')]), 2, 'each row once');
    } finally {
      await role.drop();
    }
  });

  it('G8: row-level security on the sent table (keep mode) with a RESTRICTIVE policy is refused before claiming, naming the policy; without it (a permissive policy USING (true) left), it relays', async () => {
    const f = await fixture(sql, 'rlssent');
    const t = qualified(parseTableName(f.table));
    const sent = sentTableOf(f.table);
    const role = await createRole([`GRANT SELECT, UPDATE, DELETE ON ${t} TO {role}`, `GRANT SELECT, INSERT, DELETE ON ${sent} TO {role}`, READ_MIGRATIONS]);
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
      await sql.unsafe(`ALTER TABLE ${sent} ENABLE ROW LEVEL SECURITY`);
      await sql.unsafe(`CREATE POLICY all_rows ON ${sent} FOR ALL TO ${role.name} USING (true) WITH CHECK (true)`);
      await sql.unsafe(`CREATE POLICY recent_only ON ${sent} AS RESTRICTIVE FOR SELECT TO PUBLIC USING (sent_at > now() - interval '1 day')`);
      await refused(role.env(f), [`row-level security on the sent table ${sent} applies to the database role ${role.name}`, 'lets it SELECT every row', 'the RESTRICTIVE policy recent_only applies to it']);
      await unmoved(f, 1);

      await sql.unsafe(`DROP POLICY recent_only ON ${sent}`);
      assert.equal((await invoke(role.env(f))).published, 1);
    } finally {
      await role.drop();
    }
  });

  it('G8 (G2): a BEFORE DELETE trigger that returns NULL on the outbox is refused before claiming, naming it and the fix; the same function as an AFTER trigger is accepted: it relays', async () => {
    const f = await fixture(sql, 'beforedel');
    const t = qualified(parseTableName(f.table));
    const fn = `${f.table}_keep`;
    await sql.unsafe(`CREATE FUNCTION ${fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`);
    await sql.unsafe(`CREATE TRIGGER keep_rows BEFORE DELETE ON ${t} FOR EACH ROW EXECUTE FUNCTION ${fn}()`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
    await refused(f.env, [`the outbox table ${t} has BEFORE ROW trigger keep_rows (BEFORE DELETE)`, `make it an AFTER trigger, or drop it (DROP TRIGGER keep_rows ON ${t})`]);
    await unmoved(f, 2);

    await sql.unsafe(`DROP TRIGGER keep_rows ON ${t}`);
    await sql.unsafe(`CREATE TRIGGER keep_rows AFTER DELETE ON ${t} FOR EACH ROW EXECUTE FUNCTION ${fn}()`);
    assert.equal((await invoke(f.env)).published, 2);
    const [left] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${t}`);
    assert.equal(left!.n, 0, 'both marks deleted their rows');
  });

  it('G8 (G2): a DO INSTEAD NOTHING rule on the outbox\'s DELETE is refused before claiming, naming it and the fix; a rule on INSERT is not the relay\'s concern: dropped, it relays', async () => {
    const f = await fixture(sql, 'rule');
    const t = qualified(parseTableName(f.table));
    await sql.unsafe(`CREATE RULE keep_rows AS ON DELETE TO ${t} DO INSTEAD NOTHING`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    await refused(f.env, [`the outbox table ${t} has rule keep_rows on the relay's UPDATE or DELETE of its rows`, `DROP RULE keep_rows ON ${t}`]);
    await unmoved(f, 1);
    await sql.unsafe(`DROP RULE keep_rows ON ${t}`);
    assert.equal((await invoke(f.env)).published, 1);
  });

  it('an UNLOGGED outbox is accepted: it relays, and a warning that a crash empties it is logged once per client', async () => {
    const f = await fixture(sql, 'unlogged');
    const t = qualified(parseTableName(f.table));
    await sql.unsafe(`ALTER TABLE ${t} SET UNLOGGED`);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const logs: string[] = [];
    const rt = new Runtime(loadConfig({ ...f.env, OUTBOX_LOG_LEVEL: 'warn' }), createLogger('warn', {}, (l) => logs.push(l)));
    try {
      assert.equal((await rt.invoke(20_000)).published, 1);
      await insertEvents(sql, f.table, [{ aggregateid: 'b' }]);
      assert.equal((await rt.invoke(20_000)).published, 1, 'a warm invocation, same client');
    } finally {
      await rt.close();
    }
    const warnings = logs.map((l) => JSON.parse(l) as { level: string; message: string }).filter((l) => l.level === 'WARN');
    assert.deepEqual(
      warnings.map((w) => w.message),
      [`the outbox table ${t} is UNLOGGED: a crash of the database empties it, with every row not yet relayed (nor is it on a replica, so a failover loses them too). ALTER TABLE ${t} SET LOGGED`],
      logs.join('\n'),
    );
  });
});

describe('retention prunes what it can reach', () => {
  // delete mode: the role needs nothing on the sent table (README); keep mode: INSERT for the move,
  // without retention's SELECT and DELETE there, which is a warning, not a refusal
  for (const [mode, sentGrant] of [
    ['delete', undefined],
    ['keep', 'INSERT'],
  ] as const) {
    it(`G6 (one bad place blocks no other): OUTBOX_SENT_ROWS=${mode}, ${sentGrant ? `only ${sentGrant}` : 'no grant'} on the sent table, retention on: relays, prunes the skipped rows older than the window, warns once about the sent table`, async () => {
      const f = await fixture(sql, `prune${mode}`);
      const t = qualified(parseTableName(f.table));
      const sent = sentTableOf(f.table);
      const role = await createRole([`GRANT SELECT, UPDATE, DELETE ON ${t} TO {role}`, READ_MIGRATIONS, ...(sentGrant ? [`GRANT ${sentGrant} ON ${sent} TO {role}`] : [])]);
      try {
        const ids = await insertEvents(sql, f.table, Array.from({ length: 6 }, (_, i) => ({ aggregateid: `a-${i}` })));
        // three skipped two hours ago, one just now; two pending
        await sql.unsafe(`UPDATE ${t} SET skipped_at = now() - interval '2 hours' WHERE id = ANY($1::uuid[])`, [ids.slice(0, 3)]);
        await sql.unsafe(`UPDATE ${t} SET skipped_at = now() WHERE id = $1`, [ids[3]!]);
        // a row kept in the sent table before (a switch from keep mode): out of this role's reach
        await sql.unsafe(`INSERT INTO ${sent} (id, aggregatetype, aggregateid, type, seq, created_at, sent_at, attempts) VALUES (gen_random_uuid(), 'order', 'old', 'Happened', 0, now() - interval '2 days', now() - interval '2 days', 0)`);

        const logs: string[] = [];
        const s = await invoke(role.env(f, { OUTBOX_SENT_ROWS: mode, OUTBOX_RETAIN_SENT_MS: '3600000', OUTBOX_RETAIN_SKIPPED_MS: '3600000' }), logs);
        assert.equal(s.published, 2);
        assert.equal(s.pruned, 3, `the skipped rows older than the window:\n${logs.join('\n')}`);
        const left = await sql.unsafe<{ id: string }[]>(`SELECT id FROM ${t}`);
        assert.deepEqual(left.map((r) => r.id), [ids[3]], 'the row skipped just now stays');
        const [old] = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${sent} WHERE aggregateid = 'old'`);
        assert.equal(old!.n, 1, 'the sent table was out of reach');

        const warnings = logs.map((l) => JSON.parse(l) as { level: string; message: string; target?: string }).filter((l) => l.level === 'WARN');
        const aboutSent = warnings.filter((w) => w.message.startsWith('pruning the sent table failed'));
        assert.equal(aboutSent.length, 1, `one warning about the sent table:\n${logs.join('\n')}`);
        assert.equal(aboutSent[0]!.target, 'sent');
        assert.equal(warnings.length, 1, `no other warning:\n${logs.join('\n')}`);
      } finally {
        await role.drop();
      }
    });
  }
});
