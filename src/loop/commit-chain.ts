// A COMMIT's answer is read one batch later (docs/DESIGN.md, "The commit chain and the claim
// ahead"): safe because the COMMIT is on the wire before the next batch's first record goes to
// Kafka, and the next claim follows it on the same connection, so its snapshot sees the batch sent.
import type { BatchTransaction } from './ports.ts';

export class CommitChain {
  private pending: { tx: BatchTransaction; answer: Promise<void> } | undefined;

  get behind(): BatchTransaction | undefined {
    return this.pending?.tx;
  }

  add(tx: BatchTransaction, answer: Promise<void>): void {
    // never an unhandled rejection before it is read
    answer.catch(() => undefined);
    this.pending = { tx, answer };
  }

  async answered(): Promise<void> {
    const pending = this.pending;
    this.pending = undefined;
    await pending?.answer;
  }

  async failureOf(): Promise<Error | undefined> {
    try {
      await this.answered();
      return undefined;
    } catch (err) {
      return err instanceof Error ? err : new Error(String(err));
    }
  }
}
