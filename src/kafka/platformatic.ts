// @platformatic/kafka as the Publisher's client (producer-publisher.ts does the rest). Same
// contract as kafkajs.ts: an idempotent producer (the library then forces acks=all and one
// request in flight per connection), keys and headers as strings, the Java client's partitioner,
// gzip when asked, bounded retries.
//
// What this library does with its own state after a failed send, and why the Publisher still
// retires the producer: on any failure of an idempotent send it forgets its producer id and
// sequences, and the next send on the same object asks for a new producer id; inside one send it
// recovers from UNKNOWN_PRODUCER_ID and OUT_OF_ORDER_SEQUENCE_NUMBER by itself (a new producer
// id, the same records once more). Both are safe, but they are the library's behaviour of today,
// not a contract: the Publisher's rule (a new producer after any failed send) does not rely on them.
import {
  Admin,
  compatibilityPartitioner,
  ConfigResourceTypes,
  FindCoordinatorKeyTypes,
  Producer,
  stringSerializers,
  type ConnectionOptions,
  type ProducerOptions,
  type SASLOptions,
} from '@platformatic/kafka';
import type { KafkaCredentials, KafkaLogin } from '../domain.ts';
import type { OutboundMessage } from '../loop/ports.ts';
import type { ClientProducer, KafkaClient, PublisherOptions } from './producer-publisher.ts';
import type { ClientTransaction, TransactionalClientProducer, TransactionalKafkaClient } from './transactional.ts';

// Client retries: few and short, as kafkajs.ts's, for the same reasons (the budget; a producer
// whose retries ran out is not used again). The library's own default for an idempotent producer
// is to retry forever.
const RETRIES = 3;
// A transaction's first AddPartitionsToTxn is refused (CONCURRENT_TRANSACTIONS) while the broker
// still writes the previous one's markers, nearly every batch: retried after 20 ms, as the Java
// client does, not 100 (measured: 50 batches of 100 in 1.4 s, against 4.9 s), and often enough to
// wait about a second (three retries, 140 ms, ran out behind batches of 500 records of 1 KB).
const TRANSACTIONAL_RETRIES = 6;
const retryDelay = (_client: unknown, operation: string, attempt: number): number =>
  Math.min(2_000, (operation === 'addPartitionsToTransaction' ? 20 : 100) * 2 ** (attempt - 1));

const BROKER_TIMEOUT_MS = 10_000;

const MECHANISMS: Record<KafkaCredentials['mechanism'], SASLOptions['mechanism']> = {
  plain: 'PLAIN',
  'scram-sha-256': 'SCRAM-SHA-256',
  'scram-sha-512': 'SCRAM-SHA-512',
};

type StringProducer = Producer<string, string, string, string>;

export class PlatformaticClient implements KafkaClient, TransactionalKafkaClient {
  constructor(private readonly kafka: PublisherOptions['kafka']) {}

  async connect(login: KafkaLogin | undefined): Promise<ClientProducer> {
    const connection = this.connection(login);
    const producer = this.producer(connection, {});
    try {
      // The library connects lazily, on the first send. Asking for the producer id now is the
      // connect: it reaches a broker, logs in (a refused password surfaces here, as with kafkajs'
      // connect) and gives this producer its own producer id.
      await producer.initIdempotentProducer({});
    } catch (err) {
      await producer.close(true).catch(() => undefined);
      throw err;
    }
    return new PlatformaticProducer(producer, () => new Admin(connection));
  }

  /**
   * Exactly-once delivery's producer. The library initialises the transactional id at the first
   * beginTransaction (which fences older producers of the id). It asks as producer id 0, epoch 0
   * unless told, which the broker answers with PRODUCER_FENCED once the id has a history: -1/-1
   * ("no producer yet") is what a new producer must send. Its `timeout` is both the transaction
   * timeout and the broker's wait for replicas; the deadline races bound the latter.
   */
  connectTransactional(login: KafkaLogin | undefined, transactionalId: string, transactionTimeoutMs: number): Promise<TransactionalClientProducer> {
    const connection = this.connection(login);
    const producer = this.producer({ ...connection, timeout: transactionTimeoutMs, retries: TRANSACTIONAL_RETRIES }, { transactionalId, producerId: -1n, producerEpoch: -1 });
    return Promise.resolve(new PlatformaticTransactionalProducer(producer, () => new Admin(connection)));
  }

  private producer(connection: ReturnType<PlatformaticClient['connection']>, transactional: Pick<ProducerOptions<string, string, string, string>, 'transactionalId' | 'producerId' | 'producerEpoch'>): StringProducer {
    return new Producer({
      ...connection,
      ...transactional,
      idempotent: true,
      maxInflights: 1,
      acks: -1,
      autocreateTopics: false,
      // its default partitioner hashes keys differently: about half of the keys would land on
      // another partition than with kafkajs or the Java client (test/integration/partitions.test.ts)
      partitioner: compatibilityPartitioner,
      compression: this.kafka.compression === 'gzip' ? 'gzip' : 'none',
      serializers: stringSerializers,
    } satisfies ProducerOptions<string, string, string, string>);
  }

  /** What the producer and its admin client share: brokers, timeouts, retries, TLS, SASL. */
  private connection(login: KafkaLogin | undefined): ConnectionOptions & { clientId: string; bootstrapBrokers: string[]; retries: number; retryDelay: typeof retryDelay; timeout: number } {
    const k = this.kafka;
    return {
      clientId: k.clientId,
      bootstrapBrokers: k.brokers,
      connectTimeout: 3_000,
      requestTimeout: 10_000,
      retries: RETRIES,
      retryDelay,
      // the broker-side wait for replicas (and for InitProducerId)
      timeout: BROKER_TIMEOUT_MS,
      // SNI with the broker's host name, as kafkajs does (MSK needs it)
      ...(k.ssl ? { tls: { rejectUnauthorized: k.sslRejectUnauthorized }, tlsServerName: true } : {}),
      ...(login ? { sasl: sasl(login) } : {}),
    };
  }
}

