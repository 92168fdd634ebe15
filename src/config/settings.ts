// Every environment variable the relay reads, declared once. The reader refuses a name not
// declared here (env-reader.ts), and test/unit/settings.test.ts checks docs/configuration.md's
// table and serverless.yml's environment against this list: adding a setting is its entry here,
// its read in load.ts, its row in the docs and, when deployed, its line in serverless.yml.
import { TEST_HOOKS } from '../test-hooks.ts';

export type SettingKind =
  /** a decision a user makes: one row of docs/configuration.md's table */
  | 'setting'
  /** another name for a setting, read after it (its row names it) */
  | 'alias'
  /** set by Lambda, the AWS SDK's environment or serverless.yml itself, from a parameter or the framework: listed, not a row */
  | 'platform'
  /** read only when the sources run through tsx (src/test-hooks.ts); every build uses the constant */
  | 'test-hook';

export interface Setting {
  readonly name: string;
  readonly kind: SettingKind;
  /** the default as the docs table states it (kind `setting`) */
  readonly default?: string;
  /** the decision it serves, in a few words (kind `setting`) */
  readonly decision?: string;
  /** serverless.yml's provider.environment value for it, when the deployment sets it */
  readonly serverless?: string;
  /** kind `alias`: the setting it stands for */
  readonly aliasOf?: string;
}

const setting = (name: string, dflt: string, decision: string, serverless?: string): Setting => ({ name, kind: 'setting', default: dflt, decision, ...(serverless === undefined ? {} : { serverless }) });
const param = (p: string) => `\${param:${p}}`;

