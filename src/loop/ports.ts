// What the invocation loop needs from the database (Store) and from Kafka (Publisher): the loop
// sees each side only through these. OutboxStore/BatchTx (src/outbox/store.ts, batch-tx.ts) and
// ProducerPublisher (src/kafka/producer-publisher.ts) implement them against the real services;
// the model-based tests implement them in memory.
import type { Deadline } from '../budget.ts';
import type { OutboxRow } from '../domain.ts';
import type { MessageRejectedError, RelayError } from '../errors.ts';
import type { Failure } from './settlement.ts';

/**
 * Where retention deletes old rows (src/outbox/sql.ts pruneSql): the sent table, and skipped rows
 * in the outbox.
 */
export type PruneTarget = 'sent' | 'skipped';

/** What one call of a partitioned outbox's maintenance did (src/outbox/partitioned.sql): partitions made, dropped, and left for the next call. */
export interface PartitionMaintenance {
  created: number;
  dropped: number;
  busy: number;
}

export interface ClaimedRow extends OutboxRow {
  /** false: an earlier unsent row of its aggregate is outside this claim, so this one is held back (G4) */
  publishable: boolean;
  /** the unsent row of this aggregate, not in the claim, that holds this one back */
  first_gap?: string | null;
  /**
   * held back behind an unclaimable row, one this invocation cannot take now: locked by a
   * transaction that is not a relay's (a foreign lock), not due or parked by hand, or marked waiting
   * (heldGapsSql); its aggregate is left out of the invocation's later claims (docs/order-guard.md)
   */
  behindUnclaimable?: boolean;
  /** of those, behind a stale mark: clearing the stale marks frees it (Store.clearStaleMarks) */
  behindStaleMark?: boolean;
}

/** What a claim leaves out, besides rows others hold. */
export interface ClaimFilter {
  /** aggregates this invocation found held back behind an unclaimable row (ClaimedRow.behindUnclaimable) */
  aggregates: string[];
  /** the rows of this invocation's batch in flight: theirs is no gap (they are other aggregates) */
  inFlight: string[];
  /** topics backed off in this invocation, and the template that routes rows without a topic */
  topics: string[];
  topicTemplate: string;
}

/** Why a claim found nothing (rows locked by others, or waiting behind failed rows, or none). */
export type NothingClaimable = 'locked' | 'behind-failed-rows' | 'empty';

/** One batch's transaction: open → (COMMIT on the wire) → ended. */
export interface BatchTransaction {
  /** Up to `limit` rows in seq order, locked by this transaction, with the order guard's verdict. */
  claim(limit: number, filter: ClaimFilter): Promise<ClaimedRow[]>;
  /** Fill in the payloads the claim left out (payloadLeftOut) of these claimed rows, read now. */
  readPayloads(rows: ClaimedRow[]): Promise<void>;
  /** Write the marks of rows about to be sent, uncommitted, while they are on their way (see store). */
  premark(seqs: string[]): void;
  /**
   * If exactly the premarked rows were acked and nothing failed: write COMMIT and resolve (once it
   * is on the wire) with its answer, which the caller reads later (wrapped: a promise resolved
   * with a promise would wait for it). Otherwise resolve undefined.
   */
  commitIfAllPremarked(sent: string[], failures: Failure[]): Promise<{ answer: Promise<void> } | undefined>;
  /** Mark exactly `sent`, record `failures`, COMMIT, and wait for the answer. */
  markAndCommit(sent: string[], failures: Failure[]): Promise<void>;
  /** Never throws; a no-op once the transaction has ended or its COMMIT is on the wire. */
  rollback(): Promise<void>;
}

export interface InsertWatch {
  /** UNLISTEN and close the connection. Never rejects. */
  close(): Promise<void>;
}

