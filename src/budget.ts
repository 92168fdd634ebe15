// The invocation's time budget (guarantee G5). The deadline is fixed once per invocation from the
// Lambda context, and every await in the loop is raced against it, so a hung broker or database
// cannot make the invocation outlive its Lambda timeout. Within it, the loop starts a batch only
// when the batch is expected to finish (BatchBudget). Every number of the rule is in BUDGET.
import { DeadlineExceededError } from './errors.ts';

/**
 * The budget's numbers, together. Each says where it is applied; none is configurable except the
 * safety margin (OUTBOX_SAFETY_MARGIN_MS, whose default this is).
 */
export const BUDGET = {
  /**
   * OUTBOX_SAFETY_MARGIN_MS's default (config/load.ts): the deadline is this long before the Lambda
   * timeout. Failures end inside it (a rollback's grace), and the backlog metrics are read in it.
   */
  safetyMarginMs: 3_000,
  /**
   * Time kept after a batch's sends for marking and committing what was acked: sends give up this
   * long before the deadline (BatchBudget.sendBy), and a batch starts only if it fits before that.
   */
  markReserveMs: 500,
  /** ...and at most 1/this (a quarter) of what is left: a nearly spent budget still goes mostly to the sends (BatchBudget.sendBy). */
  markReserveDivisor: 4,
  /** A batch starts only if this many of the slowest recent batch, and markReserveMs, still fit (BatchBudget.fits). */
  batchesReserved: 2,
  /** The next batch is claimed ahead, while this one is published, only if this many batches fit (BatchBudget.fitsClaimAhead). */
  batchesClaimedAhead: 2,
  /** No batch is expected to take less than this (BatchTimer). */
  batchFloorMs: 50,
  /** The slowest batch's weight one batch later: one slow batch keeps the loop cautious for a few (BatchTimer). */
  slowBatchDecay: 0.8,
  /**
   * How long a ROLLBACK may take past the deadline before its connection is given up
   * (Deadline.rollbackGrace): what the deadline leaves, within these bounds.
   */
  rollbackGraceMs: { min: 250, max: 2_000 },
  /**
   * A transaction's idle_in_transaction_session_timeout is the time left plus this; its
   * statement_timeout is the time left (src/outbox/tx-settings.ts).
   */
  idleInTransactionPastDeadlineMs: 1_000,
  /**
   * How long the LISTEN connection of a linger may take to close (src/outbox/store.ts,
   * watchInserts): the server must have seen it go before the container may be frozen.
   */
  listenCloseMs: 1_000,
  /**
   * The function's edge after the loop (src/lambda/), inside the safety margin: the backlog read
   * for the metrics, then the helpers' starts (fan-out), each given at most its budget and not
   * tried with less than its minimum; edgeReserveMs stays for publishing the metrics record and
   * returning before the Lambda timeout (afterInvocation).
   */
  backlogBudgetMs: 1_000,
  backlogMinMs: 100,
  fanoutBudgetMs: 1_000,
  fanoutMinMs: 100,
  edgeReserveMs: 500,
} as const;

/**
 * OUTBOX_SAFETY_MARGIN_MS's minimum (config/load.ts): what the worst failure runs past the deadline. A
 * statement lost at the deadline is followed by a ROLLBACK's shortest grace (the deadline has
 * nothing left to give it), then the LISTEN connection's close; a smaller margin lets Lambda kill
 * the invocation before it has ended its transactions and reported the failure.
 */
export const MIN_SAFETY_MARGIN_MS = BUDGET.rollbackGraceMs.min + BUDGET.listenCloseMs;

export class Deadline {
  constructor(
    /** epoch ms at which the invocation must have returned its summary */
    readonly at: number,
    private readonly now: () => number = Date.now,
  ) {}

  static fromRemaining(remainingMs: number, safetyMarginMs: number, now: () => number = Date.now): Deadline {
    return new Deadline(now() + remainingMs - safetyMarginMs, now);
  }

  /** A deadline `ms` from now, on this one's clock. */
  fromNow(ms: number): Deadline {
    return new Deadline(this.now() + ms, this.now);
  }

  /** The same deadline, `ms` earlier: room kept for work that must follow (committing marks). */
  minus(ms: number): Deadline {
    return new Deadline(this.at - ms, this.now);
  }

