// Linger mode (OUTBOX_IDLE=linger): when nothing is left to claim, the invocation waits for new
// rows instead of returning, until the budget is nearly spent. With a function timeout a little
// longer than the schedule's period, consecutive invocations overlap and one of them is always
// waiting, so an event reaches Kafka within a claim's reach of its commit instead of up to a
// minute later. SKIP LOCKED and the aggregate locks make the overlap safe, as they make any
// number of concurrent invocations safe.
//
// How a waiting invocation learns of new rows:
// - notify (a direct connection): LISTEN on the channel that the insert trigger notifies at
//   every producer COMMIT that inserted rows. The claim follows the notification at once.
// - poll (PgBouncer in transaction mode, RDS Proxy, or LISTEN refused): every OUTBOX_POLL_MS, one
//   index probe for the newest pending row (newestPendingSql). A row newer than the newest seen
//   when the wait began wakes the invocation; when the wait began with nothing pending at all,
//   any pending row does. A claim that found claimable rows it could not get (held by others, or
//   committed after its snapshot: the probe would take those for old rows) is followed by one
//   more claim before the wait (Invocation.linger).
// - both: a claim at least every RECLAIM_MS, whatever the signals say. Rows also become claimable
//   without an insert (a backoff ends, another invocation rolls back, a foreign lock is released)
//   and a row can commit with a lower seq than one already seen (seq is taken at INSERT, not at
//   COMMIT); none of those notify or raise the newest seq.
import type { Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { InsertWatch, Store } from './ports.ts';

/** the longest a waiting invocation goes without claiming */
export const RECLAIM_MS = 2_000;

export type WakeReason = 'notified' | 'probe' | 'reclaim';

/** how it learns of new rows (notify unless a pooler sits in between: config/load.ts, lambda/runtime.ts) and OUTBOX_POLL_MS */
export interface IdleOptions {
  /** how a waiting invocation learns of new rows: LISTEN/NOTIFY, or a probe every pollMs */
  wake: 'notify' | 'poll';
  pollMs: number;
}

export class Idle {
  private mode: 'notify' | 'poll';
  private watch: InsertWatch | undefined;
  private listening = false;
  /** notifications received so far; a claim remembers the count it started at */
  private notifications = 0;
  private wakeUp: (() => void) | undefined;
  private closed = false;

  constructor(
    private readonly store: Store,
    private readonly config: IdleOptions,
    private readonly logger: Logger,
  ) {
    this.mode = config.wake;
  }

  /** Learning of new rows by the probe (behind a pooler, or LISTEN failed or was lost). */
  get polling(): boolean {
    return this.mode === 'poll';
  }

  /** The count a claim starting now has seen: notifications after it mean rows it may have missed. */
  seen(): number {
    return this.notifications;
  }

  /**
   * Wait until rows may be claimable: resolves with why, or undefined when `until` (epoch ms)
   * comes first. `since.seen`: the count seen() gave when the last claim started; `since.at`: when
   * it started; `since.anyRowWakes`: any pending row is news (that claim found none pending);
   * otherwise the first probe only learns where the pending rows end.
   */
  async wait(deadline: Deadline, until: number, since: { seen: number; at: number; anyRowWakes: boolean }): Promise<WakeReason | undefined> {
    if (this.mode === 'notify' && !this.listening) {
      await this.listen(deadline);
      // setting LISTEN up may take long (a slow connect): no batch may start past `until`
      if (Date.now() >= until) return undefined;
      // rows committed between that claim and LISTEN notified no one: claim once more
      if (this.listening) return 'reclaim';
    }
    let newest: string | null | undefined = since.anyRowWakes ? null : undefined;
    let nextProbe = Date.now();
    for (;;) {
      const now = Date.now();
      if (now >= until) return undefined;
      if (this.notifications !== since.seen) return 'notified';
      if (now >= since.at + RECLAIM_MS) return 'reclaim';
      if (this.mode === 'poll' && now >= nextProbe) {
        nextProbe = now + this.config.pollMs;
        const found = await this.store.newestPending(deadline);
        // a probe may answer late (a busy database): no batch may start past `until`
        if (Date.now() >= until) return undefined;
        // the first probe of a wait that began with rows pending only learns where they end
        if (newest === undefined) newest = found ?? null;
        else if (found !== null && (newest === null || isAfter(found, newest))) return 'probe';
        continue;
      }
      const wakeAt = Math.min(until, since.at + RECLAIM_MS, this.mode === 'poll' ? nextProbe : Infinity);
      await this.sleep(wakeAt - now);
    }
  }

  /** End the LISTEN, if any. Never rejects. */
  async close(): Promise<void> {
    this.closed = true;
    this.wakeUp?.();
    const watch = this.watch;
    this.watch = undefined;
    this.listening = false;
    await watch?.close();
  }

  private async listen(deadline: Deadline): Promise<void> {
    try {
      this.watch = await this.store.watchInserts(deadline, {
        insert: () => {
          this.notifications++;
          this.wakeUp?.();
        },
        lost: (err) => {
          if (this.closed) return;
          this.fallBackToPolling('the LISTEN connection closed', err);
          this.wakeUp?.();
        },
      });
      this.listening = true;
      if (this.closed) await this.close();
    } catch (err) {
      this.fallBackToPolling('LISTEN failed', err);
    }
  }

  private fallBackToPolling(what: string, err: unknown): void {
    this.mode = 'poll';
    this.listening = false;
    this.logger.warn(`${what}; this invocation polls for new rows every ${this.config.pollMs} ms instead (set DATABASE_PREPARE=false behind a pooler)`, { pollMs: this.config.pollMs, error: err });
  }

  /** Sleep `ms`, or until a notification, a lost LISTEN or close() calls wakeUp. */
  private sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        if (this.wakeUp === done) this.wakeUp = undefined;
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      this.wakeUp = done;
    });
  }
}

/** seq values are int8 as decimal strings without sign or leading zeros: longer is larger */
function isAfter(a: string, b: string): boolean {
  return a.length > b.length || (a.length === b.length && a > b);
}
