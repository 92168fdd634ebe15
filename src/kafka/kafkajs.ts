// kafkajs as the Publisher's client (producer-publisher.ts does the rest): an idempotent
// producer, acks=all, one request in flight per broker (kafkajs does not enforce
// maxInFlightRequests=1 for idempotent producers, and without it a retried request can land
// behind a later one and reorder an aggregate), the Java client's partitioner.
import { CompressionTypes, Kafka, logLevel as KafkaLogLevel, Partitioners, type Admin, type KafkaConfig, type Producer, type SASLOptions } from 'kafkajs';
import type { KafkaLogin } from '../domain.ts';
import type { Logger } from '../log.ts';
import type { OutboundMessage } from '../loop/ports.ts';
import type { ClientProducer, KafkaClient, PublisherOptions } from './producer-publisher.ts';

// Client retries: few and short. kafkajs warns that "limiting retries for the idempotent producer
// may invalidate EoS guarantees": true of a producer that is used again after its retries ran out,
// because kafkajs has then rolled its sequence numbers back (see ProducerPublisher.sendOnce in producer-publisher.ts). This
// one never is, so bounded retries are safe, and they must be bounded: an invocation has a budget,
// and a broker that stays down past a few retries is the next invocation's business, not this one's.
const RETRY = { retries: 3, initialRetryTime: 100, maxRetryTime: 2_000 };
const EOS_RETRIES_WARNING = /Limiting retries for the idempotent producer/;

export class KafkajsClient implements KafkaClient {
  constructor(
    private readonly kafka: PublisherOptions['kafka'],
    private readonly logger: Logger,
  ) {}

  async connect(login: KafkaLogin | undefined): Promise<ClientProducer> {
    const kafka = new Kafka(this.config(login));
    const producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
      retry: RETRY,
    });
    try {
      await producer.connect();
    } catch (err) {
      await producer.disconnect().catch(() => undefined);
      throw err;
    }
    return new KafkajsProducer(producer, kafka.admin(), this.kafka.compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None);
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
        if (level <= KafkaLogLevel.WARN && !EOS_RETRIES_WARNING.test(message)) this.logger.warn(`kafkajs: ${message}`, fields);
        else this.logger.debug(`kafkajs: ${message}`, fields);
      },
    };
    if (login) config.sasl = sasl(login);
    return config;
  }
}

/** kafkajs' SASL options; with MSK IAM, the provider is asked at every authentication (a new connection, a re-authentication). */
function sasl(login: KafkaLogin): SASLOptions {
  if (login.mechanism === 'aws-msk-iam') return { mechanism: 'oauthbearer', oauthBearerProvider: async () => ({ value: await login.token() }) };
  return { mechanism: login.mechanism, username: login.username, password: login.password } as SASLOptions;
}

/** One kafkajs producer (one producer id) and the admin client of the same Kafka instance. */
class KafkajsProducer implements ClientProducer {
  private adminConnected = false;

  constructor(
    private readonly producer: Producer,
    private readonly admin: Admin,
    private readonly compression: CompressionTypes,
  ) {}

  async send(topic: string, messages: OutboundMessage[], brokerTimeoutMs: number): Promise<void> {
    await this.producer.send({
      topic,
      acks: -1,
      timeout: brokerTimeoutMs,
      compression: this.compression,
      messages: messages.map((m) => ({ key: m.key, value: m.value, headers: m.headers })),
    });
  }

  async topicConfig(topic: string, name: string): Promise<string | undefined> {
    if (!this.adminConnected) {
      await this.admin.connect();
      this.adminConnected = true;
    }
    const res = await this.admin.describeConfigs({ includeSynonyms: false, resources: [{ type: 2 /* TOPIC */, name: topic, configNames: [name] }] });
    return res.resources[0]?.configEntries.find((e) => e.configName === name)?.configValue;
  }

  async close(): Promise<void> {
    await Promise.allSettled([this.producer.disconnect(), this.admin.disconnect()]);
  }
}
