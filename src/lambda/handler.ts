// Lambda entry point: a middy pipeline, each middleware one job, sharing one EdgeState through
// request.internal (src/lambda/edge.ts): the remaining time read once, the container (configuration
// and runtime built on the first invocation), Powertools' logger context and its one EMF metrics
// record per invocation, the backlog read, fan-out. A failure is logged with its cause and rethrown
// so Lambda records the invocation as failed.
import { injectLambdaContext } from '@aws-lambda-powertools/logger/middleware';
import { logMetrics } from '@aws-lambda-powertools/metrics/middleware';
import middy from '@middy/core';
import type { Context } from 'aws-lambda';
import { createLogger } from '../log.ts';
import type { Summary } from '../loop/invocation.ts';
import { edge, edgeState, invocationState, lazyTracing, perContainer, type Internal, type Middleware } from './edge.ts';
import { fanOutStep } from './fanout.ts';
import { invocationMetrics } from './invocation-metrics.ts';
import { helperMarker, type RelayEvent } from './relay-event.ts';

const requestLogging = (): Middleware => ({
  after: (request) => {
    edgeState(request)?.container.logger.info('invocation finished', { summary: request.response });
  },
  onError: (request) => {
    const err = request.error;
    // no container: a configuration error; log it with the request id all the same
    let log = edgeState(request)?.container.logger;
    if (!log) {
      log = createLogger('info');
      log.powertools.addContext(request.context);
    }
    log.error('invocation failed', { error: err, summary: (err as { summary?: Summary } | null)?.summary });
    // not handled here: middy rethrows, and Lambda records the failure
  },
});

// after and onError run in the reverse order of use(): the summary is logged, the metrics added
// (the backlog read), helpers started from those figures, the record published, the logger's
// per-invocation keys cleared, the trace closed. The event: EventBridge's scheduled event, or a
// helper's (src/lambda/fanout.ts).
export const handler = middy<RelayEvent, Summary, Error, Context, Internal>({ timeoutEarlyInMillis: 0 })
  .use(edge())
  // its subsegment spans the rest of the invocation, closed after everything else
  .use(lazyTracing())
  .use(perContainer((c) => injectLambdaContext(c.logger.powertools, { resetKeys: true }) as Middleware))
  .use(perContainer((c) => logMetrics(c.metrics) as Middleware))
  .use(fanOutStep())
  .use(invocationMetrics())
  .use(requestLogging())
  .handler(async (event, context) => {
    const { container, timeout } = invocationState(context);
    // a child holds this invocation's Lambda context even if another starts meanwhile (the CLI's schedule overlaps them)
    const marker = helperMarker(event);
    const log = container.logger.child(marker ? { helperOf: marker.startedBy } : {});
    return container.runtime.invokeUntil(timeout, log, { helper: marker !== undefined });
  });
