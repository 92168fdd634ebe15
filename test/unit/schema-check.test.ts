// What checkTables makes of the database's answer (src/outbox/schema-check.ts schemaProblems): which
// mode needs what, which schemas are accepted, and how each problem is worded. The statement
// itself, and every refusal end to end, are tested on the real database
// (test/integration/schema-check.test.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DatabaseError } from '../../src/errors.ts';
import { assertSchema, schemaProblems, schemaWarnings, SIZE_CHECKED_COLUMNS, type CheckedMode, type SchemaFacts } from '../../src/outbox/schema-check.ts';

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
    ...shape('outbox'),
    ...shape('sent'),
    ...over,
  };
}

/** a plain logged table: no inheritance, no row-level security for the role, no trigger that could skip a row */
function shape<P extends 'outbox' | 'sent'>(p: P) {
  return {
    [`${p}_kind`]: 'r', [`${p}_persistence`]: 'p', [`${p}_is_partition`]: false, [`${p}_children`]: [], [`${p}_parents`]: [],
    [`${p}_rls_blocked`]: null, [`${p}_rls_restrictive`]: null, [`${p}_triggers`]: [], [`${p}_rules`]: [],
  } as Pick<SchemaFacts, `${P}_kind` | `${P}_persistence` | `${P}_is_partition` | `${P}_children` | `${P}_parents` | `${P}_rls_blocked` | `${P}_rls_restrictive` | `${P}_triggers` | `${P}_rules`>;
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

describe('schemaProblems: what the tables are (kind, inheritance, row-level security, triggers)', () => {
  it('an outbox that is a view, a materialized view or a foreign table is refused, naming the kind and the fix; its missing size checks are not said too', () => {
    for (const [kind, name] of [['v', 'a view'], ['m', 'a materialized view'], ['f', 'a foreign table']] as const) {
      assert.deepEqual(problems({ outbox_kind: kind, checked_columns: [] }), [
        `the outbox table "outbox" is ${name}, not a table: the relay locks its rows, then deletes or moves them by address (tableoid, ctid) in the batch's transaction, ` +
          'which only a table\'s rows allow. Set OUTBOX_TABLE to the table itself, made by `outbox-relay migrate`',
      ]);
    }
  });

  it('a sent table that is a view is refused in keep mode (instead of its grants), and not looked at in delete mode', () => {
    assert.deepEqual(problems({ sent_kind: 'v', sent_insert: false }, 'keep'), [
      'the sent table "outbox_sent" is a view, not a table: acked rows are moved into it and retention deletes them by address (tableoid, ctid). ' +
        'Make it a table (rename this one and run `outbox-relay migrate`, which creates it), or set OUTBOX_SENT_ROWS=delete to keep no sent rows',
    ]);
    assert.deepEqual(problems({ sent_kind: 'v', sent_children: ['x'], sent_triggers: [{ name: 't', events: 'INSERT' }] }, 'delete'), []);
  });

  it('a partitioned outbox (or sent table) is not refused here: outbox_kind tells it; a partition is no inheritance child', () => {
    assert.deepEqual(problems({ outbox_kind: 'p', outbox_children: ['outbox_p1', 'outbox_p2'], sent_kind: 'p', sent_children: ['outbox_sent_p1'] }), []);
    assert.deepEqual(problems({ outbox_is_partition: true, outbox_parents: ['outbox_all'] }), []);
  });

  it('inheritance: an outbox with children, an outbox that is a child, a sent table with children (keep mode): each refused with the ALTER TABLE … NO INHERIT', () => {
    assert.deepEqual(problems({ outbox_children: ['outbox_a', 'outbox_b'] }), [
      'the outbox table "outbox" has inheritance children outbox_a and outbox_b: the relay\'s claims reach their rows too, which have none of the outbox\'s indexes, ' +
        'identity, size checks or triggers (each claim reads a child whole, and a child\'s seqs can repeat the outbox\'s). Detach each (ALTER TABLE outbox_a NO INHERIT "outbox"; ALTER TABLE outbox_b NO INHERIT "outbox"), ' +
        'or set OUTBOX_TABLE to a table without children',
    ]);
    assert.deepEqual(problems({ outbox_parents: ['events'] }), [
      'the outbox table "outbox" inherits from events: rows inserted there are never relayed, and a statement on it (another relay\'s claims and marks, ' +
        'a DELETE by hand) reaches the outbox\'s rows too. Detach it (ALTER TABLE "outbox" NO INHERIT events)',
    ]);
    assert.deepEqual(problems({ sent_children: ['old_sent'] }), [
      'the sent table "outbox_sent" has inheritance child old_sent: retention deletes its old rows, and reaches the children\'s rows too, ' +
        'deleting whatever they keep once it is older than the window. Detach it (ALTER TABLE old_sent NO INHERIT "outbox_sent")',
    ]);
    assert.deepEqual(problems({ sent_children: ['old_sent'] }, 'delete'), []);
  });

  it('row-level security that hides rows from the role: names the commands, why each matters, and the policy or BYPASSRLS that fixes it', () => {
    assert.deepEqual(problems({ outbox_rls_blocked: ['UPDATE', 'DELETE'], outbox_rls_restrictive: [] }), [
      'row-level security on the outbox table "outbox" applies to the database role relay (no superuser, no BYPASSRLS, and not the table\'s owner, or the table forces it), ' +
        'and no policy lets it UPDATE and DELETE every row (UPDATE: claims lock rows FOR UPDATE, which sees only the rows an UPDATE policy lets through: the others stay pending forever, ' +
        'and failed attempts go unrecorded; DELETE: a mark deletes only the rows a DELETE policy lets through: the others are published again on every invocation): ' +
        'CREATE POLICY outbox_relay ON "outbox" FOR ALL TO relay USING (true) WITH CHECK (true), or ALTER ROLE relay BYPASSRLS',
    ]);
    // policies that let everything through: nothing blocked
    assert.deepEqual(problems({ outbox_rls_blocked: [], outbox_rls_restrictive: [], sent_rls_blocked: [], sent_rls_restrictive: [] }), []);
    const [restricted] = problems({ outbox_rls_blocked: ['SELECT', 'UPDATE', 'DELETE'], outbox_rls_restrictive: ['tenant_only'] });
    assert.match(restricted!, /; the RESTRICTIVE policy tenant_only applies to it, which no permissive policy lifts\): CREATE POLICY .* WITH CHECK \(true\), with relay left out of tenant_only, or ALTER ROLE relay BYPASSRLS$/);
    const [sent] = problems({ sent_rls_blocked: ['INSERT'], sent_rls_restrictive: [] });
    assert.match(sent!, /^row-level security on the sent table "outbox_sent" applies .* lets it INSERT every row \(INSERT: the move of acked rows fails, .*\): CREATE POLICY outbox_relay ON "outbox_sent" FOR ALL TO relay/);
    assert.deepEqual(problems({ sent_rls_blocked: ['INSERT'] }, 'delete'), []);
  });

  it('rules on the relay\'s UPDATE, DELETE (the outbox) or INSERT, DELETE (the sent table): each named, with the fix', () => {
    assert.deepEqual(problems({ outbox_rules: ['keep_rows'] }), [
      'the outbox table "outbox" has rule keep_rows on the relay\'s UPDATE or DELETE of its rows, which rewrites the relay\'s statements (a DO INSTEAD rule skips or redirects them): ' +
        'drop it (DROP RULE keep_rows ON "outbox"), or use an AFTER trigger for what it does',
    ]);
    assert.match(problems({ sent_rules: ['a', 'b'] })[0]!, /^the sent table "outbox_sent" has rules a and b on the move's INSERT or retention's DELETE, .*DROP RULE a ON "outbox_sent"; DROP RULE b ON "outbox_sent"/);
    assert.deepEqual(problems({ sent_rules: ['a'] }, 'delete'), [], 'delete mode writes no sent row');
  });

  it('BEFORE ROW triggers that can skip the relay\'s row: each named with its events, and the fix', () => {
    assert.deepEqual(problems({ outbox_triggers: [{ name: 'keep_rows', events: 'DELETE' }] }), [
      'the outbox table "outbox" has BEFORE ROW trigger keep_rows (BEFORE DELETE), which can skip the relay\'s UPDATE or DELETE of a row by returning NULL ' +
        '(a skipped mark leaves its row pending, published again on every invocation, and a skipped UPDATE loses a failed attempt): ' +
        'make it an AFTER trigger, or drop it (DROP TRIGGER keep_rows ON "outbox")',
    ]);
    const [sent] = problems({ sent_triggers: [{ name: 'a', events: 'INSERT' }, { name: '"B"', events: 'INSERT OR DELETE' }] });
    assert.match(sent!, /^the sent table "outbox_sent" has BEFORE ROW triggers a \(BEFORE INSERT\) and "B" \(BEFORE INSERT OR DELETE\), .*: make them AFTER triggers, or drop them \(DROP TRIGGER a ON "outbox_sent"; DROP TRIGGER "B" ON "outbox_sent"\)$/);
  });

  it('all at once, one problem each', () => {
    const all = problems({ outbox_children: ['c'], outbox_rls_blocked: ['DELETE'], outbox_rls_restrictive: [], outbox_triggers: [{ name: 't', events: 'UPDATE' }], outbox_delete: false });
    assert.equal(all.length, 4, all.join('\n'));
  });
});

