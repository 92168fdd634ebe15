// Container-scoped state: configuration, the postgres.js client and the Kafka producer are
// created once and reused by warm invocations, and re-created only when broken (a statement
// abandoned at the deadline, refused credentials after a rotation).
import type { Sql } from 'postgres';
import { Deadline } from '../budget.ts';
import type { Config } from '../config/types.ts';
import { claimColumns, settingColumns, type KafkaCredentials, type MskIamLogin } from '../domain.ts';
import { BrokerUnavailableError, ConfigError, DatabaseError, DeadlineExceededError } from '../errors.ts';
import { createPublisher, preloadKafkaClient } from '../kafka/clients.ts';
import { MskIamTokens } from '../kafka/msk-iam.ts';
import type { Logger } from '../log.ts';
import type { Publisher } from '../loop/ports.ts';
import { backlog, UnconfirmedRollbackError, type Backlog } from '../outbox/admin.ts';
import { CLIENT_OPTIONS, clientFor, endClient, type DatabaseTarget } from '../outbox/client.ts';
import { isAuthError, isConnectionLost, wrapDbError } from '../outbox/db-errors.ts';
import { OutboxStore, type StoreOptions } from '../outbox/store.ts';
import { runInvocation, type Summary } from '../loop/invocation.ts';
import { databaseTargetFromSecret, kafkaCredentialsFromSecret, SecretsManagerSource, type SecretSource } from './secrets.ts';
import type { RdsAuthTokens } from '../outbox/rds-iam.ts';
import { ALLOW_PLAINTEXT_LOGIN, databasePlaintextProblem, databaseTls, databaseTlsWarning, kafkaPlaintextProblem, kafkaTlsWarning, verifyFull, type DatabaseTls } from '../transport.ts';
import { judgedHosts, parseDatabaseUrl, type DatabaseUrl } from '../database-url.ts';

export class Runtime {
  private sql: Sql | undefined;
  /** a connection of `sql` closed: replace the client before the next invocation uses it */
  private connectionLost = false;
  private store: OutboxStore | undefined;
  private publisherInstance: Publisher | undefined;
  private readonly secrets: SecretSource;

  constructor(
    readonly config: Config,
    readonly logger: Logger,
    secrets?: SecretSource,
  ) {
    this.secrets = secrets ?? new SecretsManagerSource();
    this.prepare = config.database.prepare;
    this.warnOnce(kafkaTlsWarning(config.kafka));
    this.warnOnce(this.allowedPlaintext(kafkaPlaintextProblem(config.kafka)));
  }

  /** A plaintext login OUTBOX_ALLOW_PLAINTEXT_LOGIN allowed, as the warning that says what it risks. */
  private allowedPlaintext(problem: string | undefined): string | undefined {
    return problem && `${ALLOW_PLAINTEXT_LOGIN}=true allows it: ${problem.slice(0, problem.lastIndexOf(':'))}`;
  }

  /** the warnings about weak settings already logged: each once per container, at its start */
  private readonly warned = new Set<string>();

  private warnOnce(warning: string | undefined): void {
    if (warning === undefined || this.warned.has(warning)) return;
    this.warned.add(warning);
    this.logger.warn(warning);
  }

  /** Where the database is: DATABASE_URL, or the secret's URL or fields. */
  async databaseTarget(refresh = false, deadline?: Deadline): Promise<DatabaseTarget> {
    const db = this.config.database;
    if (db.url) return { url: db.url };
    const raw = await this.secrets.get(db.secretId!, refresh, deadline);
    return databaseTargetFromSecret(db.secretId!, raw, db.auth);
  }

  /** DATABASE_AUTH=iam: the auth tokens of the database client's login; undefined with passwords. */
  private iam: RdsAuthTokens | undefined;

  /**
   * The tokens for the target's login, after the checks config/load.ts makes of a DATABASE_URL (a
   * secret's target is known only now): one host, a user (TLS: database() checked it). One token is
   * signed at once, so that missing credentials or region fail here, saying what to check, before
   * any connection. The signer is loaded only for DATABASE_AUTH=iam.
   */
  private async iamTokens(target: DatabaseTarget, url: DatabaseUrl | undefined): Promise<RdsAuthTokens> {
    const source = this.config.database.url ? 'DATABASE_URL' : `the secret ${JSON.stringify(this.config.database.secretId)}`;
    if (url && url.hosts.length !== 1) throw new ConfigError([`DATABASE_AUTH=iam signs a token for one host, and ${source} names several: name the one endpoint`]);
    const login = 'url' in target ? { host: url!.hosts[0]!, port: url!.ports[0]!, user: url!.user } : { host: target.host, port: target.port, user: target.user };
    if (!login.user) throw new ConfigError([`DATABASE_AUTH=iam needs the database user, as the token is signed for it, and ${source} names none`]);
    const { RdsAuthTokens } = await import('../outbox/rds-iam.ts');
    const tokens = new RdsAuthTokens(login);
    await tokens.sign();
    return tokens;
  }

