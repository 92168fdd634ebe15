import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import * as platformatic from '@platformatic/kafka';
import kafkajs from 'kafkajs';
import { classifySendError, errorTypes, isSaslAuthError } from '../../src/kafka/classify.ts';
import { BrokerUnavailableError, DeadlineExceededError, UnexpectedKafkaError } from '../../src/errors.ts';

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

describe('classifySendError: every code in its scope', () => {
  it('record codes: the row is charged, and parked at once (retrying the same bytes cannot succeed)', () => {
    for (const type of ['MESSAGE_TOO_LARGE', 'RECORD_LIST_TOO_LARGE', 'INVALID_RECORD', 'INVALID_TIMESTAMP']) {
      const err = protocol(type);
      const r = classifySendError(err, 'orders');
      assert.ok(r.scope === 'record', type);
      assert.equal(r.code, type);
      assert.equal(r.error.permanent, true, type);
      assert.equal(r.error.message, `broker rejected the message (${type}) on topic orders`);
      assert.equal(r.error.cause, err);
    }
  });

  it('topic codes: backed off, not permanent, with a hint of what to do', () => {
    const hints: Record<string, RegExp> = {
      UNKNOWN_TOPIC_OR_PARTITION: /does not exist \(or was deleted\) and auto-creation is off/,
      KafkaJSTopicMetadataNotLoaded: /the broker has no partitions for the topic/,
      TOPIC_AUTHORIZATION_FAILED: /grant WRITE on the topic/,
      UNKNOWN_TOPIC_ID: /: fix the topic name or its configuration$/,
      INCONSISTENT_TOPIC_ID: /: fix the topic name or its configuration$/,
      INVALID_TOPIC_EXCEPTION: /: fix the topic name or its configuration$/,
      TOPIC_DELETION_DISABLED: /: fix the topic name or its configuration$/,
      POLICY_VIOLATION: /: fix the topic name or its configuration$/,
    };
    for (const [type, hint] of Object.entries(hints)) {
      const err = type.startsWith('KafkaJS') ? Object.assign(new Error('no metadata'), { name: type }) : protocol(type);
      const r = classifySendError(err, 'orders');
      assert.ok(r.scope === 'topic', type);
      assert.equal(r.code, type);
      assert.equal(r.error.permanent, false, type);
      assert.ok(r.error.message.startsWith(`cannot publish to topic orders (${type}): `), r.error.message);
      assert.match(r.error.message, hint);
      assert.equal(r.error.cause, err);
    }
  });

  it('producer codes: a new producer, the cause kept', () => {
    for (const type of ['OUT_OF_ORDER_SEQUENCE_NUMBER', 'UNKNOWN_PRODUCER_ID', 'INVALID_PRODUCER_EPOCH', 'DUPLICATE_SEQUENCE_NUMBER', 'INVALID_PRODUCER_ID_MAPPING', 'PRODUCER_FENCED']) {
      const err = protocol(type);
      const r = classifySendError(err, 'orders');
      assert.ok(r.scope === 'producer', type);
      assert.equal(r.code, type);
      assert.equal(r.error.message, `the broker refused the producer's state (${type}) on topic orders: ${type}`);
      assert.equal(r.error.cause, err);
    }
  });

  it('CORRUPT_MESSAGE (a request damaged on the wire, retriable in the Java client): a new producer, the same send once more, no row charged', () => {
    // kafkajs: retriable, so it arrives after kafkajs' own retries, wrapped
    const err = new KafkaJSNumberOfRetriesExceeded(new KafkaJSProtocolError({ message: 'This message has failed its CRC checksum', type: 'CORRUPT_MESSAGE', code: 2, retriable: true } as never), { retryCount: 3, retryTime: 100 });
    const r = classifySendError(err, 'orders');
    assert.ok(r.scope === 'producer');
    assert.equal(r.code, 'CORRUPT_MESSAGE');
    assert.ok(r.error instanceof BrokerUnavailableError);
    assert.equal(r.error.message, 'the broker found the request corrupt (CORRUPT_MESSAGE) on topic orders, damaged on its way: This message has failed its CRC checksum');
    assert.equal(r.error.cause, err);
    // a record error elsewhere in the chain (a later attempt) still charges the record
    const both = Object.assign(new Error('several'), { errors: [protocol('CORRUPT_MESSAGE'), protocol('MESSAGE_TOO_LARGE')] });
    assert.equal(classifySendError(both, 'orders').scope, 'record');
  });

  it('auth keeps the cause; broker wraps the message and keeps the cause; a deadline passes through as is', () => {
    const sasl = saslError('bad');
    const auth = classifySendError(sasl, 't');
    assert.equal(auth.error.cause, sasl);

    const down = new KafkaJSConnectionError('Connection error: ECONNREFUSED');
    const broker = classifySendError(down, 't');
    assert.equal(broker.scope, 'broker');
    assert.ok(broker.error instanceof BrokerUnavailableError);
    assert.equal(broker.error.message, 'broker unavailable: Connection error: ECONNREFUSED');
    assert.equal(broker.error.cause, down);
    assert.equal(classifySendError('just a string', 't').error.message, 'Kafka send failed with an error the relay does not recognise (no error type): just a string; handled like an unavailable broker: the invocation stops, no row is charged');

    const late = new DeadlineExceededError('publishing');
    const r = classifySendError(late, 't');
    assert.equal(r.scope, 'broker');
    assert.equal(r.error, late);
  });

  it('finds a code inside an aggregate error (a send to several brokers)', () => {
    const aggregate = Object.assign(new Error('several'), { name: 'KafkaJSAggregateError', errors: [new KafkaJSConnectionError('x'), protocol('MESSAGE_TOO_LARGE')] });
    assert.equal(classifySendError(aggregate, 't').scope, 'record');
  });
});

