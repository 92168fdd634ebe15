// The invocation's metrics record, after it succeeded or failed: the Summary's counts and times,
// and three figures read from the table after the loop (src/outbox/admin.ts `backlog`): the age of
// the oldest pending row and the number of pending and parked rows. Powertools' logMetrics
// middleware (used before this one, so its after/onError run after these) publishes the record.
// Nothing here throws or waits past its own deadline: a record must be published, and a metric
// must not fail an invocation that relayed its rows. Without the table's figures (no healthy
// client, too little time, a failed read), the record carries the Summary's alone.
import { afterInvocation, BUDGET, type Deadline } from '../budget.ts';
import type { Logger } from '../log.ts';
import type { Summary } from '../loop/summary.ts';
import type { Backlog } from '../outbox/admin.ts';
import { edgeState, type Middleware, type Request } from './edge.ts';
import { addBacklogMetrics, addSummaryMetrics } from './metrics.ts';
import type { Runtime } from './runtime.ts';

export function invocationMetrics(): Middleware {
  const record = async (request: Request, summary: Summary | undefined): Promise<void> => {
    const state = edgeState(request);
    if (!state) return; // no container: a configuration error, nothing to report
    const { metrics, logger, runtime } = state.container;
    try {
      if (summary) addSummaryMetrics(metrics, summary);
      state.backlog = await readBacklog(runtime, state.timeout, logger);
      if (state.backlog) addBacklogMetrics(metrics, state.backlog);
    } catch (err) {
      logger.warn('invocation metrics incomplete', { error: err });
    }
  };
  return {
    after: (request) => record(request, request.response ?? undefined),
    onError: (request) => record(request, (request.error as { summary?: Summary } | null)?.summary),
  };
}

/**
 * The backlog figures within BUDGET.backlogBudgetMs, raced here as well as in the read: whatever
 * the read waits on (a connection, a rollback), the record is published before the timeout.
 */
export async function readBacklog(runtime: Pick<Runtime, 'backlog'>, timeout: Deadline, logger: Logger): Promise<Backlog | undefined> {
  const { deadline } = afterInvocation(timeout, BUDGET.backlogBudgetMs, BUDGET.backlogMinMs);
  if (!deadline) {
    logger.warn('backlog metrics skipped: too little time left before the Lambda timeout (raise OUTBOX_SAFETY_MARGIN_MS)', { remainingMs: timeout.remaining() });
    return undefined;
  }
  try {
    const backlog = await deadline.race('reading the backlog figures', runtime.backlog(deadline));
    if (!backlog) logger.info('backlog metrics skipped: no healthy database connection after this invocation');
    return backlog;
  } catch (err) {
    logger.warn('backlog metrics skipped: reading the table failed', { error: err });
    return undefined;
  }
}
