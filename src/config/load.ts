// The only reader of process.env. Turns the environment into a typed, validated Config and
// reports every problem at once, each naming the variable and the form it expects.
import { BUDGET, MIN_SAFETY_MARGIN_MS } from '../budget.ts';
import {
  DEFAULT_MAX_HEADER_BYTES,
  DEFAULT_MAX_HEADERS,
  DEFAULT_ROUTER,
  HEADER_FORMATS,
  KEY_COLUMNS,
  LEGAL_TOPIC,
  MAX_HEADERS_JSON_BYTES,
  METADATA_OPTIONS,
  PARKED_POLICIES,
  PLACED_MAX_COLUMNS,
  RESERVED_HEADER_PREFIX,
  TOPIC_PLACEHOLDERS,
  parseTableName,
  placedColumns,
  relayHeaders,
  routerOf,
  templateHead,
  unknownPlaceholders,
  type Metadata,
  type Placement,
  type RouterOptions,
  type RowRules,
  type TableName,
} from '../domain.ts';
import { ConfigError } from '../errors.ts';
import { LOG_LEVELS, type LogLevel } from '../log.ts';
import { TEST_HOOKS } from '../test-hooks.ts';
import { ALLOW_PLAINTEXT_LOGIN, DATABASE_SSL_MODES, databaseLogin, kafkaPlaintextProblem, kafkaTlsDefault, parseBroker } from '../transport.ts';
import { parseDatabaseUrl, type DatabaseUrl } from '../database-url.ts';
import { EnvReader, type Env } from './env-reader.ts';
import { DECLARED } from './settings.ts';
import { KAFKA_AUTHS, KAFKA_CLIENTS, PAUSE_WINDOWS, type Config, type KafkaAuth, type KafkaClientName } from './types.ts';
import { uriReferenceProblem } from './uri-reference.ts';

// the Config's shape lives in config/types.ts; importers keep naming this file

export const DEFAULT_TOPIC_TEMPLATE = 'outbox.event.{aggregatetype}';

/** What the settings made constants are (REMOVED_SETTINGS); the tests may still shorten them through the test hooks. */
export const CONNECT_TIMEOUT_MS = 5_000;
export const BACKOFF_BASE_MS = 1_000;
export const BACKOFF_MAX_MS = 300_000;
export const POLL_MS = 250;

/**
 * Settings that were removed, each with what took its place (docs/configuration.md#removed-settings).
 * One still set is refused: ignoring it would silently change what its user asked for.
 */
export const REMOVED_SETTINGS: Readonly<Record<string, string>> = {
  OUTBOX_MAX_REQUEST_BYTES:
    "a send carries at most 1 MiB of records (the Java producer's max.request.size) and at most the topic's limit; " +
    'a larger message that the topic takes still goes, alone. Unset it; to bound messages, set OUTBOX_MAX_MESSAGE_BYTES',
  OUTBOX_WAKE:
    'a lingering invocation polls when a pooler sits in between (DATABASE_PREPARE=false, or one found at connect) and LISTENs ' +
    'otherwise. Unset it; behind PgBouncer or RDS Proxy set DATABASE_PREPARE=false',
  DATABASE_CONNECT_TIMEOUT_MS:
    `a connection attempt gives up after ${CONNECT_TIMEOUT_MS / 1000} s, which a reachable database meets; a slower one is a network path to fix. Unset it`,
  OUTBOX_BACKOFF_BASE_MS: `a failed row is retried after ${BACKOFF_BASE_MS / 1000} s, doubling per attempt up to ${BACKOFF_MAX_MS / 60_000} minutes, with jitter. Unset it; how many failures park a row is OUTBOX_MAX_ATTEMPTS`,
  OUTBOX_BACKOFF_MAX_MS: `a failed row's retry delay doubles up to ${BACKOFF_MAX_MS / 60_000} minutes. Unset it; how many failures park a row is OUTBOX_MAX_ATTEMPTS`,
  OUTBOX_POLL_MS: `a lingering invocation behind a pooler probes for new rows every ${POLL_MS} ms. Unset it; on a direct connection (DATABASE_PREPARE=true) it LISTENs instead`,
  KAFKA_SSL_REJECT_UNAUTHORIZED:
    "KAFKA_SSL=no-verify is TLS without checking the brokers' certificates (what KAFKA_SSL_REJECT_UNAUTHORIZED=false was). Unset it; " +
    'for a private CA give Node NODE_EXTRA_CA_CERTS instead',
  OUTBOX_METRICS:
    "each invocation's metrics go to stdout in Lambda, where CloudWatch reads them and the alarms need them, and to stderr elsewhere (stdout is the CLI's summary). Unset it",
};

