// kafkajs as the Publisher's client (producer-publisher.ts does the rest): an idempotent
// producer, acks=all, one request in flight per broker (kafkajs does not enforce
// maxInFlightRequests=1 for idempotent producers, and without it a retried request can land
// behind a later one and reorder an aggregate), the Java client's partitioner.
import kafkajs, { CompressionTypes, Kafka, logLevel as KafkaLogLevel, Partitioners, type Admin, type KafkaConfig, type Mechanism, type Producer, type ProducerConfig, type ProducerRecord, type SASLOptions } from 'kafkajs';
import type { KafkaLogin } from '../domain.ts';
import type { Logger } from '../log.ts';
import type { OutboundMessage } from '../loop/ports.ts';
import type { ClientProducer, KafkaClient, PublisherOptions } from './producer-publisher.ts';
import type { ClientTransaction, TransactionalClientProducer, TransactionalKafkaClient } from './transactional.ts';

// Client retries: few and short. kafkajs warns that "limiting retries for the idempotent producer
// may invalidate EoS guarantees": true of a producer that is used again after its retries ran out,
// because kafkajs has then rolled its sequence numbers back (see ProducerPublisher.sendOnce in producer-publisher.ts). This
// one never is, so bounded retries are safe, and they must be bounded: an invocation has a budget,
// and a broker that stays down past a few retries is the next invocation's business, not this one's.
const RETRY = { retries: 3, initialRetryTime: 100, maxRetryTime: 2_000 };
// A transaction's AddPartitionsToTxn is refused (CONCURRENT_TRANSACTIONS) while the broker still
// writes the previous one's markers, nearly every batch: the transactional producer's first retry
// comes after 20 ms, as the Java client's does, and six of them wait about a second, as big
// batches' markers may take (measured: 200 batches of 20 in 3.1 s, against 6.9 s at 100 ms).
const TRANSACTIONAL_RETRY = { retries: 6, initialRetryTime: 20, maxRetryTime: 2_000 };
const EOS_RETRIES_WARNING = /Limiting retries for the idempotent producer/;
// CONCURRENT_TRANSACTIONS, retried (TRANSACTIONAL_RETRY): routine in exactly-once delivery
const CONCURRENT_TRANSACTIONS = /another concurrent operation on the same transaction/;

export class KafkajsClient implements KafkaClient, TransactionalKafkaClient {
  constructor(
    private readonly kafka: PublisherOptions['kafka'],
    private readonly logger: Logger,
  ) {}

  async connect(login: KafkaLogin | undefined): Promise<ClientProducer> {
    const { producer, admin } = await this.connected(login, {});
    return new KafkajsProducer(producer, admin, this.compression());
  }

  /** Exactly-once delivery's producer: kafkajs initialises its transactional id at the first transaction(), which fences. */
  async connectTransactional(login: KafkaLogin | undefined, transactionalId: string, transactionTimeoutMs: number): Promise<TransactionalClientProducer> {
    const { producer, admin } = await this.connected(login, { transactionalId, transactionTimeout: transactionTimeoutMs, retry: TRANSACTIONAL_RETRY });
    return new KafkajsTransactionalProducer(producer, admin, this.compression());
  }

  private async connected(login: KafkaLogin | undefined, transactional: Pick<ProducerConfig, 'transactionalId' | 'transactionTimeout' | 'retry'>): Promise<{ producer: Producer; admin: Admin }> {
    const kafka = new Kafka(this.config(login));
    const producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
      retry: RETRY,
      ...transactional,
    });
    try {
      await producer.connect();
    } catch (err) {
      await producer.disconnect().catch(() => undefined);
      throw err;
    }
    return { producer, admin: kafka.admin() };
  }

  private compression(): CompressionTypes {
    return this.kafka.compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None;
  }

  private config(login: KafkaLogin | undefined): KafkaConfig {
    const k = this.kafka;
    const config: KafkaConfig = {
      clientId: k.clientId,
      brokers: k.brokers,
      ssl: k.ssl ? { rejectUnauthorized: k.sslRejectUnauthorized } : false,
      connectionTimeout: 3_000,
      requestTimeout: 10_000,
      retry: RETRY,
      logLevel: KafkaLogLevel.WARN,
      logCreator: () => ({ namespace, level, log }) => {
        const { message, ...rest } = log;
        const fields = { kafkajs: namespace, ...rest };
        // the retries warning is answered above (RETRY): not worth a line per producer
        const routine = EOS_RETRIES_WARNING.test(message) || CONCURRENT_TRANSACTIONS.test(`${message} ${String(rest.error)}`);
        if (level <= KafkaLogLevel.WARN && !routine) this.logger.warn(`kafkajs: ${message}`, fields);
        else this.logger.debug(`kafkajs: ${message}`, fields);
      },
    };
    if (login) config.sasl = sasl(login);
    return config;
  }
}

/** kafkajs' SASL options; with MSK IAM, OAUTHBEARER asking for the token at every authentication (a new connection, a re-authentication). */
function sasl(login: KafkaLogin): SASLOptions | Mechanism {
  if (login.mechanism === 'aws-msk-iam') return { mechanism: 'OAUTHBEARER', authenticationProvider: oauthBearer(login.token) };
  return { mechanism: login.mechanism, username: login.username, password: login.password } as SASLOptions;
}

