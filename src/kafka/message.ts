// Row → Kafka message (the Publisher's MessageFormat). The key is the aggregate id (so one
// aggregate stays on one partition and in order), the value is the JSON payload as stored, and the
// `id` header is the row's uuid, identical on every copy, which is what lets consumers drop the
// duplicates at-least-once allows.
import {
  CLOUDEVENTS_HEADERS, LEGAL_TOPIC, NO_METADATA, PLACED_MAX_CHARS, ROW_COLUMNS, routerOf, topicFor,
  type Metadata, type OutboxRow, type RouterOptions,
} from '../domain.ts';
import { MessageRejectedError } from '../errors.ts';
import type { OutboundMessage } from '../loop/ports.ts';

/**
 * `metadata`: what the relay adds for consumers (OUTBOX_METADATA), each from the row's own columns,
 * and the message's shape (its router options: docs/debezium.md).
 */
export function toMessage(row: OutboxRow, template: string, metadata: Metadata = NO_METADATA): OutboundMessage {
  const topic = topicFor(row, template);
  if (!LEGAL_TOPIC.test(topic)) {
    throw new MessageRejectedError(
      `topic ${JSON.stringify(topic.slice(0, 300))} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-]); fix the row's topic/aggregatetype or OUTBOX_TOPIC_TEMPLATE`,
    );
  }
  const router = routerOf(metadata);
  const headers: Record<string, string> = {};
  for (const [k, v] of Object.entries(row.headers ?? {})) {
    if (v === null || v === undefined) continue;
    headers[k] = typeof v === 'string' ? v : JSON.stringify(v);
  }
  // id and the placed headers are the relay's (relayHeaders): a row's own headers cannot override them
  // the router's headers as Connect's header converter writes strings: as they are, or JSON strings
  const format = (v: string) => (router.headerFormat === 'json' ? jacksonText(JSON.stringify(v)) : v);
  headers.id = format(row.id);
  for (const p of router.placement.filter((x) => x.place === 'header')) {
    const v = placedValue(row, p.column);
    // NULL: JSON's null; as text none (Kafka allows a null header value, the relay's clients send none)
    if (v !== null) headers[p.alias] = format(v);
    else if (router.headerFormat === 'json') headers[p.alias] = 'null';
    else delete headers[p.alias];
  }
  // nor the metadata's (relayHeaders): a row without trace context gets none, not its own headers'
  if (metadata.seq) headers.seq = row.seq;
  if (metadata.trace) {
    delete headers.traceparent;
    delete headers.tracestate;
    Object.assign(headers, traceContext(row.tracingspancontext));
  }
  const source = metadata.cloudEventsSource;
  if (source !== undefined) Object.assign(headers, cloudEventHeaders(row, source));
  const key = row[router.key];
  const message: OutboundMessage = { seq: row.seq, aggregateid: row.aggregateid, topic, key, value: messageValue(row, router), headers };
  if (metadata.timestamp) message.timestamp = createdAt(row).getTime();
  return message;
}

/**
 * The value: the payload as stored, or compacted (table.expand.json.payload: as Connect's
 * JsonConverter writes the expanded payload), or inside an envelope with the columns placed there
 * (`{"payload":...,"alias":"value"}`, the payload a JSON string unless expanded, as JsonConverter writes it).
 */
