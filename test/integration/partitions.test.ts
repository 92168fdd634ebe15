// services: postgres, kafka
// Both clients put a key on the same partition (and carry the same key, value and headers): a
// deployment can switch OUTBOX_KAFKA_CLIENT without an aggregate's events moving to another
// partition, which would break its order for consumers. @platformatic/kafka's default
// partitioner does not do this (about half of the keys land elsewhere); platformatic.ts uses its
// compatibilityPartitioner, the Java client's hash, which kafkajs' DefaultPartitioner also is.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { createPublisher } from '../../src/kafka/clients.ts';
import { createLogger } from '../../src/log.ts';
import type { OutboundMessage, Publisher } from '../../src/loop/ports.ts';
import { consumeAll, createTopics, DATABASE_URL, KAFKA_BROKERS, uniqueName, type Consumed } from './helpers.ts';

const KEYS = 2_000;
const PARTITIONS = 12;

async function publishAll(publisher: Publisher, topic: string): Promise<void> {
  const messages: OutboundMessage[] = Array.from({ length: KEYS }, (_, i) => ({
    seq: String(i + 1),
    aggregateid: `order-${i}`,
    topic,
    key: `order-${i}`,
    value: i % 100 === 0 ? null : JSON.stringify({ i, note: 'ü€' }),
    headers: { id: `id-${i}`, type: 'Happened', tenant: `t${i % 7}` },
  }));
  try {
    const outcome = await publisher.publish(messages, new Deadline(Date.now() + 30_000));
    assert.equal(outcome.acked.length, KEYS, JSON.stringify({ ...outcome, acked: outcome.acked.length }));
  } finally {
    await publisher.close();
  }
}

/** key → what arrived for it: its partition and the message as the consumer read it */
function byKey(messages: Consumed[]): Map<string, Consumed> {
  return new Map(messages.map((m) => [m.key!, m]));
}

describe('kafkajs and platformatic: the same partition for every key', () => {
  it(`${KEYS} keys on a ${PARTITIONS}-partition topic: each key on the same partition with both clients, with the same value and headers`, async () => {
    const prefix = uniqueName('test.partitions');
    const topics = { kafkajs: `${prefix}.kafkajs`, platformatic: `${prefix}.platformatic` };
    await createTopics(Object.values(topics), PARTITIONS);
    const config = loadConfig({ DATABASE_URL, KAFKA_BROKERS });
    const logger = createLogger('error');
    await Promise.all([
      publishAll(createPublisher({ kafka: { ...config.kafka, client: 'kafkajs' }, logger }), topics.kafkajs),
      publishAll(createPublisher({ kafka: { ...config.kafka, client: 'platformatic' }, logger }), topics.platformatic),
    ]);

    const [viaKafkajs, viaPlatformatic] = await Promise.all([consumeAll([topics.kafkajs], KEYS), consumeAll([topics.platformatic], KEYS)]);
    const a = byKey(viaKafkajs);
    const b = byKey(viaPlatformatic);
    assert.equal(a.size, KEYS);
    assert.equal(b.size, KEYS);
    const moved = [...a].filter(([key, m]) => b.get(key)?.partition !== m.partition);
    assert.equal(moved.length, 0, `${moved.length} of ${KEYS} keys on another partition (first: ${moved[0]?.[0]})`);
    for (const [key, m] of a) {
      const other = b.get(key)!;
      assert.deepEqual([other.value, other.headers], [m.value, m.headers], key);
    }
    // not a vacuous match (every key on one partition): the keys spread over all of them
    assert.equal(new Set([...a.values()].map((m) => m.partition)).size, PARTITIONS);
  });
});