/**
 * SASL/OAUTHBEARER (RFC 7628), as kafkajs' own but for a refused token. A broker that refuses one
 * answers with an error challenge (`{"status":"invalid_token"}`), not with an error code; the
 * client must then send %x01, and only that answer fails. kafkajs 2.2.4 takes the challenge for
 * success: the connection goes on unauthenticated and its next request fails as a closed
 * connection or ILLEGAL_SASL_STATE, read as an unavailable broker. Here it is a
 * KafkaJSSASLAuthenticationError, so a refused token is handled as refused credentials
 * (classify.ts): a new token, once, then a failure that says so.
 */
// not a named export of the CommonJS module; its type declares no constructor arguments, and the
// class takes a message as every kafkajs error does
const SaslAuthenticationError = kafkajs.KafkaJSSASLAuthenticationError as unknown as new (message: string) => Error;

function oauthBearer(token: () => Promise<string>): Mechanism['authenticationProvider'] {
  // kafkajs writes a request's encoding as it is, so it must carry its length (Kafka's BYTES)
  const bytes = (b: Buffer) => {
    const framed = Buffer.alloc(4 + b.length);
    framed.writeInt32BE(b.length);
    b.copy(framed, 4);
    return { encode: () => Promise.resolve(framed) };
  };
  // and hands the server's bytes over the same way, after their length
  const raw = { decode: (b: Buffer) => Promise.resolve(b.length >= 4 ? b.subarray(4, 4 + Math.max(0, b.readInt32BE(0))) : b), parse: (b: Buffer) => b };
  return ({ saslAuthenticate }) => ({
    async authenticate() {
      const value = await token();
      const challenge = await saslAuthenticate<Buffer>({ request: bytes(Buffer.from(`n,,\x01auth=Bearer ${value}\x01\x01`)), response: raw });
      if (!challenge || challenge.length === 0) return;
      const refusal = challenge.toString('utf8');
      try {
        await saslAuthenticate({ request: bytes(Buffer.from('\x01')) });
      } catch (err) {
        throw new SaslAuthenticationError(`SASL OAUTHBEARER: the broker refused the token (${refusal}): ${(err as Error).message}`);
      }
      throw new SaslAuthenticationError(`SASL OAUTHBEARER: the broker refused the token (${refusal})`);
    },
  });
}

/** A send's record batch as kafkajs takes it. */
function record(topic: string, messages: OutboundMessage[], brokerTimeoutMs: number, compression: CompressionTypes): ProducerRecord {
  return {
    topic,
    acks: -1,
    timeout: brokerTimeoutMs,
    compression,
    // kafkajs takes the record's timestamp as a string of milliseconds (unset: the send time)
    messages: messages.map((m) => ({
      key: m.key,
      value: m.value,
      headers: m.headers,
      ...(m.timestamp === undefined ? {} : { timestamp: String(m.timestamp) }),
    })),
  };
}

/** One kafkajs producer (one producer id) and the admin client of the same Kafka instance. */
class KafkajsProducer implements ClientProducer {
  private adminConnected = false;

  constructor(
    protected readonly producer: Producer,
    private readonly admin: Admin,
    protected readonly compression: CompressionTypes,
  ) {}

  async send(topic: string, messages: OutboundMessage[], brokerTimeoutMs: number): Promise<void> {
    await this.producer.send(record(topic, messages, brokerTimeoutMs, this.compression));
  }

  protected async connectedAdmin(): Promise<Admin> {
    if (!this.adminConnected) {
      await this.admin.connect();
      this.adminConnected = true;
    }
    return this.admin;
  }

  async topicConfig(topic: string, name: string): Promise<string | undefined> {
    const admin = await this.connectedAdmin();
    const res = await admin.describeConfigs({ includeSynonyms: false, resources: [{ type: 2 /* TOPIC */, name: topic, configNames: [name] }] });
    return res.resources[0]?.configEntries.find((e) => e.configName === name)?.configValue;
  }

  async close(): Promise<void> {
    await Promise.allSettled([this.producer.disconnect(), this.admin.disconnect()]);
  }
}

class KafkajsTransactionalProducer extends KafkajsProducer implements TransactionalClientProducer {
  async begin(): Promise<ClientTransaction> {
    const tx = await this.producer.transaction();
    const compression = this.compression;
    return {
      async send(topic, messages, brokerTimeoutMs) {
        await tx.send(record(topic, messages, brokerTimeoutMs, compression));
      },
      async addOffset({ group, topic, batchNo }) {
        await tx.sendOffsets({ consumerGroupId: group, topics: [{ topic, partitions: [{ partition: 0, offset: batchNo }] }] });
      },
      commit: () => tx.commit(),
      abort: () => tx.abort(),
    };
  }

  // an offset committed in a transaction is visible only once that transaction has committed
  async committedOffset(group: string): Promise<bigint> {
    const admin = await this.connectedAdmin();
    let highest = -1n;
    for (const { partitions } of await admin.fetchOffsets({ groupId: group })) {
      for (const { offset } of partitions) if (BigInt(offset) > highest) highest = BigInt(offset);
    }
    return highest;
  }
}