  /** A login the database refused under DATABASE_AUTH=iam, said as such (what to check); any other error as it is. */
  private explained(err: Error): Error {
    if (this.iam && err instanceof DatabaseError && isAuthError(err.cause)) return this.iam.refused(err.cause);
    return err;
  }

  /**
   * Named prepared statements for this client: DATABASE_PREPARE, turned off when the probe in
   * database() finds a pooler or proxy between the relay and Postgres.
   */
  private prepare: boolean;

  /** The shared postgres.js client; `refresh` re-reads the secret and reconnects. */
  async database(refresh = false, deadline?: Deadline): Promise<Sql> {
    if (this.sql && !refresh && !this.store?.poisoned && !this.connectionLost) return this.sql;
    await this.closeDatabase();
    const target = await this.databaseTarget(refresh, deadline);
    // the host is known only now when it comes from a secret; a URL is read as the driver reads it
    const url = 'url' in target ? parseDatabaseUrl(target.url, this.config.database.url ? 'DATABASE_URL' : `the URL of the secret ${JSON.stringify(this.config.database.secretId)}`) : undefined;
    const hosts = url ? judgedHosts(url) : 'host' in target ? [target.host] : [];
    const tls = databaseTls(this.config.database.ssl, url?.sslmode, hosts);
    this.warnOnce(databaseTlsWarning(tls));
    // config/load.ts refused a DATABASE_URL's plaintext login; a secret's host is known only now
    const plaintext = databasePlaintextProblem(tls, hosts, this.config.database.auth);
    if (plaintext && !this.config.allowPlaintextLogin) throw new ConfigError([plaintext]);
    this.warnOnce(this.allowedPlaintext(plaintext));
    this.iam = this.config.database.auth === 'iam' ? await this.iamTokens(target, url) : undefined;
    // verify-full checks the certificate against the names the driver connects to
    const names = url ? url.hosts : hosts;
    let client = this.connect(target, this.config.database.prepare, tls, names);
    this.prepare = this.config.database.prepare;
    if (this.prepare) {
      const seen = await this.backendPids(client, deadline).catch(async (err: unknown) => {
        await client.end({ timeout: 1 }).catch(() => undefined);
        if (err instanceof DeadlineExceededError) {
          throw new DatabaseError(`the database did not answer in time: ${err.message}; check the database and the network path to it (a pooler or proxy in between?)`, { cause: err });
        }
        throw this.explained(wrapDbError(err, 'connecting to the database'));
      });
      if (seen.client !== seen.server) {
        // A transaction pooler (PgBouncer < 1.21, RDS Proxy) hands each transaction whichever server
        // connection is free, and named prepared statements stay behind on the one that prepared
        // them: postgres.js then fails, or re-sends statements out of order within a transaction
        // (docs/configuration.md, DATABASE_PREPARE). Unnamed statements work through any pooler.
        this.logger.warn('the database connection goes through a connection pooler or proxy; named prepared statements are turned off for it (set DATABASE_PREPARE=false to skip this check)', {
          backendPidSeenByClient: seen.client,
          backendPidOnServer: seen.server,
        });
        await client.end({ timeout: 1 }).catch(() => undefined);
        this.prepare = false;
        client = this.connect(target, false, tls, names);
      }
    }
    this.sql = client;
    this.store = undefined;
    return this.sql;
  }

  /**
   * The backend pid the client was given when it connected (BackendKeyData, what a cancel request
   * names) and the one the server runs the statement in. Connected straight to Postgres they are
   * the same process; a pooler or proxy answers the startup itself with a key of its own (PgBouncer
   * a random one), so they differ. One round trip, once per client (cold start or reconnect).
   */
  private async backendPids(client: Sql, deadline?: Deadline): Promise<{ client: number; server: number }> {
    const probe = client<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
    // never unbounded, even for a caller without a deadline (the CLI's migrate and parked): a
    // frozen server would otherwise hang it here, before its own statements' bounds apply
    const bound = deadline ?? new Deadline(Date.now() + 2 * this.config.database.connectTimeoutMs);
    const rows = await bound.race('probing the database connection', probe, () => probe.cancel());
    return { client: rows.state.pid, server: rows[0]!.pid };
  }

