// Postgres side of the loop. One transaction per batch on a reserved connection (BEGIN/COMMIT
// by hand, because the loop keeps the next batch's transaction open while the current one is
// being published). Every statement is bounded twice: server-side by statement_timeout and
// client-side by the deadline race, and the transaction itself by
// idle_in_transaction_session_timeout so it cannot outlive a frozen or killed invocation (G7).
import type { ParkedPolicy } from '../domain.ts';
import { BUDGET, type Deadline } from '../budget.ts';
import { DatabaseError, DeadlineExceededError } from '../errors.ts';
import { socketsFlushed } from '../event-loop.ts';
import type { BatchTransaction, ClaimFilter, ClaimedRow, InsertWatch, NothingClaimable, PruneTarget, Store } from '../loop/ports.ts';
import type { Failure } from '../loop/settlement.ts';
import { endClient, openConnections } from './client.ts';
import { assertSchema, type SchemaFacts } from './schema-check.ts';
import * as q from './sql.ts';
import { notifyChannel, qualified, quoteIdent, sentTable, type TableName } from './identifier.ts';
import postgres, { type PendingQuery, type ReservedSql, type Row, type Sql } from 'postgres';

export type { ClaimedRow, Failure };

/** rows marked waiting per transaction by markWaiting: a long backlog is marked in short transactions */
const MARK_WAITING_CHUNK = 10_000;

/** What happens to an acked row: OUTBOX_SENT_ROWS. */
export type SentRowsMode = 'keep' | 'delete';

export interface StoreOptions {
  /** named prepared statements (DATABASE_PREPARE) */
  prepare?: boolean;
  sentRows?: SentRowsMode;
  /** the claim's bounds in bytes (src/outbox/sql.ts ClaimBytes); OUTBOX_MAX_BATCH_BYTES and the largest payload read with the claim */
  claimBytes?: Partial<q.ClaimBytes>;
}

/**
 * The claim's bounds when not given: the configuration's defaults (src/config.ts). A payload over
 * the broker's default message.max.bytes (1 MiB) is read by a second statement once its topic's
 * limit is known to allow it (OUTBOX_MAX_MESSAGE_BYTES, when set, replaces this).
 */
export const DEFAULT_CLAIM_BYTES: q.ClaimBytes = { batch: 64 * 1024 * 1024, payload: 1_048_576 };

/**
 * The planner settings of every batch transaction, set for that transaction only (OutboxStore
 * .begin; a test plans the claim under them).
 * - plan_cache_mode: the claim is planned for its actual parameters every time. A generic plan
 *   (what Postgres switches a prepared statement to after five runs when it looks no dearer) does
 *   not know the LIMIT: with rows waiting in the table it chose a sequential scan and a sort, 80
 *   times slower, trying the aggregate lock of every pending row on the way.
 * - enable_sort off: the claim must walk the claim index in seq order and stop after its LIMIT.
 *   When the outbox holds little but pending rows (sent rows move out, or are deleted), every row
 *   matches the claim's predicate, and the planner prices that ordered walk as a read of the whole
 *   heap. After the first autovacuum of a table under full load (80,000 pages, 1,500 rows in
 *   them) it read every pending row through the aggregate index and sorted them, every claim: the
 *   relay moved 14 % fewer events/s (bench: --only sustained --sent-rows). The setting only prices
 *   sorts out of the plan where another path exists: the batch's other statements read through
 *   indexes or in no order, and a statement with no other way still sorts.
 * - enable_incremental_sort off: the same for a sort of rows that arrive sorted by a prefix of
 *   the key. The claim orders by both keys of the claim index (seq, next_attempt_at), so the walk
 *   of the seq_key index, which Postgres prices the same or lower on such an outbox (a two-column
 *   index is priced as less correlated with the heap), would need one. That
 *   walk reads waiting rows and tests every backing-off row on the heap.
 * - jit off: a sort the claim cannot do without (the byte cut's window over at most a batch of
 *   (seq, size) pairs) is priced at enable_sort's penalty, 10^10, and a plan that dear is
 *   JIT-compiled: 110 functions, 1-2 s of every claim instead of a few ms (measured). The batch's
 *   statements are short; none gains from JIT.
 */
export const BATCH_PLANNER_SETTINGS: ReadonlyArray<readonly [string, string]> = [
  ['plan_cache_mode', 'force_custom_plan'],
  ['enable_sort', 'off'],
  ['enable_incremental_sort', 'off'],
  ['jit', 'off'],
];

