// Starts helpers through Lambda's Invoke API, asynchronously (InvocationType Event: Lambda queues
// the event and answers 202). src/lambda/fanout.ts imports this module only when a scheduled invocation
// wants helpers, so a function with fan-out off loads no code of @aws-sdk/client-lambda. The SDK
// reads AWS_ENDPOINT_URL_LAMBDA itself (the tests' Invoke API endpoint).
import { InvokeCommand, LambdaClient } from '@aws-sdk/client-lambda';
import { helperEvent } from './relay-event.ts';

/**
 * One client per container. It holds no state a failed or aborted call leaves behind; no retry of
 * its own (maxAttempts 1): a throttled start is given up at once, and the next tick tries again.
 */
let client: LambdaClient | undefined;

export interface Started {
  started: number;
  /** the first failure (throttled, refused, unanswered within the time allowed): no more were tried */
  error?: Error;
}

/** Starts `count` helpers of `functionArn` one after the other, within `timeoutMs`, stopping at the first failure. */
export async function startHelpers(functionArn: string, count: number, startedBy: string, timeoutMs: number): Promise<Started> {
  client ??= new LambdaClient({ maxAttempts: 1 });
  const signal = AbortSignal.timeout(timeoutMs);
  let started = 0;
  try {
    for (; started < count; started++) {
      const payload = new TextEncoder().encode(JSON.stringify(helperEvent(startedBy)));
      await client.send(new InvokeCommand({ FunctionName: functionArn, InvocationType: 'Event', Payload: payload }), { abortSignal: signal });
    }
    return { started };
  } catch (err) {
    return { started, error: err as Error };
  }
}
