// What the function is invoked with: EventBridge's scheduled event, or a fan-out helper's (src/lambda/fanout.ts).
// Apart from the fan-out, so that the metrics and the helpers' invoker read it without importing the fan-out.
import type { ScheduledEvent } from 'aws-lambda';

/** What a helper's event carries: who started it, and when (for its logs and the failure queue's reader). */
export interface HelperMarker {
  helper: true;
  /** the request id of the scheduled invocation that started it */
  startedBy: string;
  /** ISO time it was started */
  at: string;
}

export interface HelperEvent {
  outboxRelay: HelperMarker;
}

/** What the function is invoked with: EventBridge's scheduled event, or a helper's. */
export type RelayEvent = ScheduledEvent | HelperEvent;

/** The helper marker of `event`; undefined for any other event (the schedule's, the CLI's). */
export function helperMarker(event: unknown): HelperMarker | undefined {
  const marker = (event as Partial<HelperEvent> | null | undefined)?.outboxRelay;
  return marker?.helper === true ? marker : undefined;
}

export function helperEvent(startedBy: string, now = new Date()): HelperEvent {
  return { outboxRelay: { helper: true, startedBy, at: now.toISOString() } };
}
