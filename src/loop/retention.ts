// Retention that keeps pace with the relay. In `keep` mode every sent row stays until it is older
// than OUTBOX_RETAIN_SENT_MS; at the relay's full rate that is as many rows to delete as to mark.
// Rows an operator skipped are kept apart from that, for OUTBOX_RETAIN_SKIPPED_MS (a month by
// default): each carries the record of who skipped it and why, which a day's window would lose.
// So pruning runs alongside the loop, for the whole invocation, on a connection of its own (the
// rows it deletes are sent, the loop's are pending: they never wait on each other), in short
// chunks, oldest first, until nothing older than the window is left or the deadline nears. It
// never fails the invocation: what it could not delete, the next invocation deletes.
//
// Each place (PruneTarget) is pruned on its own: one the database refuses (the sent table missing,
// or not writable by the role: in delete mode the role needs no privilege there, docs/schema.md,
// "The relay's database role") is logged, once per invocation, and the pass goes on with the
// next, so skipped rows in the outbox are still pruned. Any other failure (the deadline, a lost
// connection) ends the pass: the next place would fail the same way.
import { BatchTimer, type Deadline } from '../budget.ts';
import { DeadlineExceededError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { PruneTarget, Store } from './ports.ts';

/** rows per chunk: one short transaction each (a few tens of milliseconds) */
export const PRUNE_CHUNK_ROWS = 5_000;

/** sent rows first (they are nearly all of them), then skipped ones */
const PRUNE_TARGETS: readonly PruneTarget[] = ['sent', 'skipped'];

/** How long each kind of row is kept, in ms; 0 keeps them forever. */
export interface RetentionWindows {
  /** sent rows (OUTBOX_RETAIN_SENT_MS), in the sent table */
  sentMs: number;
  /** skipped rows (OUTBOX_RETAIN_SKIPPED_MS), with their audit record */
  skippedMs: number;
}

export class Retention {
  private stopped = false;
  private readonly timer = new BatchTimer();

  constructor(
    private readonly store: Store,
    private readonly windows: RetentionWindows,
    private readonly logger: Logger,
  ) {}

  /** Deletes chunks (sent rows, then skipped ones: PRUNE_TARGETS) until none older than its window is left, the deadline nears, or stop(). Resolves with the number deleted; never rejects. */
  async run(deadline: Deadline): Promise<number> {
    let deleted = 0;
    for (const what of PRUNE_TARGETS) {
      const retainMs = what === 'skipped' ? this.windows.skippedMs : this.windows.sentMs;
      if (retainMs === 0) continue;
      try {
        for (;;) {
          if (this.stopped || !deadline.fits(this.timer.expected())) return deleted;
          const started = Date.now();
          const n = await this.store.pruneChunk(what, retainMs, PRUNE_CHUNK_ROWS, deadline);
          this.timer.record(Date.now() - started);
          deleted += n;
          if (n < PRUNE_CHUNK_ROWS) break;
        }
      } catch (err) {
        if (refusedPlace(err)) {
          this.logger.warn(`pruning ${PLACES[what]} failed; the other places are pruned, and the next invocation tries again`, { target: what, deleted, error: err, ...(what === 'sent' ? { hint: SENT_HINT } : {}) });
          continue;
        }
        const level = err instanceof DeadlineExceededError ? 'info' : 'warn';
        this.logger[level]('pruning old sent rows stopped; the next invocation goes on', { target: what, deleted, error: err });
        return deleted;
      }
    }
    return deleted;
  }

  /** The invocation failed: no new chunk starts (the one running finishes or is cancelled at the deadline). */
  stop(): void {
    this.stopped = true;
  }
}

const PLACES: Record<PruneTarget, string> = {
  sent: 'the sent table',
  skipped: 'the skipped rows in the outbox',
};

const SENT_HINT =
  'in keep mode the relay\'s role needs SELECT and DELETE on the sent table for retention (docs/schema.md, "The relay\'s database role"); ' +
  'in delete mode it needs none there, and the sent table only holds rows kept before a switch to delete: grant them to prune those rows';

/**
 * The database refused the statement for its objects (SQLSTATE class 42: a table missing, a
 * privilege lacking), not the connection or the clock: other places may still be pruned. The
 * store wraps the server's error (cause).
 */
function refusedPlace(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; e && depth < 3; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code.startsWith('42');
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}
