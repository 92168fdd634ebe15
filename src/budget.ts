// Deadline arithmetic. The deadline is fixed once per invocation from the Lambda context;
// every await in the loop is raced against it so a hung broker or database cannot make the
// invocation outlive its Lambda timeout (guarantee G5).
import { DeadlineExceededError } from './errors.ts';

export class Deadline {
  constructor(
    /** epoch ms at which the invocation must have returned its summary */
    readonly at: number,
    private readonly now: () => number = Date.now,
  ) {}

  static fromRemaining(remainingMs: number, safetyMarginMs: number, now: () => number = Date.now): Deadline {
    return new Deadline(now() + remainingMs - safetyMarginMs, now);
  }

  /** The same deadline, `ms` earlier: room kept for work that must follow (committing marks). */
  minus(ms: number): Deadline {
    return new Deadline(this.at - ms, this.now);
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

/** Moving estimate of how long one batch takes, so the loop stops before starting one it cannot finish. */
export class BatchTimer {
  private worst = 0;
  constructor(private readonly floorMs = 50) {}
  record(ms: number): void {
    // decay slowly: one slow batch should keep us cautious for a few batches
    this.worst = Math.max(ms, this.worst * 0.8);
  }
  expected(): number {
    return Math.max(this.floorMs, this.worst);
  }
}
