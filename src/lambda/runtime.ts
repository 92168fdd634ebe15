// The container's wiring: configuration, the database connection (src/outbox/connection.ts) and
// the Kafka producer, created once and reused by warm invocations. Each policy lives where its
// setting is read or its resource is handled; this module only connects them.
import type { Sql } from 'postgres';
import { Deadline } from '../budget.ts';
import type { Config } from '../config/types.ts';
import { claimColumns, settingColumns, type KafkaCredentials, type MskIamLogin } from '../domain.ts';
import { BrokerUnavailableError } from '../errors.ts';
import { createLanePublisher, createPublisher, preloadKafkaClient } from '../kafka/clients.ts';
import type { PublisherOptions } from '../kafka/producer-publisher.ts';
import { MskIamTokens } from '../kafka/msk-iam.ts';
import type { Logger } from '../log.ts';
import type { Publisher } from '../loop/ports.ts';
import { runInvocation, type Summary } from '../loop/invocation.ts';
import type { Backlog } from '../outbox/admin.ts';
import type { DatabaseTarget } from '../outbox/client.ts';
import { DatabaseConnection } from '../outbox/connection.ts';
import { OutboxStore, type StoreOptions } from '../outbox/store.ts';
import { allowedPlaintextWarning, kafkaPlaintextProblem, kafkaTlsWarning } from '../transport.ts';
import { databaseTargetFromSecret, kafkaCredentialsFromSecret, SecretsManagerSource, type SecretSource } from './secrets.ts';

export class Runtime {
  private readonly db: DatabaseConnection;
  private publisherInstance: Publisher | undefined;
  private readonly secrets: SecretSource;
  /** the warnings about weak settings already logged: each once per container */
  private readonly warned = new Set<string>();
  /** KAFKA_AUTH=iam: the container's MSK IAM tokens, cached across its invocations */
  private mskIam: MskIamTokens | undefined;

  constructor(
    readonly config: Config,
    readonly logger: Logger,
    secrets?: SecretSource,
  ) {
    this.secrets = secrets ?? new SecretsManagerSource();
    this.db = new DatabaseConnection({
      database: config.database,
      allowPlaintextLogin: config.allowPlaintextLogin,
      table: config.outbox.table,
      target: (refresh, deadline) => this.databaseTarget(refresh, deadline),
      newStore: (sql, prepare) => this.newStore(sql, this.storeOptions(prepare)),
      warn: (warning) => this.warnOnce(warning),
      logger,
    });
    this.warnOnce(kafkaTlsWarning(config.kafka));
    this.warnOnce(allowedPlaintextWarning(kafkaPlaintextProblem(config.kafka)));
  }

  private warnOnce(warning: string | undefined): void {
    if (warning === undefined || this.warned.has(warning)) return;
    this.warned.add(warning);
    this.logger.warn(warning);
  }

  /** Where the database is: DATABASE_URL, or the secret's URL or fields. */
  async databaseTarget(refresh = false, deadline?: Deadline): Promise<DatabaseTarget> {
    const db = this.config.database;
    if (db.url) return { url: db.url };
    return databaseTargetFromSecret(db.secretId!, await this.secrets.get(db.secretId!, refresh, deadline), db.auth);
  }

  /** The shared postgres.js client; `refresh` re-reads the secret and reconnects. */
  database(refresh = false, deadline?: Deadline): Promise<Sql> {
    return this.db.client(refresh, deadline);
  }

  outboxStore(refresh = false, deadline?: Deadline): Promise<OutboxStore> {
    return this.db.outboxStore(refresh, deadline);
  }

  private storeOptions(prepare: boolean): StoreOptions {
    const { sentRows, maxBatchBytes, maxMessageBytes, metadata } = this.config.outbox;
    // OUTBOX_MAX_MESSAGE_BYTES, when set, is every topic's limit: a larger payload is never read
    const claimBytes = { batch: maxBatchBytes, ...(maxMessageBytes === undefined ? {} : { payload: maxMessageBytes }) };
    // the columns the metadata read (created_at, tracingspancontext) are claimed only when on
    const lanes = this.config.outbox.delivery === 'exactly-once';
    return { prepare, sentRows, claimBytes, columns: claimColumns(metadata), columnNames: settingColumns(metadata), lanes };
  }