/** the batch transaction's timeouts ($1-$3) and planner settings, local to it (true) */
const BATCH_SETTINGS_SQL = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true), set_config('idle_in_transaction_session_timeout', $3, true), ${BATCH_PLANNER_SETTINGS.map((_, i) => `set_config($${4 + 2 * i}, $${5 + 2 * i}, true)`).join(', ')}`;

/** a chore's timeouts (OutboxStore.chore): statement, lock, idle in transaction */
const CHORE_SETTINGS_SQL = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true), set_config('idle_in_transaction_session_timeout', $3, true)`;

export class OutboxStore implements Store {
  readonly table: string;
  private readonly policy: ParkedPolicy;
  readonly markText: string;
  private readonly whyEmptyText: string;
  /** where `keep` moves sent rows (the sent table) */
  readonly sentTable: string;
  private readonly sentRows: SentRowsMode;
  private readonly claimBytes: q.ClaimBytes;
  readonly payloadsText: string;
  /** checkTables() found the sent table writable (once per client) */
  private tablesChecked = false;
  private readonly pruneText: Record<PruneTarget, string>;
  readonly markWaitingText: string;
  readonly unwaitText: string;
  private readonly waitingWorkText: string;
  private readonly newestText: string;
  /** the insert trigger's channel for this table's inserts */
  readonly channel: string;
  /** named prepared statements for the per-batch queries, unless DATABASE_PREPARE=false (PgBouncer, RDS Proxy) */
  readonly prepared: { prepare: boolean };
  /** set when a statement was abandoned mid-flight: the client must be replaced */
  poisoned = false;
  /**
   * Set (with `poisoned`) when one of the client's connections closed under us (backend
   * terminated, failover, network). postgres.js 3.4.9 throws an uncatchable TypeError from
   * nextWrite (porsager/postgres#1208), killing the process, when a statement is written to a
   * reserved connection whose socket closed while it sat idle in our transaction; which of our
   * connections closed is not exposed, so no open transaction writes anything more.
   */
  connectionLost = false;
  /** rejecters of the reserve() waits in flight, which a connection closing fails (see reserve) */
  private readonly reserveWaits = new Set<(err: Error) => void>();

  constructor(
    readonly sql: Sql,
    table: TableName,
    policy: ParkedPolicy,
    { prepare = true, sentRows = 'keep', claimBytes = {} }: StoreOptions = {},
  ) {
    this.prepared = { prepare };
    this.claimBytes = { ...DEFAULT_CLAIM_BYTES, ...claimBytes };
    this.table = qualified(table);
    this.policy = policy;
    this.sentTable = qualified(sentTable(table));
    this.sentRows = sentRows;
    this.markText = sentRows === 'delete' ? q.deleteSentSql(this.table) : q.moveSentSql(this.table, this.sentTable);
    this.whyEmptyText = q.whyEmptySql(this.table, policy);
    this.pruneText = { sent: q.pruneSql(this.table, this.sentTable, 'sent'), 'legacy-sent': q.pruneSql(this.table, this.sentTable, 'legacy-sent'), skipped: q.pruneSql(this.table, this.sentTable, 'skipped') };
    this.newestText = q.newestPendingSql(this.table);
    this.payloadsText = q.payloadsSql(this.table);
    this.markWaitingText = q.markWaitingSql(this.table, policy);
    this.unwaitText = q.unwaitSql(this.table, policy);
    this.waitingWorkText = q.waitingWorkSql(this.table, policy);
    this.channel = notifyChannel(table);
  }

  /** The claim for `filter` (its shape: src/outbox/sql.ts claimStatement). */
  claimStatement(limit: number, filter: ClaimFilter): q.Statement {
    return q.claimStatement(this.table, this.policy, limit, filter, this.table, this.claimBytes);
  }

  /**
   * Reserve a connection and open the batch transaction. BEGIN and the timeouts are sent without
   * waiting for their answers: the claim follows them down the same connection (postgres.js
   * pipelines), so a claim costs one round trip, not three. That matters because the claim runs
   * while the previous batch is being encoded for Kafka on the same event loop.
   *
   * `after`: a batch whose COMMIT has just been sent (commitIfAllPremarked). The new transaction takes
   * over its connection, so the database runs this BEGIN and claim only after that COMMIT: the
   * claim's snapshot sees the previous batch as sent and its aggregates as free. On a connection
   * of its own, the claim would race the COMMIT, skip the rows of the aggregates still locked by
   * it, take their later rows once the COMMIT landed, and then have to hold them all back.
   */
  async begin(deadline: Deadline, after?: BatchTransaction): Promise<BatchTx> {
    const handed = after instanceof BatchTx ? after.handOver() : undefined;
    const conn = handed ?? (await this.reserve(deadline));
    const stmtMs = String(Math.max(1, deadline.remaining()));
    // the transaction may sit idle while the batch is on its way to Kafka; never past the deadline
    const idleMs = String(Math.max(1, deadline.remaining() + BUDGET.idleInTransactionPastDeadlineMs));
    return this.open(conn, deadline, BATCH_SETTINGS_SQL, [stmtMs, stmtMs, idleMs, ...BATCH_PLANNER_SETTINGS.flat()]);
  }

