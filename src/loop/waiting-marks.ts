// Neither pass fails the invocation: a waiting mark is an optimisation, never a guarantee
// (docs/DESIGN.md, "The order guard").
import type { Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { Store } from './ports.ts';

export async function clearStaleMarks(store: Store, logger: Logger, deadline: Deadline): Promise<boolean> {
  try {
    const { cleared, blocked } = await store.clearStaleMarks(deadline);
    if (cleared) logger.info('stale marks cleared: their aggregates are no longer blocked', { cleared });
    return blocked;
  } catch (err) {
    logger.warn('clearing stale marks failed; the rows behind them are held back until the next invocation (order is kept)', {
      error: err,
    });
    return false;
  }
}

export async function markWaiting(store: Store, logger: Logger, deadline: Deadline): Promise<void> {
  try {
    const marked = await store.markWaiting(deadline);
    if (marked) logger.info('rows behind blocked aggregates marked waiting: claims no longer read them', { marked });
  } catch (err) {
    logger.warn('marking waiting rows failed; claims skip them the slower way until the next invocation', {
      error: err,
    });
  }
}
