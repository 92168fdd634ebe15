// Exactly-once delivery's publisher (docs/DESIGN.md, "Exactly-once delivery (opt-in)"): every batch in one Kafka transaction
// of the lane's transactional id, committed by the loop only after the database has the batch on
// record (outbox/lanes.ts). It shares the records and their bounds with ProducerPublisher
// (message.ts) and differs where a transaction makes it differ: a failed send aborts the whole
// batch (nothing of it is acked), and the producer never outlives a failure, as there.
import { BUDGET, Deadline } from '../budget.ts';
import type { KafkaLogin, OutboxRow } from '../domain.ts';
import { DeadlineExceededError, TransactionAbortedError, type MessageRejectedError, type RelayError } from '../errors.ts';
import type { OutboundMessage, PublishOutcome, TransactionalPublisher } from '../loop/ports.ts';
import { classifySendError, isSaslAuthError, type SendFailure } from './classify.ts';
import { compressionSlack, splitBySize, toMessage, tooLarge } from './message.ts';
import { oneKeyPerAggregate, type ClientProducer, type PublisherOptions } from './producer-publisher.ts';

/** One Kafka transaction of a transactional producer. */
export interface ClientTransaction {
  send(topic: string, messages: OutboundMessage[], brokerTimeoutMs: number): Promise<void>;
  /** `batchNo` as `group`'s offset on `topic` partition 0, within the transaction (TxnOffsetCommit). */
  addOffset(offset: { group: string; topic: string; batchNo: string }): Promise<void>;
  commit(): Promise<void>;
  abort(): Promise<void>;
}

export interface TransactionalClientProducer extends ClientProducer {
  /** The producer's first begin initialises its id: every older producer of the id is fenced, the transaction it left open ended. */
  begin(): Promise<ClientTransaction>;
  /** The highest offset `group` has committed on any partition, -1 when none. */
  committedOffset(group: string): Promise<bigint>;
}

export interface TransactionalKafkaClient {
  connectTransactional(login: KafkaLogin | undefined, transactionalId: string, transactionTimeoutMs: number): Promise<TransactionalClientProducer>;
}

// broker default message.max.bytes, and the most record bytes one send carries (producer-publisher.ts)
const BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588;
const MAX_REQUEST_BYTES = 1_048_576;

export class LanePublisher implements TransactionalPublisher {
  private producer: Promise<TransactionalClientProducer> | undefined;
  private open: { tx: ClientTransaction; topic: string } | undefined;
  private readonly limits = new Map<string, number>();
  /** the broker refused our credentials on a send: the next connect reads the secret again first */
  private refreshCredentials = false;
  connects = 0;

  constructor(
    private readonly opts: PublisherOptions,
    private readonly client: TransactionalKafkaClient,
    private readonly transactionalId: string,
    /** the transaction's own timeout: the lease's, so an open transaction never outlives its holder by much */
    private readonly transactionTimeoutMs: number,
  ) {}

  toMessage(row: OutboxRow, topicTemplate: string): OutboundMessage {
    return toMessage(row, topicTemplate, this.opts.metadata);
  }

  tooLarge(m: OutboundMessage, limitBytes: number, unreadValueBytes?: number): MessageRejectedError | undefined {
    return tooLarge(m, limitBytes, unreadValueBytes);
  }

  /** Fences the lane's earlier producers now: what their last transaction did is final once this returns. */
  async fence(deadline: Deadline): Promise<void> {
    await this.transaction(deadline);
  }

  /** The lane's last batch number Kafka committed (its group's offset); call after fence(). */
  async committedBatch(deadline: Deadline): Promise<bigint> {
    const producer = await this.current(deadline);
    try {
      return await deadline.race('reading the lane\'s committed batch from Kafka', producer.committedOffset(this.transactionalId));
    } catch (err) {
      // a coordinator still loading after a broker restart, say: Kafka unavailable, as for a send
      if (err instanceof DeadlineExceededError) throw err;
      throw classifySendError(err, this.transactionalId, this.opts.kafka.auth).error;
    }
  }

