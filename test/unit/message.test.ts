import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { MessageRejectedError } from '../../src/errors.ts';
import { encodedSize, toMessage, topicFor, type OutboxRow } from '../../src/kafka/message.ts';

const row: OutboxRow = {
  seq: '7',
  id: '4c2b6b7e-7d8a-4c55-9a52-0d5f3c1e9a10',
  aggregatetype: 'order',
  aggregateid: 'order-1',
  type: 'OrderCreated',
  payload: '{"total":42}',
  topic: null,
  headers: { traceparent: '00-abc', tenant: 7, type: 'spoofed', id: 'spoofed', skip: null },
  attempts: 0,
};

describe('row → message', () => {
  it('keys by aggregate, keeps the payload text, sets id and type headers that rows cannot override', () => {
    const m = toMessage(row, 'outbox.event.{aggregatetype}');
    assert.equal(m.topic, 'outbox.event.order');
    assert.equal(m.key, 'order-1');
    assert.equal(m.value, '{"total":42}');
    assert.deepEqual(m.headers, { traceparent: '00-abc', tenant: '7', id: row.id, type: 'OrderCreated' });
  });

  it('routes by template or the row override', () => {
    assert.equal(topicFor(row, 'x.{aggregatetype}.{type}'), 'x.order.OrderCreated');
    assert.equal(topicFor({ ...row, topic: 'special' }, 'x.{aggregatetype}'), 'special');
  });

  it('rejects illegal topic names as the row\'s own fault', () => {
    assert.throws(() => toMessage({ ...row, topic: 'bad topic!' }, 'x'), MessageRejectedError);
    assert.throws(() => toMessage({ ...row, aggregatetype: 'a/b' }, 'outbox.event.{aggregatetype}'), /not a legal Kafka topic name/);
  });

  it('estimates the encoded size from key, value and headers', () => {
    const small = encodedSize(toMessage(row, 't'));
    const big = encodedSize(toMessage({ ...row, payload: JSON.stringify('x'.repeat(10_000)) }, 't'));
    assert.ok(big - small >= 9_900);
    assert.ok(small < 300);
  });
});
