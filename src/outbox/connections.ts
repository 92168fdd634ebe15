// The store's postgres.js client while in use: reserving a connection, bounding each statement by
// the deadline, and giving the client up when it can no longer be trusted to end its transactions.
// The postgres.js 3.4.9 defects worked around here: docs/DESIGN.md, "The store and postgres.js".
import type { Deadline } from '../budget.ts';
import { DatabaseError, DeadlineExceededError } from '../errors.ts';
import { endClient, openConnections } from './client.ts';
import { connectionClosed, wrapDbError } from './db-errors.ts';
import type { PendingQuery, ReservedSql, Row, Sql } from 'postgres';

export class Connections {
  /** set when a statement was abandoned mid-flight, or a connection closed: the client must be replaced */
  poisoned = false;
  /** set (with `poisoned`) when one of the client's connections closed under us: nothing more is written */
  connectionLost = false;
  /** a statement lost its race with the deadline (bounded): what the batch's later statements report */
  missedDeadline = false;
  /** rejecters of the reserve() waits in flight, which a connection closing fails (see reserve) */
  private readonly reserveWaits = new Set<(err: Error) => void>();
  /** set by abandon(): the client's end, under way */
  private ended: Promise<void> | undefined;

  constructor(readonly sql: Sql) {}

  /**
   * A connection of the client's own for a transaction. A connection closing fails the wait at once
   * (porsager/postgres#1195 would strand it until the deadline); a client known bad is not asked.
   */
  async reserve(deadline: Deadline): Promise<ReservedSql> {
    const what = 'reserving a database connection';
    const why = this.connectionLost
      ? 'a connection of the database client had closed'
      : 'the database client was abandoned';
    const refused = () => wrapDbError(connectionClosed(why), what);
    if (this.poisoned) throw refused();
    let fail!: (err: Error) => void;
    const lost = new Promise<never>((_, reject) => {
      fail = reject;
    });
    lost.catch(() => undefined);
    this.reserveWaits.add(fail);
    let reserving: Promise<ReservedSql> | undefined;
    try {
      await this.bounded(deadline, 'opening the database connections', Promise.race([openConnections(this.sql), lost]));
      if (this.poisoned) throw refused();
      reserving = this.sql.reserve();
      return await this.bounded(deadline, what, Promise.race([reserving, lost]));
    } catch (err) {
      // A reservation that arrives after the wait failed (the client is abandoned by then) would
      // hold its connection open for good, past the client's end(): back to the pool, and closed.
      reserving?.then(
        (conn) => {
          conn.release();
          this.abandon();
        },
        () => undefined,
      );
      throw err;
    } finally {
      this.reserveWaits.delete(fail);
    }
  }

  /** One of the client's connections closed under us: no transaction writes more, waits for one end now. */
  loseConnection(): void {
    // after our own abandon (a missed deadline, an unanswered rollback) a close is the end we asked
    // for: the first cause stays the one the invocation reports
    if (!this.poisoned) this.connectionLost = true;
    this.abandon();
    const closed = connectionClosed('a connection of the database client closed while this waited for a free one');
    for (const fail of this.reserveWaits) fail(closed);
    this.reserveWaits.clear();
  }

  /**
   * The client can no longer be trusted to end its transactions: end it, so the server rolls back
   * what is open (docs/DESIGN.md, "A transaction is ended by the server"; end(), not destroy: why there).
   */
  abandon(): void {
    this.poisoned = true;
    this.ended ??= endClient(this.sql);
  }

  /** Why nothing more may run on this client, as the error `what` reports (the first cause met); else undefined. */
  unusable(what: string): Error | undefined {
    if (!this.poisoned) return undefined;
    if (this.connectionLost) {
      return new DatabaseError(
        'a database connection closed during the invocation (terminated by the server, failover or network) ' +
          `before ${what}; the rows it held stay pending`,
      );
    }
    if (this.missedDeadline) return new DeadlineExceededError(what);
    return new DatabaseError(
      'the database client was abandoned (a rollback or commit was not answered in time) ' +
        `before ${what}; the rows it held stay pending`,
    );
  }

  /** The store's own transactions (retention, the waiting marks) never run on a client known bad. */
  assertUsable(what: string): void {
    const unusable = this.unusable(what);
    if (unusable) throw unusable;
  }

  /**
   * Race a statement against the deadline; if it loses, cancel it server-side (a closed connection
   * alone does not stop a running statement) and abandon the client: its connection is still busy.
   */
  async bounded<T>(deadline: Deadline, what: string, query: Promise<T> | PendingQuery<Row[]>): Promise<T> {
    try {
      return await deadline.race(what, query as Promise<T>, () => {
        const cancel = (query as { cancel?: () => void }).cancel;
        if (typeof cancel === 'function') cancel.call(query);
        this.missedDeadline = true;
        this.abandon();
      });
    } catch (err) {
      throw wrapDbError(err, what);
    }
  }
}