function messageValue(row: OutboxRow, router: RouterOptions): string | null {
  const envelope = router.placement.filter((p) => p.place === 'envelope');
  // the payload as stored, as StringConverter writes it; else JsonConverter writes the value
  if (envelope.length === 0 && !router.expandPayload) return row.payload;
  if (envelope.length === 0 && row.payload === null) return null;
  // Debezium expands an object or an array; any other payload stays its JSON text, a string
  const expand = router.expandPayload && row.payload !== null && /^\s*[[{]/.test(row.payload);
  const payload = row.payload === null ? 'null' : expand ? compactJson(row.payload) : JSON.stringify(row.payload);
  if (envelope.length === 0) return jacksonText(payload);
  const fields = [`"payload":${payload}`];
  for (const p of envelope) fields.push(`${JSON.stringify(p.alias)}:${JSON.stringify(placedValue(row, p.column))}`);
  return jacksonText(`{${fields.join(',')}}`);
}

/**
 * JSON text as Jackson's UTF-8 generator (Connect's JsonConverter) writes it: a character beyond
 * the BMP (an emoji) as its two escaped UTF-16 surrogates, `\uD83D\uDE00`, not as 4 UTF-8 bytes.
 */
function jacksonText(json: string): string {
  return json.replace(/[\uD800-\uDBFF][\uDC00-\uDFFF]/g, (pair) => {
    const hex = (i: number) => pair.charCodeAt(i).toString(16).toUpperCase();
    return `\\u${hex(0)}\\u${hex(1)}`;
  });
}

/** A placed column's text (null for NULL); over PLACED_MAX_CHARS characters, the row is parked. */
export function placedValue(row: OutboxRow, column: string): string | null {
  const own: readonly string[] = ROW_COLUMNS;
  if (own.includes(column)) return row[column as (typeof ROW_COLUMNS)[number]];
  const v = row.placed?.[column];
  if (v === undefined) throw new Error(`row ${row.seq} has no placed column ${column}: the claim must read it (claimColumns)`);
  if (v !== null && v.length > PLACED_MAX_CHARS && [...v].length > PLACED_MAX_CHARS) {
    throw new MessageRejectedError(
      `column ${column} holds more than ${PLACED_MAX_CHARS} characters, the most a placed column may (OUTBOX_ADDITIONAL_PLACEMENT; the relay's memory bound): ` +
        'shorten the value, or carry it in the payload',
      true,
    );
  }
  return v;
}

/**
 * JSON text as Debezium expands it and Connect's JsonConverter writes it: no whitespace between
 * tokens (Postgres prints jsonb with `", "` and `": "`), no object member whose value is null
 * (the expansion drops them), and a number with a fraction or an exponent as the Java double it
 * was parsed into (javaDouble); strings and integers as printed.
 */
export function compactJson(text: string): string {
  const tokens = text.match(/"(?:[^"\\]|\\.)*"|[{}[\],:]|[^{}[\],:"\s]+/g) ?? [];
  const out: string[] = [];
  const objects: boolean[] = []; // per open container: is it an object
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (t === '{' || t === '[') objects.push(t === '{');
    else if (t === '}' || t === ']') objects.pop();
    const atKey = objects.at(-1) === true && t.startsWith('"') && (tokens[i - 1] === '{' || tokens[i - 1] === ',');
    if (atKey && tokens[i + 2] === 'null' && (tokens[i + 3] === ',' || tokens[i + 3] === '}')) {
      i += tokens[i + 3] === ',' ? 3 : 2; // the member and its comma; before a `}`, the comma before it
      if (tokens[i + 1] === '}' && out.at(-1) === ',') out.pop();
      continue;
    }
    out.push(/^-?\d/.test(t) && /[.eE]/.test(t) ? javaDouble(Number(t)) : t);
  }
  return out.join('');
}

/**
 * Java's Double.toString, which Jackson writes doubles with: plain from 10^-3 to 10^7 with at
 * least one decimal (12.5, 1.0), else d.dddE±n (1.0E7, 1.5E-4); the digits are the shortest that
 * read back (Java before 19 printed one more digit in rare cases).
 */
export function javaDouble(n: number): string {
  const abs = Math.abs(n);
  if (abs === 0 || (abs >= 1e-3 && abs < 1e7)) return Number.isInteger(n) ? `${n < 0 || Object.is(n, -0) ? '-' : ''}${abs}.0` : String(n);
  const [mantissa, exponent] = n.toExponential().split('e') as [string, string];
  return `${mantissa.includes('.') ? mantissa : `${mantissa}.0`}E${exponent.replace('+', '')}`;
}

function createdAt(row: OutboxRow): Date {
  if (!(row.created_at instanceof Date)) {
    throw new Error(`row ${row.seq} has no created_at: the claim must read it when the metadata need it (claimColumns)`);
  }
  return row.created_at;
}

