// The Publisher both Kafka clients share (kafkajs.ts, platformatic.ts): everything that does not
// depend on the client library. A client only provides `KafkaClient`: connect a new idempotent
// producer, send one topic's messages on it, read a topic's config, close it.
//
// What a send carries is bounded (splitBySize), and what a failure does depends on its scope
// (classify.ts): a record is charged, a topic is backed off, a producer is replaced and the send
// retried once, a broker that is down stops the invocation. And a producer never outlives a
// failed send (see sendOnce).
import type { Deadline } from '../budget.ts';
import type { Config } from '../config/types.ts';
import type { KafkaLogin, Metadata, OutboxRow } from '../domain.ts';
import { DeadlineExceededError, type MessageRejectedError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { OutboundMessage, PublishOutcome, Publisher } from '../loop/ports.ts';
import { classifySendError, isSaslAuthError, type SendFailure } from './classify.ts';
import { compressionSlack, splitBySize, toMessage, tooLarge } from './message.ts';

export interface PublisherOptions {
  kafka: Config['kafka'];
  /** what the messages carry for consumers besides the row (OUTBOX_METADATA); none when not given */
  metadata?: Metadata;
  /** configured OUTBOX_MAX_MESSAGE_BYTES; undefined = read the topic's limit from the broker */
  maxMessageBytes?: number;
  logger: Logger;
  /**
   * how to log in: SASL credentials (from Secrets Manager) or MSK IAM tokens; `refresh`, after the
   * broker refused them, reads the secret again or signs a new token
   */
  credentials?: (refresh: boolean) => Promise<KafkaLogin>;
}

/** One idempotent producer (one producer id, acks=all, one request in flight) of a client library. */
export interface ClientProducer {
  /** One send of one topic's messages; rejects with the library's own error (classify.ts reads it). */
  send(topic: string, messages: OutboundMessage[], brokerTimeoutMs: number): Promise<void>;
  /** A topic config's value as the broker reports it; undefined when absent. */
  topicConfig(topic: string, name: string): Promise<string | undefined>;
  /** Disconnect everything the producer opened. Never used again afterwards. */
  close(): Promise<void>;
}

/** A Kafka client library. */
export interface KafkaClient {
  /**
   * A new producer, connected and with a producer id of its own. Rejects with the library's error
   * when the broker cannot be reached or refuses the credentials (classify.ts: isSaslAuthError).
   */
  connect(login: KafkaLogin | undefined): Promise<ClientProducer>;
}

// broker default message.max.bytes (1 MiB + record batch overhead)
const BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588;
/**
 * Most record bytes one send carries (a message larger than this that its topic takes goes alone):
 * the Java producer's max.request.size default, far under any broker's socket.request.max.bytes.
 */
const MAX_REQUEST_BYTES = 1_048_576;

/** One producer of the client, and the state of its use. */
interface ProducerSlot {
  producer: ClientProducer;
  /** sends started on it and not yet settled */
  inFlight: number;
  /** a send on it failed: no new send may start on it; closed once its last send settles */
  retired: boolean;
  disposed: boolean;
  /**
   * the client's own calls on it (sends, config reads) not yet settled. A deadline abandons a call,
   * not the library's work: kafkajs goes on with an abandoned send, and may connect a broker for
   * it (a metadata refresh) after the producer was closed, a socket the close never saw
   */
  running: Set<Promise<unknown>>;
}

type PartResult = 'continue' | 'stop';

/** A connect under way, shared by the sends that wait for it; abandoned when one of them gives up at its deadline. */
interface Connecting {
  done: Promise<ProducerSlot>;
  abandoned: boolean;
}

export class ProducerPublisher implements Publisher {
  private slot: ProducerSlot | undefined;
  private connecting: Connecting | undefined;
  /** the broker refused our credentials on a send: the next connect reads the secret again first */
  private refreshCredentials = false;
  private readonly limits = new Map<string, number>();
  connects = 0;
  /** close() was called: a connect that finishes later is disposed of, never used */
  private closed = false;

  constructor(
    protected readonly opts: PublisherOptions,
    private readonly client: KafkaClient,
  ) {}

  /** A row as a Kafka record (message.ts). */
  toMessage(row: OutboxRow, topicTemplate: string): OutboundMessage {
    return toMessage(row, topicTemplate, this.opts.metadata);
  }

  tooLarge(m: OutboundMessage, limitBytes: number, unreadValueBytes?: number): MessageRejectedError | undefined {
    return tooLarge(m, limitBytes, unreadValueBytes);
  }

  /** The producer every new send uses; connects one when there is none (first use, or the last was retired). */
  private async current(deadline: Deadline): Promise<ProducerSlot> {
    if (this.slot) return this.slot;
    const attempt = (this.connecting ??= this.startConnect());
    try {
      return await deadline.race('connecting to Kafka', attempt.done);
    } catch (err) {
      // A connect that outlives its invocation is never handed to the next one (a warm container):
      // begun while the broker was away (paused, partitioned), kafkajs can finish it with a broker
      // object that is connected but was never initialised, and answers every send with "Broker not
      // connected". It is closed when it finishes; the next invocation connects afresh.
      attempt.abandoned = true;
      if (this.connecting === attempt) this.connecting = undefined;
      throw err;
    }
  }

  private startConnect(): Connecting {
    const attempt = { abandoned: false } as Connecting;
    attempt.done = this.connect()
      .finally(() => {
        if (this.connecting === attempt) this.connecting = undefined;
      })
      .then((slot) => {
        // abandoned at a deadline, or close() was called meanwhile: disposed of, never used
        if (attempt.abandoned || this.closed) {
          this.dispose(slot);
          throw new DeadlineExceededError('connecting to Kafka');
        }
        this.slot = slot;
        return slot;
      });
    attempt.done.catch(noop);
    return attempt;
  }

  private async connect(): Promise<ProducerSlot> {
    let refresh = this.refreshCredentials;
    for (;;) {
      let producer: ClientProducer;
      try {
        producer = await this.client.connect(this.opts.credentials ? await this.opts.credentials(refresh) : undefined);
      } catch (err) {
        // rotated credentials, or a token the broker no longer takes: fetch the secret again (sign a new token) once, then give up
        if (!refresh && this.opts.credentials && isSaslAuthError(err)) {
          this.opts.logger.warn('Kafka authentication failed; refreshing the Kafka secret once');
          refresh = true;
          continue;
        }
        throw err;
      }
      this.refreshCredentials = false;
      this.connects++;
      return { producer, inFlight: 0, retired: false, disposed: false, running: new Set() };
    }
  }

  /**
   * One send of one topic's messages on the current producer, bounded by the deadline.
   *
   * A producer never outlives a failed send. When a Produce request fails, a client may leave its
   * idempotence state (producer id, epoch, sequence numbers) out of step with the broker's:
   * kafkajs rolls back the sequence numbers of every partition in it, including partitions the
   * broker did append (a request whose answer was lost or came too late, or one partition refused
   * while the others were written). The broker recognises an idempotent producer's duplicate by
   * (producer id, epoch, first and last sequence) of a recent batch, not by its content. So the
   * same producer, used again, is either refused forever (OUT_OF_ORDER_SEQUENCE_NUMBER: the relay
   * stuck on one batch) or, worse, sends *different* rows under a sequence range the broker
   * already holds and is told "duplicate, acknowledged" without anything being written: rows
   * marked sent that are not on Kafka. A new producer has a new producer id and starts its
   * sequences at zero, so neither can happen; the price is at most one more copy of rows the
   * broker had in fact appended (G2). The rule holds for every client, whatever it does with its
   * own state after a failure (platformatic.ts says what that one does).
   */
  private async sendOnce(topic: string, group: OutboundMessage[], deadline: Deadline): Promise<void> {
    const slot = await this.current(deadline);
    slot.inFlight++;
    try {
      // the broker-side wait for replicas; the deadline race covers the rest
      const brokerTimeoutMs = Math.max(1_000, Math.min(30_000, deadline.remaining()));
      await deadline.race(`publishing to ${topic}`, track(slot, slot.producer.send(topic, group, brokerTimeoutMs)));
    } catch (err) {
      this.retire(slot, topic, err);
      throw err;
    } finally {
      slot.inFlight--;
      if (slot.retired && slot.inFlight === 0) this.dispose(slot);
    }
  }

  /** No new send starts on `slot`; sends still running on it (other topics) finish first. */
  private retire(slot: ProducerSlot, topic: string, err: unknown): void {
    if (slot.retired) return;
    slot.retired = true;
    if (this.slot === slot) this.slot = undefined;
    // a topic's limit may have changed with it (recreated): read it again
    this.limits.clear();
    this.opts.logger.info('a send failed: this Kafka producer is discarded, the next send uses a new producer id', { topic, error: err });
  }

  private dispose(slot: ProducerSlot): void {
    if (slot.disposed) return;
    // do not wait for a hung broker to say goodbye
    void closeSlot(slot);
  }

  /**
   * sendOnce, and once more with a new producer when the failure was the producer's state or our
   * credentials (read from the secret again first). Returns the failure that stands, if any.
   */
  private async trySend(topic: string, group: OutboundMessage[], deadline: Deadline): Promise<SendFailure | undefined> {
    let failure: SendFailure;
    try {
      await this.sendOnce(topic, group, deadline);
      return undefined;
    } catch (err) {
      failure = classifySendError(err, topic, this.opts.kafka.auth);
    }
    if (failure.scope !== 'producer' && failure.scope !== 'auth') return failure;
    if (failure.scope === 'auth' && this.opts.credentials) this.refreshCredentials = true;
    this.opts.logger.warn(`send refused (${failure.code}); retrying once with a new producer`, { topic, messages: group.length });
    try {
      await this.sendOnce(topic, group, deadline);
      return undefined;
    } catch (err) {
      return classifySendError(err, topic, this.opts.kafka.auth);
    }
  }

  async publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome> {
    const outcome: PublishOutcome = { acked: [], rejected: [], backedOff: [] };
    if (messages.length === 0) return outcome;
    // One send per topic, concurrently. Within a topic, messages keep their order (same key →
    // same partition; one request in flight). Separate sends mean a failing topic cannot take
    // the acks of the others down with it.
    const byTopic = new Map<string, OutboundMessage[]>();
    for (const m of messages) {
      const list = byTopic.get(m.topic);
      if (list) list.push(m);
      else byTopic.set(m.topic, [m]);
    }
    await Promise.all([...byTopic].map(([topic, group]) => this.publishTopic(topic, group, deadline, outcome)));
    return outcome;
  }

  /** A topic's messages in sends that fit, one after the other (order); stops at a topic- or broker-wide failure. */
  private async publishTopic(topic: string, group: OutboundMessage[], deadline: Deadline, outcome: PublishOutcome): Promise<void> {
    let limit: number;
    try {
      limit = Math.min(await this.topicLimit(topic, deadline), MAX_REQUEST_BYTES);
    } catch (err) {
      outcome.unavailable ??= classifySendError(err, topic, this.opts.kafka.auth).error;
      return;
    }
    if (this.opts.kafka.compression !== 'none') limit -= compressionSlack(limit);
    // a rejected row's later rows (same aggregate, whatever their keys) stay pending: publishing them would reorder (G4)
    const blocked = new Set<string>();
    for (const part of splitBySize(group, limit).flatMap(oneKeyPerAggregate)) {
      const sendable = part.filter((m) => !blocked.has(m.aggregateid));
      if (sendable.length === 0) continue;
      if ((await this.publishPart(topic, sendable, deadline, outcome, blocked)) === 'stop') return;
    }
  }

  private async publishPart(topic: string, part: OutboundMessage[], deadline: Deadline, outcome: PublishOutcome, blocked: Set<string>): Promise<PartResult> {
    const failure = await this.trySend(topic, part, deadline);
    if (!failure) {
      for (const m of part) outcome.acked.push(m.seq);
      return 'continue';
    }
    if (failure.scope !== 'record') return stopFor(topic, failure, outcome);
    if (part.length === 1) {
      reject(part[0]!, failure.error, outcome, blocked);
      return 'continue';
    }
    // A record-level refusal of a multi-record send does not say which record: send them one at a
    // time, in order, so only the guilty row is charged. Partitions the broker did append get one
    // more copy of their rows (at-least-once, same ids), on a new producer (see sendOnce).
    for (const m of part) {
      if (blocked.has(m.aggregateid)) continue;
      const single = await this.trySend(topic, [m], deadline);
      if (!single) outcome.acked.push(m.seq);
      else if (single.scope === 'record') reject(m, single.error, outcome, blocked);
      else return stopFor(topic, single, outcome);
    }
    return 'continue';
  }

  /** The topic's limit; rejects with the failure classified (a RelayError), as the Publisher port says. */
  async maxMessageBytes(topic: string, deadline: Deadline): Promise<number> {
    try {
      return await this.topicLimit(topic, deadline);
    } catch (err) {
      throw classifySendError(err, topic, this.opts.kafka.auth).error;
    }
  }

  /** The topic's limit; rejects with the client library's error, or DeadlineExceededError. */
  private async topicLimit(topic: string, deadline: Deadline): Promise<number> {
    if (this.opts.maxMessageBytes !== undefined) return this.opts.maxMessageBytes;
    const cached = this.limits.get(topic);
    if (cached !== undefined) return cached;
    const slot = await this.current(deadline);
    let limit = BROKER_DEFAULT_MAX_MESSAGE_BYTES;
    try {
      const value = await deadline.race(`reading ${topic}'s max.message.bytes`, track(slot, slot.producer.topicConfig(topic, 'max.message.bytes')));
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
    this.closed = true;
    // a connect still under way disposes of its producer when it finishes (startConnect), or it
    // would hold a connection, and the process, open forever
    const slot = this.slot;
    this.slot = undefined;
    if (slot) await closeSlot(slot);
  }
}

/** `call`, counted among the slot's running calls until it settles. */
function track<T>(slot: ProducerSlot, call: Promise<T>): Promise<T> {
  slot.running.add(call);
  const settled = (): void => void slot.running.delete(call);
  call.then(settled, settled);
  return call;
}

/**
 * Closes the slot's producer now and, when calls abandoned at a deadline are still running on it,
 * once more after they settle (the client's retries bound them): a connection one of them opened
 * after the first close would otherwise stay open in a warm container until the broker drops it
 * as idle (connections.max.idle.ms, 10 minutes by default). Resolves after the first close.
 */
async function closeSlot(slot: ProducerSlot): Promise<void> {
  slot.disposed = true;
  const running = [...slot.running];
  await slot.producer.close().catch(noop);
  if (running.length > 0) void Promise.allSettled(running).then(() => slot.producer.close().catch(noop));
}

/** `m` is charged; its aggregate's later rows are held (the aggregate is the unit of order, whatever the key). */
function reject(m: OutboundMessage, error: MessageRejectedError, outcome: PublishOutcome, blocked: Set<string>): void {
  outcome.rejected.push({ seq: m.seq, error });
  blocked.add(m.aggregateid);
}

/**
 * A send's messages, in order, cut into consecutive sends in each of which an aggregate's
 * messages share one key. The broker takes or refuses a send's records per partition, and one
 * key is one partition: with the key from another column (OUTBOX_KEY_COLUMN=id, type), two rows
 * of an aggregate can have different keys, so different partitions, and a send holding both could
 * have the later one appended while the earlier one is refused (G4). With the default key (the
 * aggregate) nothing is cut.
 */
export function oneKeyPerAggregate<M extends OutboundMessage>(messages: M[]): M[][] {
  const sends: M[][] = [];
  let current: M[] = [];
  let keys = new Map<string, string>();
  for (const m of messages) {
    const key = keys.get(m.aggregateid);
    if (key !== undefined && key !== m.key) {
      sends.push(current);
      current = [];
      keys = new Map();
    }
    keys.set(m.aggregateid, m.key);
    current.push(m);
  }
  if (current.length > 0) sends.push(current);
  return sends;
}

/** A failure wider than one record: the topic's remaining rows stay pending, uncharged. */
function stopFor(topic: string, failure: Exclude<SendFailure, { scope: 'record' }>, outcome: PublishOutcome): PartResult {
  if (failure.scope === 'topic') outcome.backedOff.push({ topic, error: failure.error });
  else outcome.unavailable ??= failure.error;
  return 'stop';
}

function noop(): void {}