  private connect(target: DatabaseTarget, prepare: boolean, tls: DatabaseTls, names: readonly string[]): Sql {
    const db = this.config.database;
    const client: Sql = clientFor(target, {
      ...CLIENT_OPTIONS,
      // two batch transactions overlap (claim next while publishing current) + one for prune/status
      max: 3,
      prepare,
      connect_timeout: Math.ceil(db.connectTimeoutMs / 1000),
      idle_timeout: 0,
      // no rotation by age either: a connection then closes only when something broke, and every
      // close (see onclose) abandons the open transactions and replaces the client
      max_lifetime: null,
      // A connection of this client closed under us. Writing to it again through a reserved
      // handle would crash the process (postgres.js 3.4.9, porsager/postgres#1208: uncaught
      // TypeError in nextWrite), so the open transactions write nothing more (OutboxStore
      // .connectionLost) and the next invocation builds a new client.
      onclose: () => {
        if (this.sql !== client) return;
        this.connectionLost = true;
        this.store?.loseConnection();
      },
      connection: { application_name: db.applicationName },
      // undefined: the URL's own sslmode (transport.ts, databaseTls)
      ...(tls.mode === 'verify-full' ? { ssl: verifyFull(names) } : tls.ssl === undefined ? {} : { ssl: tls.ssl }),
      // DATABASE_AUTH=iam: a token signed for each connection when the server asks for it
      ...(this.iam ? { password: this.iam.password } : {}),
      onnotice: () => undefined,
    });
    return client;
  }

  async outboxStore(refresh = false, deadline?: Deadline): Promise<OutboxStore> {
    const sql = await this.database(refresh, deadline);
    const { sentRows, maxBatchBytes, maxMessageBytes } = this.config.outbox;
    // OUTBOX_MAX_MESSAGE_BYTES, when set, is every topic's limit: a larger payload is never read
    const claimBytes = { batch: maxBatchBytes, ...(maxMessageBytes === undefined ? {} : { payload: maxMessageBytes }) };
    // the columns the metadata read (created_at, tracingspancontext) are claimed only when on
    const columns = claimColumns(this.config.outbox.metadata);
    const columnNames = settingColumns(this.config.outbox.metadata);
    this.store ??= this.newStore(sql, { prepare: this.prepare, sentRows, claimBytes, columns, columnNames });
    return this.store;
  }

  /** The store of a new client. A subclass may build another: bench/stores.ts (the benches' comparisons, the unguarded claim of a G4 test). */
  protected newStore(sql: Sql, options: StoreOptions): OutboxStore {
    return new OutboxStore(sql, this.config.outbox.table, this.config.outbox.parkedPolicy, options);
  }

  publisher(): Publisher {
    const kafka = this.config.kafka;
    // OUTBOX_KAFKA_CLIENT: kafkajs or platformatic, the same Publisher around either
    this.publisherInstance ??= createPublisher({
      kafka,
      metadata: this.config.outbox.metadata,
      maxMessageBytes: this.config.outbox.maxMessageBytes,
      logger: this.logger,
      credentials: kafka.auth === 'sasl' ? (refresh) => this.kafkaCredentials(refresh) : kafka.auth === 'iam' ? (refresh) => this.mskIamLogin(refresh) : undefined,
    });
    return this.publisherInstance;
  }

  /** KAFKA_AUTH=iam: the container's MSK IAM tokens, cached across its invocations (src/kafka/msk-iam.ts). */
  private mskIam: MskIamTokens | undefined;

  /**
   * The MSK IAM login of a new producer. A token is signed (or the cached one taken) now, so that
   * missing credentials fail as such (MskIamError) before the client connects; `refresh`: the
   * broker refused the cached one, sign another.
   */
  private async mskIamLogin(refresh: boolean): Promise<MskIamLogin> {
    const tokens = (this.mskIam ??= new MskIamTokens(this.config.kafka.region!));
    if (refresh) tokens.invalidate();
    await tokens.token();
    return { mechanism: 'aws-msk-iam', token: () => tokens.token() };
  }

  /** The Kafka secret's credentials (config/load.ts refused sending them unencrypted off this machine, unless allowed). */
  private async kafkaCredentials(refresh: boolean, deadline?: Deadline): Promise<KafkaCredentials> {
    const kafka = this.config.kafka;
    return kafkaCredentialsFromSecret(kafka.secretId!, await this.secrets.get(kafka.secretId!, refresh, deadline));
  }

