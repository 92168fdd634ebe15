// The invocation's time budget (guarantee G5). The deadline is fixed once per invocation from the
// Lambda context, and every await in the loop is raced against it, so a hung broker or database
// cannot make the invocation outlive its Lambda timeout. Within it, the loop starts a batch only
// when the batch is expected to finish (BatchBudget). Every number of the rule is in BUDGET.
import { DeadlineExceededError } from './errors.ts';

// Every number of the rule, each used where its comment says; only the safety margin is a
// setting (OUTBOX_SAFETY_MARGIN_MS, default safetyMarginMs).
export const BUDGET = {
  // the deadline is this long before the Lambda timeout: failures end inside it (a rollback's
  // grace), and the edge's steps after the loop run in it
  safetyMarginMs: 3_000,
  // kept after a batch's sends for marking what was acked: sends stop this long (at most a quarter
  // of what is left) before the deadline (BatchBudget.sendBy)
  markReserveMs: 500,
  markReserveDivisor: 4,
  // a batch starts only if this many of the slowest recent batch, and markReserveMs, fit (fits);
  // the next is claimed ahead only if this many fit (fitsClaimAhead)
  batchesReserved: 2,
  batchesClaimedAhead: 2,
  // BatchTimer: no batch is expected faster than this; one slow batch keeps the loop cautious for a few
  batchFloorMs: 50,
  slowBatchDecay: 0.8,
  // a ROLLBACK may run this far past the deadline before its connection is given up (rollbackGrace)
  rollbackGraceMs: { min: 250, max: 2_000 },
  // a transaction's statement_timeout is the time left, its idle_in_transaction_session_timeout this much more (outbox/tx-settings.ts)
  idleInTransactionPastDeadlineMs: 1_000,
  // work that may stop early (the side transactions, the backlog read) has its statements timed out
  // by the server this long before the client's race: an ordinary error, after which the
  // connection still takes the ROLLBACK, where a lost race abandons the client
  serverFirstMs: 100,
  // the LISTEN connection of a linger must be seen closed by the server before the container is frozen (outbox/store.ts)
  listenCloseMs: 1_000,
  // the function's edge after the loop (src/lambda/, afterInvocation): the backlog read, then the
  // helpers' starts, each at most its budget and not tried with less than its minimum;
  // edgeReserveMs stays for publishing the metrics record and returning
  backlogBudgetMs: 1_000,
  backlogMinMs: 100,
  fanoutBudgetMs: 1_000,
  fanoutMinMs: 100,
  edgeReserveMs: 500,
  // exactly-once delivery (loop/lane.ts): a lane's lease outlasts its holder's Lambda timeout by
  // this much (past it the holder is dead or paused); its Kafka transactions time out with the
  // lease, at most at Kafka's default transaction.max.timeout.ms (a longer one is refused); an
  // abort outside a send's deadline (the invocation ending) waits this long at most
  laneLeasePastTimeoutMs: 2_000,
  kafkaTransactionMaxMs: 900_000,
  transactionAbortWaitMs: 2_000,
} as const;

// OUTBOX_SAFETY_MARGIN_MS's minimum: the worst failure runs a ROLLBACK's shortest grace past the
// deadline, then the LISTEN connection's close; with less, Lambda kills the invocation before it
// has ended its transactions and reported the failure.
export const MIN_SAFETY_MARGIN_MS = BUDGET.rollbackGraceMs.min + BUDGET.listenCloseMs;

export class Deadline {
  constructor(
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

  minus(ms: number): Deadline {
    return new Deadline(this.at - ms, this.now);
  }

  /** A ROLLBACK's deadline, past this one (it is how a failure ends): one grace is the most a failure spends. */
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

  fits(expectedMs: number): boolean {
    return this.remaining() > expectedMs;
  }

  /** The promise, or DeadlineExceededError when the deadline passes first; `onTimeout` cancels the work (a query, a producer). */
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

  fitsClaimAhead(): boolean {
    return this.deadline.fits(this.timer.expected() * BUDGET.batchesClaimedAhead);
  }

  /** A lingering invocation waits for rows until a batch would no longer fit. */
  lingerUntil(): number {
    return this.deadline.at - this.batchReserveMs();
  }

  /** A little before the deadline, so the acks that did arrive can still be committed instead of re-sent. */
  sendBy(): Deadline {
    return this.deadline.minus(Math.min(BUDGET.markReserveMs, this.deadline.remaining() / BUDGET.markReserveDivisor));
  }

  private batchReserveMs(): number {
    return this.timer.expected() * BUDGET.batchesReserved + BUDGET.markReserveMs;
  }
}
