// Fan-out on backlog (docs/DESIGN.md, "Fan-out on backlog"): a scheduled invocation that stopped
// on its budget with more claimable rows left than it moved starts helpers, invocations of the
// same function, so that up to OUTBOX_FANOUT_MAX work at once. No coordinator keeps the bound:
// only an invocation started by the schedule starts helpers, at most max - 1, and a helper never
// starts another. The rows' locks (FOR UPDATE SKIP LOCKED) share the work, as between ticks.
import type { Metrics } from '@aws-lambda-powertools/metrics';
import type { Context } from 'aws-lambda';
import type { Logger } from '../log.ts';
import type { Summary } from '../loop/summary.ts';
import { afterInvocation, BUDGET, type Deadline } from '../budget.ts';
import { edgeState, type Middleware } from './edge.ts';
import { METRICS, type MetricName } from './metrics.ts';
import type { Backlog } from '../outbox/admin.ts';
import { helperMarker } from './relay-event.ts';

// the events, in a module of their own that metrics.ts and fanout-invoke.ts read too (no import circle)
export { helperEvent, helperMarker, type HelperEvent, type HelperMarker, type RelayEvent } from './relay-event.ts';

/**
 * How many helpers a scheduled invocation starts: none unless fan-out is on, the invocation
 * stopped on its budget having moved rows, and the backlog read after it shows more rows than it
 * moved; then as many more invocations as the backlog needs at this one's pace, at most max - 1.
 * A count that reached its cap (BACKLOG_COUNT_CAP) is a lower bound of an unknown backlog: max - 1.
 */
export function helpersWanted(max: number, summary: Pick<Summary, 'stoppedBecause' | 'claimed'>, backlog: Backlog | undefined): number {
  if (max <= 1 || summary.stoppedBecause !== 'budget' || summary.claimed === 0 || backlog === undefined) return 0;
  if (backlog.pendingRowsCapped) return max - 1;
  if (backlog.pendingRows <= summary.claimed) return 0;
  return Math.min(max - 1, Math.ceil(backlog.pendingRows / summary.claimed) - 1);
}

export interface FanOutStep {
  /** OUTBOX_FANOUT_MAX */
  max: number;
  event: unknown;
  context: Pick<Context, 'awsRequestId' | 'invokedFunctionArn'>;
  /** the Lambda timeout (edge.ts): the helpers are started within BUDGET.fanoutBudgetMs of what it leaves */
  timeout: Deadline;
  summary: Summary;
  /** the figures read after the invocation; undefined when they could not be read */
  backlog: Backlog | undefined;
  metrics: Metrics;
  logger: Logger;
}

/**
 * After a successful invocation and its backlog read: a helper counts whether it found nothing; a
 * scheduled invocation starts the helpers helpersWanted says. Never throws: a helper not started
 * is logged and counted (HelpersNotStarted), and its rows stay claimable for the next tick.
 */
export async function fanOut(s: FanOutStep): Promise<void> {
  if (s.max <= 1) return;
  const add = (name: MetricName, value: number) => s.metrics.addMetric(name, METRICS[name], value);
  const marker = helperMarker(s.event);
  if (marker) {
    add('HelpersFoundNothing', s.summary.claimed === 0 ? 1 : 0);
    return;
  }
  const wanted = helpersWanted(s.max, s.summary, s.backlog);
  let started = 0;
  let error: Error | undefined;
  const { leftMs, deadline } = afterInvocation(s.timeout, BUDGET.fanoutBudgetMs, BUDGET.fanoutMinMs);
  if (wanted > 0 && !deadline) {
    error = new Error(`too little time left before the Lambda timeout (${leftMs} ms): raise OUTBOX_SAFETY_MARGIN_MS`);
  } else if (wanted > 0) {
    try {
      const { startHelpers } = await import('./fanout-invoke.ts');
      ({ started, error } = await startHelpers(s.context.invokedFunctionArn, wanted, s.context.awsRequestId, leftMs));
    } catch (err) {
      error = err as Error;
    }
  }
  add('HelpersStarted', started);
  add('HelpersNotStarted', wanted - started);
  const figures = { wanted, started, pendingRows: s.backlog?.pendingRows, moved: s.summary.claimed };
  if (error) {
    // a throttle (TooManyRequestsException) is the usual cause: every concurrent invocation is busy
    s.logger.warn('helpers not started: their rows stay claimable for the next tick', { ...figures, error: { name: error.name, message: error.message } });
  } else if (wanted > 0) s.logger.info('helpers started', figures);
}

/** The fan-out step, after the metrics step has read the backlog (used before it: its `after` runs later). */
export function fanOutStep(): Middleware {
  return {
    after: async (request) => {
      const state = edgeState(request);
      if (!state || !request.response) return;
      const { config, metrics, logger } = state.container;
      const { event, context, response: summary } = request;
      await fanOut({ max: config.fanoutMax, event, context, timeout: state.timeout, summary, backlog: state.backlog, metrics, logger });
    },
  };
}
