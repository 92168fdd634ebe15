// What checkTables makes of the database's answer (src/outbox/schema-check.ts schemaProblems): which
// mode needs what, which schemas are accepted, and how each problem is worded. The statement
// itself, and every refusal end to end, are tested on the real database
// (test/integration/schema-check.test.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DatabaseError } from '../../src/errors.ts';
import { assertSchema, schemaProblems, SIZE_CHECKED_COLUMNS, type CheckedMode, type SchemaFacts } from '../../src/outbox/schema-check.ts';

const MIGRATIONS = [
  { version: 1, name: '001_create_outbox.sql' },
  { version: 2, name: '002_more.sql' },
  { version: 3, name: '003_last.sql' },
];

/** a role that has everything, on a schema that has every migration */
function facts(over: Partial<SchemaFacts> = {}): SchemaFacts {
  return {
    role: 'relay',
    role_ident: 'relay',
    schema_ident: null,
    schema_usage: true,
    outbox_present: true,
    outbox_select: true,
    outbox_update: true,
    outbox_delete: true,
    sent_present: true,
    sent_insert: true,
    sent_select: true,
    sent_delete: true,
    outbox_select_lacking: [],
    outbox_update_lacking: [],
    sent_insert_lacking: [],
    checked_columns: ['headers', ...SIZE_CHECKED_COLUMNS],
    unreadable_columns: [],
    migrations_table: 'outbox_relay_migrations',
    migrations_readable: true,
    versions: [1, 2, 3],
    ...over,
  };
}

function problems(over: Partial<SchemaFacts>, sentRows: CheckedMode = 'keep'): string[] {
  return schemaProblems(facts(over), { table: '"outbox"', sentTable: '"outbox_sent"', sentRows, migrations: MIGRATIONS });
}

describe('schemaProblems: the columns the settings read', () => {
  it('columns the table lacks or the role may not read are named with the settings that read them and the fixes', () => {
    assert.deepEqual(problems({ unreadable_columns: ['tenant', 'region'] }), [
      'the outbox table "outbox" has no column tenant or region that the role relay may read, and the settings read them ' +
        '(OUTBOX_ADDITIONAL_PLACEMENT places a column, OUTBOX_METADATA=trace reads tracingspancontext): correct the setting, ' +
        'add the column to the table, or GRANT SELECT (tenant, region) ON "outbox" TO relay',
    ]);
  });
});

describe('schemaProblems: the size bound of every column but the payload', () => {
  it('a table without the size check of a column (made by hand, or by an older migrate) is refused, naming the columns and the fix', () => {
    assert.deepEqual(problems({ checked_columns: ['headers', 'aggregatetype', 'aggregateid', 'type', 'topic', 'tracingspancontext'] }), [
      'the outbox table "outbox" bounds no size of headers_bytes (no CHECK constraint names it): one large row could take the relay past its memory. ' +
        'Add the size check of docs/schema.md ("Every column bounded"), as `outbox-relay migrate` creates it',
    ]);
    const [p] = problems({ checked_columns: [] });
    assert.match(p ?? '', /bounds no size of aggregatetype, aggregateid, type, topic, headers_bytes and tracingspancontext \(no CHECK constraint names them\)/);
  });
});

