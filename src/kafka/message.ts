// Row → Kafka message (the Publisher's MessageFormat). The key is the aggregate id (so one
// aggregate stays on one partition and in order), the value is the JSON payload as stored, and the
// `id` header is the row's uuid, identical on every copy, which is what lets consumers drop the
// duplicates at-least-once allows.
import { LEGAL_TOPIC, topicFor, type OutboxRow } from '../domain.ts';
import { MessageRejectedError } from '../errors.ts';
import type { OutboundMessage } from '../loop/ports.ts';

export function toMessage(row: OutboxRow, template: string): OutboundMessage {
  const topic = topicFor(row, template);
  if (!LEGAL_TOPIC.test(topic)) {
    throw new MessageRejectedError(
      `topic ${JSON.stringify(topic.slice(0, 300))} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-]); fix the row's topic/aggregatetype or OUTBOX_TOPIC_TEMPLATE`,
    );
  }
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(row.headers ?? {})) {
    if (v === null || v === undefined) continue;
    headers[k] = typeof v === 'string' ? v : JSON.stringify(v);
  }
  // id and type are the relay's contract (RELAY_HEADERS): a row's own headers cannot override them
  headers.id = row.id;
  headers.type = row.type;
  return { seq: row.seq, aggregateid: row.aggregateid, topic, key: row.aggregateid, value: row.payload, headers };
}

/** a record batch's own header (v2: base offset, length, epoch, magic, crc, attributes, ... record count) */
export const BATCH_OVERHEAD_BYTES = 61;

/** Upper bound of the bytes one record takes inside a record batch: key, value, headers and varints at their widest. */
export function recordBytes(m: OutboundMessage): number {
  let size = 21;
  size += Buffer.byteLength(m.key) + (m.value === null ? 0 : Buffer.byteLength(m.value));
  for (const [k, v] of Object.entries(m.headers)) size += Buffer.byteLength(k) + Buffer.byteLength(v) + 10;
  return size;
}

/**
 * Upper bound of the bytes this message takes alone in a record batch on the broker. Used to park
 * oversized rows before sending them.
 */
export function encodedSize(m: OutboundMessage): number {
  return BATCH_OVERHEAD_BYTES + recordBytes(m);
}

/**
 * A message over its topic's `limit` (max.message.bytes) can never be sent: parked at once
 * (permanent). `unreadValueBytes`: the size of a payload the claim left out (never read), counted
 * as the value.
 */
export function tooLarge(m: OutboundMessage, limit: number, unreadValueBytes?: number): MessageRejectedError | undefined {
  const size = encodedSize(m) + (unreadValueBytes ?? 0);
  if (size <= limit) return undefined;
  if (unreadValueBytes !== undefined) {
    return new MessageRejectedError(
      `payload is ${unreadValueBytes} bytes (the message ${size}), over the ${limit}-byte limit of topic ${m.topic}; parked from its size, the payload was not read: ` +
        'shrink the payload (keep large data elsewhere and send a reference to it) or raise max.message.bytes / OUTBOX_MAX_MESSAGE_BYTES',
      true,
    );
  }
  return new MessageRejectedError(`message is ${size} bytes, over the ${limit}-byte limit of topic ${m.topic}: shrink the payload or raise max.message.bytes / OUTBOX_MAX_MESSAGE_BYTES`, true);
}

/**
 * Split one topic's messages, in order, into consecutive sends of at most `maxBytes` each
 * (batch header included). The broker checks max.message.bytes per partition's record batch, and a
 * send's batch for one partition holds at most every record of the send, so a send under the
 * limit can never be refused as too large however the keys spread over partitions. Without this,
 * rows that each fit, but share a partition, are refused together forever (MESSAGE_TOO_LARGE).
 * A message larger than `maxBytes` on its own travels alone: the per-row check decides about it.
 */
export function splitBySize<M extends OutboundMessage>(messages: M[], maxBytes: number): M[][] {
  const sends: M[][] = [];
  let current: M[] = [];
  let bytes = BATCH_OVERHEAD_BYTES;
  for (const m of messages) {
    const size = recordBytes(m);
    if (current.length > 0 && bytes + size > maxBytes) {
      sends.push(current);
      current = [];
      bytes = BATCH_OVERHEAD_BYTES;
    }
    current.push(m);
    bytes += size;
  }
  if (current.length > 0) sends.push(current);
  return sends;
}

/**
 * gzip can make incompressible data slightly larger (deflate's stored blocks: 5 bytes per 16 KiB,
 * plus the gzip header and trailer); the uncompressed size minus this is a safe budget for a
 * compressed batch.
 */
export function compressionSlack(maxBytes: number): number {
  return Math.ceil(maxBytes / 16_384) * 5 + 32;
}