  /** BEGIN and the transaction's settings, in flight ahead of its first statement. */
  private open(conn: ReservedSql, deadline: Deadline, settingsSql: string, settings: string[]): BatchTx {
    const tx = new BatchTx(this, conn, deadline);
    tx.opened = Promise.all([tx.run('BEGIN', conn`BEGIN`), tx.run('setting timeouts', conn.unsafe(settingsSql, settings, this.prepared))]).then(() => undefined);
    // awaited by the first statement that needs the transaction; never an unhandled rejection
    tx.opened.catch(() => undefined);
    return tx;
  }

  /**
   * A short transaction of the relay's own chores beside the loop (a retention chunk, a waiting-mark
   * pass), on a connection of its own and ended as a batch's is (BatchTx): a statement never goes
   * out on a client known bad, and a connection whose end the server did not confirm is never
   * released, the client is ended instead. Not postgres.js' sql.begin: after a failure it sends its
   * ROLLBACK whatever the connection's state, and on a closed one that write crashes the process
   * (3.4.9, porsager/postgres#1208: an uncaught TypeError in nextWrite).
   */
  private async chore<T>(deadline: Deadline, what: string, lockTimeoutMs: number, work: (tx: BatchTx) => Promise<T>): Promise<T> {
    this.assertUsable(what);
    const stmtMs = String(Math.max(1, deadline.remaining()));
    const idleMs = String(Math.max(1, deadline.remaining() + BUDGET.idleInTransactionPastDeadlineMs));
    const tx = this.open(await this.reserve(deadline), deadline, CHORE_SETTINGS_SQL, [stmtMs, String(lockTimeoutMs), idleMs]);
    try {
      const result = await work(tx);
      await tx.commit(what);
      return result;
    } catch (err) {
      await tx.rollback();
      throw err;
    }
  }