describe('schemaProblems: migrations', () => {
  it('none when every migration is recorded, and none for versions newer than the relay knows (a rolling deploy)', () => {
    assert.deepEqual(problems({}), []);
    assert.deepEqual(problems({ versions: [1, 2, 3, 4, 5] }), []);
  });

  it('names each missing migration, what is recorded, and `outbox-relay migrate`; the sent table it would create is not named again', () => {
    const [p, ...rest] = problems({ versions: [1], sent_present: false });
    assert.deepEqual(rest, []);
    assert.equal(p, 'the outbox table "outbox" lacks migrations 2 (002_more.sql) and 3 (003_last.sql), which this version of the relay needs (recorded in outbox_relay_migrations: 1): run `outbox-relay migrate` (idempotent) before the relay');
  });

  it('a table with no migration recorded, a migrations table missing or unreadable: each says what to run or grant', () => {
    assert.match(problems({ versions: [] }).join(), /^no migration of the outbox table "outbox" is recorded in outbox_relay_migrations: .* Run `outbox-relay migrate`, as the table's owner/);
    assert.match(problems({ migrations_table: null, migrations_readable: null, versions: null }).join(), /^outbox_relay_migrations, .* does not exist .*Run it, as the table's owner/);
    assert.deepEqual(problems({ migrations_readable: false, versions: null }), [
      'the database role relay may not read outbox_relay_migrations, where `outbox-relay migrate` records the migrations of each outbox table, and which the relay reads to know that the schema is the one it was built for: GRANT SELECT ON outbox_relay_migrations TO relay',
    ]);
  });
});

describe('schemaProblems: privileges granted on some columns only', () => {
  it('UPDATE on some columns of the outbox: names the columns it lacks and the GRANT of exactly those', () => {
    assert.deepEqual(problems({ outbox_update_lacking: ['last_error', 'waiting'] }), [
      'the database role relay has UPDATE on some columns of the outbox table "outbox" only, and lacks it on last_error and waiting ' +
        '(UPDATE: claims lock rows FOR UPDATE, and failed attempts, backoff, parking and the waiting marks are UPDATEs): GRANT UPDATE (last_error, waiting) ON "outbox" TO relay',
    ]);
  });

  it('SELECT on the outbox and INSERT on the sent table likewise; none of it said again when the privilege is missing on the whole table', () => {
    const [select, insert] = problems({ outbox_select_lacking: ['payload'], sent_insert_lacking: ['headers', 'retried_by'] });
    assert.match(select!, /^the database role relay has SELECT on some columns of the outbox table "outbox" only, and lacks it on payload \(SELECT: .*\): GRANT SELECT \(payload\) ON "outbox" TO relay$/);
    assert.match(insert!, /^the database role relay has INSERT on some columns of the sent table "outbox_sent" only, and lacks it on headers and retried_by .*: GRANT INSERT \(headers, retried_by\) ON "outbox_sent" TO relay$/);
    assert.equal(problems({ outbox_update: false, outbox_update_lacking: ['attempts', 'last_error', 'next_attempt_at', 'parked_at', 'waiting'] }).length, 1);
  });
});

describe('schemaProblems: privileges by mode', () => {
  const none = { outbox_select: false, outbox_update: false, outbox_delete: false, sent_insert: false, sent_select: false, sent_delete: false };

  it('keep: SELECT, UPDATE, DELETE on the outbox and INSERT on the sent table (with retention\'s SELECT and DELETE in the same GRANT)', () => {
    const [outbox, sent] = problems(none, 'keep');
    assert.match(outbox!, /^the database role relay lacks SELECT, UPDATE and DELETE on the outbox table "outbox" \(.*\): GRANT SELECT, UPDATE, DELETE ON "outbox" TO relay$/);
    assert.equal(sent, 'the database role relay may not INSERT into the sent table "outbox_sent", where acked rows are moved: GRANT SELECT, INSERT, DELETE ON "outbox_sent" TO relay (SELECT and DELETE for retention)');
  });

  it('keep: retention\'s SELECT and DELETE on the sent table alone are no refusal (retention warns)', () => {
    assert.deepEqual(problems({ sent_select: false, sent_delete: false }, 'keep'), []);
  });

  it('delete: SELECT, UPDATE, DELETE on the outbox, nothing on the sent table, which need not exist', () => {
    assert.deepEqual(problems({ sent_present: false, sent_insert: null, sent_select: null, sent_delete: null }, 'delete'), []);
    assert.deepEqual(problems({ ...none, outbox_select: true, outbox_update: true }, 'delete').map((p) => p.replace(/ \(.*\)/, '')), ['the database role relay lacks DELETE on the outbox table "outbox": GRANT DELETE ON "outbox" TO relay']);
  });
});

describe('schemaProblems: tables', () => {
  it('an outbox that does not exist is the only thing said', () => {
    assert.deepEqual(problems({ outbox_present: false, versions: [], sent_present: false, outbox_select: null }), ['the outbox table "outbox" does not exist (on the database role\'s search_path): run `outbox-relay migrate` (it creates the table), or check OUTBOX_TABLE']);
  });

  it('a schema the role may not use: GRANT USAGE, and the tables (not looked up) are not called missing', () => {
    assert.deepEqual(problems({ schema_ident: 'app', schema_usage: false, outbox_present: false, sent_present: false }), ['the database role relay may not use the schema app of the outbox table "outbox": GRANT USAGE ON SCHEMA app TO relay']);
  });
});

describe('assertSchema', () => {
  it('throws one DatabaseError no retry fixes, one problem per line when several', () => {
    assert.doesNotThrow(() => assertSchema(facts(), { table: '"outbox"', sentTable: '"outbox_sent"', sentRows: 'keep', migrations: MIGRATIONS }));
    assert.throws(
      () => assertSchema(facts({ versions: [1, 2], outbox_delete: false }), { table: '"outbox"', sentTable: '"outbox_sent"', sentRows: 'delete', migrations: MIGRATIONS }),
      (err: unknown) => {
        assert.ok(err instanceof DatabaseError);
        assert.equal(err.retriable, false);
        const lines = err.message.split('\n  - ');
        assert.equal(lines[0], 'the relay cannot run against the outbox table "outbox" until these are fixed:');
        assert.equal(lines.length, 3);
        return true;
      },
    );
  });
});
