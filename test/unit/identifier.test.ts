import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { derivedName, parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { loadMigrations, render } from '../../src/outbox/migrate.ts';

describe('identifiers', () => {
  it('quotes plain and schema-qualified names', () => {
    assert.equal(qualified(parseTableName('outbox')), '"outbox"');
    assert.equal(qualified(parseTableName('app.Outbox_2')), '"app"."Outbox_2"');
  });

  it('refuses anything that is not an identifier', () => {
    for (const bad of ['outbox; drop table x', 'a.b.c', '', '1abc', 'a"b', 'x'.repeat(64), 'out box']) {
      assert.throws(() => parseTableName(bad), /not a valid table name/, bad);
    }
  });

  it('keeps derived names within 63 characters', () => {
    const n = derivedName(parseTableName('x'.repeat(63)), 'aggregate_idx');
    assert.ok(n.length <= 65);
    assert.ok(n.endsWith('_aggregate_idx"'));
  });

  it('renders migrations with quoted names only', () => {
    const sql = render(loadMigrations()[0]!.sql, parseTableName('app.events'));
    assert.match(sql, /CREATE TABLE IF NOT EXISTS "app"\."events"/);
    assert.doesNotMatch(sql, /\{\{/);
  });
});
