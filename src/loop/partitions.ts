// A partitioned outbox made by `migrate` (docs/schema.md, "Partitioned outboxes"): once per
// invocation, before the first claim, one call of its maintenance function makes the partitions of
// the next widths, drops the outbox's old empty ones and the sent table's older than
// OUTBOX_RETAIN_SENT_MS (src/outbox/partitioned.sql). Nothing depends on it having run: a row with
// no partition of its own goes to the DEFAULT partition, and what it could not do (a lock it did
// not get within its lock_timeout, a failure) the next invocation does. So it never fails the
// invocation: a failure is a warning.
import type { Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { Store } from './ports.ts';

/**
 * The longest a call may take: its lock waits (at most four of its 200 ms lock_timeout,
 * partitioned.sql) and its work. With less time left than this it is left to the next invocation.
 */
export const MAINTENANCE_MAX_MS = 1_000;

export async function maintainPartitions(store: Store, retainSentMs: number, logger: Logger, deadline: Deadline): Promise<void> {
  if (!store.partitionsMaintained || !store.maintainPartitions || !deadline.fits(MAINTENANCE_MAX_MS)) return;
  try {
    const done = await store.maintainPartitions(retainSentMs > 0 ? retainSentMs : null, deadline);
    if (done.created > 0 || done.dropped > 0) logger.info('partitions maintained', { ...done });
    if (done.busy > 0) logger.info('partition maintenance left some partitions for the next invocation (a lock not had at once, or the DEFAULT partition holds rows of their range)', { ...done });
  } catch (err) {
    logger.warn('maintaining the partitions failed; the relay goes on (rows without a partition go to the DEFAULT one), and the next invocation tries again', { error: err });
  }
}
