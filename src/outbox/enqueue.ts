// For application code on postgres.js: write an event into the outbox inside the caller's own
// transaction, so the event exists if and only if the business change committed.
import type { Sql, TransactionSql } from 'postgres';
import { parseTableName } from '../domain.ts';
import { qualified } from './identifier.ts';

export interface OutboxEvent<P = unknown> {
  aggregatetype: string;
  aggregateid: string;
  type: string;
  payload: P;
  /** explicit topic instead of the relay's topic template */
  topic?: string;
  /** extra Kafka headers (string values; `id` and `type` are set by the relay) */
  headers?: Record<string, string>;
  /** sent as the `traceparent` and `tracestate` headers with OUTBOX_METADATA=trace; stored as Debezium writes it */
  traceContext?: { traceparent: string; tracestate?: string };
}

export interface EnqueueOptions {
  /** outbox table, e.g. "outbox" or "app.outbox" (default "outbox") */
  table?: string;
}

/** Insert one event; returns its id (the Kafka `id` header). Call it with the transaction handle from sql.begin. */
export async function enqueue<P>(sql: TransactionSql | Sql, event: OutboxEvent<P>, options: EnqueueOptions = {}): Promise<string> {
  const table = qualified(parseTableName(options.table ?? 'outbox'));
  // JSON goes over the wire as text and is parsed by Postgres: a string bound straight to a
  // jsonb parameter would be stored as a JSON string, not as the object
  const values: unknown[] = [event.aggregatetype, event.aggregateid, event.type, JSON.stringify(event.payload ?? null)];
  values.push(event.topic ?? null, event.headers ? JSON.stringify(event.headers) : null);
  // named only when given: a producer granted INSERT on the other columns only still can
  const trace = event.traceContext ? tracingSpanContext(event.traceContext) : undefined;
  if (trace !== undefined) values.push(trace);
  const [column, value] = trace === undefined ? ['', ''] : [', tracingspancontext', ', $7'];
  const rows = await sql.unsafe<{ id: string }[]>(
    `INSERT INTO ${table} (aggregatetype, aggregateid, type, payload, topic, headers${column})
     VALUES ($1, $2, $3, $4::text::jsonb, $5, $6::text::jsonb${value}) RETURNING id`,
    values as never[],
  );
  return rows[0]!.id;
}

/** As Debezium's outbox extension stores it: java.util.Properties text. */
export function tracingSpanContext(context: { traceparent: string; tracestate?: string }): string {
  // Properties.store's escapes: a backslash, the separators and comment marks, line breaks
  const controls: Record<string, string> = { '\t': '\\t', '\n': '\\n', '\r': '\\r', '\f': '\\f' };
  const escape = (v: string) => v.replace(/[\\=:#!]/g, (c) => `\\${c}`).replace(/[\t\n\r\f]/g, (c) => controls[c]!);
  const { traceparent, tracestate } = context;
  return `traceparent=${escape(traceparent)}\n${tracestate ? `tracestate=${escape(tracestate)}\n` : ''}`;
}
