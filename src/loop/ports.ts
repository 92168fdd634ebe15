// The loop sees the database and Kafka only through these ports, so the model-based tests can
// implement them in memory.
import type { Deadline } from '../budget.ts';
import type { OutboxRow } from '../domain.ts';
import type { MessageRejectedError, RelayError } from '../errors.ts';
import type { Failure } from './settlement.ts';

export type PruneTarget = 'sent' | 'skipped';

export interface PartitionMaintenance {
  created: number;
  dropped: number;
  busy: number;
}

export interface ClaimedRow extends OutboxRow {
  /** false: an earlier unsent row of its aggregate is outside this claim (G4) */
  publishable: boolean;
  first_gap?: string | null;
  /** held back behind a row this invocation cannot take now; its aggregate is left out of later claims (docs/order-guard.md) */
  behindUnclaimable?: boolean;
  /** of those, behind a stale mark: clearing the stale marks frees it (Store.clearStaleMarks) */
  behindStaleMark?: boolean;
}

export interface ClaimFilter {
  aggregates: string[];
  /** the batch in flight: its rows are no gap, they are other aggregates' */
  inFlight: string[];
  topics: string[];
  topicTemplate: string;
}

export type NothingClaimable = 'locked' | 'behind-failed-rows' | 'empty';

/** Exactly-once delivery: the statement that ends a lane's batch in flight, run in the batch's transaction before its COMMIT. */
export interface LaneSettlement {
  text: string;
  params: Array<string | number>;
}

export interface BatchTransaction {
  claim(limit: number, filter: ClaimFilter): Promise<ClaimedRow[]>;
  readPayloads(rows: ClaimedRow[]): Promise<void>;
  premark(seqs: string[]): void;
  /** The answer is wrapped: a promise resolved with a promise would wait for it, and the caller reads it later. */
  commitIfAllPremarked(sent: string[], failures: Failure[], settle?: LaneSettlement): Promise<{ answer: Promise<void> } | undefined>;
  markAndCommit(sent: string[], failures: Failure[], settle?: LaneSettlement): Promise<void>;
  /** Never throws: it runs on every failure path. */
  rollback(): Promise<void>;
}

/** Exactly-once delivery (docs/DESIGN.md, "Exactly-once delivery (opt-in)"): a lane one invocation holds. */
export interface LaneLease {
  lane: number;
  holder: string;
  /** the lane's Kafka transactional id, and the consumer group its transactions commit their batch number to */
  transactionalId: string;
  /** what the lane's last holder left in flight: its batch's number and rows, to settle before any send */
  unsettled?: { batchNo: string; seqs: string[] };
  /** its last holder never released it (dead or paused): it may have left a transaction open */
  abandoned: boolean;
}

export interface LaneStore {
  /** Undefined when every lane is leased. */
  lease(holder: string, leaseMs: number, deadline: Deadline): Promise<LaneLease | undefined>;
  /** Committed before the Kafka commit; the batch's number. Rejects with LaneLostError unless the lane is still ours and settled. */
  record(lease: LaneLease, seqs: string[], deadline: Deadline): Promise<string>;
  settlement(lease: LaneLease, batchNo: string): LaneSettlement;
  /** What the last holder left: marked sent (its Kafka transaction committed) or freed; the rows marked. */
  settleUnsettled(lease: LaneLease, committed: boolean, deadline: Deadline): Promise<number>;
  release(lease: LaneLease, deadline: Deadline): Promise<void>;
}

export interface InsertWatch {
  close(): Promise<void>;
}

export interface Store {
  /** Undefined while the client can still commit a batch; else why not, as the error `what` fails with. */
  unusable(what: string): Error | undefined;
  begin(deadline: Deadline, after?: BatchTransaction): Promise<BatchTransaction>;
  nothingClaimable(deadline: Deadline): Promise<NothingClaimable>;
  clearStaleMarks(deadline: Deadline): Promise<{ cleared: number; blocked: boolean }>;
  markWaiting(deadline: Deadline): Promise<number>;
  /** A lingering invocation's cheap probe for new rows. */
  newestPending(deadline: Deadline): Promise<string | null>;
  watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch>;
  /** Exactly-once delivery's leases; absent in the default mode. */
  readonly lanes?: LaneStore;
  /** Rejects before anything is published that could not then be marked sent. */
  checkTables(deadline: Deadline): Promise<readonly string[]>;
  /** Then the sent table is not pruned by rows (docs/schema.md, "Partitioned outboxes"); absent in the model's stores. */
  readonly partitionsMaintained?: boolean;
  maintainPartitions?(retainSentMs: number | null, deadline: Deadline): Promise<PartitionMaintenance>;
  pruneChunk(what: PruneTarget, retainMs: number, limit: number, deadline: Deadline): Promise<number>;
}

export interface OutboundMessage {
  seq: string;
  aggregateid: string;
  topic: string;
  key: string;
  value: string | null;
  headers: Record<string, string>;
  /** CreateTime, when the metadata set it; else the client's send time */
  timestamp?: number;
}

export interface MessageFormat {
  toMessage(row: OutboxRow, topicTemplate: string): OutboundMessage;
  /** `unreadValueBytes`: a payload the claim left out, counted in its place. */
  tooLarge(message: OutboundMessage, limitBytes: number, unreadValueBytes?: number): MessageRejectedError | undefined;
}

export interface PublishOutcome {
  /** acked with acks=all (exactly-once delivery: and their transaction committed): the only rows that may be marked sent */
  acked: string[];
  rejected: Array<{ seq: string; error: MessageRejectedError }>;
  /** refused as a whole (unknown, not authorized): their rows stay pending with no attempt charged */
  backedOff: Array<{ topic: string; error: MessageRejectedError }>;
  unavailable?: RelayError;
  /** exactly-once delivery: the lane's batch these acks were recorded as, settled with the marks */
  settle?: LaneSettlement;
}

/**
 * Exactly-once delivery (docs/DESIGN.md, "Exactly-once delivery (opt-in)"): a lane's publisher. publish() writes the batch in
 * an open Kafka transaction (any failure aborts it: nothing acked); commit() ends it once the
 * database has the batch on record.
 */
export interface TransactionalPublisher extends Publisher {
  /** The lane's earlier producers fenced: their last transaction's fate is final. */
  fence(deadline: Deadline): Promise<void>;
  /** The lane's last batch number Kafka committed (-1 when none); after fence(). */
  committedBatch(deadline: Deadline): Promise<bigint>;
  /**
   * Rejects with the failure classified; then whether it committed is unknown, and the lane's next
   * holder finds out. Except a TransactionAbortedError: not committed, ever.
   */
  commit(batchNo: string, deadline: Deadline): Promise<void>;
  abort(): Promise<void>;
}

/** Another client (e.g. a librdkafka binding) can be added without touching the loop. */
export interface Publisher extends MessageFormat {
  /** Never throws for send failures: they are the outcome. */
  publish(messages: OutboundMessage[], deadline: Deadline): Promise<PublishOutcome>;
  /** Rejects with the failure already classified (a RelayError), when the broker cannot be asked. */
  maxMessageBytes(topic: string, deadline: Deadline): Promise<number>;
  /** Producers connected so far: every failed send discards its producer and adds one. */
  readonly connects: number;
  close(): Promise<void>;
}
