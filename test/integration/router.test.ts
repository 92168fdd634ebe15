// services: postgres, kafka
// Debezium's Outbox Event Router options as relay settings (docs/debezium.md), read back from the
// broker: the key from another column, columns of the application's placed in headers and in the
// value's envelope, the payload expanded, the router's headers as JSON strings; a placed value over its
// bound parks its row (the claim never reads more than 1,025 characters of it).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseTableName } from '../../src/domain.ts';
import { qualified } from '../../src/outbox/identifier.ts';
import { consumeAll, fileDb, fixture, insertEvents, invokeOk as invoke, rowById } from './helpers.ts';

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
});
