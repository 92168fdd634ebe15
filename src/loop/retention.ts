// Retention that keeps pace with the relay. In `keep` mode every sent row stays until it is older
// than OUTBOX_RETAIN_SENT_MS; at the relay's full rate that is as many rows to delete as to mark.
// So pruning runs alongside the loop, for the whole invocation, on a connection of its own (the
// rows it deletes are sent, the loop's are pending: they never wait on each other), in short
// chunks, oldest first, until nothing older than the window is left or the deadline nears. It
// never fails the invocation: what it could not delete, the next invocation deletes.
import { BatchTimer, type Deadline } from '../budget.ts';
import { DeadlineExceededError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { PruneTarget, Store } from './ports.ts';

/** rows per chunk: one short transaction each (a few tens of milliseconds) */
export const PRUNE_CHUNK_ROWS = 5_000;

/** sent rows first (they are nearly all of them), then the few left by older versions, then skipped ones */
const PRUNE_TARGETS: readonly PruneTarget[] = ['sent', 'legacy-sent', 'skipped'];

export class Retention {
  private stopped = false;
  private readonly timer = new BatchTimer();

  constructor(
    private readonly store: Store,
    private readonly retainMs: number,
    private readonly logger: Logger,
  ) {}

  /** Deletes chunks (sent rows, then skipped ones: PRUNE_TARGETS) until none older than the window is left, the deadline nears, or stop(). Resolves with the number deleted; never rejects. */
  async run(deadline: Deadline): Promise<number> {
    let deleted = 0;
    try {
      for (const what of PRUNE_TARGETS) {
        for (;;) {
          if (this.stopped || !deadline.fits(this.timer.expected())) return deleted;
          const started = Date.now();
          const n = await this.store.pruneChunk(what, this.retainMs, PRUNE_CHUNK_ROWS, deadline);
          this.timer.record(Date.now() - started);
          deleted += n;
          if (n < PRUNE_CHUNK_ROWS) break;
        }
      }
    } catch (err) {
      const level = err instanceof DeadlineExceededError ? 'info' : 'warn';
      this.logger[level]('pruning old sent rows stopped; the next invocation goes on', { deleted, error: err });
    }
    return deleted;
  }

  /** The invocation failed: no new chunk starts (the one running finishes or is cancelled at the deadline). */
  stop(): void {
    this.stopped = true;
  }
}
