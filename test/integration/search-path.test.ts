// services: postgres
// The outbox's trigger functions run with a fixed search_path (001_baseline.sql, at its end): a role that
// writes to the outbox with a search_path of its own, naming first a schema that holds a table or
// function of the same name, cannot make the unwait trigger update that table instead of the
// outbox, nor the insert trigger call that function instead of pg_notify.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { migrate } from '../../src/outbox/migrate.ts';
import { notifyChannel, parseTableName, qualified, quoteIdent } from '../../src/outbox/identifier.ts';
import { db, fileDb, uniqueName } from './helpers.ts';

const sql = fileDb();

/** An outbox in public, and a schema of the caller's holding a table of the same name. */
async function setUp(prefix: string): Promise<{ name: string; t: string; evil: string; cleanUp(): Promise<void> }> {
  const name = uniqueName(prefix);
  const table = parseTableName(name);
  await migrate(sql, table);
  const evil = quoteIdent(uniqueName('hostile'));
  await sql.unsafe(`CREATE SCHEMA ${evil}`);
  return {
    name,
    t: qualified(table),
    evil,
    cleanUp: async () => {
      await sql.unsafe(`DROP SCHEMA ${evil} CASCADE`);
      await sql.unsafe(`DROP TABLE ${qualified(table)}, ${quoteIdent(`${name}_sent`)}`);
    },
  };
}

describe('trigger functions resolve names through their own search_path, not the caller\'s', () => {
  it('are created with search_path pg_catalog, the table\'s schema, pg_temp (unqualified and schema-qualified tables)', async () => {
    const plain = uniqueName('sp_plain');
    const schema = uniqueName('sp_schema');
    await migrate(sql, parseTableName(plain));
    await migrate(sql, parseTableName(`${schema}.tbl`));
    try {
      const rows = await sql<{ proname: string; config: string[] }[]>`
        SELECT proname, proconfig AS config FROM pg_proc
        WHERE (pronamespace = 'public'::regnamespace AND proname LIKE ${`${plain}%`}) OR pronamespace = ${schema}::regnamespace
        ORDER BY proname`;
      assert.equal(rows.length, 4, rows.map((r) => r.proname).join());
      for (const r of rows) {
        const expected = r.proname.startsWith(plain) ? 'public' : schema;
        assert.deepEqual(r.config, [`search_path=pg_catalog, ${expected}, pg_temp`], r.proname);
      }
    } finally {
      await sql.unsafe(`DROP TABLE ${quoteIdent(plain)}, ${quoteIdent(`${plain}_sent`)}`);
      await sql.unsafe(`DROP SCHEMA ${quoteIdent(schema)} CASCADE`);
    }
  });

  it('the unwait trigger clears the outbox\'s waiting marks, not those of a same-named table earlier on the caller\'s search_path', async () => {
    const s = await setUp('sp_unwait');
    try {
      // aggregate a: a failed row, and a later row waiting behind it
      await sql.unsafe(`INSERT INTO ${s.t} (aggregatetype, aggregateid, type, attempts) VALUES ('order', 'a', 'T', 1)`);
      await sql.unsafe(`INSERT INTO ${s.t} (aggregatetype, aggregateid, type, waiting) VALUES ('order', 'a', 'T', true)`);
      // the caller's own table of the same name, with a waiting row of aggregate a too
      await sql.unsafe(`CREATE TABLE ${s.evil}.${quoteIdent(s.name)} (LIKE ${s.t})`);
      await sql.unsafe(`INSERT INTO ${s.evil}.${quoteIdent(s.name)} (id, aggregatetype, aggregateid, type, seq, created_at, attempts, next_attempt_at, waiting)
                        VALUES (gen_random_uuid(), 'order', 'a', 'T', 1, now(), 0, now(), true)`);

      // the failed row is reset by a session whose search_path names the caller's schema first
      await sql.begin(async (tx) => {
        await tx.unsafe(`SET LOCAL search_path = ${s.evil}, public`);
        await tx.unsafe(`UPDATE public.${quoteIdent(s.name)} SET attempts = 0 WHERE attempts = 1`);
      });

      const outbox = await sql.unsafe<{ waiting: boolean }[]>(`SELECT waiting FROM ${s.t} ORDER BY seq`);
      assert.deepEqual(outbox.map((r) => r.waiting), [false, false], "the outbox's mark is cleared");
      const theirs = await sql.unsafe<{ waiting: boolean }[]>(`SELECT waiting FROM ${s.evil}.${quoteIdent(s.name)}`);
      assert.deepEqual(theirs.map((r) => r.waiting), [true], "the caller's table is not touched");
    } finally {
      await s.cleanUp();
    }
  });

  it('the insert trigger calls pg_catalog.pg_notify, not a pg_notify of the caller\'s placed before pg_catalog', async () => {
    const s = await setUp('sp_notify');
    const listener = db();
    const heard: string[] = [];
    try {
      await sql.unsafe(`CREATE TABLE ${s.evil}.calls (channel text)`);
      await sql.unsafe(`CREATE FUNCTION ${s.evil}.pg_notify(text, text) RETURNS void LANGUAGE sql AS $$ INSERT INTO ${s.evil}.calls VALUES ($1) $$`);
      await listener.listen(notifyChannel(parseTableName(s.name)), (payload) => heard.push(payload));

      await sql.begin(async (tx) => {
        await tx.unsafe(`SET LOCAL search_path = ${s.evil}, pg_catalog, public`);
        await tx.unsafe(`INSERT INTO public.${quoteIdent(s.name)} (aggregatetype, aggregateid, type) VALUES ('order', 'a', 'T')`);
      });

      const deadline = Date.now() + 5_000;
      while (heard.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      assert.equal(heard.length, 1, 'the notification reached the channel');
      const calls = await sql.unsafe<{ n: number }[]>(`SELECT count(*)::int AS n FROM ${s.evil}.calls`);
      assert.equal(calls[0]!.n, 0, "the caller's pg_notify was never called");
    } finally {
      await listener.end();
      await s.cleanUp();
    }
  });
});
