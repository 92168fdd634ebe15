// What the relay's two sides share: the outbox row, where a row is published (topic routing), what
// a row may choose (RowRules), the table's name, what parked rows do to their aggregate, and the
// broker's credentials. The database side (src/outbox/), the Kafka side (src/kafka/), the loop
// (src/loop/invocation.ts, src/loop/) and the configuration all take these from here, so neither side needs
// the other. Depends on nothing.

/** One row of the outbox table, as the claim returns it. */
export interface OutboxRow {
  seq: string;
  id: string;
  aggregatetype: string;
  aggregateid: string;
  type: string;
  /** payload as JSON text, or null (a NULL payload, or one the claim left out: payloadLeftOut) */
  payload: string | null;
  /**
   * the payload's size in bytes (its JSON text, UTF-8), as the outbox stores it (payload_bytes,
   * a generated column); null for a NULL payload. Absent where rows do not come from a claim.
   */
  payload_bytes?: number | null;
  topic: string | null;
  headers: Record<string, unknown> | null;
  attempts: number;
  /**
   * created_at, read by the claim only when the metadata need it (claimColumns: the record's
   * timestamp, ce_time), as Postgres prints `extract(epoch FROM created_at)`: seconds since 1970,
   * exact to the microsecond whatever the session's TimeZone or the year, `Infinity`/`-Infinity`
   * for ±infinity (src/kafka/message.ts: createdAtMs). Not a Date: postgres.js parses timestamptz
   * text with `new Date()`, which reads years 1-99 as 19xx/20xx and an offset with seconds as nothing.
   */
  created_epoch?: string;
  /** read by the claim only with OUTBOX_METADATA=trace: Debezium's trace context column (src/kafka/message.ts) */
  tracingspancontext?: string | null;
  /** read by the claim only when columns beyond ROW_COLUMNS are placed: their text, cut (claimColumns) */
  placed?: Record<string, string | null>;
}

/**
 * The claim left this row's payload out (larger than it reads with the batch): it is read
 * afterwards if the row's topic takes a message that large, else the row is parked from its size.
 */
export function payloadLeftOut(row: OutboxRow): row is OutboxRow & { payload: null; payload_bytes: number } {
  return row.payload === null && row.payload_bytes != null;
}

// Topic routing: a row's own `topic`, else the template (OUTBOX_TOPIC_TEMPLATE) with each
// placeholder replaced by the row's column of that name. The claim routes rows the same way in SQL
// (src/outbox/sql.ts) to leave backed-off topics out. Whichever way a topic was chosen, a row whose
// topic does not start with the topic prefix is never sent (src/loop/row-rules.ts).

/** Kafka's own rule for topic names (kafka.common.internals.Topic). */
export const LEGAL_TOPIC = /^[a-zA-Z0-9._-]{1,249}$/;

/** The placeholders a topic template may use, in the order they are replaced. */
export const TOPIC_PLACEHOLDERS = ['aggregatetype', 'type'] as const;

export function topicFor(row: Pick<OutboxRow, 'aggregatetype' | 'type' | 'topic'>, template: string): string {
  if (row.topic) return row.topic;
  return TOPIC_PLACEHOLDERS.reduce((topic, column) => topic.replaceAll(`{${column}}`, row[column]), template);
}

/**
 * The template's fixed start: its text before the first placeholder (all of it when it has none).
 * Every topic the template gives starts with it, whatever the row's columns hold; the topic prefix
 * (OUTBOX_TOPIC_PREFIX) defaults to it (src/config/load.ts).
 */
export function templateHead(template: string): string {
  const at = template.indexOf('{');
  return at < 0 ? template : template.slice(0, at);
}

/** The placeholders of `template` that topicFor does not replace, without their braces. */
export function unknownPlaceholders(template: string): string[] {
  const known: readonly string[] = TOPIC_PLACEHOLDERS;
  return [...template.matchAll(/\{([^}]*)\}/g)].map((m) => m[1] ?? '').filter((p) => !known.includes(p));
}

/** The headers the relay sets on every message (the row's `id` and `type`): a row's own headers never override them. */
export const RELAY_HEADERS: readonly string[] = ['id', 'type'];

