// For application code on postgres.js: write an event into the outbox inside the caller's own
// transaction, so the event exists if and only if the business change committed.
import type { Sql, TransactionSql } from 'postgres';
import { parseTableName } from './domain.ts';
import { qualified } from './outbox/identifier.ts';

export interface OutboxEvent<P = unknown> {
  aggregatetype: string;
  aggregateid: string;
  type: string;
  payload: P;
  /** explicit topic instead of the relay's topic template */
  topic?: string;
  /** extra Kafka headers (string values; `id` and `type` are set by the relay) */
  headers?: Record<string, string>;
}

export interface EnqueueOptions {
  /** outbox table, e.g. "outbox" or "app.outbox" (default "outbox") */
  table?: string;
}

/** Insert one event; returns its id (the Kafka `id` header). Call it with the transaction handle from sql.begin. */
export async function enqueue<P>(sql: TransactionSql | Sql, event: OutboxEvent<P>, options: EnqueueOptions = {}): Promise<string> {
  const table = qualified(parseTableName(options.table ?? 'outbox'));
  const rows = await sql.unsafe<{ id: string }[]>(
    `INSERT INTO ${table} (aggregatetype, aggregateid, type, payload, topic, headers)
     VALUES ($1, $2, $3, $4::text::jsonb, $5, $6::text::jsonb) RETURNING id`,
    // JSON goes over the wire as text and is parsed by Postgres: a string bound straight to a
    // jsonb parameter would be stored as a JSON string, not as the object
    [event.aggregatetype, event.aggregateid, event.type, JSON.stringify(event.payload ?? null), event.topic ?? null, event.headers ? JSON.stringify(event.headers) : null],
  );
  return rows[0]!.id;
}
