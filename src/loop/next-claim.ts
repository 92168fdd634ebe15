import type { BatchTransaction, ClaimedRow } from './ports.ts';

export interface Batch {
  tx: BatchTransaction;
  rows: ClaimedRow[];
  startedAt: number;
}

export class NextClaim {
  constructor(private readonly claim: Promise<Batch>) {
    // never an unhandled rejection before take() or discard()
    claim.catch(() => undefined);
  }

  /** Whatever it found: the batch in flight is told its rows are in flight only until then (ClaimFilter.inFlight). */
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
