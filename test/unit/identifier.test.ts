import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { derivedName, derivedUniqueName, displayName, notifyChannel, parseTableName, qualified, quoteIdent, quoteLiteral, sentTable } from '../../src/outbox/identifier.ts';
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

  it('names a schema-wide object within 63 characters, distinct for long table names that share a prefix', () => {
    assert.equal(derivedUniqueName(parseTableName('app.outbox'), 'unwait'), '"outbox_unwait"');
    const [x, y] = [`${'t'.repeat(58)}aaaaa`, `${'t'.repeat(58)}bbbbb`].map((n) => derivedUniqueName(parseTableName(n), 'unwait'));
    assert.notEqual(x, y);
    for (const n of [x!, y!]) {
      assert.equal(n.length, 65, n);
      assert.ok(n.endsWith('_unwait"'), n);
    }
  });

  it('renders migrations with quoted names only', () => {
    const sql = render(loadMigrations()[0]!.sql, parseTableName('app.events'));
    assert.match(sql, /CREATE TABLE IF NOT EXISTS "app"\."events"/);
    assert.doesNotMatch(sql, /\{\{/);
  });

  it('names a channel of at most 63 bytes for any table name, distinct for long names that share a prefix', () => {
    const long = (s: string) => parseTableName(`${'s'.repeat(60)}.${'t'.repeat(58)}${s}`);
    assert.equal(notifyChannel(parseTableName('app.outbox')), 'outbox:app.outbox');
    const [x, y] = [notifyChannel(long('aaaaa')), notifyChannel(long('bbbbb'))];
    assert.ok(Buffer.byteLength(x) <= 63 && Buffer.byteLength(y) <= 63);
    assert.notEqual(x, y);
    assert.equal(quoteLiteral("it's"), "'it''s'");
  });

  it('names the sent table beside the outbox, within 63 characters, distinct for long names that share a prefix', () => {
    assert.deepEqual(sentTable(parseTableName('app.outbox')), { schema: 'app', name: 'outbox_sent' });
    assert.deepEqual(sentTable(parseTableName('outbox')), { schema: undefined, name: 'outbox_sent' });
    const fits = 'f'.repeat(58);
    assert.equal(sentTable(parseTableName(fits)).name, `${fits}_sent`);
    const [x, y] = [sentTable(parseTableName(`${'t'.repeat(58)}aaaaa`)), sentTable(parseTableName(`${'t'.repeat(58)}bbbbb`))];
    assert.ok(x.name.length <= 63 && y.name.length <= 63, `${x.name} ${y.name}`);
    assert.notEqual(x.name, y.name);
    assert.match(x.name, /_sent$/);
    const sql = render(loadMigrations()[0]!.sql, parseTableName('app.events'));
    assert.match(sql, /CREATE TABLE IF NOT EXISTS "app"\."events_sent"/);
    assert.match(sql, /CREATE INDEX IF NOT EXISTS "events_sent_sent_at_idx" ON "app"\."events_sent" \(sent_at\)/);
  });
});

describe('identifiers: edges', () => {
  it('refuses a qualified name when either part is not an identifier, and says what is expected', () => {
    for (const bad of ['app.1x', '1x.outbox', 'app.', '.outbox']) {
      assert.throws(() => parseTableName(bad), /^Error: ".*" is not a valid table name; expected an identifier such as outbox or app\.outbox \(letters, digits and underscores, starting with a letter or underscore, at most 63 characters per part\)$/, bad);
    }
    assert.deepEqual(parseTableName('_a.' + 'b'.repeat(63)), { schema: '_a', name: 'b'.repeat(63) });
  });

  it('doubles embedded quotes', () => {
    assert.equal(quoteIdent('a"b'), '"a""b"');
    assert.equal(quoteIdent('""'), '""""""');
  });

  it('derives names with an underscore and the suffix, truncating the base to fit 63 characters', () => {
    assert.equal(derivedName(parseTableName('app.events'), 'seq_idx'), '"events_seq_idx"');
    assert.equal(derivedName(parseTableName('x'.repeat(63)), 'aggregate_idx'), `"${'x'.repeat(49)}_aggregate_idx"`);
  });

  it('displays the name as configured, without quotes', () => {
    assert.equal(displayName(parseTableName('app.events')), 'app.events');
    assert.equal(displayName(parseTableName('events')), 'events');
  });
});
