// The database side of a container: one postgres.js client and its store, built on first use and
// reused by warm invocations, replaced when broken (a statement abandoned at the deadline, a
// connection closed under it, credentials refused after a rotation). Decided here, once per
// client: the login's TLS and refusals (transport.ts databaseLogin, for a secret's host known only
// now), RDS IAM tokens, and whether a pooler sits in between (named statements off, LISTEN replaced
// by polling). run() is the invocation's retry: the secret read again once, the client rebuilt once.
import type { Sql } from 'postgres';
import { Deadline } from '../budget.ts';
import type { Config } from '../config/types.ts';
import { ConfigError, DatabaseError, DeadlineExceededError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { Summary } from '../loop/summary.ts';
import { databaseLogin, verifyFull, type DatabaseLogin, type LoginTarget } from '../transport.ts';
import { parseDatabaseUrl } from '../database-url.ts';
import { backlog, UnconfirmedRollbackError, type Backlog } from './admin.ts';
import { CLIENT_OPTIONS, clientFor, endClient, type DatabaseTarget } from './client.ts';
import { isAuthError, isConnectionLost, wrapDbError } from './db-errors.ts';
import type { RdsAuthTokens } from './rds-iam.ts';
import type { OutboxStore } from './store.ts';

export interface ConnectionOptions {
  database: Config['database'];
  allowPlaintextLogin: boolean;
  table: Config['outbox']['table'];
  /** where the database is: DATABASE_URL, or the secret's URL or fields (`refresh`: read it again) */
  target(refresh: boolean, deadline?: Deadline): Promise<DatabaseTarget>;
  /** the store of a new client; `prepare`: named statements, off behind a pooler */
  newStore(sql: Sql, prepare: boolean): OutboxStore;
  /** each warning about a weak setting, once per container */
  warn(warning: string): void;
  logger: Logger;
}

export class DatabaseConnection {
  private sql: Sql | undefined;
  /** a connection of `sql` closed: replace the client before the next invocation uses it */
  private connectionLost = false;
  private store: OutboxStore | undefined;
  /** DATABASE_AUTH=iam: the tokens of the client's login */
  private iam: RdsAuthTokens | undefined;
  /** named prepared statements for this client: DATABASE_PREPARE, off once a pooler was found */
  private prepare: boolean;

  constructor(private readonly o: ConnectionOptions) {
    this.prepare = o.database.prepare;
  }

  /** The client, built when there is none or it is broken; `refresh` re-reads the secret and reconnects. */
  async client(refresh = false, deadline?: Deadline): Promise<Sql> {
    if (this.sql && !refresh && !this.store?.poisoned && !this.connectionLost) return this.sql;
    await this.close();
    const db = this.o.database;
    const target = await this.o.target(refresh, deadline);
    const login = this.judge(target);
    for (const warning of login.warnings) this.o.warn(warning);
    if (login.problems.length > 0) throw new ConfigError(login.problems);
    this.iam = login.iam ? await this.signedTokens(login.iam) : undefined;
    let client = this.connect(target, db.prepare, login);
    this.prepare = db.prepare;
    if (this.prepare && (await this.behindPooler(client, deadline))) {
      await client.end({ timeout: 1 }).catch(() => undefined);
      this.prepare = false;
      client = this.connect(target, false, login);
    }
    this.sql = client;
    this.store = undefined;
    return client;
  }

  /** The target's login by the rule config/load.ts applied to DATABASE_URL; a URL read as the driver reads it. */
  private judge(target: DatabaseTarget): DatabaseLogin {
    const { url, secretId, ssl, auth } = this.o.database;
    const source = url ? 'DATABASE_URL' : `the secret ${JSON.stringify(secretId)}`;
    const login: LoginTarget = 'url' in target ? { url: parseDatabaseUrl(target.url, url ? 'DATABASE_URL' : `the URL of ${source}`) } : target;
    return databaseLogin(login, source, { ssl, auth, allowPlaintext: this.o.allowPlaintextLogin });
  }

  /**
   * One token signed at once, so that missing credentials or region fail here, saying what to
   * check, before any connection. The signer is loaded only for DATABASE_AUTH=iam.
   */
  private async signedTokens(login: NonNullable<DatabaseLogin['iam']>): Promise<RdsAuthTokens> {
    const { RdsAuthTokens } = await import('./rds-iam.ts');
    const tokens = new RdsAuthTokens(login);
    await tokens.sign();
    return tokens;
  }

  /**
   * A transaction pooler (PgBouncer < 1.21, RDS Proxy) hands each transaction whichever server
   * connection is free, and named prepared statements stay behind on the one that prepared them:
   * postgres.js then fails, or re-sends statements out of order within a transaction
   * (docs/configuration.md, DATABASE_PREPARE). Seen by the backend pid: the one the client was
   * given at startup (BackendKeyData) is the server's own unless something else answered the
   * startup (PgBouncer gives a random key). One round trip per client.
   */
  private async behindPooler(client: Sql, deadline?: Deadline): Promise<boolean> {
    const probe = client<{ pid: number }[]>`SELECT pg_backend_pid() AS pid`;
    // never unbounded, even for a caller without a deadline (the CLI's migrate and parked)
    const bound = deadline ?? new Deadline(Date.now() + 2 * this.o.database.connectTimeoutMs);
    const rows = await bound.race('probing the database connection', probe, () => probe.cancel()).catch(async (err: unknown) => {
      await client.end({ timeout: 1 }).catch(() => undefined);
      if (err instanceof DeadlineExceededError) {
        throw new DatabaseError(`the database did not answer in time: ${err.message}; check the database and the network path to it (a pooler or proxy in between?)`, { cause: err });
      }
      throw this.explained(wrapDbError(err, 'connecting to the database'));
    });
    const seen = { backendPidSeenByClient: rows.state.pid, backendPidOnServer: rows[0]!.pid };
    if (seen.backendPidSeenByClient === seen.backendPidOnServer) return false;
    this.o.logger.warn('the database connection goes through a connection pooler or proxy; named prepared statements are turned off for it (set DATABASE_PREPARE=false to skip this check)', seen);
    return true;
  }

  private connect(target: DatabaseTarget, prepare: boolean, login: DatabaseLogin): Sql {
    const db = this.o.database;
    const { tls } = login;
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
      // Writing again to a closed connection through a reserved handle would crash the process
      // (postgres.js 3.4.9, porsager/postgres#1208), so the open transactions write nothing more
      // (OutboxStore.loseConnection) and the next invocation builds a new client.
      onclose: () => {
        if (this.sql !== client) return;
        this.connectionLost = true;
        this.store?.loseConnection();
      },
      connection: { application_name: db.applicationName },
      // undefined: the URL's own sslmode; verify-full checks the names the driver connects to
      ...(tls.mode === 'verify-full' ? { ssl: verifyFull(login.names) } : tls.ssl === undefined ? {} : { ssl: tls.ssl }),
      // DATABASE_AUTH=iam: a token signed for each connection when the server asks for it
      ...(this.iam ? { password: this.iam.password } : {}),
      onnotice: () => undefined,
    });
    return client;
  }

  async outboxStore(refresh = false, deadline?: Deadline): Promise<OutboxStore> {
    const sql = await this.client(refresh, deadline);
    this.store ??= this.o.newStore(sql, this.prepare);
    return this.store;
  }

  /** How a lingering invocation learns of new rows: LISTEN through a transaction pooler succeeds but hears nothing, so poll. */
  wake<W extends string>(configured: W): W | 'poll' {
    return !this.prepare && this.o.database.prepare ? 'poll' : configured;
  }

  /** A login the database refused under DATABASE_AUTH=iam, said as such (what to check); any other error as it is. */
  private explained(err: Error): Error {
    if (this.iam && err instanceof DatabaseError && isAuthError(err.cause)) return this.iam.refused(err.cause);
    return err;
  }

  /**
   * `work` on the store, retried at most twice within the same deadline: credentials refused are
   * the secret rotated under us (read it again, once); a connection found closed before anything
   * was claimed is a warm client's connection closed while the container sat idle (failover,
   * pg_terminate_backend, a proxy's idle timeout): build a new client, once.
   */
  async run(deadline: Deadline, logger: Logger, work: (store: OutboxStore) => Promise<Summary>): Promise<Summary> {
    let refresh = false;
    let refreshed = false;
    let reconnected = false;
    for (;;) {
      try {
        return await work(await this.outboxStore(refresh, deadline));
      } catch (err) {
        if (!(err instanceof DatabaseError)) throw err;
        // every connection signs a token of its own: reading the secret again would change nothing
        if (this.iam && isAuthError(err.cause)) throw this.explained(err);
        const secretId = this.o.database.secretId;
        if (!refreshed && isAuthError(err.cause) && secretId) {
          logger.warn('database refused the credentials; refreshing the database secret once', { secretId });
          refresh = refreshed = true;
          continue;
        }
        const before = (err as { summary?: Summary }).summary;
        // connectionLost: onclose saw it first, and the claim refused to write to the closed connection
        if (!reconnected && (isConnectionLost(err.cause) || this.connectionLost) && before?.batches === 0 && before.published === 0) {
          logger.warn('a database connection was found closed; reconnecting once', { error: err.message });
          await this.close();
          refresh = false;
          reconnected = true;
          continue;
        }
        throw err;
      }
    }
  }

  /**
   * The backlog figures after an invocation, with its client and never a new one: undefined when
   * there is none or it is broken (connecting again could take the rest of the budget). A read
   * that lost its race may still be running, and one whose ROLLBACK was not confirmed ended the
   * client: either way the client is replaced before the next invocation uses it.
   */
  async backlog(deadline: Deadline): Promise<Backlog | undefined> {
    if (!this.sql || this.store?.poisoned || this.connectionLost) return undefined;
    try {
      return await backlog(this.sql, this.o.table, deadline);
    } catch (err) {
      if (err instanceof DeadlineExceededError || err instanceof UnconfirmedRollbackError) {
        if (this.store) this.store.abandon();
        else this.connectionLost = true;
      }
      throw err;
    }
  }

  async close(): Promise<void> {
    const sql = this.sql;
    this.sql = undefined;
    this.store = undefined;
    this.connectionLost = false;
    if (sql) await endClient(sql);
  }
}
