// What the relay's two sides share: the outbox row, where a row is published (topic routing), what
// a row may choose (RowRules), the table's name, what parked rows do to their aggregate, and the
// broker's credentials. The database side (src/outbox/), the Kafka side (src/kafka/), the loop
// (src/relay.ts, src/loop/) and the configuration all take these from here, so neither side needs
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
  /** read by the claim only when the metadata need it (claimColumns): the record's timestamp, ce_time */
  created_at?: Date;
  /** read by the claim only with OUTBOX_METADATA=trace: Debezium's trace context column (src/kafka/message.ts) */
  tracingspancontext?: string | null;
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
 * (OUTBOX_TOPIC_PREFIX) defaults to it (src/config.ts).
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

/** What a row may choose: the rules src/loop/row-rules.ts checks, read from settings by src/config.ts. */
export interface RowRules {
  /** every topic must start with this (never empty: src/config.ts) */
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
  return [
    ...RELAY_HEADERS,
    ...(metadata.seq ? ['seq'] : []),
    ...(metadata.trace ? ['traceparent', 'tracestate'] : []),
    ...(metadata.cloudEventsSource !== undefined ? CLOUDEVENTS_HEADERS : []),
  ];
}

/** The columns the claim reads beyond its usual ones, only for the metadata that need them. */
export type ClaimColumn = 'created_at' | 'tracingspancontext';
export function claimColumns(metadata: Metadata): ClaimColumn[] {
  const columns: ClaimColumn[] = [];
  if (metadata.timestamp || metadata.cloudEventsSource !== undefined) columns.push('created_at');
  if (metadata.trace) columns.push('tracingspancontext');
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

/** Kafka SASL credentials, as the Kafka secret holds them (src/secrets.ts reads them). */
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