describe('errorTypes', () => {
  it('lists type and name of the error, its cause, originalError and aggregated errors, depth first', () => {
    const inner = { type: 'INNER', name: 'InnerError' };
    const err = { type: 'OUTER', name: 'OuterError', cause: { name: 'Cause', cause: inner }, originalError: { type: 'ORIG' }, errors: [{ name: 'A' }, { type: 'B' }] };
    assert.deepEqual(errorTypes(err), ['OUTER', 'OuterError', 'Cause', 'INNER', 'InnerError', 'ORIG', 'A', 'B']);
  });

  it('nothing for values that are not objects, and type or name only when they are strings', () => {
    for (const v of [undefined, null, 0, '', 'UNKNOWN_PRODUCER_ID', function MESSAGE_TOO_LARGE() {}]) assert.deepEqual(errorTypes(v), []);
    assert.deepEqual(errorTypes({ type: 42, name: 'N' }), ['N']);
    assert.deepEqual(errorTypes({ type: 'T', name: 7 }), ['T']);
    assert.deepEqual(errorTypes({ errors: 'not an array' }), []);
  });

  it('visits a cyclic chain once', () => {
    const a: Record<string, unknown> = { type: 'A' };
    const b = { type: 'B', cause: a, errors: [a] };
    a.cause = b;
    a.originalError = a;
    assert.deepEqual(errorTypes(a), ['A', 'B']);
  });
});

describe('isSaslAuthError', () => {
  it('is true when refused credentials are anywhere in the chain, false otherwise', () => {
    assert.equal(isSaslAuthError(saslError('bad')), true);
    assert.equal(isSaslAuthError(new KafkaJSNumberOfRetriesExceeded(protocol('SASL_AUTHENTICATION_FAILED'), { retryCount: 1, retryTime: 1 })), true);
    assert.equal(isSaslAuthError(Object.assign(new Error('x'), { errors: [new Error('y'), saslError('z')] })), true);
    assert.equal(isSaslAuthError(protocol('MESSAGE_TOO_LARGE')), false);
    assert.equal(isSaslAuthError(new KafkaJSConnectionError('down')), false);
    assert.equal(isSaslAuthError(undefined), false);
  });

  it('an error it does not recognise is handled like the broker being down, but named apart', () => {
    for (const err of [protocol('SOMETHING_NEW'), new Error('socket hang up, somehow'), 'a string']) {
      const r = classifySendError(err, 't');
      assert.equal(r.scope, 'broker');
      assert.ok(r.error instanceof UnexpectedKafkaError, String(err));
      assert.match(r.error.message, /does not recognise/);
    }
  });
});