  /**
   * A connection of the client's own for a batch transaction. postgres.js 3.4.9 strands a
   * reserve() that waits for a free connection when one of the client's connections closes
   * (porsager/postgres#1195: the closing connection reconnects with the wait as its first query and
   * drops it), so the wait would last until the deadline and leave the invocation no time to
   * reconnect. The client is replaced after any close anyway (connectionLost), so a close fails the
   * wait at once (loseConnection), and a client already known to have lost one is not asked at all.
   * A reservation that arrives after the wait failed is left to the client's end().
   */
  private async reserve(deadline: Deadline): Promise<ReservedSql> {
    const what = 'reserving a database connection';
    const refused = () => wrapDbError(connectionClosed(this.connectionLost ? 'a connection of the database client had closed' : 'the database client was abandoned'), what);
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

  /**
   * One of the client's connections closed under us (backend terminated, failover, network): no
   * open transaction writes anything more, the client is replaced before the next invocation uses
   * it, and the waits for a connection end now (see reserve).
   */
  loseConnection(): void {
    this.connectionLost = true;
    this.abandon();
    for (const fail of this.reserveWaits) fail(connectionClosed('a connection of the database client closed while this waited for a free one'));
    this.reserveWaits.clear();
  }

  /**
   * The client can no longer be trusted to end its transactions: close every connection, so the
   * server rolls back whatever is open on them (docs/DESIGN.md, "A transaction is ended by the
   * server"). postgres.js pools a released connection as it is, open transaction included, and the
   * next `sql.begin` on the pool (retention, the waiting marks) would COMMIT what was left in it:
   * a batch's premarks, acked and un-acked rows alike. So a connection whose ROLLBACK could not be
   * sent or confirmed is never released; the whole client goes (the Runtime replaces a poisoned
   * client before the next invocation anyway). A COMMIT already written still reaches the server;
   * its answer, if not read yet, fails as a lost connection and its rows are sent again (G2).
   */
  abandon(): void {
    this.poisoned = true;
    // end(), not destroy: a second for the connections to finish what they were sending, then
    // every one is closed (an open transaction's within that second: it never answers again).
    // Immediately would be worse: postgres.js reconnects a closed connection that had a wait
    // queued (porsager/postgres#1195), and a connection destroyed while its reconnect is pending
    // comes back after the end, open for good; one that reconnects within the second sees the end
    // and closes itself.
    this.ended ??= endClient(this.sql);
  }

  /**
   * Why nothing more may run on this client, as the error `what` reports: undefined while it may.
   * The cause the invocation fails with is the first one met (a closed connection, a statement
   * past the deadline), not the refusals that follow it.
   */
  unusable(what: string): Error | undefined {
    if (!this.poisoned) return undefined;
    if (this.connectionLost) return new DatabaseError(`a database connection closed during the invocation (terminated by the server, failover or network) before ${what}; the rows it held stay pending`);
    if (this.missedDeadline) return new DeadlineExceededError(what);
    return new DatabaseError(`the database client was abandoned (a rollback or commit was not answered in time) before ${what}; the rows it held stay pending`);
  }

  /** The pool's own transactions (retention, the waiting marks) never run on a client known bad. */
  private assertUsable(what: string): void {
    const unusable = this.unusable(what);
    if (unusable) throw unusable;
  }

  /** a statement lost its race with the deadline (bounded): what the batch's later statements report */
  missedDeadline = false;

  /** set by abandon(): the client's end, under way */
  private ended: Promise<void> | undefined;

  /** After an empty claim: are rows there for others to take, only waiting behind failed rows, or none at all? */
  async nothingClaimable(deadline: Deadline): Promise<NothingClaimable> {
    const [r] = await this.bounded(deadline, 'checking why nothing was claimable', this.sql.unsafe<{ claimable: boolean; pending: boolean }[]>(this.whyEmptyText));
    return r?.claimable ? 'locked' : r?.pending ? 'behind-failed-rows' : 'empty';
  }

  /**
   * A relay upgraded without `migrate`, or whose role lacks a grant its statements need, would
   * publish a batch, fail to mark it, and publish the same batch again on every invocation. So,
   * once per client, before the first claim, one statement: the outbox has every migration this
   * version ships, and the role has the privileges the OUTBOX_SENT_ROWS mode needs (the sent
   * table in keep mode); otherwise the invocation fails saying what to run or GRANT
   * (src/outbox/schema-check.ts).
   */
  async checkTables(deadline: Deadline): Promise<void> {
    if (this.tablesChecked) return;
    const [facts] = await this.bounded(deadline, "checking the schema and the role's privileges", this.sql.unsafe<SchemaFacts[]>(q.schemaCheckSql(), [this.table, this.sentTable]));
    assertSchema(facts, { table: this.table, sentTable: this.sentTable, sentRows: this.sentRows });
    this.tablesChecked = true;
  }

  /**
   * One retention chunk: deletes up to `limit` rows sent (or skipped) more than `retainMs` ago,
   * oldest first, from one of the places that hold them (PruneTarget), in a transaction of its own
   * whose statement_timeout ends with the deadline. Returns how many it deleted; fewer than `limit`
   * means nothing older is left there.
   */
  async pruneChunk(what: PruneTarget, retainMs: number, limit: number, deadline: Deadline): Promise<number> {
    const doing = `pruning ${what === 'skipped' ? 'skipped' : 'sent'} rows`;
    // lock_timeout as long as the statement's: a sent row nothing else locks
    return this.chore(deadline, doing, Math.max(1, deadline.remaining()), async (tx) => (await tx.query(doing, this.pruneText[what], [retainMs, limit])).count);
  }

  /**
   * Once per invocation, before its first claim: clear the waiting marks nothing justifies any
   * more (behind a row that no longer blocks: parked under hold before a switch to skip, or due
   * again), so the claim sees those rows at once (a claim running beside the clearing took its
   * row locks for an application's and held the rows back).
   * Normally a single probe and no transaction: no row waits. `blocked`: some aggregate is
   * blocked, so markWaiting() has work.
   */
  async clearStaleWaiting(deadline: Deadline): Promise<{ cleared: number; blocked: boolean }> {
    const [work] = await this.bounded(deadline, 'looking for waiting marks to tidy', this.sql.unsafe<{ waiting: boolean; blocked: boolean }[]>(this.waitingWorkText, [], this.prepared));
    if (!work?.waiting) return { cleared: 0, blocked: work?.blocked ?? false };
    const cleared = await this.tidyChunk(deadline, async (tx) => (await tx.query('clearing stale waiting marks', this.unwaitText, [null])).count);
    return { cleared, blocked: work.blocked };
  }

  /**
   * Alongside the loop, when an aggregate is blocked: mark the rows written behind its blocking
   * row since the last pass, in transactions of MARK_WAITING_CHUNK rows.
   */
  async markWaiting(deadline: Deadline): Promise<number> {
    let marked = 0;
    for (;;) {
      const n = await this.tidyChunk(deadline, async (tx) => (await tx.query('marking waiting rows', this.markWaitingText, [null, MARK_WAITING_CHUNK])).count);
      marked += n;
      if (n < MARK_WAITING_CHUNK) return marked;
    }
  }

  private tidyChunk<T>(deadline: Deadline, work: (tx: BatchTx) => Promise<T>): Promise<T> {
    // lock_timeout: a row an application holds is not worth waiting for (SKIP LOCKED covers most)
    return this.chore(deadline, 'tidying the waiting marks', 1_000, work);
  }

  async newestPending(deadline: Deadline): Promise<string | null> {
    const [row] = await this.bounded(deadline, 'probing for new rows', this.sql.unsafe<{ newest: string | null }[]>(this.newestText, [], this.prepared));
    return row?.newest ?? null;
  }

  /**
   * A client of its own, one connection, for the length of one linger: LISTEN there, UNLISTEN by
   * closing it. Never kept across invocations: a container frozen between invocations would leave
   * a listening backend that stops reading, and Postgres cannot truncate its notification queue
   * past a listener that does not read; once that queue is full, producers' commits fail.
   */
  async watchInserts(deadline: Deadline, on: { insert(): void; lost(err: unknown): void }): Promise<InsertWatch> {
    let closing = false;
    const listener = postgres({
      // the main client's parsed options (postgres.js' own listen() does the same)
      ...this.sql.options,
      max: 1,
      idle_timeout: null,
      max_lifetime: null,
      fetch_types: false,
      onnotify: (channel: string) => {
        if (channel === this.channel) on.insert();
      },
      onclose: () => {
        if (!closing) on.lost(new Error('the LISTEN connection closed'));
      },
    } as unknown as postgres.Options<Record<string, never>>);
    const close = async () => {
      closing = true;
      await listener.end({ timeout: 1 }).catch(() => undefined);
    };
    try {
      // not bounded(): losing this race says nothing about the main client's connections
      await deadline.race('listening for new rows (LISTEN)', listener.unsafe(`LISTEN ${quoteIdent(this.channel)}`));
    } catch (err) {
      await close();
      throw wrapDbError(err, 'listening for new rows (LISTEN)');
    }
    return { close };
  }

  /**
   * Race a statement against the deadline; if it loses, cancel it server-side (a closed connection
   * alone does not stop a running statement) and abandon the client: its connection is still busy
   * with the statement, inside a transaction or not, and nothing tells when it will be free.
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

/**
 * open: BEGIN sent, statements may follow. committing: COMMIT written, answer pending (the
 * connection may be handed to the next batch's transaction meanwhile). ended: committed, rolled
 * back or failed; the connection was released, unless it was handed over.
 */
type TxState = 'open' | 'committing' | 'ended';

export class BatchTx implements BatchTransaction {
  private state: TxState = 'open';
  /** who uses the connection: this transaction, or the next batch's (begin's `after`), once */
  private connectionUser: 'this' | 'next' = 'this';
  /** the rows premark() marked behind the savepoint, and whether those statements succeeded */
  private premarked?: { seqs: Set<string>; written: Promise<boolean> };
  /** the claimed rows' aggregates, and whether each had failed before (sending it may free its aggregate) */
  private readonly claimed = new Map<string, { aggregateid: string; retried: boolean }>();
  /** BEGIN and the timeouts, in flight ahead of the first statement (see OutboxStore.begin) */
  opened: Promise<void> = Promise.resolve();
  constructor(
    private readonly store: OutboxStore,
    private readonly conn: ReservedSql,
    private readonly deadline: Deadline,
  ) {}

  run<T>(what: string, query: Promise<T> | PendingQuery<Row[]>): Promise<T> {
    // A PendingQuery is sent only when awaited: rejecting here means it never reaches the socket.
    // On a client abandoned (ended) a reserved connection's statement would never be answered.
    const unusable = this.store.unusable(what);
    if (unusable) return Promise.reject(unusable);
    return this.store.bounded(this.deadline, what, query);
  }

  /**
   * `filter.aggregates`: aggregates this invocation already found stuck behind someone else's row.
   * `filter.inFlight`: the rows of this invocation's batch being published, whose transaction must
   * stay open until this claim has returned (src/outbox/sql.ts, anyGapPossible).
   * `filter.topics`: topics not to claim rows for, with the template that routes rows (firstRowsForTopics).
   */
  async claim(limit: number, filter: ClaimFilter = { aggregates: [], inFlight: [], topics: [], topicTemplate: '' }): Promise<ClaimedRow[]> {
    const { text, params } = this.store.claimStatement(limit, filter);
    const claimed = this.run('claiming a batch', this.conn.unsafe<ClaimedRow[]>(text, params as never[], this.store.prepared));
    claimed.catch(() => undefined);
    // if BEGIN failed, so did the claim behind it: the connection is the same
    await this.opened;
    const rows = await claimed;
    // seq order is the publishing order within an aggregate (G4); the claim leaves it to us
    rows.sort(bySeq);
    for (const r of rows) this.claimed.set(r.seq, { aggregateid: r.aggregateid, retried: r.attempts > 0 });
    const waiting = rows.filter((r) => !r.publishable);
    if (waiting.length === 0) return rows;
    const gaps = [...new Set(waiting.map((r) => r.first_gap!))];
    const held = await this.run('checking held-back rows', this.conn.unsafe<{ seq: string; why: 'locked' | 'waiting' | 'parked' | 'not-due' | null }[]>(q.heldGapsSql(this.store.table), [gaps]));
    const why = new Map(held.map((g) => [g.seq, g.why]));
    for (const r of waiting) {
      const because = why.get(r.first_gap!);
      // a gap row that cannot be claimed now: its aggregate is left out (heldGapsSql)
      r.waitsOnForeignLock = because != null;
      r.waitsOnStaleMark = because === 'waiting';
    }
    return rows;
  }

  /**
   * The payloads the claim left out (ClaimBytes.payload) of `rows`, whose topics take messages that
   * large, filled in: rows of this transaction's claim, locked by it.
   */
  async readPayloads(rows: ClaimedRow[]): Promise<void> {
    if (rows.length === 0) return;
    const read = await this.run('reading large payloads', this.conn.unsafe<{ seq: string; payload: string | null }[]>(this.store.payloadsText, [rows.map((r) => r.seq)], this.store.prepared));
    const bySeq = new Map(read.map((r) => [r.seq, r.payload]));
    for (const r of rows) r.payload = bySeq.get(r.seq) ?? null;
  }

  /**
   * Write the marks of the rows about to be sent while they are on their way to the broker, behind
   * a savepoint and uncommitted: the UPDATE's work (a new row version and its index entries per
   * row) then overlaps the send instead of following the ack, and settle() has only to COMMIT.
   * Nothing is visible to anyone before that COMMIT, which is sent only after the acks (G1); a
   * crash rolls the marks back with the transaction. If not every row is acked, markAndCommit()
   * returns to the savepoint and marks exactly the acked ones.
   */
  premark(seqs: string[]): void {
    if (seqs.length === 0 || this.store.poisoned) return;
    const seqSet = new Set(seqs);
    const statements = [this.run('opening the premark savepoint', this.conn`SAVEPOINT premark`), this.run('marking rows sent', this.conn.unsafe(this.store.markText, [seqs], this.store.prepared))];
    // a row that had failed, once sent, may free the rows waiting behind it (the waiting marks)
    const freed = this.aggregatesOf(seqs, true);
    if (freed.length) statements.push(this.run('clearing waiting marks', this.conn.unsafe(this.store.unwaitText, [freed], this.store.prepared)));
    // settled here so a failure is never unhandled; the commit methods look at the outcome
    const written = Promise.all([this.opened, ...statements]).then(
      () => true,
      () => false,
    );
    this.premarked = { seqs: seqSet, written };
  }

  /**
   * The usual ending of a batch: every premarked row was acked and nothing failed, so only COMMIT
   * is left. Resolves once the COMMIT has been written to the socket (not answered), with a
   * promise of its answer; resolves undefined when the batch needs markAndCommit() instead.
   */
  async commitIfAllPremarked(sent: string[], failures: Failure[]): Promise<{ answer: Promise<void> } | undefined> {
    const pre = this.premarked;
    if (!pre || failures.length > 0 || sent.length !== pre.seqs.size || !sent.every((s) => pre.seqs.has(s))) return undefined;
    if (!(await pre.written)) return undefined;
    this.premarked = undefined;
    const answer = this.endWith(this.run('committing the batch', this.conn`COMMIT`));
    answer.catch(() => undefined);
    this.state = 'committing';
    await socketsFlushed();
    return { answer };
  }

  /** One statement of the transaction, after its BEGIN (a chore's: OutboxStore.chore). */
  async query<T extends Row[]>(what: string, text: string, params: Array<string | number | null>): Promise<postgres.RowList<T>> {
    await this.opened;
    return this.run(what, this.conn.unsafe<T>(text, params, this.store.prepared));
  }

  /** COMMIT and wait for its answer (a chore's end: OutboxStore.chore). */
  commit(what: string): Promise<void> {
    return this.endWith(this.run(what, this.conn`COMMIT`));
  }

  /** The transaction ends with its COMMIT's answer. */
  private endWith(commit: Promise<unknown>): Promise<void> {
    return commit.then(
      () => this.end(),
      (err: unknown) => {
        // an answered COMMIT has ended the transaction on the server, failed or not; an unanswered
        // one may not have (a lost race with the deadline, a closed connection): see endUnconfirmed
        if (this.store.poisoned) this.endUnconfirmed();
        else this.end();
        throw err;
      },
    );
  }

  /** The connection, for the next batch's transaction, while this one's COMMIT is on the wire; once. */
  handOver(): ReservedSql | undefined {
    if (this.state !== 'committing' || this.connectionUser !== 'this' || this.store.poisoned) return undefined;
    this.connectionUser = 'next';
    return this.conn;
  }

  /** The server ended the transaction (answered its COMMIT): release the connection unless the next batch's transaction has it. */
  private end(): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    if (this.connectionUser === 'this') this.conn.release();
  }

  /** The transaction's end was not confirmed: never release the connection, end the client (OutboxStore.abandon). */
  private endUnconfirmed(): void {
    if (this.state === 'ended') return;
    this.state = 'ended';
    this.store.abandon();
  }

  /**
   * Mark the acked rows sent (or delete them), record the failed attempts and COMMIT, all sent at
   * once down the connection: one round trip. If any statement fails, the transaction is aborted
   * and the COMMIT only ends it, so a failure anywhere means nothing of the batch was recorded.
   * Premarks are undone first: the acked rows are marked again, exactly.
   */
  async markAndCommit(sent: string[], failures: Failure[]): Promise<void> {
    await this.opened;
    const statements: Promise<unknown>[] = [];
    const pre = this.premarked;
    this.premarked = undefined;
    if (pre) {
      // Not every premarked row was acked (commitIfAllPremarked handles that case), or the premark
      // failed and left the transaction aborted: back to the savepoint, then mark exactly the acked.
      await pre.written;
      statements.push(this.run('undoing the premarks', this.conn`ROLLBACK TO SAVEPOINT premark`));
    }
    if (sent.length) statements.push(this.run('marking rows sent', this.conn.unsafe(this.store.markText, [sent], this.store.prepared)));
    if (failures.length) {
      statements.push(
        this.run(
          'recording failed attempts',
          this.conn.unsafe(q.recordFailuresSql(this.store.table), [
            failures.map((f) => f.seq),
            failures.map((f) => f.error.slice(0, 2_000)),
            failures.map((f) => Math.round(f.delayMs)),
            failures.map((f) => (f.park ? 1 : 0)),
          ]),
        ),
      );
    }
    // The waiting marks follow the blocking rows just changed: rows that failed
    // before and were sent now, or failed again (parked under skip: no longer blocking), may free
    // their aggregates; rows that failed now block theirs.
    const blocking = this.aggregatesOf(failures.map((f) => f.seq), false);
    const freed = [...new Set([...this.aggregatesOf(sent, true), ...blocking])];
    if (freed.length) statements.push(this.run('clearing waiting marks', this.conn.unsafe(this.store.unwaitText, [freed], this.store.prepared)));
    // a chunk at most, to keep this batch short; the next invocation's markWaiting marks any more
    if (blocking.length) statements.push(this.run('marking waiting rows', this.conn.unsafe(this.store.markWaitingText, [blocking, MARK_WAITING_CHUNK], this.store.prepared)));
    statements.push(this.run('committing the batch', this.conn`COMMIT`));
    const results = await Promise.allSettled(statements);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await this.rollback();
      throw failed.reason;
    }
    this.end();
  }