/**
 * The removed settings that are set. Where a test hook kept the name (src/config/settings.ts), the
 * sources read it as the hook: only the builds refuse it.
 */
export function removedSettingProblems(read: EnvReader, testHooks: boolean = TEST_HOOKS): string[] {
  return Object.entries(REMOVED_SETTINGS)
    .filter(([name]) => !(testHooks && DECLARED.has(name)) && read.given(name) !== undefined)
    .map(([name, instead]) => `${name} was removed: ${instead}`);
}

/** What the AWS SDK's default credential chain reads from the environment, short of the instance metadata. */
const AWS_CREDENTIAL_VARIABLES = ['AWS_ACCESS_KEY_ID', 'AWS_PROFILE', 'AWS_WEB_IDENTITY_TOKEN_FILE', 'AWS_CONTAINER_CREDENTIALS_FULL_URI', 'AWS_CONTAINER_CREDENTIALS_RELATIVE_URI'];

/**
 * `kafka: false`: for the commands that only use the database (migrate, status, parked): Kafka's
 * settings are still checked when given, and KAFKA_BROKERS is not required.
 */
export function loadConfig(env: Env = process.env, { kafka = true }: { kafka?: boolean } = {}): Config {
  const read = new EnvReader(env);
  read.problems.push(...removedSettingProblems(read));
  const allowPlaintextLogin = read.bool(ALLOW_PLAINTEXT_LOGIN, false);
  const database = databaseConfig(read, allowPlaintextLogin);
  const config: Config = {
    database,
    kafka: kafkaConfig(read, allowPlaintextLogin, kafka),
    allowPlaintextLogin,
    outbox: outboxConfig(read, database.prepare),
    logLevel: logLevel(read),
    telemetry: telemetryConfig(read),
    fanoutMax: fanoutMax(read),
    testPauseAfterPublishMs: TEST_HOOKS ? read.int('OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS', 0, 0, 3_600_000) : 0,
    testPauseAt: TEST_HOOKS ? read.oneOf('OUTBOX_TEST_PAUSE_AT', PAUSE_WINDOWS, 'publish') : 'publish',
    awsCredentials: AWS_CREDENTIAL_VARIABLES.some((name) => read.str(name) !== undefined),
  };
  if (read.problems.length) throw new ConfigError(read.problems);
  return config;
}

function databaseConfig(read: EnvReader, allowPlaintext: boolean): Config['database'] {
  const url = read.str('DATABASE_URL');
  const secretId = read.str('DATABASE_SECRET_ID');
  if (!url && !secretId) {
    read.problems.push('DATABASE_URL or DATABASE_SECRET_ID is required; e.g. DATABASE_URL=postgres://user:pass@host:5432/db, or DATABASE_SECRET_ID naming a Secrets Manager secret (RDS JSON or a URL)');
  }
  if (url && secretId) read.problems.push('set only one of DATABASE_URL and DATABASE_SECRET_ID, not both');
  const parsed = url === undefined ? undefined : databaseUrl(read, url);
  const auth = read.oneOf('DATABASE_AUTH', ['password', 'iam'] as const, 'password');
  const ssl = read.str('DATABASE_SSL') === undefined ? undefined : read.oneOf('DATABASE_SSL', DATABASE_SSL_MODES, 'verify-full', 'verify-full, or disable when the host is this machine');
  // with a secret, the host is known only once it is read: outbox/connection.ts applies the same rule then
  if (parsed) {
    read.problems.push(...databaseLogin({ url: parsed }, 'DATABASE_URL', { ssl, auth, allowPlaintext }).problems);
    // a DATABASE_URL's own rule: a secret's password is its own business
    if (auth === 'iam' && parsed.hosts.length === 1 && parsed.password) {
      read.problems.push('DATABASE_URL has a password, but DATABASE_AUTH=iam logs in with a token: remove the password (postgres://user@host:5432/db)');
    }
  }
  return {
    url,
    secretId,
    auth,
    prepare: read.bool('DATABASE_PREPARE', true),
    connectTimeoutMs: TEST_HOOKS ? read.int('DATABASE_CONNECT_TIMEOUT_MS', CONNECT_TIMEOUT_MS, 100, 600_000) : CONNECT_TIMEOUT_MS,
    applicationName: read.str('OUTBOX_CLIENT_ID') ?? 'outbox-relay',
    ssl,
  };
}

