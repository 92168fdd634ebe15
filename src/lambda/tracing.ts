// X-Ray tracing with Powertools Tracer, when OUTBOX_TRACING is on (serverless.yml's `tracing`).
// src/lambda/handler.ts imports this module only then: the tracer and the X-Ray SDK land in chunks of
// their own that a cold start without tracing never loads (docs/DEPLOY.md, "Tracing").
import { Tracer } from '@aws-lambda-powertools/tracer';
import { captureLambdaHandler } from '@aws-lambda-powertools/tracer/middleware';
import type middy from '@middy/core';

/** A subsegment `## handler` per invocation, its error or response attached; AWS SDK calls traced beneath it. */
export function tracingMiddleware(serviceName: string): middy.MiddlewareObj {
  return captureLambdaHandler(new Tracer({ serviceName, enabled: true }));
}
