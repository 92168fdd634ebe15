// Nothing depends on partition maintenance having run (a row with no partition of its own goes to
// the DEFAULT one, and the next invocation does what this one could not), so a failure is a warning.
import type { Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { Store } from './ports.ts';

// At most four 200 ms lock waits (partitioned.sql's lock_timeout) and the work.
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