export interface Store {
  /**
   * The client can no longer commit a batch: a connection closed, or a statement or a rollback
   * missed its time, and the client is (being) ended, its open transactions rolled back by the
   * server (OutboxStore.abandon). Nothing claimed on it is published any more: this says why, as
   * the error `what` fails with; undefined while the client is usable.
   */
  unusable(what: string): Error | undefined;
  /** Open a batch transaction; `after`: a transaction whose COMMIT is on the wire, to follow on its connection. */
  begin(deadline: Deadline, after?: BatchTransaction): Promise<BatchTransaction>;
  nothingClaimable(deadline: Deadline): Promise<NothingClaimable>;
  /** Before the first claim: clear stale marks; `blocked`: markWaiting has work (OutboxStore). */
  clearStaleMarks(deadline: Deadline): Promise<{ cleared: number; blocked: boolean }>;
  /** Alongside the loop: mark the rows written behind blocking rows since the last pass (OutboxStore). */
  markWaiting(deadline: Deadline): Promise<number>;
  /** The highest seq among pending rows, null when none: a lingering invocation's cheap probe for new rows. */
  newestPending(deadline: Deadline): Promise<string | null>;
  /**
   * LISTEN for the table's inserts (the insert trigger) on a connection of its own, until
   * close(). Rejects when LISTEN cannot be set up; `lost` is called if that connection closes.
   */
  watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch>;
  /**
   * Before the first claim of an invocation, once per client: the tables the marks will write
   * exist and may be written (OutboxStore.checkTables). Rejects with a DatabaseError that says what
   * to do, so that nothing is published that could not then be marked sent. Resolves to warnings
   * the invocation logs (an UNLOGGED outbox), given once per client.
   */
  checkTables(deadline: Deadline): Promise<readonly string[]>;
  /**
   * Known once checkTables() resolved: the outbox and its sent table are partitioned by `migrate`,
   * with its maintenance function, which this role may call (docs/schema.md, "Partitioned
   * outboxes"). Then maintainPartitions() makes their partitions and drops the old ones, and the
   * sent table is not pruned by rows. Absent: plain tables (the model's stores).
   */
  readonly partitionsMaintained?: boolean;
  /** One call of the maintenance function; `retainSentMs` null drops no sent partition. */
  maintainPartitions?(retainSentMs: number | null, deadline: Deadline): Promise<PartitionMaintenance>;
  /** One retention chunk (see OutboxStore.pruneChunk): rows deleted, fewer than `limit` when none older is left. */
  pruneChunk(what: PruneTarget, retainMs: number, limit: number, deadline: Deadline): Promise<number>;
}

/** A row as the publisher sends it (Publisher.toMessage). */
export interface OutboundMessage {
  seq: string;
  aggregateid: string;
  topic: string;
  key: string;
  value: string | null;
  headers: Record<string, string>;
  /** the record's timestamp (ms since the epoch: CreateTime), when the metadata set it; else the client's send time */
  timestamp?: number;
}

/** How rows become the publisher's messages: the broker's rules, which the loop's plan (src/loop/plan.ts) asks. */
export interface MessageFormat {
  /**
   * The message `row` becomes, its topic routed by `topicTemplate` (topicFor). Throws
   * MessageRejectedError when the row can never be sent as it is (a topic name the broker refuses).
   */
  toMessage(row: OutboxRow, topicTemplate: string): OutboundMessage;
  /**
   * Why `message` can never be sent to a topic that takes at most `limitBytes` (maxMessageBytes);
   * undefined when it fits. `unreadValueBytes`: the size of a value not read (its row's payload,
   * left out by the claim), counted in its place.
   */
  tooLarge(message: OutboundMessage, limitBytes: number, unreadValueBytes?: number): MessageRejectedError | undefined;
}

export interface PublishOutcome {
  /** seqs the broker acknowledged with acks=all: the only rows that may be marked sent */
  acked: string[];
  /** seqs rejected for a reason tied to the message itself (size, invalid record): counted as an attempt */
  rejected: Array<{ seq: string; error: MessageRejectedError }>;
  /**
   * topics the broker refused as a whole (unknown, deleted, not authorized): their unacked rows
   * stay pending without an attempt charged, and the invocation sends nothing more to them
   */
  backedOff: Array<{ topic: string; error: MessageRejectedError }>;
  /** set when the broker or network failed as a whole; rows neither acked nor rejected stay pending */
  unavailable?: RelayError;
}

/**
 * The loop talks to Kafka only through this interface, so another client (e.g. a librdkafka
 * binding) can be added without touching the loop. Turning rows into messages (MessageFormat) and
 * classifying the broker's errors are the publisher's.
 */
export interface Publisher extends MessageFormat {
  /** Publish in order; messages with the same key keep their relative order. Never throws for send failures. */
  publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome>;
  /**
   * Largest message the broker accepts on `topic`, in bytes (cached). Rejects, when the broker
   * cannot be asked, with the failure already classified: a RelayError (PublishOutcome.unavailable).
   */
  maxMessageBytes(topic: string, deadline: Deadline): Promise<number>;
  /**
   * Producers connected since the publisher was created, each with a producer id of its own: warm
   * invocations without failures add none, every failed send adds one (the failed one is discarded).
   */
  readonly connects: number;
  close(): Promise<void>;
}
