// Pruning runs alongside the loop on a connection of its own, in short chunks (docs/schema.md,
// "Retention: how big the tables grow"): at the relay's full rate in keep mode there are as many
// rows to delete as to mark, and the rows it deletes are sent, the loop's pending, so they never
// wait on each other. A place the database refuses (in delete mode the role may hold no privilege
// on the sent table) is skipped so the others are still pruned; any other failure would fail the
// next place the same way, so it ends the pass.
import { BatchTimer, type Deadline } from '../budget.ts';
import { DeadlineExceededError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { PruneTarget, Store } from './ports.ts';

// a few tens of milliseconds per chunk's transaction
export const PRUNE_CHUNK_ROWS = 5_000;

const PRUNE_TARGETS: readonly PruneTarget[] = ['sent', 'skipped'];

export interface RetentionWindows {
  sentMs: number;
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
        // the deadline, met by the client's race or by the server's statement_timeout set just before it (57014)
        const level = err instanceof DeadlineExceededError || sqlState(err) === '57014' ? 'info' : 'warn';
        this.logger[level]('pruning old sent rows stopped; the next invocation goes on', { target: what, deleted, error: err });
        return deleted;
      }
    }
    return deleted;
  }

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

// SQLSTATE class 42 (a table missing, a privilege lacking) is about this place, not the connection
// or the clock.
function refusedPlace(err: unknown): boolean {
  return sqlState(err)?.startsWith('42') ?? false;
}

function sqlState(err: unknown): string | undefined {
  let e: unknown = err;
  for (let depth = 0; e && depth < 3; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}