/** DATABASE_URL as postgres.js will read it; undefined, with the problem noted, when it cannot be used. */
function databaseUrl(read: EnvReader, url: string): DatabaseUrl | undefined {
  if (!/^postgres(ql)?:\/\//.test(url)) {
    read.problems.push('DATABASE_URL must start with postgres:// or postgresql:// (e.g. postgres://user:pass@host:5432/db)');
    return undefined;
  }
  try {
    return parseDatabaseUrl(url, 'DATABASE_URL');
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    read.problems.push(...err.problems);
    return undefined;
  }
}

function kafkaConfig(read: EnvReader, allowPlaintext: boolean, required: boolean): Config['kafka'] {
  const brokers = (read.str('KAFKA_BROKERS') ?? '').split(',').map((b) => b.trim()).filter(Boolean);
  if (brokers.length === 0 && required) {
    read.problems.push('KAFKA_BROKERS is required: a comma-separated list of host:port, e.g. KAFKA_BROKERS=b-1.msk.example:9096,b-2.msk.example:9096');
  }
  // kafkajs stays the default: it is the client users named; platformatic is the maintained one
  const client = read.oneOf('OUTBOX_KAFKA_CLIENT', KAFKA_CLIENTS, 'kafkajs');
  for (const b of brokers) brokerProblems(read, b, client);
  const secretId = read.str('KAFKA_SECRET_ID');
  const auth = kafkaAuth(read, secretId);
  const region = read.str('AWS_REGION');
  if (auth === 'iam' && region === undefined) {
    read.problems.push("KAFKA_AUTH=iam signs its tokens for the cluster's region, and AWS_REGION is not set: set it to the MSK cluster's region, e.g. AWS_REGION=eu-west-1 (Lambda sets it to the function's)");
  }
  // SASL credentials and IAM tokens never cross a network in the clear by default; no-verify:
  // TLS, the brokers' certificates unchecked (warned at start)
  const noVerify = read.str('KAFKA_SSL')?.toLowerCase() === 'no-verify';
  const ssl = noVerify || read.bool('KAFKA_SSL', kafkaTlsDefault(secretId !== undefined || auth === 'iam', brokers));
  const plaintext = allowPlaintext ? undefined : kafkaPlaintextProblem({ ssl, brokers, auth });
  if (plaintext) read.problems.push(plaintext);
  return {
    client,
    brokers,
    auth,
    secretId,
    region,
    ssl,
    sslRejectUnauthorized: !noVerify,
    clientId: read.str('OUTBOX_CLIENT_ID') ?? 'outbox-relay',
    compression: read.oneOf('OUTBOX_COMPRESSION', ['none', 'gzip'] as const, 'none'),
  };
}

/**
 * A KAFKA_BROKERS entry the clients cannot read alike is refused (transport.ts, parseBroker): the
 * TLS default and the plaintext refusal judge each broker's host, and must judge the one the
 * client connects to.
 */
function brokerProblems(read: EnvReader, broker: string, client: KafkaClientName): void {
  const parsed = parseBroker(broker);
  if (!parsed) {
    read.problems.push(
      `KAFKA_BROKERS entry ${JSON.stringify(broker)} is not host:port: a host name or IPv4 address, ":" and the port (e.g. b-1.msk.example:9096); an IPv6 address goes in brackets ([2001:db8::1]:9092), with OUTBOX_KAFKA_CLIENT=platformatic`,
    );
  } else if (parsed.port < 1 || parsed.port > 65_535) {
    read.problems.push(`KAFKA_BROKERS entry ${JSON.stringify(broker)} has port ${parsed.port}: a port is 1 to 65535`);
  } else if (parsed.ipv6 && client === 'kafkajs') {
    read.problems.push(
      `KAFKA_BROKERS entry ${JSON.stringify(broker)} is an IPv6 address, which kafkajs cannot connect to (it reads a broker's host up to its first ":"): name the broker by a host name, or set OUTBOX_KAFKA_CLIENT=platformatic`,
    );
  }
}

/**
 * KAFKA_AUTH, checked against KAFKA_SECRET_ID: sasl needs the secret, none and iam take none.
 * Unset, it follows the secret (sasl with one, none without), as before KAFKA_AUTH existed.
 */
