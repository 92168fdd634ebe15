// src/kafka/clients.ts: the configured Kafka client's module is imported on first use, once, and a
// module that cannot be imported stops the publish with an error that says so. That the deployed
// bundle then loads only the configured library is checked on the zip itself, under the Lambda
// runtime emulator (test/integration/lambda-runtime.test.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { KafkaClientLoadError } from '../../src/errors.ts';
import { CLIENT_LOADERS, kafkaClient } from '../../src/kafka/clients.ts';
import { ProducerPublisher, type ClientProducer, type KafkaClient } from '../../src/kafka/producer-publisher.ts';
import type { TransactionalKafkaClient } from '../../src/kafka/transactional.ts';
import { createLogger } from '../../src/log.ts';
import type { OutboundMessage } from '../../src/loop/ports.ts';

const config = loadConfig({ DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092', OUTBOX_MAX_MESSAGE_BYTES: '100000' });
const logger = createLogger('error', {}, () => undefined);
const message: OutboundMessage = { seq: '1', aggregateid: 'a', topic: 'orders', key: 'a', value: '{}', headers: {} };

const producer: ClientProducer = {
  send: () => Promise.resolve(),
  topicConfig: () => Promise.resolve(undefined),
  close: () => Promise.resolve(),
};
const loadedClient: KafkaClient & TransactionalKafkaClient = {
  connect: () => Promise.resolve(producer),
  connectTransactional: () => Promise.reject(new Error('not used here')),
};

describe('the Kafka client is loaded on first use (src/kafka/clients.ts)', () => {
  it("the client's module is imported at the first connect, not before, and only once", async () => {
    let loads = 0;
    const client = kafkaClient(config.kafka, logger, () => (loads++, Promise.resolve(loadedClient)));
    assert.equal(loads, 0, 'nothing imported when the client is made');
    // two connects at once (two topics' sends of one invocation) share the import
    assert.deepEqual(await Promise.all([client.connect(undefined), client.connect(undefined)]), [producer, producer]);
    await client.connect(undefined);
    assert.equal(loads, 1);
  });

  it('a module that cannot be imported: the publish stops as for an unavailable broker, no row charged, with an error naming the client and what to do; the next connect tries again', async () => {
    let loads = 0;
    const missing = Object.assign(new Error("Cannot find module '/var/task/chunks/platformatic-ABC.mjs' imported from /var/task/handler.mjs"), { code: 'ERR_MODULE_NOT_FOUND' });
    const client = kafkaClient({ ...config.kafka, client: 'platformatic' }, logger, () => (loads++ === 0 ? Promise.reject(missing) : Promise.resolve(loadedClient)));
    const publisher = new ProducerPublisher({ kafka: config.kafka, maxMessageBytes: 100_000, logger }, client);

    const first = await publisher.publish([message], new Deadline(Date.now() + 5_000));
    assert.deepEqual(first.acked, []);
    assert.deepEqual(first.rejected, [], 'no row is charged');
    assert.ok(first.unavailable instanceof KafkaClientLoadError, `the load error itself, not wrapped as an unknown Kafka error: ${String(first.unavailable)}`);
    assert.equal(first.unavailable.cause, missing);
    assert.match(first.unavailable.message, /the Kafka client platformatic \(OUTBOX_KAFKA_CLIENT\) could not be loaded: Cannot find module .*platformatic-ABC\.mjs/);
    assert.match(first.unavailable.message, /deploy the whole zip .*chunks\//);

    const next = await publisher.publish([message], new Deadline(Date.now() + 5_000));
    assert.equal(next.unavailable, undefined, String(next.unavailable));
    assert.deepEqual(next.acked, ['1']);
    assert.equal(loads, 2);
  });

  it("each client's loader imports that client", async () => {
    const kafkajs = await CLIENT_LOADERS.kafkajs(config.kafka, logger);
    const platformatic = await CLIENT_LOADERS.platformatic({ ...config.kafka, client: 'platformatic' }, logger);
    assert.equal(kafkajs.constructor.name, 'KafkajsClient');
    assert.equal(platformatic.constructor.name, 'PlatformaticClient');
  });
});