  /**
   * The outbox settings for an invocation. A pooler found at connect (database()) also decides
   * how a lingering invocation learns of new rows: LISTEN through a transaction pooler succeeds
   * but hears nothing, so poll.
   */
  private outboxConfig(helper: boolean): Config['outbox'] {
    const o = this.config.outbox;
    const wake = !this.prepare && this.config.database.prepare ? 'poll' : o.wake;
    // a helper of fan-out (src/lambda/fanout.ts) never lingers: it ends at its first claim that finds nothing
    const idle = helper ? 'exit' : o.idle;
    return wake === o.wake && idle === o.idle ? o : { ...o, wake, idle };
  }

  /** One invocation with `remainingMs` before its timeout (the benches', the tests'). */
  invoke(remainingMs: number, logger: Logger = this.logger, options: { helper?: boolean } = {}): Promise<Summary> {
    return this.invokeUntil(Deadline.fromRemaining(remainingMs, 0), logger, options);
  }

  /**
   * One invocation: the loop of docs/DESIGN.md ("The invocation loop"), until the safety margin
   * before `timeout` (the Lambda's). `helper`: started by another invocation's fan-out.
   */
  async invokeUntil(timeout: Deadline, logger: Logger = this.logger, { helper = false } = {}): Promise<Summary> {
    const deadline = timeout.minus(this.config.outbox.safetyMarginMs);
    // a cold start: the Kafka client's module loads while the database connects (a no-op once loaded)
    if (!this.publisherInstance) preloadKafkaClient(this.config.kafka.client);
    const deps = (store: OutboxStore) => ({
      store,
      publisher: this.publisher(),
      config: this.outboxConfig(helper),
      logger,
      pauseAfterPublishMs: this.config.testPauseAfterPublishMs,
    });
    let summary: Summary | undefined;
    let refresh = false;
    let refreshed = false;
    let reconnected = false;
    while (!summary) {
      try {
        summary = await runInvocation(deps(await this.outboxStore(refresh, deadline)), deadline);
      } catch (err) {
        if (!(err instanceof DatabaseError)) throw err;
        // every connection signs a token of its own: reading the secret again would change nothing
        if (this.iam && isAuthError(err.cause)) throw this.explained(err);
        if (!refreshed && isAuthError(err.cause) && this.config.database.secretId) {
          // credentials rotated under us: read the secret again once and retry with the same deadline
          logger.warn('database refused the credentials; refreshing the database secret once', { secretId: this.config.database.secretId });
          refresh = refreshed = true;
          continue;
        }
        const before = (err as { summary?: Summary }).summary;
        // connectionLost: the client's onclose saw it first (the statement before the claim, the
        // waiting marks' probe, met the closed socket), and the claim refused to write to it
        if (!reconnected && (isConnectionLost(err.cause) || this.connectionLost) && before?.batches === 0 && before.published === 0) {
          // The warm client's connections were closed while the container sat idle (failover,
          // pg_terminate_backend, a proxy's idle timeout) and the first statement found out.
          // Nothing was claimed yet: build a new client once instead of failing the invocation.
          logger.warn('a database connection was found closed; reconnecting once', { error: err.message });
          await this.closeDatabase();
          refresh = false;
          reconnected = true;
          continue;
        }
        throw err;
      }
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

  /**
   * The backlog figures for the invocation's metrics (src/lambda/metrics.ts), read with the client the
   * invocation used and never a new one: undefined when there is none, or it is broken (the
   * invocation failed on the database; connecting again could take the rest of the budget).
   * A read that loses the race with `deadline` may still be running, and one whose ROLLBACK was
   * not confirmed ended the client: either way the client is replaced before the next invocation
   * uses it, as after any abandoned statement.
   */
  async backlog(deadline: Deadline): Promise<Backlog | undefined> {
    if (!this.sql || this.store?.poisoned || this.connectionLost) return undefined;
    try {
      return await backlog(this.sql, this.config.outbox.table, deadline);
    } catch (err) {
      if (err instanceof DeadlineExceededError || err instanceof UnconfirmedRollbackError) {
        if (this.store) this.store.abandon();
        else this.connectionLost = true;
      }
      throw err;
    }
  }

  async closeDatabase(): Promise<void> {
    const sql = this.sql;
    this.sql = undefined;
    this.store = undefined;
    this.connectionLost = false;
    if (!sql) return;
    await endClient(sql);
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
