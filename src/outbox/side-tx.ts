// Each on a connection of its own, ended as a batch's is (BatchTx), never postgres.js' sql.begin:
// docs/DESIGN.md, "The store and postgres.js".
import { BatchTimer, BUDGET, type Deadline } from '../budget.ts';
import type { LaneLease, LaneSettlement, PruneTarget } from '../loop/ports.ts';
import { BatchTx, MARK_WAITING_CHUNK, type BatchStatements } from './batch-tx.ts';
import type { Connections } from './connections.ts';
import type { PartitionMaintenance } from './migrate.ts';
import { isStatementTimeout } from './db-errors.ts';
import { txSettings } from './tx-settings.ts';

export interface SideStatements extends BatchStatements {
  readonly pruneText: Record<PruneTarget, string>;
  readonly waitingWorkText: string;
  /** exactly-once delivery: the rows of a batch in flight still pending, locked; their mark by seq */
  readonly inFlightPendingText: string;
  readonly markBySeqText: string;
}

export class SideTransactions {
  constructor(
    private readonly client: Connections,
    private readonly statements: SideStatements,
  ) {}

  pruneChunk(what: PruneTarget, retainMs: number, limit: number, deadline: Deadline): Promise<number> {
    const doing = `pruning ${what === 'skipped' ? 'skipped' : 'sent'} rows`;
    const text = this.statements.pruneText[what];
    // lock_timeout as long as the statement's: a sent row nothing else locks
    type Pruned = { affected: string };
    return this.run(deadline, doing, undefined, async (tx) => Number((await tx.query<Pruned[]>(doing, text, [retainMs, limit]))[0]?.affected ?? 0));
  }

  /** Its locks wait at most its own lock_timeout. */
  maintainPartitions(text: string, retainSentMs: number | null, deadline: Deadline): Promise<PartitionMaintenance> {
    const doing = 'maintaining the partitions';
    type Done = { done: string };
    return this.run(deadline, doing, undefined, async (tx) => JSON.parse((await tx.query<Done[]>(doing, text, [retainSentMs]))[0]!.done) as PartitionMaintenance);
  }

  /** Usually one probe and no transaction. */
  async clearStaleMarks(deadline: Deadline): Promise<{ cleared: number; blocked: boolean }> {
    const { waitingWorkText, unwaitText, prepared } = this.statements;
    type Work = { waiting: boolean; blocked: boolean };
    const [work] = await this.client.bounded(
      deadline,
      'looking for waiting marks to tidy',
      this.client.sql.unsafe<Work[]>(waitingWorkText, [], prepared),
    );
    if (!work?.waiting) return { cleared: 0, blocked: work?.blocked ?? false };
    const cleared = await this.tidy(
      deadline,
      async (tx) => (await tx.query('clearing stale marks', unwaitText, [null])).count,
    );
    return { cleared, blocked: work.blocked };
  }

  /** While another chunk fits the budget: the next invocation marks the rest. */
  async markWaiting(deadline: Deadline): Promise<number> {
    const { markWaitingText } = this.statements;
    let marked = 0;
    // retention's rule, with a batch's room to spare, so that no chunk's work is thrown away; one
    // slower than that is timed out by the server (run), rolled back, and ends the pass
    const timer = new BatchTimer();
    while (deadline.fits(timer.expected() * BUDGET.batchesReserved)) {
      const started = Date.now();
      let n: number;
      try {
        n = await this.tidy(
          deadline,
          async (tx) => (await tx.query('marking waiting rows', markWaitingText, [null, MARK_WAITING_CHUNK])).count,
        );
      } catch (err) {
        if (isStatementTimeout(err) && !this.client.poisoned) break;
        throw err;
      }
      timer.record(Date.now() - started);
      marked += n;
      if (n < MARK_WAITING_CHUNK) break;
    }
    return marked;
  }

  /**
   * Exactly-once delivery: what a lane's last holder left in flight. Its Kafka transaction
   * committed: the rows still pending are marked sent (a row its holder's marks did reach, or
   * that went by hand, is not pending); it did not: they are only freed. Then the lane is settled.
   */
  settleLane(lease: LaneLease, committed: boolean, settle: LaneSettlement, deadline: Deadline): Promise<number> {
    const seqs = lease.unsettled?.seqs ?? [];
    return this.run(deadline, 'settling the lane', undefined, async (tx) => {
      let marked = 0;
      if (committed && seqs.length > 0) {
        const pending = await tx.query<{ seq: string }[]>('locking the rows in flight', this.statements.inFlightPendingText, [seqs]);
        if (pending.length > 0) await tx.query('marking the rows in flight sent', this.statements.markBySeqText, [pending.map((r) => r.seq)]);
        marked = pending.length;
      }
      await tx.query('settling the lane', settle.text, settle.params);
      return marked;
    });
  }

  private tidy<T>(deadline: Deadline, work: (tx: BatchTx) => Promise<T>): Promise<T> {
    // lock_timeout: a row an application holds is not worth waiting for (SKIP LOCKED covers most)
    return this.run(deadline, 'tidying the waiting marks', 1_000, work);
  }

  /** Never on a client known bad. */
  private async run<T>(
    deadline: Deadline,
    what: string,
    lockTimeoutMs: number | undefined,
    work: (tx: BatchTx) => Promise<T>,
  ): Promise<T> {
    this.client.assertUsable(what);
    const conn = await this.client.reserve(deadline);
    const tx = BatchTx.open(
      this.client,
      this.statements,
      conn,
      deadline,
      // the server ends a statement before the race would (which abandons the client)
      txSettings(deadline.minus(BUDGET.serverFirstMs), { batch: false, lockTimeoutMs }),
    );
    try {
      const result = await work(tx);
      await tx.commit(what);
      return result;
    } catch (err) {
      await tx.rollback();
      throw err;
    }
  }
}
