// Linger mode (docs/DESIGN.md, "Linger mode: waiting for rows instead of exiting"). Whatever the
// signals say, a waiting invocation claims every RECLAIM_MS: rows also become claimable without an
// insert (a backoff ends, a foreign lock is released), and a row can commit with a lower seq than
// one already seen (seq is taken at INSERT), none of which notifies or raises the newest seq.
import type { Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { InsertWatch, Store } from './ports.ts';

export const RECLAIM_MS = 2_000;

export type WakeReason = 'notified' | 'probe' | 'reclaim';

export interface IdleOptions {
  wake: 'notify' | 'poll';
  pollMs: number;
}

export class Idle {
  private mode: 'notify' | 'poll';
  private watch: InsertWatch | undefined;
  private listening = false;
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

  get polling(): boolean {
    return this.mode === 'poll';
  }

  seen(): number {
    return this.notifications;
  }

  /** `since.anyRowWakes`: the last claim found none pending, so any pending row is news. */
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

// int8 as decimal strings without sign or leading zeros: longer is larger
function isAfter(a: string, b: string): boolean {
  return a.length > b.length || (a.length === b.length && a > b);
}
