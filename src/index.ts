// Public API for application code and embedding.
export { enqueue, type OutboxEvent, type EnqueueOptions } from './enqueue.ts';
export { handler } from './handler.ts';
export type { Summary, StopReason } from './relay.ts';
