// services: postgres, kafka
// Debezium's Outbox Event Router options as relay settings (docs/debezium.md), read back from the
// broker: the key from another column, columns of the application's placed in headers and in the
// value's envelope, the payload expanded, the router's headers as JSON strings; a placed value over its
// bound parks its row (the claim never reads more than 1,025 characters of it).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseTableName } from '../../src/domain.ts';
import { qualified } from '../../src/outbox/identifier.ts';
import { consumeAll, createTopics, fileDb, fixture, insertEvents, invokeOk as invoke, rowById, rowStates, topicCount } from './helpers.ts';

const sql = fileDb();

describe('Debezium router options, read back from Kafka', () => {
  it('key, placement (header and envelope, a column of the application\'s), expanded payload, the router\'s headers as JSON (a NULL column: null); a placed value over 1,024 characters parks its row', async () => {
    const f = await fixture(sql, 'router', ['order'], 1);
    const table = qualified(parseTableName(f.table));
    await sql.unsafe(`ALTER TABLE ${table} ADD COLUMN tenant text CHECK (char_length(tenant) <= 5000)`);
    const [a, b, long] = await insertEvents(sql, f.table, [
      { aggregateid: 'o-1', type: 'OrderPlaced', payload: { n: 1, note: 'a b, c: d ✓' } },
      { aggregateid: 'o-1', type: 'OrderPaid', payload: { n: 2 } },
      { aggregateid: 'o-2', type: 'OrderPaid', payload: { n: 3 } },
    ]);
    await sql.unsafe(`UPDATE ${table} SET tenant = 'acme ✓' WHERE id = $1`, [a!]);
    await sql.unsafe(`UPDATE ${table} SET tenant = repeat('x', 1025) WHERE id = $1`, [long!]);
    const summary = await invoke({
      ...f.env,
      OUTBOX_KEY_COLUMN: 'id',
      OUTBOX_ADDITIONAL_PLACEMENT: 'type:header:eventType,tenant:header:tenant,aggregatetype:envelope:aggregateType',
      OUTBOX_EXPAND_JSON_PAYLOAD: 'true',
      OUTBOX_HEADER_FORMAT: 'json',
    });
    assert.deepEqual([summary.published, summary.parked], [2, 1]);
    const messages = await consumeAll([f.topic('order')], 2);
    assert.deepEqual(
      messages.map((m) => ({ key: m.key, value: m.value, headers: m.headers })),
      [
        { key: a, value: '{"payload":{"n":1,"note":"a b, c: d ✓"},"aggregateType":"order"}', headers: { id: `"${a}"`, eventType: '"OrderPlaced"', tenant: '"acme ✓"' } },
        { key: b, value: '{"payload":{"n":2},"aggregateType":"order"}', headers: { id: `"${b}"`, eventType: '"OrderPaid"', tenant: 'null' } },
      ],
    );
    const parked = await rowById(sql, f.table, long!);
    assert.equal(parked.parked, true);
    assert.match(parked.last_error ?? '', /column tenant holds more than 1024 characters/);
  });

  it('G4, the key from another column (OUTBOX_KEY_COLUMN=type): an aggregate\'s row the broker refuses (INVALID_TIMESTAMP) is parked and holds the aggregate\'s later rows, keyed otherwise: none of them reaches Kafka, in that invocation or the next; other aggregates flow', async () => {
    const f = await fixture(sql, 'router_key_hold', ['order'], 3);
    const topic = f.topic('late');
    await createTopics([topic], 3, [{ name: 'message.timestamp.before.max.ms', value: '600000' }]);
    const ids = await insertEvents(sql, f.table, ['Placed', 'Paid', 'Shipped'].flatMap((type) => [
      { aggregatetype: 'late', aggregateid: 'A', type },
      { aggregatetype: 'late', aggregateid: 'B', type },
    ]));
    const a = ids.filter((_, i) => i % 2 === 0);
    const b = ids.filter((_, i) => i % 2 === 1);
    // A's first row is older than the topic takes: the broker refuses that record alone
    await sql.unsafe(`UPDATE ${qualified(parseTableName(f.table))} SET created_at = now() - interval '1 hour' WHERE id = $1`, [a[0]!]);
    const env = { ...f.env, OUTBOX_KEY_COLUMN: 'type', OUTBOX_METADATA: 'timestamp' };
    const first = await invoke(env);
    assert.deepEqual([first.published, first.parked], [3, 1]);
    await invoke(env);
    const states = await rowStates(sql, f.table);
    const state = (id: string) => states.find((r) => r.id === id)!;
    assert.deepEqual([state(a[0]!).parked, state(a[0]!).attempts], [true, 1]);
    assert.match(state(a[0]!).last_error ?? '', /INVALID_TIMESTAMP/);
    for (const id of a.slice(1)) assert.deepEqual([state(id).sent, state(id).attempts], [false, 0], 'held behind the parked row, not charged');
    for (const id of b) assert.equal(state(id).sent, true, 'B flows');
    const messages = await consumeAll([topic], 3);
    assert.deepEqual(messages.map((m) => m.headers.id).sort(), [...b].sort());
    assert.equal(await topicCount([topic]), 3, 'nothing of A on any partition');
    // what makes this a test of partitions: A's later keys are not all on the partition of its first
    const partitionOf = new Map(messages.map((m) => [m.key, m.partition]));
    assert.ok(['Paid', 'Shipped'].some((k) => partitionOf.get(k) !== partitionOf.get('Placed')), `keys by partition: ${JSON.stringify([...partitionOf])}`);
  });
});