export const SETTINGS: readonly Setting[] = [
  setting('DATABASE_URL', '—', 'which database, and the login, as a URL'),
  setting('DATABASE_SECRET_ID', '—', 'which database, from a Secrets Manager secret', '${param:databaseSecretId, param:databaseSecretArn}'),
  setting('DATABASE_SSL', '`verify-full`; off for a host on this machine', 'how the database connection is encrypted', param('databaseSsl')),
  setting('DATABASE_AUTH', '`password`', 'password or RDS IAM login', param('databaseAuth')),
  setting('DATABASE_PREPARE', '`true`', 'whether a pooler sits in between', param('databasePrepare')),
  setting('KAFKA_BROKERS', '— (required; not by `migrate`, `status`, `parked`)', 'which brokers', param('kafkaBrokers')),
  setting('KAFKA_SECRET_ID', '—', 'the SASL login', '${param:kafkaSecretId, param:kafkaSecretArn}'),
  setting('KAFKA_AUTH', '`sasl` with `KAFKA_SECRET_ID`, else `none`', 'how the relay logs in to Kafka', param('kafkaAuth')),
  setting('KAFKA_SSL', '`true` when the relay logs in, unless every broker is on this machine; else `false`', "TLS to the brokers, their certificates checked", param('kafkaSsl')),
  setting('OUTBOX_ALLOW_PLAINTEXT_LOGIN', '`false`', 'whether a login may cross the network unencrypted'),
  setting('OUTBOX_TABLE', '`outbox`', 'which table', param('outboxTable')),
  setting('OUTBOX_BATCH_SIZE', '`500`', 'rows per transaction, and duplicates per crash', param('batchSize')),
  setting('OUTBOX_SAFETY_MARGIN_MS', '`3000`', 'how long before the Lambda timeout an invocation stops', param('safetyMarginMs')),
  setting('OUTBOX_MAX_ATTEMPTS', '`10`', 'how many failures park a row', param('maxAttempts')),
  setting('OUTBOX_TOPIC_TEMPLATE', '`outbox.event.{aggregatetype}`', "each row's topic", param('topicTemplate')),
  setting('OUTBOX_TOPIC_PREFIX', 'the template\'s text before its first placeholder', 'which topics rows may reach', param('topicPrefix')),
  setting('OUTBOX_HEADERS_ALLOW_RESERVED', 'none', 'which `__` headers rows may set', param('headersAllowReserved')),
  setting('OUTBOX_HEADERS_MAX_COUNT', '`32`', 'how many headers a row may carry', param('headersMaxCount')),
  setting('OUTBOX_HEADERS_MAX_BYTES', '`16384`', "how large a row's headers may be", param('headersMaxBytes')),
  setting('OUTBOX_METADATA', 'none', 'what the relay adds for consumers'),
  setting('OUTBOX_CLOUDEVENTS_SOURCE', '—', "the CloudEvents' source"),
  setting('OUTBOX_KEY_COLUMN', '`aggregateid`', 'the Kafka key'),
  setting('OUTBOX_ADDITIONAL_PLACEMENT', '`type:header:type`', 'which columns consumers get, and where'),
  setting('OUTBOX_EXPAND_JSON_PAYLOAD', '`false`', "Debezium's expanded payload"),
  setting('OUTBOX_HEADER_FORMAT', '`text`', "how headers are encoded for consumers' converters"),
  setting('OUTBOX_PARKED_POLICY', '`hold`', 'order or flow, behind a parked row', param('parkedPolicy')),
  setting('OUTBOX_MAX_MESSAGE_BYTES', 'from the broker', 'the largest message', param('maxMessageBytes')),
  setting('OUTBOX_MAX_BATCH_BYTES', "from the function's memory: 64 MiB at 512 MB", 'the memory a batch may take'),
  setting('OUTBOX_SENT_ROWS', '`keep`', 'whether sent events stay in the database', param('sentRows')),
  setting('OUTBOX_RETAIN_SENT_MS', '`86400000`', 'how long sent rows stay', param('retainSentMs')),
  setting('OUTBOX_PARTITION_WIDTH', '— (plain tables)', 'partitioned tables, and their width'),
  setting('OUTBOX_RETAIN_SKIPPED_MS', '`2592000000` (30 days)', "how long operators' skips stay on record", param('retainSkippedMs')),
  setting('OUTBOX_IDLE', '`exit`', 'cost or latency, when the outbox is empty', param('idle')),
  setting('OUTBOX_DELIVERY', '`at-least-once`', 'duplicates after a crash, or Kafka transactions', param('delivery')),
  setting('OUTBOX_FANOUT_MAX', '`1`', 'how many invocations may work on a backlog', param('fanoutMax')),
  setting('OUTBOX_COMPRESSION', '`none`', 'bytes on the wire or CPU', param('compression')),
  setting('OUTBOX_KAFKA_CLIENT', '`kafkajs`', 'which Kafka client library', param('kafkaClient')),
  setting('OUTBOX_CLIENT_ID', '`outbox-relay`', 'how the relay is named to Kafka and Postgres'),
  setting('OUTBOX_LOG_LEVEL', '`info`', 'how much is logged'),
  setting('POWERTOOLS_METRICS_NAMESPACE', '`OutboxRelay`', "the metrics' CloudWatch namespace", param('metricsNamespace')),

  // Powertools' own names for the log level, in its order; the deployment sets the first, so that
  // an operator changing it on the function gets Powertools' convention
  { name: 'POWERTOOLS_LOG_LEVEL', kind: 'alias', aliasOf: 'OUTBOX_LOG_LEVEL', serverless: param('logLevel') },
  { name: 'LOG_LEVEL', kind: 'alias', aliasOf: 'OUTBOX_LOG_LEVEL' },

  { name: 'OUTBOX_STAGE', kind: 'platform', serverless: '${sls:stage}' },
  { name: 'POWERTOOLS_SERVICE_NAME', kind: 'platform', serverless: '${self:service}' },
  // must agree with the function's TracingConfig, which the same parameter sets
  { name: 'OUTBOX_TRACING', kind: 'platform', serverless: param('tracing') },
  { name: 'AWS_REGION', kind: 'platform' },
  { name: 'AWS_LAMBDA_FUNCTION_NAME', kind: 'platform' },
  { name: 'AWS_LAMBDA_FUNCTION_MEMORY_SIZE', kind: 'platform' },
  // what the AWS SDK's credential chain reads, short of the instance metadata
  { name: 'AWS_ACCESS_KEY_ID', kind: 'platform' },
  { name: 'AWS_PROFILE', kind: 'platform' },
  { name: 'AWS_WEB_IDENTITY_TOKEN_FILE', kind: 'platform' },
  { name: 'AWS_CONTAINER_CREDENTIALS_FULL_URI', kind: 'platform' },
  { name: 'AWS_CONTAINER_CREDENTIALS_RELATIVE_URI', kind: 'platform' },

  // dead code in every build, names included (scripts/build.mjs checks the bundle for them):
  // there a hook is undeclared, so that reading one outside `if (TEST_HOOKS)` fails at once
  ...(TEST_HOOKS
    ? ([
        { name: 'OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS', kind: 'test-hook' },
        { name: 'OUTBOX_TEST_PAUSE_AT', kind: 'test-hook' },
        // once settings, now constants (load.ts, REMOVED_SETTINGS), that tests shorten to stay fast
        { name: 'DATABASE_CONNECT_TIMEOUT_MS', kind: 'test-hook' },
        { name: 'OUTBOX_BACKOFF_BASE_MS', kind: 'test-hook' },
        { name: 'OUTBOX_BACKOFF_MAX_MS', kind: 'test-hook' },
        { name: 'OUTBOX_POLL_MS', kind: 'test-hook' },
        { name: 'OUTBOX_METRICS', kind: 'test-hook' },
      ] as const)
    : []),
];

export const DECLARED: ReadonlySet<string> = new Set(SETTINGS.map((s) => s.name));

export function declared(kind: SettingKind): Setting[] {
  return SETTINGS.filter((s) => s.kind === kind);
}