  /** The distinct aggregates of the claimed rows `seqs` (only those that had failed before, with `retriedOnly`). */
  private aggregatesOf(seqs: string[], retriedOnly: boolean): string[] {
    const out = new Set<string>();
    for (const seq of seqs) {
      const row = this.claimed.get(seq);
      if (row && (!retriedOnly || row.retried)) out.add(row.aggregateid);
    }
    return [...out];
  }

  /**
   * Never throws. The connection goes back to the pool only once the server has answered the
   * ROLLBACK; when it cannot be sent (the client is poisoned: a statement lost its race with the
   * deadline, or a connection closed) or is not answered in time, the client is ended instead, and
   * the server rolls the transaction back when the connection closes (OutboxStore.abandon).
   */
  async rollback(): Promise<void> {
    if (this.state !== 'open') return;
    this.state = 'ended';
    if (this.connectionUser !== 'this') return;
    if (!this.store.poisoned) {
      try {
        await this.deadlineFree(this.conn`ROLLBACK`);
        this.conn.release();
        return;
      } catch {
        // not confirmed: the transaction may still be open on the server
      }
    }
    this.store.abandon();
  }

  private async deadlineFree<T>(p: Promise<T>): Promise<T> {
    // A rollback may run past the deadline (it is how a failure ends), by a short grace of its
    // own, inside the safety margin: what the deadline leaves, within BUDGET.rollbackGraceMs.
    // Unanswered by then, the client is ended (rollback), so one grace is the most a
    // failure spends: the invocation's other transaction finds the client poisoned and waits not.
    const { min, max } = BUDGET.rollbackGraceMs;
    const graceMs = Math.min(max, Math.max(min, this.deadline.remaining()));
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('rollback timed out')), graceMs)))]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** seq values are int8 as decimal strings without sign or leading zeros: shorter is smaller */
export function bySeq(a: { seq: string }, b: { seq: string }): number {
  return a.seq.length - b.seq.length || (a.seq < b.seq ? -1 : a.seq > b.seq ? 1 : 0);
}

