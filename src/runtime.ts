// Container-scoped state: configuration, the postgres.js client and the Kafka producer are
// created once and reused by warm invocations, and re-created only when broken (a statement
// abandoned at the deadline, refused credentials after a rotation).
import postgres, { type Sql } from 'postgres';
import { Deadline } from './budget.ts';
import type { Config } from './config.ts';
import { BrokerUnavailableError, DatabaseError } from './errors.ts';
import { KafkajsPublisher } from './kafka/kafkajs.ts';
import type { Publisher } from './kafka/publisher.ts';
import type { Logger } from './log.ts';
import { OutboxStore, isAuthError } from './outbox/store.ts';
import { runInvocation, type Summary } from './relay.ts';
import { databaseUrlFromSecret, kafkaCredentialsFromSecret, SecretsManagerSource, type SecretSource } from './secrets.ts';

export class Runtime {
  private sql: Sql | undefined;
  private store: OutboxStore | undefined;
  private publisherInstance: Publisher | undefined;
  private readonly secrets: SecretSource;

  constructor(
    readonly config: Config,
    readonly logger: Logger,
    secrets?: SecretSource,
  ) {
    this.secrets = secrets ?? new SecretsManagerSource();
  }

  async databaseUrl(refresh = false): Promise<string> {
    const db = this.config.database;
    if (db.url) return db.url;
    const raw = await this.secrets.get(db.secretId!, refresh);
    return databaseUrlFromSecret(db.secretId!, raw);
  }

  /** The shared postgres.js client; `refresh` re-reads the secret and reconnects. */
  async database(refresh = false): Promise<Sql> {
    if (this.sql && !refresh && !this.store?.poisoned) return this.sql;
    await this.closeDatabase();
    const url = await this.databaseUrl(refresh);
    const db = this.config.database;
    this.sql = postgres(url, {
      // two batch transactions overlap (claim next while publishing current) + one for prune/status
      max: 3,
      prepare: db.prepare,
      connect_timeout: Math.ceil(db.connectTimeoutMs / 1000),
      idle_timeout: 0,
      connection: { application_name: db.applicationName },
      // RDS-style JSON secrets carry no sslmode; RDS for Postgres 15+ requires TLS by default
      ...(db.ssl ? { ssl: db.ssl === 'disable' ? false : db.ssl } : {}),
      onnotice: () => undefined,
    });
    this.store = undefined;
    return this.sql;
  }

  async outboxStore(refresh = false): Promise<OutboxStore> {
    const sql = await this.database(refresh);
    this.store ??= new OutboxStore(sql, this.config.outbox.table, this.config.outbox.parkedPolicy, { prepare: this.config.database.prepare });
    return this.store;
  }

  publisher(): Publisher {
    const kafka = this.config.kafka;
    this.publisherInstance ??= new KafkajsPublisher({
      kafka,
      maxMessageBytes: this.config.outbox.maxMessageBytes,
      logger: this.logger,
      credentials: kafka.secretId ? async (refresh) => kafkaCredentialsFromSecret(kafka.secretId!, await this.secrets.get(kafka.secretId!, refresh)) : undefined,
    });
    return this.publisherInstance;
  }

  /** One invocation: the loop of DESIGN §2 with deadline = now + remaining - safety margin. */
  async invoke(remainingMs: number, logger: Logger = this.logger): Promise<Summary> {
    const deadline = Deadline.fromRemaining(remainingMs, this.config.outbox.safetyMarginMs);
    const deps = (store: OutboxStore) => ({
      store,
      publisher: this.publisher(),
      config: this.config.outbox,
      logger,
      pauseAfterPublishMs: this.config.testPauseAfterPublishMs,
    });
    let summary: Summary;
    try {
      summary = await runInvocation(deps(await this.outboxStore()), deadline);
    } catch (err) {
      // credentials rotated under us: read the secret again once and retry with the same deadline
      if (!(err instanceof DatabaseError && isAuthError(err.cause) && this.config.database.secretId)) throw err;
      logger.warn('database refused the credentials; refreshing the database secret once', { secretId: this.config.database.secretId });
      summary = await runInvocation(deps(await this.outboxStore(true)), deadline);
    }
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

  async closeDatabase(): Promise<void> {
    const sql = this.sql;
    this.sql = undefined;
    this.store = undefined;
    await sql?.end({ timeout: 1 }).catch(() => undefined);
  }

  /** Bounded: a hung broker or database must not keep a CLI process (or a test) alive. */
  async close(timeoutMs = 3_000): Promise<void> {
    const publisher = this.publisherInstance;
    this.publisherInstance = undefined;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled([this.closeDatabase(), publisher?.close()]),
      new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs).unref())),
    ]);
    clearTimeout(timer);
  }
}