function kafkaAuth(read: EnvReader, secretId: string | undefined): KafkaAuth {
  const auth = read.oneOf('KAFKA_AUTH', KAFKA_AUTHS, secretId === undefined ? 'none' : 'sasl', 'sasl when KAFKA_SECRET_ID is set, else none');
  if (auth === 'sasl' && secretId === undefined) {
    read.problems.push('KAFKA_AUTH=sasl needs KAFKA_SECRET_ID, the Secrets Manager secret with the SASL username, password and mechanism: set it, or use KAFKA_AUTH=iam for Amazon MSK IAM access control');
  }
  if (auth === 'iam' && secretId !== undefined) {
    read.problems.push(
      'KAFKA_AUTH=iam logs in with tokens signed by the function\'s AWS credentials and takes no secret, and KAFKA_SECRET_ID is set too: unset KAFKA_SECRET_ID, or unset KAFKA_AUTH (or set KAFKA_AUTH=sasl) to log in with the secret\'s SASL/SCRAM credentials',
    );
  }
  if (auth === 'none' && secretId !== undefined) {
    read.problems.push('KAFKA_AUTH=none logs in with no credentials, and KAFKA_SECRET_ID is set too: unset KAFKA_SECRET_ID, or unset KAFKA_AUTH to log in with the secret');
  }
  return auth;
}

function outboxConfig(read: EnvReader, prepare: boolean): Config['outbox'] {
  let table: TableName = { schema: undefined, name: 'outbox' };
  const tableRaw = read.str('OUTBOX_TABLE');
  if (tableRaw !== undefined) {
    try {
      table = parseTableName(tableRaw);
    } catch (e) {
      read.problems.push(`OUTBOX_TABLE: ${(e as Error).message}`);
    }
  }
  const topicTemplate = read.str('OUTBOX_TOPIC_TEMPLATE') ?? DEFAULT_TOPIC_TEMPLATE;
  const unknown = unknownPlaceholders(topicTemplate);
  if (unknown.length) {
    const braced = (names: readonly string[]) => names.map((p) => `{${p}}`).join(', ');
    read.problems.push(`OUTBOX_TOPIC_TEMPLATE=${JSON.stringify(topicTemplate)} uses unknown placeholder(s) ${braced(unknown)}; allowed: ${braced(TOPIC_PLACEHOLDERS)}`);
  }
  const backoffBaseMs = TEST_HOOKS ? read.int('OUTBOX_BACKOFF_BASE_MS', BACKOFF_BASE_MS, 1, 86_400_000) : BACKOFF_BASE_MS;
  const backoffMaxMs = TEST_HOOKS ? read.int('OUTBOX_BACKOFF_MAX_MS', BACKOFF_MAX_MS, 1, 86_400_000) : BACKOFF_MAX_MS;
  const metadata = metadataConfig(read);
  if (backoffMaxMs < backoffBaseMs) read.problems.push(`OUTBOX_BACKOFF_MAX_MS (${backoffMaxMs}) must be >= OUTBOX_BACKOFF_BASE_MS (${backoffBaseMs})`);
  return {
    table,
    batchSize: read.int('OUTBOX_BATCH_SIZE', 500, 1, 10_000),
    safetyMarginMs: safetyMarginMs(read),
    maxAttempts: read.int('OUTBOX_MAX_ATTEMPTS', 10, 1, 1_000),
    backoffBaseMs,
    backoffMaxMs,
    topicTemplate,
    rowRules: { ...rowRules(read, topicTemplate), relayHeaders: relayHeaders(metadata) },
    metadata,
    parkedPolicy: read.oneOf('OUTBOX_PARKED_POLICY', PARKED_POLICIES, 'hold'),
    maxMessageBytes: read.str('OUTBOX_MAX_MESSAGE_BYTES') === undefined ? undefined : read.int('OUTBOX_MAX_MESSAGE_BYTES', 1_000_000, 1_024, 100_000_000),
    maxBatchBytes: read.int('OUTBOX_MAX_BATCH_BYTES', defaultMaxBatchBytes(functionMemoryMb(read), routerOf(metadata).expandPayload), 1_024, 4 * 1024 ** 3),
    sentRows: read.oneOf('OUTBOX_SENT_ROWS', ['keep', 'delete'] as const, 'keep'),
    retainSentMs: read.int('OUTBOX_RETAIN_SENT_MS', 86_400_000, 0, 365 * 86_400_000),
    partitionWidthS: partitionWidthS(read),
    // skipped rows are the audit record of an operator's decision: kept a month, not a day
    retainSkippedMs: read.int('OUTBOX_RETAIN_SKIPPED_MS', 30 * 86_400_000, 0, 3_650 * 86_400_000),
    idle: read.oneOf('OUTBOX_IDLE', ['exit', 'linger'] as const, 'exit'),
    delivery: read.oneOf('OUTBOX_DELIVERY', ['at-least-once', 'exactly-once'] as const, 'at-least-once'),
    // DATABASE_PREPARE=false says a pooler sits in between (PgBouncer in transaction mode, RDS
    // Proxy): LISTEN does not work through the first and pins a session of the second
    wake: prepare ? 'notify' : 'poll',
    pollMs: TEST_HOOKS ? read.int('OUTBOX_POLL_MS', POLL_MS, 10, 60_000) : POLL_MS,
  };
}

