// The publisher's own state across invocations of a warm container (pure logic: a fake client
// whose connects and sends the test settles by hand). What the real clients do with a broker that
// is paused is tested against one in linger.test.ts and broker-faults.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Deadline } from '../../src/budget.ts';
import { loadConfig } from '../../src/config/load.ts';
import { DeadlineExceededError } from '../../src/errors.ts';
import { oneKeyPerAggregate, ProducerPublisher, type ClientProducer, type KafkaClient } from '../../src/kafka/producer-publisher.ts';
import { createLogger } from '../../src/log.ts';
import type { OutboundMessage } from '../../src/loop/ports.ts';

const config = loadConfig({ DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092', OUTBOX_MAX_MESSAGE_BYTES: '100000' });

class FakeProducer implements ClientProducer {
  sent = 0;
  closed = false;
  constructor(readonly id: number) {}
  send(_topic: string, messages: OutboundMessage[]): Promise<void> {
    this.sent += messages.length;
    return Promise.resolve();
  }
  topicConfig(): Promise<string | undefined> {
    return Promise.resolve(undefined);
  }
  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }
}

/** connect() calls wait until the test settles them */
class HandConnectedClient implements KafkaClient {
  readonly pending: Array<{ producer: FakeProducer; give: () => void }> = [];
  async connect(): Promise<ClientProducer> {
    const producer = new FakeProducer(this.pending.length + 1);
    return new Promise((resolve) => this.pending.push({ producer, give: () => resolve(producer) }));
  }
}

const message: OutboundMessage = { seq: '1', aggregateid: 'a', topic: 'orders', key: 'a', value: '{}', headers: {} };

function publisher(client: KafkaClient): ProducerPublisher {
  return new ProducerPublisher({ kafka: config.kafka, maxMessageBytes: config.outbox.maxMessageBytes, logger: createLogger('error', {}, () => undefined) }, client);
}

describe('ProducerPublisher in a warm container', () => {
  it('a connect that outlived its invocation (the broker was paused) is closed when it finishes, never used by the next invocation', async () => {
    const client = new HandConnectedClient();
    const pub = publisher(client);
    const first = await pub.publish([message], new Deadline(Date.now() + 30));
    assert.ok(first.unavailable instanceof DeadlineExceededError, `the first invocation gives up at its deadline: ${String(first.unavailable)}`);
    // the broker comes back: the abandoned connect finishes after its invocation ended
    client.pending[0]!.give();
    await new Promise((r) => setImmediate(r));

    const next = pub.publish([message], new Deadline(Date.now() + 5_000));
    await new Promise((r) => setImmediate(r));
    assert.equal(client.pending.length, 2, 'the next invocation connects a producer of its own');
    client.pending[1]!.give();
    const outcome = await next;
    assert.deepEqual(outcome.acked, ['1']);
    const [late, fresh] = client.pending.map((p) => p.producer);
    assert.equal(late!.sent, 0, 'nothing is sent on the late producer');
    assert.ok(late!.closed, 'the late producer is closed');
    assert.equal(fresh!.sent, 1);
    assert.equal(pub.connects, 2);
  });

  it('sends of one invocation waiting for the same connect share it', async () => {
    const client = new HandConnectedClient();
    const pub = publisher(client);
    const deadline = new Deadline(Date.now() + 5_000);
    const both = pub.publish([message, { ...message, seq: '2', topic: 'payments' }], deadline);
    await new Promise((r) => setImmediate(r));
    assert.equal(client.pending.length, 1, 'one connect for both topics');
    client.pending[0]!.give();
    assert.deepEqual((await both).acked.sort(), ['1', '2']);
    assert.equal(client.pending[0]!.producer.sent, 2);
  });

  it('a connect under way when the publisher is closed is closed when it finishes', async () => {
    const client = new HandConnectedClient();
    const pub = publisher(client);
    const sending = pub.publish([message], new Deadline(Date.now() + 5_000));
    await new Promise((r) => setImmediate(r));
    await pub.close();
    client.pending[0]!.give();
    const outcome = await sending;
    assert.ok(outcome.unavailable, 'the send does not go out on a closed publisher');
    assert.ok(client.pending[0]!.producer.closed);
    assert.equal(client.pending[0]!.producer.sent, 0);
  });

  it('a send abandoned at its deadline: its producer is closed at once, and once more when the send settles (kafkajs can connect a broker for it after the first close)', async () => {
    /** sends wait until the test settles them; closes are counted */
    class HangingProducer extends FakeProducer {
      closes = 0;
      readonly sends: Array<(err?: Error) => void> = [];
      override send(): Promise<void> {
        return new Promise((resolve, reject) => this.sends.push((err) => (err ? reject(err) : resolve())));
      }
      override close(): Promise<void> {
        this.closes++;
        return super.close();
      }
    }
    const producers: HangingProducer[] = [];
    const pub = publisher({ connect: () => Promise.resolve(producers[producers.push(new HangingProducer(producers.length + 1)) - 1]!) });
    const first = await pub.publish([message], new Deadline(Date.now() + 30));
    assert.ok(first.unavailable instanceof DeadlineExceededError, `the invocation gives up at its deadline: ${String(first.unavailable)}`);
    const abandoned = producers[0]!;
    await new Promise((r) => setImmediate(r));
    assert.equal(abandoned.closes, 1, 'the producer of the abandoned send is closed at once');
    // the library finishes the send (its own retries run out) after that close
    abandoned.sends[0]!(new Error('Request timed out'));
    await new Promise((r) => setImmediate(r));
    assert.equal(abandoned.closes, 2, 'and closed again once the send settled');

    // the same on close(): a send still running when the publisher is closed
    const sending = pub.publish([message], new Deadline(Date.now() + 60_000));
    await new Promise((r) => setImmediate(r));
    const last = producers[1]!;
    await pub.close();
    assert.equal(last.closes, 1);
    last.sends[0]!();
    await sending;
    await new Promise((r) => setImmediate(r));
    assert.equal(last.closes, 2, 'a send running at close() closes its producer again when it settles');
  });
});

/**
 * A broker whose partitions are the keys: a send is refused when any of its records is, but
 * appends the records of every other partition (key), as a Produce request's partitions are taken
 * or refused one by one.
 */
class PartitionedClient implements KafkaClient {
  /** what the broker appended, in order */
  readonly appended: string[] = [];
  readonly sends: string[][] = [];
  constructor(private readonly refused: ReadonlySet<string>) {}
  connect(): Promise<ClientProducer> {
    return Promise.resolve({
      send: (_topic: string, messages: OutboundMessage[]) => {
        this.sends.push(messages.map((m) => m.seq));
        const refusedKeys = new Set(messages.filter((m) => this.refused.has(m.seq)).map((m) => m.key));
        for (const m of messages) if (!refusedKeys.has(m.key)) this.appended.push(m.seq);
        return refusedKeys.size === 0 ? Promise.resolve() : Promise.reject(Object.assign(new Error('refused'), { type: 'INVALID_RECORD' }));
      },
      topicConfig: () => Promise.resolve(undefined),
      close: () => Promise.resolve(),
    });
  }
}

describe('ProducerPublisher: a record the broker refuses holds its aggregate\'s later rows, whatever their keys (G4)', () => {
  const m = (seq: string, aggregateid: string, key: string): OutboundMessage => ({ seq, aggregateid, topic: 'orders', key, value: '{}', headers: {} });

  it('the key from another column (OUTBOX_KEY_COLUMN=type): A\'s second row, another key, is neither sent nor acked after A\'s first is refused; B flows', async () => {
    const client = new PartitionedClient(new Set(['1']));
    const outcome = await publisher(client).publish([m('1', 'A', 'Placed'), m('2', 'A', 'Paid'), m('3', 'B', 'Placed'), m('4', 'B', 'Paid')], new Deadline(Date.now() + 5_000));
    assert.deepEqual(outcome.rejected.map((r) => r.seq), ['1']);
    assert.deepEqual(outcome.acked, ['3', '4']);
    assert.ok(!client.appended.includes('2'), `A's later row never reached a partition: appended ${client.appended.join(', ')}`);
  });

  it('a send holds an aggregate\'s rows of one key only (one partition): a change of key starts the next send, after the first is acked; the default key cuts nothing', async () => {
    const client = new PartitionedClient(new Set());
    const outcome = await publisher(client).publish([m('1', 'A', 'x'), m('2', 'B', 'y'), m('3', 'A', 'x'), m('4', 'A', 'z'), m('5', 'B', 'y')], new Deadline(Date.now() + 5_000));
    assert.deepEqual(outcome.acked, ['1', '2', '3', '4', '5']);
    assert.deepEqual(client.sends, [['1', '2', '3'], ['4', '5']]);
    assert.deepEqual(oneKeyPerAggregate([m('1', 'A', 'A'), m('2', 'B', 'B'), m('3', 'A', 'A')]).map((s) => s.map((x) => x.seq)), [['1', '2', '3']]);
  });
});