  async maxMessageBytes(topic: string, deadline: Deadline): Promise<number> {
    if (this.opts.maxMessageBytes !== undefined) return this.opts.maxMessageBytes;
    const cached = this.limits.get(topic);
    if (cached !== undefined) return cached;
    let limit = BROKER_DEFAULT_MAX_MESSAGE_BYTES;
    try {
      const producer = await this.current(deadline);
      const value = await deadline.race(`reading ${topic}'s max.message.bytes`, producer.topicConfig(topic, 'max.message.bytes'));
      if (value && /^\d+$/.test(value)) limit = Number(value);
    } catch (err) {
      if (err instanceof DeadlineExceededError) throw err;
      const failure = classifySendError(err, topic, this.opts.kafka.auth);
      if (failure.scope === 'broker' || failure.scope === 'auth') throw failure.error;
      this.opts.logger.debug('could not read max.message.bytes; using the broker default', { topic, error: err });
    }
    this.limits.set(topic, limit);
    return limit;
  }

  /** Acked means written in the open transaction: nothing is visible to read_committed consumers before commit(). */
  async publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome> {
    const outcome: PublishOutcome = { acked: [], rejected: [], backedOff: [] };
    if (messages.length === 0) return outcome;
    // A record-level refusal of a multi-record send does not say which record, and may blame none
    // (each fits where their sends together did not: a limit the relay does not know). The batch
    // once more, that topic's records one per send: all acked, that is the batch's transaction;
    // else the refused record alone is charged, and the batch's other rows go back to pending.
    // Each round adds a topic, so there are at most as many as the batch has topics, plus one.
    const singly = new Set<string>();
    for (let refused = await this.attempt(messages, deadline, outcome, singly); refused; refused = await this.attempt(messages, deadline, outcome, singly)) singly.add(refused);
    return outcome;
  }

  /**
   * The batch in a transaction of its own: acked, it stays open for commit(); else aborted, and
   * the failure in `outcome`, except a multi-record send refused at the record level, whose topic
   * is returned (`singly`: those topics' records one per send).
   */
  private async attempt(messages: OutboundMessage[], deadline: Deadline, outcome: PublishOutcome, singly: ReadonlySet<string>): Promise<string | undefined> {
    let tx: ClientTransaction;
    try {
      tx = await this.transaction(deadline);
    } catch (err) {
      outcome.unavailable = classifySendError(err, messages[0]!.topic, this.opts.kafka.auth).error;
      return undefined;
    }
    const failed = await this.sendAll(tx, messages, deadline, singly);
    if (!failed) {
      outcome.acked = messages.map((m) => m.seq);
      this.open = { tx, topic: messages[0]!.topic };
      return undefined;
    }
    await this.discard(tx, deadline);
    const { topic, part, failure } = failed;
    if (failure.scope === 'auth' && this.opts.credentials) this.refreshCredentials = true;
    if (failure.scope === 'topic') outcome.backedOff.push({ topic, error: failure.error });
    else if (failure.scope !== 'record') outcome.unavailable = failure.error;
    else if (part.length === 1) outcome.rejected.push({ seq: part[0]!.seq, error: failure.error });
    else return topic;
    return undefined;
  }

  /**
   * After the database recorded the batch in flight (LaneStore.record): the commit that makes it
   * visible. The lane's offset goes in first; refused (its topic deleted since the send, say), the
   * transaction is aborted, never committed: TransactionAbortedError.
   */
  async commit(batchNo: string, deadline: Deadline): Promise<void> {
    const open = this.open;
    this.open = undefined;
    if (!open) throw new Error('no Kafka transaction is open to commit: a bug in the relay, report it');
    try {
      await deadline.race("adding the lane's offset to the Kafka transaction", open.tx.addOffset({ group: this.transactionalId, topic: open.topic, batchNo }));
    } catch (err) {
      // out of time: the batch stays on record, and the lane's next holder frees its rows
      if (err instanceof DeadlineExceededError) {
        this.drop();
        throw classifySendError(err, open.topic, this.opts.kafka.auth).error;
      }
      // never committed whatever the abort does: not waited for (a broker gone would take the budget)
      void this.discard(open.tx);
      const failure = classifySendError(err, open.topic, this.opts.kafka.auth);
      throw new TransactionAbortedError(failure.error, failure.scope === 'topic' ? { topic: open.topic, error: failure.error } : undefined);
    }
    try {
      await deadline.race('committing the Kafka transaction', open.tx.commit());
    } catch (err) {
      // committed or not, nobody can tell from here: the lane's next holder finds out (fence, committedBatch)
      this.drop();
      throw classifySendError(err, open.topic, this.opts.kafka.auth).error;
    }
  }