/**
 * The library's SASL options. With MSK IAM, `token` is a function: the library calls it at every
 * authentication, a new connection's and the re-authentication it starts at 80% of the session's
 * lifetime (the broker's, which MSK ends when the token expires). A rejection becomes its
 * AuthenticationError (PLT_KFK_AUTHENTICATION) with ours as the cause.
 */
function sasl(login: KafkaLogin): SASLOptions {
  if (login.mechanism === 'aws-msk-iam') return { mechanism: 'OAUTHBEARER', token: login.token, authBytesValidator: refusedToken };
  return { mechanism: MECHANISMS[login.mechanism], username: login.username, password: login.password };
}

/**
 * A broker that refuses an OAUTHBEARER token answers with an error challenge
 * (`{"status":"invalid_token"}`, RFC 7628), not an error code, and the library (2.12) takes it for
 * success unless told: the connection then goes on unauthenticated. Told here, it fails the
 * authentication (PLT_KFK_AUTHENTICATION: refused credentials, classify.ts).
 */
function refusedToken(authBytes: Buffer, callback: (error: Error | null, result?: Buffer) => void): void {
  if (authBytes.length === 0) callback(null, authBytes);
  else callback(new Error(`SASL OAUTHBEARER: the broker refused the token (${authBytes.toString('utf8')})`));
}

class PlatformaticProducer implements ClientProducer {
  private admin: Admin | undefined;

  constructor(
    protected readonly producer: StringProducer,
    private readonly newAdmin: () => Admin,
  ) {}

  protected connectedAdmin(): Admin {
    this.admin ??= this.newAdmin();
    return this.admin;
  }

  // The broker-side wait is the producer's `timeout` (BROKER_TIMEOUT_MS), not per send as with
  // kafkajs: the deadline race around this call bounds the send as a whole.
  async send(topic: string, messages: OutboundMessage[]): Promise<void> {
    await this.producer.send({ messages: records(topic, messages) });
  }

  async topicConfig(topic: string, name: string): Promise<string | undefined> {
    const res = await this.connectedAdmin().describeConfigs({ includeSynonyms: false, resources: [{ resourceType: ConfigResourceTypes.TOPIC, resourceName: topic, configurationKeys: [name] }] });
    return res[0]?.configs.find((c) => c.name === name)?.value ?? undefined;
  }

  async close(): Promise<void> {
    // force: a send still running on it (abandoned at a deadline) must not keep it open
    await Promise.allSettled([this.producer.close(true), this.admin?.close()]);
  }
}

/** The library's records: the timestamp as a bigint of milliseconds (unset: the send time). */
function records(topic: string, messages: OutboundMessage[]) {
  return messages.map((m) => ({
    topic,
    key: m.key,
    value: m.value ?? undefined,
    headers: m.headers,
    ...(m.timestamp === undefined ? {} : { timestamp: BigInt(m.timestamp) }),
  }));
}

/**
 * The lane's offset goes in the transaction the way the library commits a consumer's: it takes a
 * consumer (for its group id) and a consumed message (topic, partition, offset and the group's
 * coordinator). The relay is no group member, so it passes what kafkajs' sendOffsets sends
 * (generation -1, no member id: a commit the broker takes for a group without members), and the
 * coordinator it looked up. Duck-typed on the library's 2.12 code, which package.json pins;
 * exactly-once.test.ts runs it with this client.
 */
class PlatformaticTransactionalProducer extends PlatformaticProducer implements TransactionalClientProducer {
  private coordinator: { group: string; nodeId: number } | undefined;

  async begin(): Promise<ClientTransaction> {
    const tx = await this.producer.beginTransaction();
    return {
      send: async (topic, messages) => {
        await tx.send({ messages: records(topic, messages) });
      },
      addOffset: async ({ group, topic, batchNo }) => {
        const coordinatorId = await this.groupCoordinator(group);
        await tx.addConsumer({ groupId: group } as unknown as Parameters<typeof tx.addConsumer>[0]);
        // the library commits a consumed message's offset + 1: the batch number is the committed offset
        const consumed = { topic, partition: 0, offset: BigInt(batchNo) - 1n, metadata: { consumer: { groupId: group, generationId: -1, memberId: '', coordinatorId } } };
        await tx.addOffset(consumed as unknown as Parameters<typeof tx.addOffset>[0]);
      },
      commit: () => tx.commit(),
      abort: () => tx.abort(),
    };
  }

  // requireStable: an offset whose transaction is still open is waited for, not read as absent
  async committedOffset(group: string): Promise<bigint> {
    let highest = -1n;
    for (const { topics } of await this.connectedAdmin().listConsumerGroupOffsets({ groups: [group], requireStable: true })) {
      for (const { partitions } of topics) for (const { committedOffset } of partitions) if (committedOffset > highest) highest = committedOffset;
    }
    return highest;
  }

  // the coordinator may move (a broker restart): a commit that fails retires this producer, and the cache with it
  private async groupCoordinator(group: string): Promise<number> {
    if (this.coordinator?.group !== group) {
      const [found] = await this.connectedAdmin().findCoordinator({ keyType: FindCoordinatorKeyTypes.GROUP, keys: [group] });
      if (!found) throw new Error(`Kafka named no coordinator for the consumer group ${group}`);
      this.coordinator = { group, nodeId: found.nodeId };
    }
    return this.coordinator.nodeId;
  }
}
