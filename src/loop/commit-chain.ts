// The commit chain. A batch whose rows were all acked ends with a COMMIT that is written to the
// database and not waited for: its answer is read one batch later, while the next batch is being
// published. Two rules make that safe:
// - the COMMIT is on the wire before the next batch's first record goes to Kafka, and Postgres
//   commits what it received even if the relay dies right after, so a crash re-sends at most the
//   batch in flight (G2);
// - the next claim is sent down the same connection, right behind the COMMIT (OutboxStore.begin's
//   `after`), so its snapshot sees that batch sent and its aggregates free.
import type { BatchTransaction } from './ports.ts';

export class CommitChain {
  private pending: { tx: BatchTransaction; answer: Promise<void> } | undefined;

  /** The transaction whose COMMIT is on the wire: the next claim follows it on its connection. */
  get behind(): BatchTransaction | undefined {
    return this.pending?.tx;
  }

  /** A batch's COMMIT was written; `answer` settles when the database has answered it. */
  add(tx: BatchTransaction, answer: Promise<void>): void {
    // read later (answered); never an unhandled rejection meanwhile
    answer.catch(() => undefined);
    this.pending = { tx, answer };
  }

  /** Waits for the outstanding COMMIT's answer and rejects if it failed. Nothing outstanding after. */
  async answered(): Promise<void> {
    const pending = this.pending;
    this.pending = undefined;
    await pending?.answer;
  }

  /** Like answered(), but returns the failure instead of throwing it. */
  async failureOf(): Promise<Error | undefined> {
    try {
      await this.answered();
      return undefined;
    } catch (err) {
      return err instanceof Error ? err : new Error(String(err));
    }
  }
}