  /**
   * The deadline of a ROLLBACK, which may run past this one (it is how a failure ends): what this
   * leaves, within BUDGET.rollbackGraceMs, so one grace is the most a failure spends.
   */
  rollbackGrace(): Deadline {
    const { min, max } = BUDGET.rollbackGraceMs;
    return new Deadline(this.now() + Math.min(max, Math.max(min, this.remaining())), this.now);
  }

  remaining(): number {
    return Math.max(0, this.at - this.now());
  }

  expired(): boolean {
    return this.remaining() <= 0;
  }

  /** true when another step expected to take `expectedMs` still fits. */
  fits(expectedMs: number): boolean {
    return this.remaining() > expectedMs;
  }

  /**
   * Resolves with the promise or rejects with DeadlineExceededError when the deadline passes
   * first. `onTimeout` lets the caller cancel the underlying work (a query, a producer).
   */
  async race<T>(what: string, promise: Promise<T>, onTimeout?: () => void): Promise<T> {
    const left = this.remaining();
    if (left <= 0) {
      promise.catch(() => undefined);
      onTimeout?.();
      throw new DeadlineExceededError(what);
    }
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        onTimeout?.();
        reject(new DeadlineExceededError(what));
      }, left);
    });
    try {
      return await Promise.race([promise, timeout]);
    } finally {
      clearTimeout(timer);
      // the loser may still reject later; never let that become an unhandled rejection
      promise.catch(() => undefined);
    }
  }
}

/**
 * The time of a step after the invocation (`timeout`: the Lambda's): at most `budgetMs`, and
 * BUDGET.edgeReserveMs before the timeout; no deadline when that leaves less than `minMs`.
 */
export function afterInvocation(timeout: Deadline, budgetMs: number, minMs: number): { leftMs: number; deadline?: Deadline } {
  const leftMs = Math.min(budgetMs, timeout.remaining() - BUDGET.edgeReserveMs);
  return leftMs < minMs ? { leftMs } : { leftMs, deadline: timeout.fromNow(leftMs) };
}

/** Moving estimate of how long one batch takes, so the loop stops before starting one it cannot finish. */
export class BatchTimer {
  private worst = 0;
  constructor(private readonly floorMs: number = BUDGET.batchFloorMs) {}
  record(ms: number): void {
    // decay slowly: one slow batch should keep us cautious for a few batches
    this.worst = Math.max(ms, this.worst * BUDGET.slowBatchDecay);
  }
  expected(): number {
    return Math.max(this.floorMs, this.worst);
  }
}

/** The loop's budget rule, asked by the invocation (src/loop/invocation.ts) before each batch and each send. */
export class BatchBudget {
  private readonly timer = new BatchTimer();

  constructor(private readonly deadline: Deadline) {}

  /** A batch took `ms`, from its claim to its marks. */
  record(ms: number): void {
    this.timer.record(ms);
  }

  /**
   * Start a batch only if it fits before the sends' own cut-off (markReserveMs before the
   * deadline), with room to spare: a batch started closer to the deadline than that would have its
   * send abandoned at the cut-off whenever it ran a little slower than the slowest recent batch,
   * and a send that misses its cut-off fails the invocation as broker-unavailable, with a healthy
   * broker (seen about once in 12-30 invocations under sustained load, before this rule).
   */
  fits(): boolean {
    return this.deadline.fits(this.batchReserveMs());
  }

  /** The next batch may be claimed while this one is published: both are expected to fit. */
  fitsClaimAhead(): boolean {
    return this.deadline.fits(this.timer.expected() * BUDGET.batchesClaimedAhead);
  }

  /** Until when a lingering invocation may wait for rows: a batch must still fit afterwards (the rule of fits). */
  lingerUntil(): number {
    return this.deadline.at - this.batchReserveMs();
  }

  /**
   * The sends' deadline: a little before the invocation's, so the acks that did arrive (other
   * topics of the batch) can still be committed instead of being re-sent by the next invocation.
   */
  sendBy(): Deadline {
    return this.deadline.minus(Math.min(BUDGET.markReserveMs, this.deadline.remaining() / BUDGET.markReserveDivisor));
  }

  private batchReserveMs(): number {
    return this.timer.expected() * BUDGET.batchesReserved + BUDGET.markReserveMs;
  }
}
