// Lambda entry point. A middy pipeline around the relay: configuration and the container-scoped
// runtime are built once (cold start); Powertools' middlewares put the Lambda context on every log
// line (injectLambdaContext) and publish one EMF metrics record per invocation (logMetrics); a
// failure is logged with its cause and rethrown so Lambda records the invocation as failed.
import { injectLambdaContext } from '@aws-lambda-powertools/logger/middleware';
import { logMetrics } from '@aws-lambda-powertools/metrics/middleware';
import middy from '@middy/core';
import type { Context } from 'aws-lambda';
import { loadConfig } from '../config/load.ts';
import { fanOut, helperMarker, type RelayEvent } from './fanout.ts';
import { createLogger, type RelayLogger } from '../log.ts';
import { BACKLOG_RESERVE_MS, createMetrics, invocationMetrics, type RelayMetrics } from './metrics.ts';
import type { Summary } from '../loop/invocation.ts';
import { Runtime } from './runtime.ts';

let runtime: Runtime | undefined;
let logger: RelayLogger | undefined;
let metrics: RelayMetrics | undefined;

/**
 * Built on first use, not at import: a configuration error then fails the invocation with its
 * message. `kafka: false`: a CLI command that uses only the database (loadConfig).
 */
export function getRuntime(options: { kafka?: boolean } = {}): Runtime {
  if (!runtime) {
    const config = loadConfig(process.env, options);
    const t = config.telemetry;
    logger = createLogger(config.logLevel, { stage: t.stage }, undefined, { serviceName: t.serviceName });
    metrics = createMetrics(t, logger.powertools);
    runtime = new Runtime(config, logger);
  }
  return runtime;
}

/** For the CLI and tests: close connections so the process can exit. */
export async function closeRuntime(): Promise<void> {
  await runtime?.close();
  runtime = undefined;
  logger = undefined;
  metrics = undefined;
}

type Request = middy.Request<RelayEvent, Summary, Error, Context>;
type Middleware = middy.MiddlewareObj<RelayEvent, Summary, Error, Context>;

/**
 * A Powertools middleware around an instance that exists only once the runtime does (and is
 * built again for a new runtime). Its `before` builds the runtime: a configuration error
 * surfaces there, and the onError steps still run (those of middlewares not built do nothing).
 */
function perRuntime(build: () => Middleware): Middleware {
  let built: { runtime: Runtime; middleware: Middleware } | undefined;
  return {
    before: async (request) => {
      const rt = getRuntime();
      if (built?.runtime !== rt) built = { runtime: rt, middleware: build() };
      await built.middleware.before?.(request);
    },
    after: async (request) => {
      await built?.middleware.after?.(request);
    },
    onError: async (request) => {
      await built?.middleware.onError?.(request);
    },
  };
}

/**
 * X-Ray tracing when the configuration turns it on: src/lambda/tracing.ts is imported on the first such
 * invocation, and never otherwise, so a function without tracing loads none of its code.
 */
function tracing(): Middleware {
  let built: Promise<Middleware> | undefined;
  const traced = async (): Promise<Middleware | undefined> => {
    const t = runtime?.config.telemetry;
    if (!t?.tracing) return undefined;
    built ??= import('./tracing.ts').then((m) => m.tracingMiddleware(t.serviceName) as Middleware);
    return built;
  };
  return {
    before: async (request) => {
      getRuntime();
      await (await traced())?.before?.(request);
    },
    after: async (request) => {
      await (await traced())?.after?.(request);
    },
    onError: async (request) => {
      await (await traced())?.onError?.(request);
    },
  };
}

const requestLogging = (): Middleware => ({
  after: (request: Request) => {
    logger?.info('invocation finished', { summary: request.response });
  },
  onError: (request: Request) => {
    const err = request.error;
    // no runtime: a configuration error; log it with the request id all the same
    const log = logger ?? createLogger('info');
    if (!logger) log.powertools.addContext(request.context);
    log.error('invocation failed', { error: err, summary: (err as { summary?: Summary } | null)?.summary });
    // not handled here: middy rethrows, and Lambda records the failure
  },
});

// after and onError run in the reverse order of use(): the summary is logged, then the
// invocation's metrics are added (the backlog read, fan-out) and published, then the logger's
// per-invocation keys cleared. The event: EventBridge's scheduled event, or a helper's (src/lambda/fanout.ts).
export const handler = middy<RelayEvent, Summary, Error, Context>({ timeoutEarlyInMillis: 0 })
  // first: its subsegment spans the whole invocation, closed after everything else
  .use(tracing())
  .use(perRuntime(() => injectLambdaContext(logger!.powertools, { resetKeys: true })))
  .use(perRuntime(() => logMetrics(metrics!)))
  .use(
    invocationMetrics({
      metrics: () => metrics,
      backlog: (deadline) => runtime?.backlog(deadline) ?? Promise.resolve(undefined),
      logger: () => logger ?? createLogger('info'),
      afterBacklog: async (request, summary, backlog) => {
        if (!runtime || !metrics || !logger) return;
        const { event, context } = request;
        await fanOut({ max: runtime.config.fanoutMax, event, context, summary, backlog, metrics, logger, reserveMs: BACKLOG_RESERVE_MS });
      },
    }),
  )
  .use(requestLogging())
  .handler(async (event, context) => {
    const rt = getRuntime();
    // a child holds this invocation's Lambda context even if another starts meanwhile (the CLI's schedule overlaps them)
    const marker = helperMarker(event);
    const log = logger!.child(marker ? { helperOf: marker.startedBy } : {});
    return rt.invoke(context.getRemainingTimeInMillis(), log, { helper: marker !== undefined });
  });
