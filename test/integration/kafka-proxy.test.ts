// services: kafka, kafka-proxy-ports alone
// The test proxy (kafka-proxy.ts) against the real broker: a client bootstrapped at the proxy
// stays behind it, a dropped Produce answer fails the send although the broker appended the
// message, a held one arrives late, and dropAllConnections really closes sockets.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import kafkajs, { type KafkaConfig, type Producer } from 'kafkajs';
import { startKafkaProxy, type KafkaProxy } from './kafka-proxy.ts';
import {
  consumeAll,
  createTopics,
  KAFKA_PROXIED_PORT,
  KAFKA_PROXY_PORT,
  KAFKA_SASL_PROXIED_PORT,
  KAFKA_SASL_PROXY_PORT,
  KAFKA_SCRAM_PASSWORD,
  KAFKA_SCRAM_USER,
  uniqueName,
} from './helpers.ts';

const { Kafka, logLevel } = kafkajs;

/** A client whose every connection goes through the proxy; small retries so a lost answer fails fast. */
function clientVia(port: number, extra: Partial<KafkaConfig> = {}) {
  return new Kafka({
    clientId: 'kafka-proxy-test',
    brokers: [`127.0.0.1:${port}`],
    connectionTimeout: 2_000,
    requestTimeout: 3_000,
    retry: { retries: 1, initialRetryTime: 100 },
    logLevel: logLevel.NOTHING,
    ...extra,
  });
}

const values = (messages: { value: string | null }[], value: string) => messages.filter((m) => m.value === value).length;

describe(`kafka proxy 127.0.0.1:${KAFKA_PROXY_PORT} → ${KAFKA_PROXIED_PORT} (PROXIED listener)`, () => {
  const topic = uniqueName('test.proxy');
  let proxy: KafkaProxy;
  let producer: Producer;

  before(async () => {
    proxy = await startKafkaProxy({ listenPort: KAFKA_PROXY_PORT, targetPort: KAFKA_PROXIED_PORT });
    await createTopics([topic], 1);
    producer = clientVia(proxy.port).producer();
    await producer.connect();
  });

  after(async () => {
    await producer?.disconnect();
    await proxy?.close();
  });

  it('metadata fetched through the proxy names the proxy as the broker', async () => {
    const admin = clientVia(proxy.port).admin();
    await admin.connect();
    try {
      const { brokers } = await admin.describeCluster();
      assert.deepEqual(brokers.map((b) => `${b.host}:${b.port}`), [`127.0.0.1:${KAFKA_PROXY_PORT}`]);
    } finally {
      await admin.disconnect();
    }
  });

  it("'pass' forwards Produce answers: the send succeeds", async () => {
    proxy.setProduceAnswers('pass');
    const before = proxy.produceRequests;
    const [meta] = await producer.send({ topic, messages: [{ value: 'pass' }] });
    assert.equal(meta?.errorCode, 0);
    assert.ok(proxy.produceRequests > before, 'the Produce request went through the proxy');
    assert.equal(proxy.dropped, 0);
  });

  it("'drop' loses the answer: the send fails, yet the broker has appended the message", async () => {
    proxy.setProduceAnswers('drop');
    try {
      await assert.rejects(producer.send({ topic, messages: [{ value: 'dropped' }] }));
      assert.ok(proxy.dropped >= 1, `dropped ${proxy.dropped}`);
    } finally {
      proxy.setProduceAnswers('pass');
    }
    // read directly from 127.0.0.1:9092, not through the proxy: 'pass' once, 'dropped' once per attempt
    const messages = await consumeAll([topic], 2);
    assert.equal(values(messages, 'pass'), 1);
    assert.ok(values(messages, 'dropped') >= 1, 'the message whose answer was dropped is on the topic');
  });

  it("'hold' delays the answer: the send succeeds, late", async () => {
    proxy.setProduceAnswers('hold', 800);
    const dropped = proxy.dropped;
    try {
      const started = Date.now();
      const [meta] = await producer.send({ topic, messages: [{ value: 'held' }] });
      assert.equal(meta?.errorCode, 0);
      assert.ok(Date.now() - started >= 750, `answered after ${Date.now() - started} ms`);
      assert.equal(proxy.dropped, dropped + 1);
    } finally {
      proxy.setProduceAnswers('pass');
    }
  });

  it('dropAllConnections closes the open sockets; a client then reconnects', async () => {
    const socket = net.connect({ port: proxy.port, host: '127.0.0.1' });
    await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    while (proxy.connections < 2) await new Promise((r) => setTimeout(r, 10)); // the producer's and ours
    proxy.dropAllConnections();
    await closed;
    assert.equal(proxy.connections, 0);
    const [meta] = await producer.send({ topic, messages: [{ value: 'after-drop-all' }] });
    assert.equal(meta?.errorCode, 0);
  });
});

describe(`kafka proxy 127.0.0.1:${KAFKA_SASL_PROXY_PORT} → ${KAFKA_SASL_PROXIED_PORT} (SASL_PROXIED listener, SCRAM)`, () => {
  it('a SCRAM producer sends through the proxy, which sees its Produce request', async () => {
    const topic = uniqueName('test.proxy_sasl');
    await createTopics([topic], 1);
    const proxy = await startKafkaProxy({ listenPort: KAFKA_SASL_PROXY_PORT, targetPort: KAFKA_SASL_PROXIED_PORT });
    const producer = clientVia(proxy.port, {
      sasl: { mechanism: 'scram-sha-512', username: KAFKA_SCRAM_USER, password: KAFKA_SCRAM_PASSWORD },
    }).producer();
    try {
      await producer.connect();
      const [meta] = await producer.send({ topic, messages: [{ value: 'sasl' }] });
      assert.equal(meta?.errorCode, 0);
      assert.equal(proxy.produceRequests, 1);
    } finally {
      await producer.disconnect();
      await proxy.close();
    }
  });
});
