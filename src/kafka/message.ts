// Row → Kafka message. The key is the aggregate id (so one aggregate stays on one partition and
// in order), the value is the JSON payload as stored, and the `id` header is the row's uuid,
// identical on every copy, which is what lets consumers drop the duplicates at-least-once allows.
import { MessageRejectedError } from '../errors.ts';

export interface OutboxRow {
  seq: string;
  id: string;
  aggregatetype: string;
  aggregateid: string;
  type: string;
  /** payload as JSON text, or null */
  payload: string | null;
  topic: string | null;
  headers: Record<string, unknown> | null;
  attempts: number;
}

export interface OutboundMessage {
  seq: string;
  aggregateid: string;
  topic: string;
  key: string;
  value: string | null;
  headers: Record<string, string>;
}

// Kafka's own rule for topic names (kafka.common.internals.Topic)
const TOPIC = /^[a-zA-Z0-9._-]{1,249}$/;

export function topicFor(row: Pick<OutboxRow, 'aggregatetype' | 'type' | 'topic'>, template: string): string {
  if (row.topic) return row.topic;
  return template.replaceAll('{aggregatetype}', row.aggregatetype).replaceAll('{type}', row.type);
}

export function toMessage(row: OutboxRow, template: string): OutboundMessage {
  const topic = topicFor(row, template);
  if (!TOPIC.test(topic)) {
    throw new MessageRejectedError(
      `topic ${JSON.stringify(topic.slice(0, 300))} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-]); fix the row's topic/aggregatetype or OUTBOX_TOPIC_TEMPLATE`,
    );
  }
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(row.headers ?? {})) {
    if (v === null || v === undefined) continue;
    headers[k] = typeof v === 'string' ? v : JSON.stringify(v);
  }
  // id and type are the relay's contract: a row's own headers cannot override them
  headers.id = row.id;
  headers.type = row.type;
  return { seq: row.seq, aggregateid: row.aggregateid, topic, key: row.aggregateid, value: row.payload, headers };
}

/**
 * Upper bound of the bytes this message takes in a record batch on the broker: key, value and
 * headers plus record and batch overhead. Used to park oversized rows before sending them.
 */
export function encodedSize(m: OutboundMessage): number {
  let size = 61 /* batch header */ + 21 /* record overhead, varints at their widest */;
  size += Buffer.byteLength(m.key) + (m.value === null ? 0 : Buffer.byteLength(m.value));
  for (const [k, v] of Object.entries(m.headers)) size += Buffer.byteLength(k) + Buffer.byteLength(v) + 10;
  return size;
}
