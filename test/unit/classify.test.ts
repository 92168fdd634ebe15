import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import kafkajs from 'kafkajs';
import { classifySendError } from '../../src/kafka/classify.ts';
import { BrokerUnavailableError, DeadlineExceededError } from '../../src/errors.ts';

// kafkajs is CommonJS and spreads its error classes into module.exports: only the default import sees them
const { KafkaJSConnectionError, KafkaJSNumberOfRetriesExceeded, KafkaJSProtocolError, KafkaJSRequestTimeoutError } = kafkajs;

function protocol(type: string, retriable = false) {
  return new KafkaJSProtocolError({ message: type, type, code: 1, retriable } as never);
}

describe('classifySendError', () => {
  it('blames the record for size errors, even wrapped by retries', () => {
    const r = classifySendError(new KafkaJSNumberOfRetriesExceeded(protocol('MESSAGE_TOO_LARGE'), { retryCount: 3, retryTime: 100 }), 't');
    assert.equal(r.scope, 'record');
    assert.equal(r.error.retriable, true);
  });

  it('blames the topic for unknown topic and ACL errors', () => {
    for (const type of ['UNKNOWN_TOPIC_OR_PARTITION', 'TOPIC_AUTHORIZATION_FAILED', 'INVALID_TOPIC_EXCEPTION']) {
      const r = classifySendError(protocol(type, true), 'orders');
      assert.equal(r.scope, 'topic', type);
      assert.match(r.error.message, /orders/);
    }
  });

  it('treats connection errors, timeouts, leadership and replicas as the broker being unavailable', () => {
    for (const err of [
      new KafkaJSConnectionError('Connection error: ECONNREFUSED'),
      new KafkaJSRequestTimeoutError('Request Produce(key: 0, version: 7) timed out'),
      protocol('NOT_LEADER_FOR_PARTITION', true),
      protocol('NOT_ENOUGH_REPLICAS', true),
      new DeadlineExceededError('publishing'),
    ]) {
      const r = classifySendError(err, 't');
      assert.equal(r.scope, 'broker');
      assert.ok(r.error instanceof BrokerUnavailableError || r.error instanceof DeadlineExceededError);
    }
  });
});