const WIDTH_UNITS: Record<string, number> = { hour: 3_600, day: 86_400, week: 604_800 };

/**
 * OUTBOX_PARTITION_WIDTH (what `migrate` reads: docs/schema.md, "Partitioned outboxes"): `N hour(s)`,
 * `N day(s)` or `N week(s)`, in seconds. Fixed lengths only (a month is not one: partitions are
 * whole widths counted from the epoch), from 1 hour (each partition is a table every claim scans
 * the claim index of) to 52 weeks. Unset: plain tables.
 */
function partitionWidthS(read: EnvReader): number | undefined {
  const raw = read.str('OUTBOX_PARTITION_WIDTH');
  if (raw === undefined) return undefined;
  const m = /^(\d+)\s*(hour|day|week)s?$/i.exec(raw);
  const seconds = m ? Number(m[1]) * WIDTH_UNITS[m[2]!.toLowerCase()]! : NaN;
  if (!(seconds >= 3_600 && seconds <= 52 * 604_800)) {
    read.problems.push(`OUTBOX_PARTITION_WIDTH=${JSON.stringify(raw)} is not a partition width: expected N hours, N days or N weeks (e.g. "1 day", "6 hours"), from 1 hour to 52 weeks (unset: plain tables)`);
    return undefined;
  }
  return seconds;
}

/** OUTBOX_FANOUT_MAX: 1 (the default) is off; the function's reserved concurrency must allow N (serverless.yml checks it). */
function fanoutMax(read: EnvReader): number {
  if (read.str('OUTBOX_FANOUT_MAX') === '0') {
    read.problems.push('OUTBOX_FANOUT_MAX=0 is not a number of invocations: set 1 to turn fan-out off (the default), or N > 1 to let up to N invocations work at once on a backlog');
    return 1;
  }
  return read.int('OUTBOX_FANOUT_MAX', 1, 1, 1_000);
}

/** OUTBOX_SAFETY_MARGIN_MS, no smaller than what a failure runs past the deadline (MIN_SAFETY_MARGIN_MS). */
function safetyMarginMs(read: EnvReader): number {
  const ms = read.int('OUTBOX_SAFETY_MARGIN_MS', BUDGET.safetyMarginMs, 0, 600_000);
  if (ms < MIN_SAFETY_MARGIN_MS) {
    read.problems.push(
      `OUTBOX_SAFETY_MARGIN_MS=${ms} is below its minimum of ${MIN_SAFETY_MARGIN_MS}: a failure at the deadline runs that long past it ` +
        `(a ROLLBACK's shortest grace, ${BUDGET.rollbackGraceMs.min} ms, then closing the LISTEN connection, up to ${BUDGET.listenCloseMs} ms), ` +
        `and Lambda would kill the invocation before it ended its transactions; set it to ${MIN_SAFETY_MARGIN_MS} or more (default ${BUDGET.safetyMarginMs})`,
    );
  }
  return ms;
}

/** Lambda's AWS_LAMBDA_FUNCTION_MEMORY_SIZE (MB, the function's memorySize); 512 elsewhere, the memory serverless.yml gives the function. */
function functionMemoryMb(read: EnvReader): number {
  return read.str('AWS_LAMBDA_FUNCTION_MEMORY_SIZE') === undefined ? 512 : read.int('AWS_LAMBDA_FUNCTION_MEMORY_SIZE', 512, 128, 10_240);
}