// @platformatic/kafka's errors, built with its own classes the way it builds them: a Produce
// answer with per-partition codes is a ResponseError holding one ProtocolError per partition
// (`apiId` is the broker's code name), retries and several brokers wrap that in MultipleErrors,
// and its own failures carry a string `code`.
describe('classifySendError: @platformatic/kafka errors map to the same scopes', () => {
  const PRODUCE = 0;
  /** A Produce answer refusing partition 1 with `code` (the broker's number), as the library builds it. */
  const produceAnswer = (code: number) => new platformatic.ResponseError(PRODUCE, 9, { '/responses/0/partitionResponses/1': [code, null] }, {});
  /** What Producer.send rejects with: the answer, inside "Producing messages failed." (one per broker) */
  const sendFailed = (...errors: Error[]) => new platformatic.MultipleErrors('Producing messages failed.', errors);

  it('the broker codes of a Produce answer: record, topic, producer, broker, each by its name', () => {
    const cases: Array<[number, string, string]> = [
      [10, 'MESSAGE_TOO_LARGE', 'record'],
      [18, 'RECORD_LIST_TOO_LARGE', 'record'],
      [87, 'INVALID_RECORD', 'record'],
      [32, 'INVALID_TIMESTAMP', 'record'],
      [3, 'UNKNOWN_TOPIC_OR_PARTITION', 'topic'],
      [29, 'TOPIC_AUTHORIZATION_FAILED', 'topic'],
      [100, 'UNKNOWN_TOPIC_ID', 'topic'],
      [45, 'OUT_OF_ORDER_SEQUENCE_NUMBER', 'producer'],
      [59, 'UNKNOWN_PRODUCER_ID', 'producer'],
      [47, 'INVALID_PRODUCER_EPOCH', 'producer'],
      [46, 'DUPLICATE_SEQUENCE_NUMBER', 'producer'],
      [2, 'CORRUPT_MESSAGE', 'producer'],
      [6, 'NOT_LEADER_OR_FOLLOWER', 'broker'],
      [19, 'NOT_ENOUGH_REPLICAS', 'broker'],
      [7, 'REQUEST_TIMED_OUT', 'broker'],
    ];
    for (const [code, name, scope] of cases) {
      const err = sendFailed(produceAnswer(code));
      const r = classifySendError(err, 'orders');
      assert.equal(r.scope, scope, name);
      if (r.scope !== 'broker') assert.equal(r.code, name);
      else assert.ok(r.error instanceof BrokerUnavailableError, `${name}: ${r.error.message}`);
      assert.equal(r.error.cause, err);
    }
  });

  it('a code behind retries (MultipleErrors of every attempt) is found; a record error wins over an earlier network one', () => {
    const retried = new platformatic.MultipleErrors('produce failed 2 times.', [new platformatic.NetworkError('Connection closed'), produceAnswer(10)]);
    assert.equal(classifySendError(sendFailed(retried), 't').scope, 'record');
  });

  it('refused credentials, on connect or on a send: auth, whatever wraps them', () => {
    const sasl = new platformatic.AuthenticationError('SASL authentication failed.', { cause: new platformatic.ProtocolError('SASL_AUTHENTICATION_FAILED', 'Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256') });
    for (const err of [sasl, sendFailed(new platformatic.MultipleErrors('metadata failed 1 times.', [sasl]))]) {
      const r = classifySendError(err, 't');
      assert.equal(r.scope, 'auth');
      assert.match(r.error.message, /KAFKA_SECRET_ID/);
      assert.equal(isSaslAuthError(err), true);
    }
  });

  it('connection refused, closed or timed out: the broker is unavailable', () => {
    const refused = new platformatic.NetworkError('Connection to 127.0.0.1:1 failed.', { cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' }) });
    for (const err of [refused, new platformatic.TimeoutError('Request timed out'), sendFailed(new platformatic.NetworkError('Connection closed'))]) {
      const r = classifySendError(err, 't');
      assert.equal(r.scope, 'broker');
      assert.ok(r.error instanceof BrokerUnavailableError, r.error.message);
      assert.equal(isSaslAuthError(err), false);
    }
  });

  it('a topic the metadata does not know (deleted): the library says it in a UserError of its own, read as UNKNOWN_TOPIC_OR_PARTITION', () => {
    const err = sendFailed(new platformatic.UserError('Unknown topic test.orders.'));
    const r = classifySendError(err, 'test.orders');
    assert.ok(r.scope === 'topic');
    assert.equal(r.code, 'UNKNOWN_TOPIC_OR_PARTITION');
    assert.match(r.error.message, /does not exist \(or was deleted\)/);
    // any other UserError is not a topic's fault: it is not recognised
    assert.ok(classifySendError(new platformatic.UserError('Cannot close producer while producing messages.'), 't').error instanceof UnexpectedKafkaError);
  });
});
