import { DatabaseError, RelayError, describe } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { CommitChain } from './commit-chain.ts';
import type { Batch } from './next-claim.ts';
import type { PublishOutcome } from './ports.ts';
import { settle, type RetryPolicy, type Settlement } from './settlement.ts';
import type { Summary } from './summary.ts';

export interface CommitContext {
  policy: RetryPolicy;
  random?: () => number;
  commits: CommitChain;
  summary: Summary;
  logger: Logger;
}

export async function commitBatch(batch: Batch, outcome: PublishOutcome, ctx: CommitContext): Promise<void> {
  const attempts = new Map(batch.rows.map((r) => [r.seq, r.attempts]));
  const result = settle(outcome.acked, outcome.rejected, (seq) => attempts.get(seq) ?? 0, ctx.policy, ctx.random);
  if (result.sent.length === 0 && result.failures.length === 0 && !outcome.settle) {
    // Nothing to write (e.g. the broker hung and the send lost the race with the deadline): a
    // COMMIT would find the deadline spent and blame "committing the batch" instead of the broker.
    return batch.tx.rollback();
  }
  try {
    const committing = await batch.tx.commitIfAllPremarked(result.sent, result.failures, outcome.settle);
    if (committing) {
      const counted = committing.answer.then(
        () => count(ctx, result),
        (err: unknown) => {
          throw commitFailed(ctx, err, result);
        },
      );
      return ctx.commits.add(batch.tx, counted);
    }
    await batch.tx.markAndCommit(result.sent, result.failures, outcome.settle);
  } catch (err) {
    await batch.tx.rollback();
    throw commitFailed(ctx, err, result);
  }
  count(ctx, result);
}

function count({ summary, logger }: CommitContext, { sent, failures }: Settlement): void {
  summary.published += sent.length;
  for (const f of failures) {
    if (f.park) summary.parked++;
    else summary.retried++;
    logger.warn(f.park ? 'row parked' : 'row will be retried', { seq: f.seq, error: f.error, delayMs: f.delayMs });
  }
}

function commitFailed({ logger }: CommitContext, err: unknown, { sent }: Settlement): Error {
  // acked but not marked: these rows will be sent again (at-least-once), with the same ids
  logger.error('could not commit the batch marks; its rows will be re-sent', { acked: sent.length, error: err });
  if (err instanceof RelayError) return err;
  return new DatabaseError(`committing marks failed: ${describe(err)}`, { cause: err });
}
