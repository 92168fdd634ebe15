// Row → Kafka message (the Publisher's MessageFormat). The key is the aggregate id by default (so one
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
  if (metadata.timestamp) message.timestamp = recordTimestamp(row);
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

/** a JSON token of valid JSON text (jsonb's): a string, a structural character, or a literal (number, true, false, null) */
const JSON_TOKEN = /"(?:[^"\\]|\\.)*"|[{}[\],:]|[^{}[\],:"\s]+/g;
/** tokens joined into one string at a time: what compactJson holds beyond its input and output */
const JOIN_EVERY = 8_192;

/**
 * JSON text as Debezium expands it and Connect's JsonConverter writes it: no whitespace between
 * tokens (Postgres prints jsonb with `", "` and `": "`), no object member whose value is null
 * (the expansion drops them), and a number with a fraction or an exponent as the Java double it
 * was parsed into (javaDouble); strings and integers as printed.
 *
 * In one pass over the text, three tokens looked ahead (a member whose value is null), the output
 * joined every JOIN_EVERY tokens: no token list nor object tree of the payload, so what it holds
 * beyond its input is the output's text (measured: docs/configuration.md, OUTBOX_EXPAND_JSON_PAYLOAD).
 */
export function compactJson(text: string): string {
  const re = new RegExp(JSON_TOKEN.source, 'g');
  const ahead: string[] = [];
  const peek = (n: number): string | undefined => {
    while (ahead.length < n) {
      const m = re.exec(text);
      if (!m) return undefined;
      ahead.push(m[0]);
    }
    return ahead[n - 1];
  };
  const chunks: string[] = [];
  let out: string[] = [];
  const emit = (t: string) => {
    out.push(t);
    if (out.length >= JOIN_EVERY) {
      chunks.push(out.join(''));
      out = [];
    }
  };
  const objects: boolean[] = []; // per open container: is it an object
  let previous: string | undefined; // the input's token before this one
  // a comma is written with the token after it: one before a dropped last member is never written
  let comma = false;
  for (let t = peek(1); t !== undefined; previous = t, t = peek(1)) {
    ahead.shift();
    if (t === '{' || t === '[') objects.push(t === '{');
    else if (t === '}' || t === ']') objects.pop();
    const atKey = objects.at(-1) === true && t.startsWith('"') && (previous === '{' || previous === ',');
    if (atKey && peek(2) === 'null' && (peek(3) === ',' || peek(3) === '}')) {
      // the member and its comma; before a `}`, the comma before it
      const last = ahead.splice(0, peek(3) === ',' ? 3 : 2).at(-1)!;
      if (last === 'null') comma = false;
      t = last;
      continue;
    }
    if (t === ',') {
      comma = true;
      continue;
    }
    if (comma) emit(',');
    comma = false;
    emit(/^-?\d/.test(t) && /[.eE]/.test(t) ? javaDouble(Number(t)) : t);
  }
  chunks.push(out.join(''));
  return chunks.join('');
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

/**
 * The row's created_at in milliseconds since the epoch, from its text as the claim reads it
 * (claimColumns: Postgres' `extract(epoch FROM created_at)`, exact to the microsecond, whatever
 * the session's TimeZone and the year); NaN for `infinity`, `-infinity`, and a time beyond
 * JavaScript's dates (±275,760 years).
 */
export function createdAtMs(row: OutboxRow): number {
  const text = row.created_epoch;
  if (typeof text !== 'string') {
    throw new Error(`row ${row.seq} has no created_at: the claim must read it when the metadata need it (claimColumns)`);
  }
  const fixed = /^(-?)(\d+)(?:\.(\d*))?$/.exec(text);
  let ms: number;
  if (fixed) {
    const [, sign, whole = '', fraction = ''] = fixed;
    const abs = Number(whole) * 1000 + Number(fraction.padEnd(3, '0').slice(0, 3));
    // floored: before 1970, a fraction of a millisecond more is a millisecond earlier (as the ISO text truncates it)
    ms = sign === '-' ? -abs - (/[1-9]/.test(fraction.slice(3)) ? 1 : 0) : abs;
  } else {
    // a float8 (before Postgres 14) may print in exponent form (1e-06); Infinity, -Infinity: not a time here
    ms = /^-?\d+(\.\d+)?e[-+]?\d+$/i.test(text) ? Math.floor(Number(text) * 1000) : NaN;
  }
  return Number.isFinite(ms) && Math.abs(ms) <= 8.64e15 ? ms : NaN;
}

/** What a created_at that cannot be the metadata asked for parks its row with. */
function badCreatedAt(row: OutboxRow, what: string): MessageRejectedError {
  return new MessageRejectedError(
    `created_at (${JSON.stringify(row.created_epoch)} seconds since 1970, as Postgres' extract(epoch)) ${what}: ` +
      "set the row's created_at to the time its event happened (the column's default is now())",
    true,
  );
}

/**
 * The record's timestamp (OUTBOX_METADATA=timestamp): created_at in milliseconds. Kafka's
 * timestamps are milliseconds since 1970, never negative (-1 means none; Java's producer refuses
 * any other): a row created before 1970, or at ±infinity, is parked.
 */
function recordTimestamp(row: OutboxRow): number {
  const ms = createdAtMs(row);
  if (Number.isNaN(ms)) return fail(badCreatedAt(row, 'is not a time a Kafka record timestamp (OUTBOX_METADATA=timestamp) can hold'));
  if (ms < 0) return fail(badCreatedAt(row, 'is before 1970-01-01, and a Kafka record timestamp (OUTBOX_METADATA=timestamp) cannot be negative'));
  return ms;
}

function fail(err: MessageRejectedError): never {
  throw err;
}

/**
 * CloudEvents' Kafka protocol binding, binary mode: the event's attributes as `ce_` headers (id,
 * type and subject from the row's columns, time its created_at), the payload as the data. Each
 * attribute valid as CloudEvents 1.0 says, or the row is parked naming the column: `ce_type` and
 * `ce_subject` non-empty strings of allowed characters, `ce_time` RFC 3339 (years 0000-9999).
 * (`ce_id` is the row's uuid; `ce_source` a URI reference, checked by the configuration.)
 */
type CloudEventHeader = (typeof CLOUDEVENTS_HEADERS)[number];

export function cloudEventHeaders(row: OutboxRow, source: string): Record<CloudEventHeader, string> {
  const ms = createdAtMs(row);
  const time = Number.isNaN(ms) ? undefined : new Date(ms).toISOString();
  if (time === undefined || !/^\d{4}-/.test(time)) {
    throw badCreatedAt(row, `gives no CloudEvents time: ce_time is RFC 3339, a time of the years 0000 to 9999 (OUTBOX_METADATA=cloudevents)`);
  }
  return {
    ce_specversion: '1.0',
    ce_id: row.id,
    ce_source: source,
    ce_type: cloudEventString(row.type, 'type', 'ce_type'),
    ce_time: time,
    ce_subject: cloudEventString(row.aggregateid, 'aggregateid', 'ce_subject'),
    'content-type': 'application/json',
  };
}

/**
 * Characters a CloudEvents String may not hold: the control characters (U+0000-U+001F,
 * U+007F-U+009F), surrogates, and Unicode's noncharacters (U+FDD0-U+FDEF, and the last two code
 * points of each plane).
 */
const NONCHARACTERS = Array.from({ length: 17 }, (_, plane) => `\\u{${(plane * 0x10000 + 0xfffe).toString(16)}}\\u{${(plane * 0x10000 + 0xffff).toString(16)}}`).join('');
const NOT_CLOUDEVENTS_STRING = new RegExp(`[\\u0000-\\u001f\\u007f-\\u009f\\ufdd0-\\ufdef${NONCHARACTERS}]|\\p{Cs}`, 'u');

function cloudEventString(value: string, column: string, attribute: string): string {
  if (value === '') {
    throw new MessageRejectedError(`${column} is empty, and CloudEvents' ${attribute} must be a non-empty string (OUTBOX_METADATA=cloudevents): give the row a ${column}`, true);
  }
  const bad = NOT_CLOUDEVENTS_STRING.exec(value);
  if (bad) {
    const code = bad[0].codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0');
    throw new MessageRejectedError(
      `${column} holds U+${code}, a character CloudEvents' ${attribute} may not hold (control characters, surrogates, noncharacters; OUTBOX_METADATA=cloudevents): remove it from the row's ${column}`,
      true,
    );
  }
  return value;
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
