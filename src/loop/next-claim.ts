// A batch as the loop holds it, and a claim started ahead, while the batch before it is published.
import type { BatchTransaction, ClaimedRow } from './ports.ts';

export interface Batch {
  tx: BatchTransaction;
  rows: ClaimedRow[];
  startedAt: number;
}

/** A claim started ahead; taken or discarded once. */
export class NextClaim {
  constructor(private readonly claim: Promise<Batch>) {
    // read by take() or discard(); never an unhandled rejection meanwhile
    claim.catch(() => undefined);
  }

  /** Resolves once the claim has returned, whatever it found (the batch in flight needs it: ClaimFilter.inFlight). */
  returned(): Promise<void> {
    return this.claim.then(noop, noop);
  }

  take(): Promise<Batch> {
    return this.claim;
  }

  async discard(): Promise<void> {
    // a claim that failed has already rolled its transaction back
    const batch = await this.claim.catch(() => undefined);
    await batch?.tx.rollback();
  }
}

function noop(): void {}
