// services: postgres
// Upgrades from every release's schema. A release's schema is made by the migration files it
// shipped, which are never edited once released: their SHA-256 is recorded here at each release,
// so an edit turns this red, and the schema is derived from the files themselves rather than from
// a copy that could drift from them unseen. Rows are written into it, as into a table in use, and
// today's `migrate` runs over it (a migration that works only on an empty table fails here); the catalog
// (columns, types, defaults, indexes, constraints, triggers, trigger functions, storage options)
// must end identical to a fresh migrate's. At a release: add its files and their hashes to RELEASES.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import { dropOutbox, loadMigrations, migrate } from '../../src/outbox/migrate.ts';
import { parseTableName, sentTable } from '../../src/outbox/identifier.ts';
import { fileDb, uniqueName } from './helpers.ts';

/** each release's migration files, by name, with their SHA-256 (`sha256sum src/outbox/migrations/*.sql`) */
const RELEASES: Record<string, Record<string, string>> = {
  '0.1.0': { '001_baseline.sql': '0173e9ab63979a07fbbb326bcd00c6d112b619f815950ddd26a9c26260456025' },
};

const sql = fileDb();

/** Everything migrate() makes for `table`, with the table's name replaced by T (two tables compare equal). */
async function catalog(table: string): Promise<unknown> {
  const [row] = await sql<{ catalog: Record<string, unknown> }[]>`
    WITH rels AS (SELECT unnest(ARRAY[${table}::regclass, ${sentTable(parseTableName(table)).name}::regclass]) AS oid)
    SELECT json_build_object(
      'columns', (SELECT json_agg(json_build_object('table', a.attrelid::regclass::text, 'name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
                    'not_null', a.attnotnull, 'default', pg_get_expr(d.adbin, d.adrelid), 'generated', a.attgenerated, 'identity', a.attidentity)
                    ORDER BY a.attrelid::regclass::text, a.attname)
                  FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                  WHERE a.attrelid IN (SELECT oid FROM rels) AND a.attnum > 0 AND NOT a.attisdropped),
      'indexes', (SELECT json_agg(pg_get_indexdef(i.indexrelid) ORDER BY pg_get_indexdef(i.indexrelid))
                  FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM rels)),
      'constraints', (SELECT json_agg(c.conname || ' ' || pg_get_constraintdef(c.oid) ORDER BY c.conname)
                      FROM pg_constraint c WHERE c.conrelid IN (SELECT oid FROM rels)),
      'triggers', (SELECT json_agg(pg_get_triggerdef(g.oid) || ' ' || p.prosrc || ' ' || coalesce(array_to_string(p.proconfig, ','), '')
                   ORDER BY g.tgname)
                   FROM pg_trigger g JOIN pg_proc p ON p.oid = g.tgfoid WHERE g.tgrelid IN (SELECT oid FROM rels) AND NOT g.tgisinternal),
      'options', (SELECT json_agg(coalesce(array_to_string(c.reloptions, ','), '') ORDER BY c.relname) FROM pg_class c WHERE c.oid IN (SELECT oid FROM rels))
    ) AS catalog`;
  // names derived from the table's (indexes, constraints, functions, the sent table) become T's
  return JSON.parse(JSON.stringify(row!.catalog).replaceAll(table, 'T'));
}

describe('upgrades from each release\'s schema', () => {
  for (const [release, files] of Object.entries(RELEASES)) {
    it(`${release}: its migration files unedited; the schema they make, migrated by today's \`migrate\`, ends identical to a fresh migrate's`, async () => {
      const all = loadMigrations();
      const shipped = all.filter((m) => m.name in files);
      assert.deepEqual(shipped.map((m) => m.name).sort(), Object.keys(files).sort(), `${release}'s migration files are all still there`);
      for (const m of shipped) {
        assert.equal(createHash('sha256').update(m.sql).digest('hex'), files[m.name], `${m.name} was released in ${release} and must never be edited: add a migration instead`);
      }
      const upgraded = uniqueName('upgraded');
      const fresh = uniqueName('fresh');
      try {
        await migrate(sql, parseTableName(upgraded), shipped);
        // rows, as a table in use holds: a later migration must work on them (a fresh table has none)
        await sql.unsafe(`INSERT INTO ${upgraded} (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'Created', '{"n": 1}'), ('order', 'a', 'Paid', NULL)`);
        await sql.unsafe(`UPDATE ${upgraded} SET attempts = 1, parked_at = now() WHERE type = 'Created'`);
        const later = await migrate(sql, parseTableName(upgraded));
        assert.deepEqual(later.applied, all.filter((m) => !(m.name in files)).map((m) => m.version), 'the upgrade applies the migrations since, only');
        await migrate(sql, parseTableName(fresh));
        assert.deepEqual(await catalog(upgraded), await catalog(fresh));
      } finally {
        await dropOutbox(sql, parseTableName(upgraded));
        await dropOutbox(sql, parseTableName(fresh));
      }
    });
  }
});