/** MB the process holds before any batch: Node, the bundle, both clients (measured: docs/configuration.md, OUTBOX_MAX_BATCH_BYTES) */
const BASELINE_MB = 128;
/** copies of a batch's payloads the process holds at its peak, the claim ahead included (measured, same place) */
const BATCH_COPIES = 6;
/**
 * With OUTBOX_EXPAND_JSON_PAYLOAD=true, the expanded text and its parts besides: one payload at the
 * 512 MB function's 64 MiB peaked at 517–549 MB (bundled CLI, one invocation; 480 unexpanded), at
 * 48 MiB at 411–435 (docs/configuration.md, OUTBOX_MAX_BATCH_BYTES)
 */
const BATCH_COPIES_EXPANDED = 8;

/**
 * OUTBOX_MAX_BATCH_BYTES' default for a function of `memoryMb` MB: what is left over the
 * baseline, shared by the copies of a batch held at once, in whole MiB, at least 1 MiB (a batch
 * takes its first row whatever its size). 512 MB: 64 MiB, 48 MiB when payloads are expanded.
 */
export function defaultMaxBatchBytes(memoryMb: number, expandPayload = false): number {
  const copies = expandPayload ? BATCH_COPIES_EXPANDED : BATCH_COPIES;
  return Math.max(1, Math.floor((memoryMb - BASELINE_MB) / copies)) * 1024 * 1024;
}

/**
 * The topic prefix and the header limits. A row may always name its own topic, so there is always
 * a prefix: OUTBOX_TOPIC_PREFIX, else the template's fixed start, which every topic the template
 * gives has anyway. A template starting with a placeholder leaves no fixed start, so the prefix
 * must then be given. Every resolved topic is checked against it (row-rules.ts); here, only that
 * the prefix can be a topic's start, that it does not reach Kafka's and its tools' internal topics
 * (all of which start with `_`), and that the template can give a topic inside it.
 */
function rowRules(read: EnvReader, template: string): RowRules {
  const given = read.str('OUTBOX_TOPIC_PREFIX');
  const head = templateHead(template);
  const topicPrefix = given ?? head;
  const named = given === undefined ? `OUTBOX_TOPIC_PREFIX (unset: OUTBOX_TOPIC_TEMPLATE's text before its first placeholder, ${JSON.stringify(head)})` : `OUTBOX_TOPIC_PREFIX=${JSON.stringify(given)}`;
  if (topicPrefix === '') {
    read.problems.push(
      `OUTBOX_TOPIC_PREFIX is required when OUTBOX_TOPIC_TEMPLATE (${JSON.stringify(template)}) starts with a placeholder: without it a row could publish to any topic the relay may write, ` +
        "other services' and Kafka's internal ones included. Set it to the prefix the relay's Kafka ACL or IAM policy grants, e.g. OUTBOX_TOPIC_PREFIX=outbox.",
    );
  } else if (!LEGAL_TOPIC.test(topicPrefix)) {
    read.problems.push(`${named} cannot start a Kafka topic name: expected 1-249 of [a-zA-Z0-9._-], e.g. outbox.`);
  } else if (topicPrefix.startsWith('_')) {
    read.problems.push(`${named} starts with "_", as Kafka's and its tools' internal topics do (__consumer_offsets, __transaction_state, _schemas): choose a prefix of your own, e.g. outbox.`);
  } else if (!templateFits(template, head, topicPrefix)) {
    read.problems.push(
      `OUTBOX_TOPIC_TEMPLATE=${JSON.stringify(template)} never gives a topic starting with OUTBOX_TOPIC_PREFIX=${JSON.stringify(topicPrefix)}, so every row it routes would be parked: ` +
        `start the template with the prefix, e.g. OUTBOX_TOPIC_TEMPLATE=${topicPrefix}{aggregatetype}`,
    );
  }
  const reservedHeadersAllowed = (read.str('OUTBOX_HEADERS_ALLOW_RESERVED') ?? '').split(',').map((n) => n.trim()).filter(Boolean);
  for (const name of reservedHeadersAllowed) {
    if (!name.startsWith(RESERVED_HEADER_PREFIX)) {
      read.problems.push(`OUTBOX_HEADERS_ALLOW_RESERVED entry ${JSON.stringify(name)} does not start with "${RESERVED_HEADER_PREFIX}": only such names are reserved, every other name is allowed already (a comma-separated list of exact names, e.g. __TypeId__)`);
    }
  }
  return {
    topicPrefix,
    reservedHeadersAllowed,
    maxHeaders: read.int('OUTBOX_HEADERS_MAX_COUNT', DEFAULT_MAX_HEADERS, 0, 1_000),
    // the table's size check refuses headers over 64 KiB of JSON at INSERT: more could never apply
    maxHeaderBytes: read.int('OUTBOX_HEADERS_MAX_BYTES', DEFAULT_MAX_HEADER_BYTES, 0, MAX_HEADERS_JSON_BYTES),
  };
}