const AUTH_CODES = new Set(['28P01', '28000']);

export function isAuthError(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code ?? ((err as { cause?: { code?: unknown } } | undefined)?.cause?.code);
  return typeof code === 'string' && AUTH_CODES.has(code);
}

/** postgres.js' own codes for a closed socket, the OS's, and the server's "terminating connection" (57P0x) */
const CONNECTION_LOST_CODES = new Set(['CONNECTION_CLOSED', 'CONNECTION_ENDED', 'CONNECTION_DESTROYED', 'ECONNRESET', 'EPIPE', '57P01', '57P02', '57P03']);

/** the error postgres.js gives a statement whose connection closed, for the waits it does not end itself */
function connectionClosed(message: string): Error {
  return Object.assign(new Error(message), { code: 'CONNECTION_CLOSED' });
}

export function isConnectionLost(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' && CONNECTION_LOST_CODES.has(code);
}

/**
 * What a transaction-mode pooler (PgBouncer before 1.21, RDS Proxy) does to named prepared
 * statements: it hands each transaction whichever server connection is free, so a statement
 * prepared on one is missing on the next (26000 `prepared statement "…" does not exist`), or its
 * name is prepared twice (42P05 `… already exists`). postgres.js re-sends a statement the server
 * says is missing; inside a pipelined transaction that re-send lands after statements queued
 * behind it, and postgres.js then reads one statement's rows with another's row description:
 * a RangeError ERR_OUT_OF_RANGE from its Buffer reads (`The value of "offset" is out of range`).
 */
