// Exactly-once delivery (docs/DESIGN.md, "Exactly-once delivery (opt-in)"): the invocation's lane, from its lease to its
// release. A lane's last holder may have died between its Kafka commit and its marks': before
// anything is sent, the new holder fences it (its producer's first transaction) and asks Kafka
// whether that batch committed, then marks its rows sent or frees them.
import { randomUUID } from 'node:crypto';
import { BUDGET, type Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { LaneLease, LaneSettlement, LaneStore, TransactionalPublisher } from './ports.ts';

export interface LaneDeps {
  lanes: LaneStore;
  /** the lane's publisher, its transactions timing out after `transactionTimeoutMs` */
  publisherFor(lease: LaneLease, transactionTimeoutMs: number): TransactionalPublisher;
  logger: Logger;
}

export class Lane {
  private constructor(
    private readonly deps: LaneDeps,
    readonly lease: LaneLease,
    readonly publisher: TransactionalPublisher,
  ) {}

  /**
   * Undefined when every lane is leased. `timeoutMs`: how long until the Lambda ends this
   * invocation whatever it does; the lease and the Kafka transactions last that, and a little more.
   */
  static async lease(deps: LaneDeps, timeoutMs: number, deadline: Deadline): Promise<Lane | undefined> {
    const leaseMs = timeoutMs + BUDGET.laneLeasePastTimeoutMs;
    const lease = await deps.lanes.lease(randomUUID(), leaseMs, deadline);
    if (!lease) return undefined;
    const lane = new Lane(deps, lease, deps.publisherFor(lease, Math.min(leaseMs, BUDGET.kafkaTransactionMaxMs)));
    try {
      if (lease.unsettled) await lane.settle(deadline);
      // its transaction left open would hold read_committed consumers back until it times out
      else if (lease.abandoned) await lane.publisher.fence(deadline);
    } catch (err) {
      await lane.end(deadline);
      throw err;
    }
    return lane;
  }

  record(seqs: string[], deadline: Deadline): Promise<string> {
    return this.deps.lanes.record(this.lease, seqs, deadline);
  }

  settlement(batchNo: string): LaneSettlement {
    return this.deps.lanes.settlement(this.lease, batchNo);
  }

  /** Never throws: it runs on every way out. An open transaction is aborted; the lease goes, or runs out. */
  async end(deadline: Deadline): Promise<void> {
    await this.publisher.abort().catch(() => undefined);
    await this.publisher.close().catch(() => undefined);
    await this.deps.lanes.release(this.lease, deadline.rollbackGrace()).catch((err: unknown) => {
      this.deps.logger.warn('the exactly-once lane could not be released; it is free again when its lease runs out', { lane: this.lease.lane, error: err });
    });
  }

  private async settle(deadline: Deadline): Promise<void> {
    const { batchNo, seqs } = this.lease.unsettled!;
    await this.publisher.fence(deadline);
    const committed = (await this.publisher.committedBatch(deadline)) >= BigInt(batchNo);
    const marked = await this.deps.lanes.settleUnsettled(this.lease, committed, deadline);
    const { lane } = this.lease;
    if (committed) {
      this.deps.logger.warn("the lane's last holder stopped after its Kafka transaction committed and before its marks did: its rows are marked sent, not sent again", { lane, batchNo, rows: seqs.length, marked });
    } else {
      this.deps.logger.warn("the lane's last holder stopped before its Kafka transaction committed: it is aborted, and its rows are claimed as usual", { lane, batchNo, rows: seqs.length });
    }
  }
}