/**
 * OUTBOX_METADATA: a comma-separated list of what the relay adds for consumers, each off unless
 * listed (each changes the records consumers read). cloudevents needs OUTBOX_CLOUDEVENTS_SOURCE,
 * the events' `ce_source`: a URI reference that names where they come from, which only the
 * deployment knows.
 */
function metadataConfig(read: EnvReader): Metadata {
  const listed = (read.str('OUTBOX_METADATA') ?? '').split(',').map((o) => o.trim().toLowerCase()).filter(Boolean);
  const known: readonly string[] = METADATA_OPTIONS;
  for (const option of listed.filter((o) => !known.includes(o))) {
    read.problems.push(`OUTBOX_METADATA entry ${JSON.stringify(option)} is not one of ${METADATA_OPTIONS.join(', ')} (a comma-separated list, e.g. OUTBOX_METADATA=timestamp,seq,trace)`);
  }
  const source = read.str('OUTBOX_CLOUDEVENTS_SOURCE');
  const cloudEvents = listed.includes('cloudevents');
  if (cloudEvents && source === undefined) {
    read.problems.push('OUTBOX_METADATA lists cloudevents, which needs OUTBOX_CLOUDEVENTS_SOURCE: the events\' ce_source, a URI reference naming where they come from, e.g. OUTBOX_CLOUDEVENTS_SOURCE=/orders-service');
  } else if (!cloudEvents && source !== undefined) {
    read.problems.push('OUTBOX_CLOUDEVENTS_SOURCE is set, but OUTBOX_METADATA does not list cloudevents, so no event would carry it: add cloudevents to OUTBOX_METADATA, or unset it');
  } else if (source !== undefined && uriReferenceProblem(source) !== undefined) {
    read.problems.push(
      `OUTBOX_CLOUDEVENTS_SOURCE=${JSON.stringify(source)} is not a URI reference (RFC 3986, as CloudEvents requires of ce_source): ${uriReferenceProblem(source)}; e.g. /orders-service, urn:example:orders or https://example.com/orders`,
    );
  }
  const router = routerConfig(read);
  return {
    timestamp: listed.includes('timestamp'),
    seq: listed.includes('seq'),
    trace: listed.includes('trace'),
    ...(cloudEvents && source !== undefined ? { cloudEventsSource: source } : {}),
    ...(router ? { router } : {}),
  };
}

const ROUTER_SETTINGS = ['OUTBOX_KEY_COLUMN', 'OUTBOX_ADDITIONAL_PLACEMENT', 'OUTBOX_EXPAND_JSON_PAYLOAD', 'OUTBOX_HEADER_FORMAT'];

/**
 * Debezium's Outbox Event Router options, as settings (docs/debezium.md); undefined when none is
 * set (the relay's defaults, DEFAULT_ROUTER).
 */
function routerConfig(read: EnvReader): RouterOptions | undefined {
  if (ROUTER_SETTINGS.every((name) => read.str(name) === undefined)) return undefined;
  const raw = read.str('OUTBOX_ADDITIONAL_PLACEMENT');
  return {
    key: read.oneOf('OUTBOX_KEY_COLUMN', KEY_COLUMNS, DEFAULT_ROUTER.key),
    placement: raw === undefined ? DEFAULT_ROUTER.placement : placementConfig(read, raw),
    expandPayload: read.bool('OUTBOX_EXPAND_JSON_PAYLOAD', DEFAULT_ROUTER.expandPayload),
    headerFormat: read.oneOf('OUTBOX_HEADER_FORMAT', HEADER_FORMATS, DEFAULT_ROUTER.headerFormat),
  };
}

const COLUMN = /^[a-z_][a-z0-9_]{0,62}$/;