const PREPARED_STATEMENT_LOST_CODES = new Set(['26000', '42P05']);

export function isPreparedStatementLost(err: unknown): boolean {
  const e = err as { code?: unknown } | undefined;
  if (typeof e?.code !== 'string') return false;
  if (PREPARED_STATEMENT_LOST_CODES.has(e.code)) return true;
  // postgres.js parses rows with Buffer reads; an out-of-range read means a row description that
  // does not belong to the row, which only a server connection switched under the client causes
  return e.code === 'ERR_OUT_OF_RANGE' && err instanceof RangeError;
}

export const POOLED_PREPARE_ADVICE =
  'the database connection looks pooled in transaction mode (PgBouncer/RDS Proxy), which loses named prepared statements between transactions: set DATABASE_PREPARE=false';

export function wrapDbError(err: unknown, what: string): Error {
  if (err instanceof DeadlineExceededError || err instanceof DatabaseError) return err;
  const e = err as { code?: string; message?: string };
  if (isPreparedStatementLost(err)) {
    // not retriable: every invocation through that pooler can hit it again until the setting changes
    return new DatabaseError(`database error while ${what}: ${POOLED_PREPARE_ADVICE} (${e.message ?? String(err)}; ${e.code})`, { cause: err, retriable: false });
  }
  if (e?.code && AUTH_CODES.has(e.code)) {
    return new DatabaseError(`database rejected the credentials while ${what} (${e.code}): check DATABASE_URL or the DATABASE_SECRET_ID secret`, { cause: err, retriable: false });
  }
  if (e?.code === '42703') {
    // a column a later migration adds (the operator commands' audit columns, say): the relay's
    // own statements never get here, the schema check refuses a table without its migrations
    return new DatabaseError(`a column the relay needs does not exist (${e.message}): the outbox table lacks a migration; run \`outbox-relay migrate\` (idempotent)`, { cause: err, retriable: false });
  }
  if (e?.code === '42P01') {
    return new DatabaseError(`a table the relay needs does not exist (${e.message}): run \`outbox-relay migrate\` (it creates the outbox table and its sent table) or check OUTBOX_TABLE`, { cause: err, retriable: false });
  }
  return new DatabaseError(`database error while ${what}: ${e?.message ?? String(err)}${e?.code ? ` (${e.code})` : ''}`, { cause: err });
}
