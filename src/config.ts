// The only reader of process.env. Turns the environment into a typed, validated Config and
// reports every problem at once, each naming the variable and the form it expects.
import { ConfigError } from './errors.ts';
import { parseTableName, type TableName } from './outbox/identifier.ts';
import type { Level } from './log.ts';

export type SaslMechanism = 'plain' | 'scram-sha-256' | 'scram-sha-512';
export type ParkedPolicy = 'hold' | 'skip';

export interface Config {
  database: {
    /** either a URL given directly or a Secrets Manager secret id to resolve it from */
    url?: string;
    secretId?: string;
    /** false for RDS Proxy / PgBouncer in transaction mode */
    prepare: boolean;
    connectTimeoutMs: number;
    applicationName: string;
    /** TLS to Postgres; undefined = as the URL says (sslmode=...) */
    ssl?: 'disable' | 'require' | 'verify-full';
  };
  kafka: {
    brokers: string[];
    secretId?: string;
    ssl: boolean;
    sslRejectUnauthorized: boolean;
    clientId: string;
    compression: 'none' | 'gzip';
    /** most bytes of records one send (one Produce request per broker) carries */
    maxRequestBytes: number;
  };
  outbox: {
    table: TableName;
    batchSize: number;
    safetyMarginMs: number;
    maxAttempts: number;
    backoffBaseMs: number;
    backoffMaxMs: number;
    topicTemplate: string;
    parkedPolicy: ParkedPolicy;
    /** upper bound for one encoded message; undefined = ask the broker */
    maxMessageBytes?: number;
    /** keep: mark sent rows (sent_at) and prune them after retainSentMs; delete: delete them when acked */
    sentRows: 'keep' | 'delete';
    /** delete sent rows older than this many ms at the end of an invocation; 0 = never */
    retainSentMs: number;
  };
  logLevel: Level;
  /** test-only fault injection: pause this long after the broker acked a batch, before its marks commit */
  testPauseAfterPublishMs: number;
}

type Env = Record<string, string | undefined>;

export const DEFAULT_TOPIC_TEMPLATE = 'outbox.event.{aggregatetype}';