/** OUTBOX_ADDITIONAL_PLACEMENT: Debezium's `column:header|envelope[:alias]`, comma-separated, or none. */
function placementConfig(read: EnvReader, raw: string): Placement[] {
  if (raw.toLowerCase() === 'none') return [];
  const placement: Placement[] = [];
  const problem = (text: string) => read.problems.push(`OUTBOX_ADDITIONAL_PLACEMENT: ${text} (a comma-separated list of column:header[:alias] or column:envelope[:alias], e.g. type:header:eventType, or none)`);
  for (const entry of raw.split(',').map((e) => e.trim()).filter(Boolean)) {
    const [column = '', place = '', alias = column, ...rest] = entry.split(':').map((x) => x.trim());
    if (!COLUMN.test(column) || ['payload', 'headers'].includes(column)) {
      problem(`${JSON.stringify(column)} is not a column the relay can place: a lowercase column name other than payload (the value) and headers (the row's own headers)`);
    } else if (place === 'partition') {
      problem(`${JSON.stringify(entry)}: partition placement is not supported, the partition is always the key's (Kafka's default partitioner)`);
    } else if ((place !== 'header' && place !== 'envelope') || rest.length > 0 || alias === '') {
      problem(`${JSON.stringify(entry)} is not column:header[:alias] or column:envelope[:alias]`);
    } else if (placement.some((p) => p.place === place && p.alias === alias) || (place === 'header' && alias === 'id') || (place === 'envelope' && alias === 'payload')) {
      problem(`${JSON.stringify(entry)} places a second value under ${place} ${JSON.stringify(alias)}`);
    } else {
      placement.push({ column, place, alias });
    }
  }
  const extra = placedColumns({ ...DEFAULT_ROUTER, placement });
  if (extra.length > PLACED_MAX_COLUMNS) {
    problem(`${extra.length} columns beyond id, aggregatetype, aggregateid and type (${extra.join(', ')}); at most ${PLACED_MAX_COLUMNS}, each read up to 1,024 characters, keep a batch within its memory`);
  }
  return placement;
}

/** Whether some row could get a topic starting with `prefix` from `template` (its fixed start `head`). */
function templateFits(template: string, head: string, prefix: string): boolean {
  if (head.startsWith(prefix)) return true;
  // the placeholders may fill in the rest of the prefix (a template without one never can)
  return head !== template && prefix.startsWith(head);
}

/**
 * The first of OUTBOX_LOG_LEVEL, POWERTOOLS_LOG_LEVEL and LOG_LEVEL that is set. Powertools reads
 * the last two itself only when its logger is given no level, and the relay always gives one: so
 * the relay reads them, in Powertools' order, after its own. (Lambda's AWS_LAMBDA_LOG_LEVEL still
 * overrides all three: Powertools applies it.)
 */
function logLevel(read: EnvReader): LogLevel {
  for (const name of ['OUTBOX_LOG_LEVEL', 'POWERTOOLS_LOG_LEVEL', 'LOG_LEVEL']) {
    if (read.str(name) !== undefined) return read.oneOf(name, LOG_LEVELS, 'info');
  }
  return 'info';
}

function telemetryConfig(read: EnvReader): Config['telemetry'] {
  const serviceName = read.str('POWERTOOLS_SERVICE_NAME') ?? 'outbox-relay';
  const stage = read.str('OUTBOX_STAGE') ?? 'local';
  const metricsNamespace = read.str('POWERTOOLS_METRICS_NAMESPACE') ?? 'OutboxRelay';
  // CloudWatch's rules for dimension values and namespaces (a value it refuses drops the whole record)
  if (serviceName.length > 250) read.problems.push('POWERTOOLS_SERVICE_NAME must be at most 250 characters');
  if (!/^[A-Za-z0-9_.-]{1,64}$/.test(stage)) read.problems.push(`OUTBOX_STAGE=${JSON.stringify(stage)} must be 1-64 letters, digits, '.', '_' or '-' (e.g. prod)`);
  if (!/^[A-Za-z0-9.\-_/#: ]{1,255}$/.test(metricsNamespace) || metricsNamespace.startsWith('AWS/')) {
    read.problems.push(`POWERTOOLS_METRICS_NAMESPACE=${JSON.stringify(metricsNamespace)} is not a CloudWatch namespace: 1-255 of letters, digits and . - _ / # : or space, not starting with AWS/`);
  }
  // Lambda sets AWS_LAMBDA_FUNCTION_NAME in every function's environment: there, stdout is where
  // CloudWatch Logs picks up EMF records; elsewhere stdout belongs to the CLI's summary
  const inLambda = read.str('AWS_LAMBDA_FUNCTION_NAME') !== undefined;
  const metrics = inLambda ? 'stdout' : 'stderr';
  return {
    serviceName,
    stage,
    metricsNamespace,
    metrics: TEST_HOOKS ? read.oneOf('OUTBOX_METRICS', ['stdout', 'stderr', 'off'] as const, metrics) : metrics,
    tracing: read.bool('OUTBOX_TRACING', false),
  };
}