describe('schemaWarnings', () => {
  it('an UNLOGGED outbox is no refusal but a warning, with the ALTER TABLE that fixes it', () => {
    assert.deepEqual(problems({ outbox_persistence: 'u' }), []);
    assert.deepEqual(schemaWarnings(facts({ outbox_persistence: 'u' }), { table: '"outbox"' }), [
      'the outbox table "outbox" is UNLOGGED: a crash of the database empties it, with every row not yet relayed (nor is it on a replica, so a failover loses them too). ALTER TABLE "outbox" SET LOGGED',
    ]);
    assert.deepEqual(schemaWarnings(facts(), { table: '"outbox"' }), []);
  });

  it('a partition maintenance function the role may not EXECUTE is no refusal but a warning, with the GRANT', () => {
    const partitioned = { outbox_kind: 'p', sent_kind: 'p', partitions_fn: true } as const;
    assert.deepEqual(problems({ ...partitioned, partitions_fn_execute: false }), []);
    const [warning, ...more] = schemaWarnings(facts({ ...partitioned, partitions_fn_execute: false }), { table: '"outbox"', partitionsFn: '"outbox_partitions"(bigint)' });
    assert.deepEqual(more, []);
    assert.match(warning!, /may not EXECUTE its partition maintenance function: .* GRANT EXECUTE ON FUNCTION "outbox_partitions"\(bigint\) TO relay /);
    assert.deepEqual(schemaWarnings(facts({ ...partitioned, partitions_fn_execute: true }), { table: '"outbox"' }), []);
    assert.deepEqual(schemaWarnings(facts({ partitions_fn: false, partitions_fn_execute: null }), { table: '"outbox"' }), [], 'no function, nothing to say');
  });
});

describe('assertSchema', () => {
  it('returns the warnings when nothing is refused', () => {
    const needs = { table: '"outbox"', sentTable: '"outbox_sent"', sentRows: 'keep', migrations: MIGRATIONS } as const;
    assert.equal(assertSchema(facts({ outbox_persistence: 'u' }), needs).length, 1);
    assert.deepEqual(assertSchema(facts(), needs), []);
  });

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