/** What a row may choose: the rules src/loop/row-rules.ts checks, read from settings by src/config/load.ts. */
export interface RowRules {
  /** every topic must start with this (never empty: src/config/load.ts) */
  topicPrefix: string;
  /** header names starting with `__` a row may still set (OUTBOX_HEADERS_ALLOW_RESERVED) */
  reservedHeadersAllowed: readonly string[];
  /** most extra headers per row (OUTBOX_HEADERS_MAX_COUNT) */
  maxHeaders: number;
  /** most bytes of extra header names and values per row, UTF-8 (OUTBOX_HEADERS_MAX_BYTES) */
  maxHeaderBytes: number;
  /** the headers the relay writes (relayHeaders: id, type and the metadata's): not the row's, never counted; default RELAY_HEADERS */
  relayHeaders?: readonly string[];
}

/** Names starting with this are reserved: frameworks read them as instructions (Spring: __TypeId__, __KeyTypeId__, __ContentTypeId__). */
export const RESERVED_HEADER_PREFIX = '__';

export const DEFAULT_MAX_HEADERS = 32;
/** room for W3C trace context with a full `baggage` (8,192 bytes by its spec) and a few more */
export const DEFAULT_MAX_HEADER_BYTES = 16_384;
/** the outbox's size check on `headers_bytes` (001_baseline.sql): the most JSON text a row's headers hold */
export const MAX_HEADERS_JSON_BYTES = 65_536;

/**
 * What the relay adds to each message for consumers (OUTBOX_METADATA; docs/configuration.md,
 * "Consumer metadata"), each off unless listed: the record's timestamp from created_at, a `seq`
 * header, W3C trace context headers from the tracingspancontext column, CloudEvents' binary-mode
 * headers (on when `cloudEventsSource`, their `ce_source`, is set).
 */
export interface Metadata {
  timestamp: boolean;
  seq: boolean;
  trace: boolean;
  cloudEventsSource?: string;
  /** Debezium's Outbox Event Router options (docs/debezium.md); absent: the relay's defaults */
  router?: RouterOptions;
}

/**
 * The message's shape, as Debezium's EventRouter options name it (docs/debezium.md): the key's
 * column (table.field.event.key), the columns placed in headers or the value's envelope
 * (table.fields.additional.placement), the payload expanded as Connect's JsonConverter writes it
 * (table.expand.json.payload), and how the router's headers (`id`, the placed ones) are encoded: text, as
 * Connect's default SimpleHeaderConverter writes strings, or json, as its JsonConverter without schemas.
 */
export interface RouterOptions {
  key: KeyColumn;
  placement: readonly Placement[];
  expandPayload: boolean;
  headerFormat: HeaderFormat;
}

export const KEY_COLUMNS = ['aggregateid', 'id', 'aggregatetype', 'type'] as const;
export type KeyColumn = (typeof KEY_COLUMNS)[number];
export const HEADER_FORMATS = ['text', 'json'] as const;
export type HeaderFormat = (typeof HEADER_FORMATS)[number];

/** A column placed in a header or in the value's envelope, under `alias` (Debezium's column:place:alias). */
export interface Placement {
  column: string;
  place: 'header' | 'envelope';
  alias: string;
}

/** The columns every claim reads: placed from the row as it is. Any other placed column is read as text, bounded. */
export const ROW_COLUMNS = ['id', 'aggregatetype', 'aggregateid', 'type'] as const;
/** A placed column's value is read up to this many characters: a longer one parks its row (the memory bound, docs/security.md). */
export const PLACED_MAX_CHARS = 1_024;
/** at most this many placed columns beyond ROW_COLUMNS: with PLACED_MAX_CHARS, at most 16 KB more per row */
export const PLACED_MAX_COLUMNS = 4;

/** The relay's defaults: today's messages (key aggregateid, a `type` header, the payload as stored, the id as text). */
export const DEFAULT_ROUTER: RouterOptions = {
  key: 'aggregateid',
  placement: [{ column: 'type', place: 'header', alias: 'type' }],
  expandPayload: false,
  headerFormat: 'text',
};

export function routerOf(metadata: Metadata): RouterOptions {
  return metadata.router ?? DEFAULT_ROUTER;
}

/** The placed columns that are not ROW_COLUMNS: the claim reads them (claimColumns). */
export function placedColumns(router: RouterOptions): string[] {
  const row: readonly string[] = ROW_COLUMNS;
  return [...new Set(router.placement.map((p) => p.column).filter((c) => !row.includes(c)))];
}

export const METADATA_OPTIONS = ['timestamp', 'seq', 'trace', 'cloudevents'] as const;
export const NO_METADATA: Metadata = { timestamp: false, seq: false, trace: false };