/**
 * CloudEvents' Kafka protocol binding, binary mode: the event's attributes as `ce_` headers (id,
 * type and subject from the row's columns, time its created_at), the payload as the data.
 */
type CloudEventHeader = (typeof CLOUDEVENTS_HEADERS)[number];

export function cloudEventHeaders(row: OutboxRow, source: string): Record<CloudEventHeader, string> {
  return {
    ce_specversion: '1.0',
    ce_id: row.id,
    ce_source: source,
    ce_type: row.type,
    ce_time: createdAt(row).toISOString(),
    ce_subject: row.aggregateid,
    'content-type': 'application/json',
  };
}

// W3C Trace Context: version 00's four fields (a later version's too, but never ff), trace and
// parent ids not all zeros; tracestate at most 32 list members of printable ASCII
const TRACEPARENT = /^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/;
const TRACESTATE = /^[\x20-\x7e]*$/;

/**
 * The W3C trace context headers of a `tracingspancontext` value: Debezium's format, Java
 * properties text (`traceparent=00-...`, as its outbox extension writes it), or a bare
 * traceparent. Nothing when absent or invalid: as W3C says of a traceparent it cannot parse, the
 * consumer then starts a trace of its own (and tracestate goes only with a valid traceparent).
 */
export interface TraceHeaders {
  traceparent: string;
  tracestate?: string;
}

export function traceContext(column: string | null | undefined): TraceHeaders | undefined {
  if (!column) return undefined;
  const bare = column.trim();
  const props = TRACEPARENT.test(bare) ? new Map([['traceparent', bare]]) : javaProperties(column);
  const traceparent = props.get('traceparent')?.trim();
  if (!traceparent || !TRACEPARENT.test(traceparent)) return undefined;
  const tracestate = props.get('tracestate')?.trim();
  const stateOk = tracestate && TRACESTATE.test(tracestate) && tracestate.split(',').length <= 32;
  return stateOk ? { traceparent, tracestate } : { traceparent };
}

/**
 * java.util.Properties' text format (Properties.load): `key=value`, `key: value` or `key value`
 * lines, `#` and `!` comments (Properties.store writes a date comment first), backslash escapes,
 * a trailing backslash continuing the line.
 */
export function javaProperties(text: string): Map<string, string> {
  const props = new Map<string, string>();
  const lines = text.split(/\r\n|\r|\n/);
  for (let i = 0; i < lines.length; i++) {
    let line = lines[i]!.replace(/^[ \t\f]+/, '');
    if (line === '' || line.startsWith('#') || line.startsWith('!')) continue;
    // an odd number of trailing backslashes: the line goes on, its next line's leading blanks dropped
    while (/(^|[^\\])(\\\\)*\\$/.test(line) && i + 1 < lines.length) {
      line = line.slice(0, -1) + lines[++i]!.replace(/^[ \t\f]+/, '');
    }
    const split = /^((?:[^\\=: \t\f]|\\.)*)[ \t\f]*[=:]?[ \t\f]*(.*)$/s.exec(line)!;
    props.set(unescapeJava(split[1]!), unescapeJava(split[2]!));
  }
  return props;
}

const CONTROLS: Record<string, string> = { t: '\t', n: '\n', r: '\r', f: '\f' };

function unescapeJava(s: string): string {
  return s.replace(/\\(u[0-9a-fA-F]{4}|.?)/g, (_, e: string) =>
    e.startsWith('u') && e.length === 5 ? String.fromCharCode(parseInt(e.slice(1), 16)) : (CONTROLS[e] ?? e),
  );
}

/** a record batch's own header (v2: base offset, length, epoch, magic, crc, attributes, ... record count) */
export const BATCH_OVERHEAD_BYTES = 61;

/** Upper bound of the bytes one record takes inside a record batch: key, value, headers and varints at their widest. */
export function recordBytes(m: OutboundMessage): number {
  // a timestamp of its own: its delta from the batch's first one, a varlong up to 10 bytes (else 1)
  let size = m.timestamp === undefined ? 21 : 30;
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
