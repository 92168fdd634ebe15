// The Config the rest of the relay reads: its shape and the choices it names. How the environment
// becomes one (defaults, checks, messages) is src/config/load.ts.
import type { Metadata, ParkedPolicy, RowRules, TableName } from '../domain.ts';
import type { LogLevel } from '../log.ts';
import type { DatabaseSsl } from '../transport.ts';

export const KAFKA_CLIENTS = ['kafkajs', 'platformatic'] as const;
export type KafkaClientName = (typeof KAFKA_CLIENTS)[number];

export const KAFKA_AUTHS = ['none', 'sasl', 'iam'] as const;
export type KafkaAuth = (typeof KAFKA_AUTHS)[number];

export interface Config {
  database: {
    /** either a URL given directly or a Secrets Manager secret id to resolve it from */
    url?: string;
    secretId?: string;
    /** password: the URL's or the secret's; iam: an RDS IAM auth token per connection (src/outbox/rds-iam.ts) */
    auth: 'password' | 'iam';
    /** false for RDS Proxy / PgBouncer in transaction mode */
    prepare: boolean;
    connectTimeoutMs: number;
    applicationName: string;
    /**
     * DATABASE_SSL; undefined = the URL's sslmode if it has one, else verify-full except to this
     * machine (transport.ts, databaseTls)
     */
    ssl?: DatabaseSsl;
  };
  kafka: {
    /** the client library that publishes (src/kafka/kafkajs.ts, src/kafka/platformatic.ts) */
    client: KafkaClientName;
    brokers: string[];
    /**
     * KAFKA_AUTH: none; sasl, with the credentials of the secret KAFKA_SECRET_ID; iam, Amazon MSK IAM
     * tokens (src/kafka/msk-iam.ts)
     */
    auth: KafkaAuth;
    secretId?: string;
    /** AWS_REGION: the region MSK IAM tokens are signed for (required with auth iam) */
    region?: string;
    /**
     * KAFKA_SSL; unset: on when the relay logs in (SASL or IAM) to brokers off this machine
     * (transport.ts, kafkaTlsDefault)
     */
    ssl: boolean;
    sslRejectUnauthorized: boolean;
    clientId: string;
    compression: 'none' | 'gzip';
  };
  outbox: {
    table: TableName;
    batchSize: number;
    safetyMarginMs: number;
    maxAttempts: number;
    backoffBaseMs: number;
    backoffMaxMs: number;
    topicTemplate: string;
    /** what a row may choose: the topic prefix, its extra headers' names, count and size (src/loop/row-rules.ts) */
    rowRules: RowRules;
    /** what the relay adds to each message for consumers (OUTBOX_METADATA, OUTBOX_CLOUDEVENTS_SOURCE) */
    metadata: Metadata;
    parkedPolicy: ParkedPolicy;
    /** upper bound for one encoded message; undefined = ask the broker */
    maxMessageBytes?: number;
    /** the most payload and headers bytes one claim takes (its first row whatever its size): OUTBOX_MAX_BATCH_BYTES */
    maxBatchBytes: number;
    /** keep: move acked rows to the sent table and prune them after retainSentMs; delete: delete them when acked */
    sentRows: 'keep' | 'delete';
    /** delete sent rows older than this many ms, alongside the loop; 0 = never */
    retainSentMs: number;
    /** OUTBOX_PARTITION_WIDTH in seconds: `migrate` creates the outbox and its sent table partitioned by time; undefined = plain tables */
    partitionWidthS?: number;
    /** delete rows an operator skipped longer ago than this many ms (their audit record goes with them); 0 = never */
    retainSkippedMs: number;
    /**
     * when nothing is left to send: exit, or linger until the budget is spent, waking on new rows
     * (src/loop/idle.ts)
     */
    idle: 'exit' | 'linger';
    /**
     * at-least-once (duplicates after a crash, the same ids), or exactly-once for read_committed
     * consumers: each batch a Kafka transaction of a leased lane (docs/DESIGN.md, "Exactly-once delivery (opt-in)")
     */
    delivery: 'at-least-once' | 'exactly-once';
    /**
     * how a lingering invocation learns of new rows: LISTEN/NOTIFY (a direct connection) or a probe
     * every pollMs (a pooler in between: DATABASE_PREPARE=false here, or found by the Runtime at connect)
     */
    wake: 'notify' | 'poll';
    /** the probe's period when wake = poll */
    pollMs: number;
  };
  /** OUTBOX_ALLOW_PLAINTEXT_LOGIN: a password or token may go unencrypted to another machine (transport.ts) */
  allowPlaintextLogin: boolean;
  /** OUTBOX_LOG_LEVEL, else POWERTOOLS_LOG_LEVEL, else LOG_LEVEL, else info */
  logLevel: LogLevel;
  /** Powertools logger and metrics (src/log.ts, src/lambda/metrics.ts) */
  telemetry: {
    /** the `service` of every log line and metric dimension (POWERTOOLS_SERVICE_NAME) */
    serviceName: string;
    /** the `stage` metric dimension and log field (serverless.yml sets the deployment stage) */
    stage: string;
    /** CloudWatch namespace of the metrics */
    metricsNamespace: string;
    /**
     * where the EMF metrics record goes: stdout (what Lambda reads; the default inside Lambda),
     * stderr (the default elsewhere: the CLI keeps stdout for its summary) or off
     */
    metrics: 'stdout' | 'stderr' | 'off';
    /** X-Ray tracing with Powertools Tracer (src/lambda/tracing.ts): OUTBOX_TRACING, off by default */
    tracing: boolean;
  };
  /**
   * OUTBOX_FANOUT_MAX: up to this many invocations work at once on a backlog, the schedule's and
   * the helpers it starts (src/lambda/fanout.ts); 1 = off
   */
  fanoutMax: number;
  /**
   * test-only fault injection: pause this long after the broker acked a batch, before its marks
   * commit; 0 in a build (src/test-hooks.ts)
   */
  testPauseAfterPublishMs: number;
  /**
   * test-only: where that pause is. `publish`: after the acks (in exactly-once delivery, before the
   * batch is recorded and its Kafka transaction commits); `kafka-commit`: after that commit, before
   * the marks'; `committed`: after both
   */
  testPauseAt: PauseWindow;
  /**
   * AWS credentials are named in the environment (keys, a profile, a web identity, container
   * credentials): the operator commands record the AWS caller identity (src/cli/operator.ts)
   */
  awsCredentials: boolean;
}

export const PAUSE_WINDOWS = ['publish', 'kafka-commit', 'committed'] as const;
export type PauseWindow = (typeof PAUSE_WINDOWS)[number];