/** CloudEvents' Kafka binding, binary mode: its attributes as `ce_` headers, the data's type as content-type. */
export const CLOUDEVENTS_HEADERS = [
  'ce_specversion', 'ce_id', 'ce_source', 'ce_type', 'ce_time', 'ce_subject', 'content-type',
] as const;

/**
 * Every header the relay writes under `metadata`: a row's own headers of these names are
 * replaced (or dropped, where the relay has no value) and never count against its header limits.
 */
export function relayHeaders(metadata: Metadata): readonly string[] {
  const placed = routerOf(metadata).placement.filter((p) => p.place === 'header').map((p) => p.alias);
  return [
    ...new Set(['id', ...placed]),
    ...(metadata.seq ? ['seq'] : []),
    ...(metadata.trace ? ['traceparent', 'tracestate'] : []),
    ...(metadata.cloudEventsSource !== undefined ? CLOUDEVENTS_HEADERS : []),
  ];
}

/**
 * The columns the claim reads beyond its usual ones, only for the metadata that need them; placed
 * columns as one JSON object `placed` of their text, each cut after PLACED_MAX_CHARS + 1 characters
 * (names are checked identifiers: src/config/load.ts).
 */
/** The outbox columns the settings make the claim read beyond the relay's own (the schema check asks for them). */
export function settingColumns(metadata: Metadata): string[] {
  return [...(metadata.trace ? ['tracingspancontext'] : []), ...placedColumns(routerOf(metadata))];
}
/** created_at as the claim reads it: OutboxRow.created_epoch */
export const CREATED_EPOCH = 'extract(epoch FROM created_at)::text AS created_epoch';
export type ClaimColumn = typeof CREATED_EPOCH | 'tracingspancontext' | `json_build_object(${string}) AS placed`;
export function claimColumns(metadata: Metadata): ClaimColumn[] {
  const columns: ClaimColumn[] = [];
  if (metadata.timestamp || metadata.cloudEventsSource !== undefined) columns.push(CREATED_EPOCH);
  if (metadata.trace) columns.push('tracingspancontext');
  const placed = placedColumns(routerOf(metadata));
  if (placed.length) {
    columns.push(`json_build_object(${placed.map((c) => `'${c}', left("${c}"::text, ${PLACED_MAX_CHARS + 1})`).join(', ')}) AS placed`);
  }
  return columns;
}

/**
 * A table name from configuration (OUTBOX_TABLE). Identifiers cannot be bound as query parameters,
 * so a name is accepted only if it is a plain (optionally schema-qualified) identifier; the
 * database side always writes it double-quoted (src/outbox/identifier.ts).
 */
export interface TableName {
  schema: string | undefined;
  name: string;
}

const IDENT = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

export function parseTableName(raw: string): TableName {
  const parts = raw.split('.');
  if (parts.length > 2 || !parts.every((p) => IDENT.test(p))) {
    throw new Error(
      `${JSON.stringify(raw)} is not a valid table name; expected an identifier such as outbox or app.outbox ` +
        '(letters, digits and underscores, starting with a letter or underscore, at most 63 characters per part)',
    );
  }
  return parts.length === 2 ? { schema: parts[0], name: parts[1]! } : { schema: undefined, name: parts[0]! };
}

/**
 * What a parked row does to the later rows of its aggregate (OUTBOX_PARKED_POLICY): `hold` holds
 * them back (order kept); `skip` lets them pass it (flow kept, order broken for that aggregate).
 */
export const PARKED_POLICIES = ['hold', 'skip'] as const;
export type ParkedPolicy = (typeof PARKED_POLICIES)[number];

export type SaslMechanism = 'plain' | 'scram-sha-256' | 'scram-sha-512';

/** Kafka SASL credentials, as the Kafka secret holds them (src/lambda/secrets.ts reads them). */
export interface KafkaCredentials {
  username: string;
  password: string;
  mechanism: SaslMechanism;
}

/** Amazon MSK IAM (KAFKA_AUTH=iam): SASL/OAUTHBEARER with a token from `token()`, asked at every authentication (src/kafka/msk-iam.ts). */
export interface MskIamLogin {
  mechanism: 'aws-msk-iam';
  token: () => Promise<string>;
}

/** How a producer logs in to Kafka, when it does. */
export type KafkaLogin = KafkaCredentials | MskIamLogin;
