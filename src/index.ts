// Public API for application code and embedding.
export { enqueue, type OutboxEvent, type EnqueueOptions } from './outbox/enqueue.ts';
export { handler } from './lambda/handler.ts';
export type { Summary, StopReason } from './loop/invocation.ts';
