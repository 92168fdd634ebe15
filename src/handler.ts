// Lambda entry point. A middy pipeline around the relay: configuration and the container-scoped
// runtime are built once (cold start), each invocation gets a logger carrying its request id,
// and a failure is logged with its cause and rethrown so Lambda records the invocation as failed.
import middy from '@middy/core';
import type { Context, ScheduledEvent } from 'aws-lambda';
import { loadConfig } from './config.ts';
import { createLogger, type Logger } from './log.ts';
import type { Summary } from './relay.ts';
import { Runtime } from './runtime.ts';

let runtime: Runtime | undefined;

/** Built on first use, not at import: a configuration error then fails the invocation with its message. */
export function getRuntime(): Runtime {
  if (!runtime) {
    const config = loadConfig();
    runtime = new Runtime(config, createLogger(config.logLevel));
  }
  return runtime;
}

/** For the CLI and tests: close connections so the process can exit. */
export async function closeRuntime(): Promise<void> {
  await runtime?.close();
  runtime = undefined;
}

interface Internal extends Record<string, unknown> {
  logger: Logger;
}

const requestLogging = (): middy.MiddlewareObj<ScheduledEvent, Summary, Error, Context, Internal> => ({
  name: 'request-logging',
  before: (request) => {
    // a configuration error surfaces here, and onError logs it with the request id
    const base = getRuntime().logger;
    request.internal.logger = base.child({ requestId: request.context.awsRequestId, function: request.context.functionName });
  },
  after: (request) => {
    request.internal.logger.info('invocation finished', { summary: request.response });
  },
  onError: (request) => {
    const logger = request.internal.logger ?? createLogger('info').child({ requestId: request.context.awsRequestId });
    const err = request.error;
    logger.error('invocation failed', { error: err, summary: (err as { summary?: Summary } | null)?.summary });
    // not handled here: middy rethrows, and Lambda records the failure
  },
});

export const handler = middy<ScheduledEvent, Summary, Error, Context, Internal>({ timeoutEarlyInMillis: 0 })
  .use(requestLogging())
  .handler(async (_event, context) => {
    const rt = getRuntime();
    const logger = rt.logger.child({ requestId: context.awsRequestId });
    return rt.invoke(context.getRemainingTimeInMillis(), logger);
  });
