// The function's edge: the middy middlewares around the invocation share one EdgeState through
// middy's request.internal. The first middleware reads the Lambda context's remaining time, once;
// every step after it (the loop, the backlog read, the fan-out) takes its time from that timeout.
import type middy from '@middy/core';
import type { Context } from 'aws-lambda';
import { Deadline } from '../budget.ts';
import type { Summary } from '../loop/summary.ts';
import type { Backlog } from '../outbox/admin.ts';
import { getContainer, type Container } from './container.ts';
import type { RelayEvent } from './relay-event.ts';

export interface EdgeState {
  container: Container;
  /** the Lambda timeout, from the remaining time read at the invocation's start */
  timeout: Deadline;
  /** the table's figures after the loop (the metrics step reads them, the fan-out step uses them); undefined: not read */
  backlog?: Backlog | undefined;
}

export type Internal = { edge?: EdgeState };
export type Request = middy.Request<RelayEvent, Summary, Error, Context, Internal>;
export type Middleware = middy.MiddlewareObj<RelayEvent, Summary, Error, Context, Internal>;

// the handler function is given the context, not the request: it finds the state by its context
const byContext = new WeakMap<object, EdgeState>();

/** First: the remaining time, then the container (a configuration error surfaces here, and every onError step still runs). */
export function edge(): Middleware {
  return {
    before: (request) => {
      const timeout = Deadline.fromRemaining(request.context.getRemainingTimeInMillis(), 0);
      const state: EdgeState = { container: getContainer(), timeout };
      request.internal.edge = state;
      byContext.set(request.context, state);
    },
  };
}

/** The state edge() set; undefined when it failed (a configuration error). */
export function edgeState(request: Request): EdgeState | undefined {
  return request.internal.edge;
}

export function invocationState(context: Context): EdgeState {
  const state = byContext.get(context);
  if (!state) throw new Error('the handler ran without the edge middleware');
  return state;
}

/** A middleware around an instance built per container (Powertools' logger and metrics); its steps do nothing without one. */
export function perContainer(build: (container: Container) => Middleware): Middleware {
  let built: { container: Container; middleware: Middleware } | undefined;
  const current = (request: Request): Middleware | undefined => {
    const container = edgeState(request)?.container;
    if (!container) return undefined;
    if (built?.container !== container) built = { container, middleware: build(container) };
    return built.middleware;
  };
  return {
    before: async (request) => {
      await current(request)?.before?.(request);
    },
    after: async (request) => {
      await current(request)?.after?.(request);
    },
    onError: async (request) => {
      await current(request)?.onError?.(request);
    },
  };
}

/**
 * X-Ray tracing when the configuration turns it on: src/lambda/tracing.ts is imported on the first
 * such invocation, and never otherwise, so a function without tracing loads none of its code.
 */
export function lazyTracing(): Middleware {
  let built: Promise<Middleware> | undefined;
  const traced = async (request: Request): Promise<Middleware | undefined> => {
    const t = edgeState(request)?.container.config.telemetry;
    if (!t?.tracing) return undefined;
    built ??= import('./tracing.ts').then((m) => m.tracingMiddleware(t.serviceName) as unknown as Middleware);
    return built;
  };
  return {
    before: async (request) => {
      await (await traced(request))?.before?.(request);
    },
    after: async (request) => {
      await (await traced(request))?.after?.(request);
    },
    onError: async (request) => {
      await (await traced(request))?.onError?.(request);
    },
  };
}