  /** The store of a new client. A subclass may build another: bench/stores.ts (the benches' comparisons, the unguarded claim of a G4 test). */
  protected newStore(sql: Sql, options: StoreOptions): OutboxStore {
    return new OutboxStore(sql, this.config.outbox.table, this.config.outbox.parkedPolicy, options);
  }

  publisher(): Publisher {
    // OUTBOX_KAFKA_CLIENT: kafkajs or platformatic, the same Publisher around either
    this.publisherInstance ??= createPublisher(this.publisherOptions());
    return this.publisherInstance;
  }

  private publisherOptions(): PublisherOptions {
    const kafka = this.config.kafka;
    return {
      kafka,
      metadata: this.config.outbox.metadata,
      maxMessageBytes: this.config.outbox.maxMessageBytes,
      logger: this.logger,
      credentials: kafka.auth === 'sasl' ? (refresh) => this.kafkaCredentials(refresh) : kafka.auth === 'iam' ? (refresh) => this.mskIamLogin(refresh) : undefined,
    };
  }

  private mskIamLogin(refresh: boolean): Promise<MskIamLogin> {
    this.mskIam ??= new MskIamTokens(this.config.kafka.region!);
    return this.mskIam.login(refresh);
  }

  /** The Kafka secret's credentials (config/load.ts refused sending them unencrypted off this machine, unless allowed). */
  private async kafkaCredentials(refresh: boolean, deadline?: Deadline): Promise<KafkaCredentials> {
    const kafka = this.config.kafka;
    return kafkaCredentialsFromSecret(kafka.secretId!, await this.secrets.get(kafka.secretId!, refresh, deadline));
  }

  /** One invocation with `remainingMs` before its timeout (the benches', the tests'). */
  invoke(remainingMs: number, logger: Logger = this.logger, options: { helper?: boolean } = {}): Promise<Summary> {
    return this.invokeUntil(Deadline.fromRemaining(remainingMs, 0), logger, options);
  }

  /**
   * One invocation: the loop of docs/DESIGN.md ("The invocation loop"), until the safety margin
   * before `timeout` (the Lambda's). `helper`: started by another invocation's fan-out, which never
   * lingers: it ends at its first claim that finds nothing.
   */
  async invokeUntil(timeout: Deadline, logger: Logger = this.logger, { helper = false } = {}): Promise<Summary> {
    const deadline = timeout.minus(this.config.outbox.safetyMarginMs);
    // a cold start: the Kafka client's module loads while the database connects (a no-op once loaded)
    if (!this.publisherInstance) preloadKafkaClient(this.config.kafka.client);
    const o = this.config.outbox;
    const summary = await this.db.run(deadline, logger, (store) =>
      runInvocation(
        {
          store,
          publisher: this.publisher(),
          // the pooler is known once connected: outboxStore() ran before this
          config: { ...o, wake: this.db.wake(o.wake), idle: helper ? 'exit' : o.idle },
          logger,
          pauseAfterPublishMs: this.config.testPauseAfterPublishMs,
          pauseAt: this.config.testPauseAt,
          // a lane's producer lives for one invocation: its next holder may be another container
          ...(store.lanes
            ? { exactlyOnce: { lanes: store.lanes, publisherFor: (lease, ms) => createLanePublisher(this.publisherOptions(), lease.transactionalId, ms), logger } }
            : {}),
        },
        deadline,
      ),
    );
    if (summary.stoppedBecause === 'broker-unavailable') {
      // rows stay pending and the next invocation retries; fail this one so it shows in
      // Lambda's Errors metric and alarms fire while the broker is away
      throw Object.assign(
        new BrokerUnavailableError(`Kafka unavailable at ${this.config.kafka.brokers.join(',')}: ${summary.error ?? 'unknown error'}; check KAFKA_BROKERS, network access and the broker`),
        { summary },
      );
    }
    return summary;
  }

  /** The backlog figures for the invocation's metrics: src/outbox/connection.ts, backlog. */
  backlog(deadline: Deadline): Promise<Backlog | undefined> {
    return this.db.backlog(deadline);
  }

  closeDatabase(): Promise<void> {
    return this.db.close();
  }

  /** Bounded: a hung broker or database must not keep a CLI process (or a test) alive. */
  async close(timeoutMs = 3_000): Promise<void> {
    const publisher = this.publisherInstance;
    this.publisherInstance = undefined;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled([this.db.close(), publisher?.close()]),
      new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs).unref())),
    ]);
    clearTimeout(timer);
  }
}
