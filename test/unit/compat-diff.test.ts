import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { compareMessages, differenceTable, groupDifferences, undocumented, type CompatMessage } from '../../bench/compat-diff.ts';

const msg = (rowId: string, offset: number, over: Partial<CompatMessage> = {}): CompatMessage => ({
  rowId,
  topic: 'order',
  partition: 1,
  offset,
  key: Buffer.from('order-1'),
  value: Buffer.from('{"n": 1}'),
  headers: [['id', Buffer.from(rowId)], ['type', Buffer.from('Created')]],
  ...over,
});
const side = () => [msg('a', 0), msg('b', 1), msg('c', 2, { key: Buffer.from('order-ü'), value: null })];

describe('compat bench: the message-by-message comparer', () => {
  it('finds no difference between identical sides, and prints an empty table', () => {
    const diffs = compareMessages(side(), side());
    assert.deepEqual(diffs, []);
    assert.match(differenceTable(groupDifferences(diffs)), /\| \(none\) \| 0 \|/);
  });

  it('reports a header differing in one byte, a header on one side only, a value and a key byte', () => {
    const peer = side();
    peer[0] = msg('a', 0, { headers: [['id', Buffer.from('a')], ['type', Buffer.from('Createe')]] });
    peer[1] = msg('b', 1, { headers: [['id', Buffer.from('b')]], value: Buffer.from('{"n":1}'), key: Buffer.from('order-2') });
    const kinds = groupDifferences(compareMessages(side(), peer)).map((g) => [g.kind, g.count]);
    assert.deepEqual(kinds.sort(), [
      ['header "type" bytes', 1],
      ['header "type" only in relay', 1],
      ['key bytes', 1],
      ['value bytes', 1],
    ]);
  });

  it('reports a reorder within a key, a missing message, a duplicate, and another partition', () => {
    const peer = [msg('b', 0), msg('a', 1, { partition: 2 }), msg('a', 5), msg('x', 3)];
    const groups = groupDifferences(compareMessages(side(), peer));
    const kinds = Object.fromEntries(groups.map((g) => [g.kind, g.count]));
    assert.deepEqual(kinds, { 'order per key': 1, 'missing in debezium': 1, 'missing in relay': 1, 'duplicate in debezium': 1, partition: 1 });
    const order = groups.find((g) => g.kind === 'order per key')!;
    assert.match(order.example.detail, /relay has row a at position 0, debezium b/);
  });

  it('a difference fails the bench unless docs list its kind as deliberate', () => {
    const peer = side().map((m) => ({ ...m, headers: m.headers.filter(([n]) => n !== 'type') }));
    const groups = groupDifferences(compareMessages(side(), peer), [{ kind: /^header "type" only in relay$/, why: 'the relay writes type' }]);
    assert.equal(groups.length, 1);
    assert.deepEqual(undocumented(groups), []);
    assert.match(differenceTable(groups), /only in relay \(deliberate: the relay writes type\) \| 3 \|/);
    assert.equal(undocumented(groupDifferences(compareMessages(side(), peer))).length, 1);
  });
});