  /** The open transaction, if any, is aborted (nothing of it becomes visible). */
  async abort(): Promise<void> {
    const open = this.open;
    this.open = undefined;
    if (open) await this.discard(open.tx);
  }

  close(): Promise<void> {
    this.open = undefined;
    this.drop();
    return Promise.resolve();
  }

  /** The first failure, if any; the sends of a topic in order, the topics at once; `singly`'s records one per send. */
  private async sendAll(tx: ClientTransaction, messages: OutboundMessage[], deadline: Deadline, singly: ReadonlySet<string>): Promise<{ topic: string; part: OutboundMessage[]; failure: SendFailure } | undefined> {
    const byTopic = new Map<string, OutboundMessage[]>();
    for (const m of messages) byTopic.set(m.topic, [...(byTopic.get(m.topic) ?? []), m]);
    let first: { topic: string; part: OutboundMessage[]; failure: SendFailure } | undefined;
    const brokerTimeoutMs = Math.max(1_000, Math.min(30_000, deadline.remaining()));
    await Promise.all(
      [...byTopic].map(async ([topic, group]) => {
        let limit: number;
        try {
          limit = Math.min(await this.maxMessageBytes(topic, deadline), MAX_REQUEST_BYTES);
        } catch (err) {
          first ??= { topic, part: group, failure: { scope: 'broker', error: err as RelayError } };
          return;
        }
        if (this.opts.kafka.compression !== 'none') limit -= compressionSlack(limit);
        const parts = singly.has(topic) ? group.map((m) => [m]) : splitBySize(group, limit).flatMap(oneKeyPerAggregate);
        for (const part of parts) {
          if (first) return;
          try {
            await deadline.race(`publishing to ${topic}`, tx.send(topic, part, brokerTimeoutMs));
          } catch (err) {
            first ??= { topic, part, failure: classifySendError(err, topic, this.opts.kafka.auth) };
            return;
          }
        }
      }),
    );
    return first;
  }

  private async transaction(deadline: Deadline): Promise<ClientTransaction> {
    if (this.open) return this.open.tx;
    const producer = await this.current(deadline);
    const tx = await deadline.race('beginning a Kafka transaction', producer.begin());
    this.open = { tx, topic: '' };
    return tx;
  }

  private current(deadline: Deadline): Promise<TransactionalClientProducer> {
    if (!this.producer) {
      const connecting = (async () => {
        const producer = await this.connect();
        this.connects++;
        return producer;
      })();
      connecting.catch(() => {
        if (this.producer === connecting) this.producer = undefined;
      });
      this.producer = connecting;
    }
    return deadline.race('connecting to Kafka', this.producer);
  }

  /** As ProducerPublisher's: credentials the broker refuses are read again (the secret rotated, a token expired) once. */
  private async connect(): Promise<TransactionalClientProducer> {
    const { credentials } = this.opts;
    let refresh = this.refreshCredentials;
    for (;;) {
      try {
        const producer = await this.client.connectTransactional(credentials ? await credentials(refresh) : undefined, this.transactionalId, this.transactionTimeoutMs);
        this.refreshCredentials = false;
        return producer;
      } catch (err) {
        if (refresh || !credentials || !isSaslAuthError(err)) throw err;
        this.opts.logger.warn('Kafka authentication failed; refreshing the Kafka secret once');
        refresh = true;
      }
    }
  }

  /** Aborted, then closed: the next transaction is a new producer's, which fences this one for good. */
  private async discard(tx: ClientTransaction, deadline?: Deadline): Promise<void> {
    if (this.open?.tx === tx) this.open = undefined;
    // at once, so that no transaction begins on it while the abort runs
    const producer = this.detach();
    // a broker that does not answer the abort: the transaction times out on its own (transactionTimeoutMs)
    const bound = deadline ?? new Deadline(Date.now() + BUDGET.transactionAbortWaitMs);
    await bound.race('aborting the Kafka transaction', tx.abort()).catch(() => undefined);
    void producer?.then((p) => p.close()).catch(() => undefined);
  }

  private drop(): void {
    void this.detach()?.then((p) => p.close()).catch(() => undefined);
  }

  private detach(): Promise<TransactionalClientProducer> | undefined {
    const producer = this.producer;
    this.producer = undefined;
    this.limits.clear();
    return producer;
  }
}