export function loadConfig(env: Env = process.env): Config {
  const problems: string[] = [];
  const str = (name: string): string | undefined => {
    const v = env[name]?.trim();
    return v === '' ? undefined : v;
  };
  const int = (name: string, def: number, min: number, max: number): number => {
    const raw = str(name);
    if (raw === undefined) return def;
    if (!/^\d+$/.test(raw)) {
      problems.push(`${name}=${JSON.stringify(raw)} is not a whole number; expected an integer between ${min} and ${max} (default ${def})`);
      return def;
    }
    const n = Number(raw);
    if (n < min || n > max) problems.push(`${name}=${raw} is out of range; expected an integer between ${min} and ${max} (default ${def})`);
    return n;
  };
  const bool = (name: string, def: boolean): boolean => {
    const raw = str(name)?.toLowerCase();
    if (raw === undefined) return def;
    if (['true', '1', 'yes', 'on'].includes(raw)) return true;
    if (['false', '0', 'no', 'off'].includes(raw)) return false;
    problems.push(`${name}=${JSON.stringify(raw)} is not a boolean; expected true or false (default ${def})`);
    return def;
  };
  const oneOf = <T extends string>(name: string, allowed: readonly T[], def: T): T => {
    const raw = str(name)?.toLowerCase();
    if (raw === undefined) return def;
    if ((allowed as readonly string[]).includes(raw)) return raw as T;
    problems.push(`${name}=${JSON.stringify(raw)} is not one of ${allowed.join(', ')} (default ${def})`);
    return def;
  };

  // --- database
  const url = str('DATABASE_URL');
  const dbSecretId = str('DATABASE_SECRET_ID');
  if (!url && !dbSecretId) {
    problems.push('DATABASE_URL or DATABASE_SECRET_ID is required; e.g. DATABASE_URL=postgres://user:pass@host:5432/db, or DATABASE_SECRET_ID naming a Secrets Manager secret (RDS JSON or a URL)');
  }
  if (url && dbSecretId) problems.push('set only one of DATABASE_URL and DATABASE_SECRET_ID, not both');
  if (url && !/^postgres(ql)?:\/\//.test(url)) {
    problems.push('DATABASE_URL must start with postgres:// or postgresql:// (e.g. postgres://user:pass@host:5432/db)');
  }

  // --- kafka
  const brokersRaw = str('KAFKA_BROKERS');
  const brokers = (brokersRaw ?? '').split(',').map((b) => b.trim()).filter(Boolean);
  if (brokers.length === 0) {
    problems.push('KAFKA_BROKERS is required: a comma-separated list of host:port, e.g. KAFKA_BROKERS=b-1.msk.example:9096,b-2.msk.example:9096');
  }
  for (const b of brokers) {
    if (!/^[A-Za-z0-9.\-_[\]:]+:\d{1,5}$/.test(b)) problems.push(`KAFKA_BROKERS entry ${JSON.stringify(b)} is not host:port`);
  }

  // --- outbox
  let table: TableName = { schema: undefined, name: 'outbox' };
  const tableRaw = str('OUTBOX_TABLE');
  if (tableRaw !== undefined) {
    try {
      table = parseTableName(tableRaw);
    } catch (e) {
      problems.push(`OUTBOX_TABLE: ${(e as Error).message}`);
    }
  }
  const topicTemplate = str('OUTBOX_TOPIC_TEMPLATE') ?? DEFAULT_TOPIC_TEMPLATE;
  const unknownPlaceholders = [...topicTemplate.matchAll(/\{([^}]*)\}/g)].map((m) => m[1]).filter((p) => !['aggregatetype', 'type'].includes(p ?? ''));
  if (unknownPlaceholders.length) {
    problems.push(`OUTBOX_TOPIC_TEMPLATE=${JSON.stringify(topicTemplate)} uses unknown placeholder(s) ${unknownPlaceholders.map((p) => `{${p}}`).join(', ')}; allowed: {aggregatetype}, {type}`);
  }
  const maxMessageBytesRaw = str('OUTBOX_MAX_MESSAGE_BYTES');
  const backoffBaseMs = int('OUTBOX_BACKOFF_BASE_MS', 1_000, 1, 86_400_000);
  const backoffMaxMs = int('OUTBOX_BACKOFF_MAX_MS', 300_000, 1, 86_400_000);
  if (backoffMaxMs < backoffBaseMs) problems.push(`OUTBOX_BACKOFF_MAX_MS (${backoffMaxMs}) must be >= OUTBOX_BACKOFF_BASE_MS (${backoffBaseMs})`);

  const config: Config = {
    database: {
      url,
      secretId: dbSecretId,
      prepare: bool('DATABASE_PREPARE', true),
      connectTimeoutMs: int('DATABASE_CONNECT_TIMEOUT_MS', 5_000, 100, 600_000),
      applicationName: str('OUTBOX_CLIENT_ID') ?? 'outbox-relay',
      ssl: str('DATABASE_SSL') === undefined ? undefined : oneOf('DATABASE_SSL', ['disable', 'require', 'verify-full'] as const, 'require'),
    },
    kafka: {
      brokers,
      secretId: str('KAFKA_SECRET_ID'),
      ssl: bool('KAFKA_SSL', false),
      sslRejectUnauthorized: bool('KAFKA_SSL_REJECT_UNAUTHORIZED', true),
      clientId: str('OUTBOX_CLIENT_ID') ?? 'outbox-relay',
      compression: oneOf('OUTBOX_COMPRESSION', ['none', 'gzip'] as const, 'none'),
      // the Java producer's max.request.size default
      maxRequestBytes: int('OUTBOX_MAX_REQUEST_BYTES', 1_048_576, 1_024, 100_000_000),
    },
    outbox: {
      table,
      batchSize: int('OUTBOX_BATCH_SIZE', 500, 1, 10_000),
      safetyMarginMs: int('OUTBOX_SAFETY_MARGIN_MS', 3_000, 0, 600_000),
      maxAttempts: int('OUTBOX_MAX_ATTEMPTS', 10, 1, 1_000),
      backoffBaseMs,
      backoffMaxMs,
      topicTemplate,
      parkedPolicy: oneOf('OUTBOX_PARKED_POLICY', ['hold', 'skip'] as const, 'hold'),
      maxMessageBytes: maxMessageBytesRaw === undefined ? undefined : int('OUTBOX_MAX_MESSAGE_BYTES', 1_000_000, 1_024, 100_000_000),
      sentRows: oneOf('OUTBOX_SENT_ROWS', ['keep', 'delete'] as const, 'keep'),
      retainSentMs: int('OUTBOX_RETAIN_SENT_MS', 86_400_000, 0, 365 * 86_400_000),
    },
    logLevel: oneOf('OUTBOX_LOG_LEVEL', ['debug', 'info', 'warn', 'error'] as const, 'info'),
    testPauseAfterPublishMs: int('OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS', 0, 0, 3_600_000),
  };
  if (problems.length) throw new ConfigError(problems);
  return config;
}
