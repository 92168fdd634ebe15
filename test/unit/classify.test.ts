import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import kafkajs from 'kafkajs';
import { classifySendError } from '../../src/kafka/classify.ts';
import { BrokerUnavailableError, DeadlineExceededError } from '../../src/errors.ts';

// kafkajs is CommonJS and spreads its error classes into module.exports: only the default import sees them
const { KafkaJSConnectionError, KafkaJSNumberOfRetriesExceeded, KafkaJSProtocolError, KafkaJSRequestTimeoutError, KafkaJSSASLAuthenticationError, KafkaJSNonRetriableError } = kafkajs;

// (kafkajs' typings declare these constructors without the arguments they take)
const saslError = (message: string) => new (KafkaJSSASLAuthenticationError as unknown as new (m: string) => Error)(message);
const nonRetriable = (cause: Error) => new (KafkaJSNonRetriableError as unknown as new (e: Error, o: { cause: Error }) => Error)(cause, { cause });

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
    for (const type of ['UNKNOWN_TOPIC_OR_PARTITION', 'TOPIC_AUTHORIZATION_FAILED', 'INVALID_TOPIC_EXCEPTION', 'UNKNOWN_TOPIC_ID']) {
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

  it('blames the producer state for sequence, producer id and epoch errors (new producer, retry once)', () => {
    for (const type of ['OUT_OF_ORDER_SEQUENCE_NUMBER', 'UNKNOWN_PRODUCER_ID', 'INVALID_PRODUCER_EPOCH', 'DUPLICATE_SEQUENCE_NUMBER']) {
      const r = classifySendError(new KafkaJSNumberOfRetriesExceeded(protocol(type), { retryCount: 0, retryTime: 1 }), 'orders');
      assert.equal(r.scope, 'producer', type);
      assert.match(r.error.message, new RegExp(type));
    }
  });

  it('tells refused credentials apart, even when kafkajs wraps them (re-read the secret, retry once)', () => {
    const sasl = saslError('SASL SCRAM SHA256 authentication failed: wrong password');
    for (const err of [sasl, nonRetriable(sasl), protocol('SASL_AUTHENTICATION_FAILED')]) {
      const r = classifySendError(err, 't');
      assert.equal(r.scope, 'auth');
      assert.match(r.error.message, /KAFKA_SECRET_ID/);
    }
  });

  it('credentials win over what they caused: a reconnect refused during a retried send', () => {
    const r = classifySendError(new KafkaJSNumberOfRetriesExceeded(saslError('bad'), { retryCount: 3, retryTime: 1 }), 't');
    assert.equal(r.scope, 'auth');
  });
});
