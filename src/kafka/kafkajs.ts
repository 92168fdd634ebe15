// kafkajs implementation of Publisher: idempotent producer, acks=all, one request in flight per
// broker (kafkajs does not enforce maxInFlightRequests=1 for idempotent producers, and without it
// a retried request can land behind a later one and reorder an aggregate).
import { CompressionTypes, Kafka, logLevel as KafkaLogLevel, Partitioners, type Admin, type KafkaConfig, type Producer, type SASLOptions } from 'kafkajs';
import type { Deadline } from '../budget.ts';
import type { Config } from '../config.ts';
import { DeadlineExceededError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { classifySendError, isSaslAuthError, type SendFailure } from './classify.ts';
import type { OutboundMessage } from './message.ts';
import type { PublishOutcome, Publisher } from './publisher.ts';

export interface KafkaCredentials {
  username: string;
  password: string;
  mechanism: 'plain' | 'scram-sha-256' | 'scram-sha-512';
}

export interface KafkajsPublisherOptions {
  kafka: Config['kafka'];
  /** configured OUTBOX_MAX_MESSAGE_BYTES; undefined = read the topic's limit from the broker */
  maxMessageBytes?: number;
  logger: Logger;
  /** resolves SASL credentials (from Secrets Manager); `refresh` bypasses the cache after an auth failure */
  credentials?: (refresh: boolean) => Promise<KafkaCredentials>;
}

// broker default message.max.bytes (1 MiB + record batch overhead)
const BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588;

export class KafkajsPublisher implements Publisher {
  private producer: Producer | undefined;
  private admin: Admin | undefined;
  private connecting: Promise<Producer> | undefined;
  private broken = false;
  private readonly limits = new Map<string, number>();
  connects = 0;

  constructor(private readonly opts: KafkajsPublisherOptions) {}

  private async client(refreshCredentials: boolean): Promise<Kafka> {
    const k = this.opts.kafka;
    const config: KafkaConfig = {
      clientId: k.clientId,
      brokers: k.brokers,
      ssl: k.ssl ? { rejectUnauthorized: k.sslRejectUnauthorized } : false,
      connectionTimeout: 3_000,
      requestTimeout: 10_000,
      // kafkajs' own retries cover a leader moving; a broker that is down is the deadline's job
      retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 2_000 },
      logLevel: KafkaLogLevel.WARN,
      logCreator: () => ({ namespace, level, log }) => {
        const { message, ...rest } = log;
        const fields = { kafkajs: namespace, ...rest };
        if (level <= KafkaLogLevel.ERROR) this.opts.logger.warn(`kafkajs: ${message}`, fields);
        else this.opts.logger.debug(`kafkajs: ${message}`, fields);
      },
    };
    if (this.opts.credentials) {
      const c = await this.opts.credentials(refreshCredentials);
      config.sasl = { mechanism: c.mechanism, username: c.username, password: c.password } as SASLOptions;
    }
    return new Kafka(config);
  }

  private async connected(deadline: Deadline): Promise<Producer> {
    if (this.broken) this.reset();
    if (this.producer) return this.producer;
    this.connecting ??= this.connect().finally(() => (this.connecting = undefined));
    return deadline.race('connecting to Kafka', this.connecting, () => {
      this.broken = true;
    });
  }

  private async connect(): Promise<Producer> {
    for (const refresh of [false, true]) {
      const kafka = await this.client(refresh);
      const producer = kafka.producer({
        idempotent: true,
        maxInFlightRequests: 1,
        allowAutoTopicCreation: false,
        createPartitioner: Partitioners.DefaultPartitioner,
        retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 2_000 },
      });
      try {
        await producer.connect();
        this.connects++;
        this.producer = producer;
        this.admin = kafka.admin();
        return producer;
      } catch (err) {
        await producer.disconnect().catch(() => undefined);
        // rotated credentials: fetch the secret again once, then give up
        if (!refresh && this.opts.credentials && isSaslAuthError(err)) {
          this.opts.logger.warn('Kafka authentication failed; refreshing the Kafka secret once');
          continue;
        }
        throw err;
      }
    }
    throw new Error('unreachable');
  }

  /** Drop a producer whose state is unknown (a send timed out mid-flight); the next call reconnects. */
  private reset(): void {
    const p = this.producer;
    const a = this.admin;
    this.producer = undefined;
    this.admin = undefined;
    this.broken = false;
    this.limits.clear();
    // do not wait for a hung broker to say goodbye
    void p?.disconnect().catch(() => undefined);
    void a?.disconnect().catch(() => undefined);
  }

  async publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome> {
    const outcome: PublishOutcome = { acked: [], rejected: [] };
    if (messages.length === 0) return outcome;
    let producer: Producer;
    try {
      producer = await this.connected(deadline);
    } catch (err) {
      outcome.unavailable = classifySendError(err, messages[0]!.topic).error;
      return outcome;
    }
    // One send per topic, concurrently. Within a topic, messages keep their order (same key →
    // same partition; one request in flight). Separate sends mean a failing topic cannot take
    // the acks of the others down with it.
    const byTopic = new Map<string, OutboundMessage[]>();
    for (const m of messages) {
      const list = byTopic.get(m.topic);
      if (list) list.push(m);
      else byTopic.set(m.topic, [m]);
    }
    await Promise.all([...byTopic].map(([topic, group]) => this.sendTopic(producer, topic, group, deadline, outcome)));
    return outcome;
  }

  private async sendTopic(producer: Producer, topic: string, group: OutboundMessage[], deadline: Deadline, outcome: PublishOutcome): Promise<void> {
    try {
      await this.send(producer, topic, group, deadline);
      for (const m of group) outcome.acked.push(m.seq);
      return;
    } catch (err) {
      const failure = classifySendError(err, topic);
      if (this.brokerDown(err, failure, outcome)) return;
      if (failure.scope === 'topic' || group.length === 1) {
        for (const m of group) outcome.rejected.push({ seq: m.seq, error: failure.error });
        return;
      }
    }
    // A record-level rejection of a multi-message request does not say which record: send them
    // one at a time, in order, so only the guilty row is charged an attempt.
    const blockedKeys = new Set<string>();
    for (const m of group) {
      // a later message of a rejected aggregate stays pending: publishing it would reorder
      if (blockedKeys.has(m.key)) continue;
      try {
        await this.send(producer, topic, [m], deadline);
        outcome.acked.push(m.seq);
      } catch (err) {
        const failure = classifySendError(err, topic);
        if (this.brokerDown(err, failure, outcome)) return;
        outcome.rejected.push({ seq: m.seq, error: failure.error });
        blockedKeys.add(m.key);
      }
    }
  }

  /** A broker-wide failure stops this topic's sends; a send abandoned at the deadline leaves the producer in an unknown state. */
  private brokerDown(err: unknown, failure: SendFailure, outcome: PublishOutcome): failure is Extract<SendFailure, { scope: 'broker' }> {
    if (failure.scope !== 'broker') return false;
    if (err instanceof DeadlineExceededError) this.broken = true;
    outcome.unavailable ??= failure.error;
    return true;
  }

  private send(producer: Producer, topic: string, group: OutboundMessage[], deadline: Deadline): Promise<unknown> {
    const compression = this.opts.kafka.compression === 'gzip' ? CompressionTypes.GZIP : CompressionTypes.None;
    return deadline.race(
      `publishing to ${topic}`,
      producer.send({
        topic,
        acks: -1,
        // the broker-side wait for replicas; the deadline race covers the rest
        timeout: Math.max(1_000, Math.min(30_000, deadline.remaining())),
        compression,
        messages: group.map((m) => ({ key: m.key, value: m.value, headers: m.headers })),
      }),
    );
  }

  async maxMessageBytes(topic: string, deadline: Deadline): Promise<number> {
    if (this.opts.maxMessageBytes !== undefined) return this.opts.maxMessageBytes;
    const cached = this.limits.get(topic);
    if (cached !== undefined) return cached;
    await this.connected(deadline);
    const admin = this.admin!;
    let limit = BROKER_DEFAULT_MAX_MESSAGE_BYTES;
    try {
      await deadline.race('connecting the Kafka admin client', admin.connect());
      const res = await deadline.race(
        `reading ${topic}'s config`,
        admin.describeConfigs({ includeSynonyms: false, resources: [{ type: 2 /* TOPIC */, name: topic, configNames: ['max.message.bytes'] }] }),
      );
      const value = res.resources[0]?.configEntries.find((e) => e.configName === 'max.message.bytes')?.configValue;
      if (value && /^\d+$/.test(value)) limit = Number(value);
    } catch (err) {
      if (err instanceof DeadlineExceededError) throw err;
      // unknown topic or no DescribeConfigs permission: the send itself will tell; use the default
      this.opts.logger.debug('could not read max.message.bytes; using the broker default', { topic, error: err });
    }
    this.limits.set(topic, limit);
    return limit;
  }

  async close(): Promise<void> {
    const p = this.producer;
    const a = this.admin;
    this.producer = undefined;
    this.admin = undefined;
    await Promise.allSettled([p?.disconnect(), a?.disconnect()]);
  }
}
