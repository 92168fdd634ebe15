// Operator queries: status, the backlog figures (also the metrics'), and parked rows. Same
// configuration as the handler.
import postgres, { type ReservedSql, type Sql, type TransactionSql } from 'postgres';
import { BUDGET, type Deadline } from '../budget.ts';
import { DatabaseError } from '../errors.ts';
import { topicFor, type ParkedPolicy, type TableName } from '../domain.ts';
import { endClient, openConnections } from './client.ts';
import { qualified } from './identifier.ts';
import * as q from './sql.ts';
import { isConnectionLost } from './db-errors.ts';

export interface TopicStatus {
  topic: string;
  pending: number;
  retrying: number;
  parked: number;
  oldestPendingMs: number | null;
}

/**
 * What the metrics report about the table after each invocation (OldestPendingAgeMs, PendingRows,
 * PendingRowsCapped, ParkedRows, ParkedRowsCapped), under the same names in `status --json`.
 * Cheap and bounded whatever the table's size (see backlogSql).
 */
export interface Backlog {
  /** ms since the pending row with the lowest seq was created (stands in for the oldest pending row); 0 when none is pending */
  oldestPendingAgeMs: number;
  /** pending rows (backing-off ones included), exact up to BACKLOG_COUNT_CAP; more than that reads CAP + 1 */
  pendingRows: number;
  /** more than BACKLOG_COUNT_CAP rows are pending: pendingRows is a lower bound */
  pendingRowsCapped: boolean;
  /** parked rows, exact up to BACKLOG_COUNT_CAP, likewise */
  parkedRows: number;
  parkedRowsCapped: boolean;
}

/** Rows counted at most (+1, to tell "exactly the cap" from "more") by the backlog figures. */
export const BACKLOG_COUNT_CAP = 10_000;

/**
 * The backlog figures, in a read-only transaction whose statement_timeout (and idle timeout)
 * ends before `deadline`, raced against `deadline` too in case the server or network hangs
 * (then it throws DeadlineExceededError and the statement may still be running: the caller
 * should not reuse the client). One round trip: BEGIN, the timeouts and the query are pipelined
 * on a reserved connection; ROLLBACK ends the transaction, which has nothing to commit, and the
 * connection is released only once it is answered (else UnconfirmedRollbackError, the client ended).
 */
export async function backlog(sql: Sql, table: TableName, deadline: Deadline): Promise<Backlog> {
  // the server gives up first, with an ordinary error, so the client-side race is only a backstop
  const serverMs = String(Math.max(1, deadline.remaining() - 100));
  const read = (async () => {
    await openConnections(sql);
    const conn = await sql.reserve();
    // did the server answer (rows, or an error such as the statement timeout)? Then the
    // connection is alive and can take the ROLLBACK
    let answered = false;
    try {
      const [, , rows] = await Promise.all([
        conn`BEGIN READ ONLY`,
        conn`SELECT set_config('statement_timeout', ${serverMs}, true), set_config('idle_in_transaction_session_timeout', ${serverMs}, true)`,
        conn.unsafe<{ oldest_pending_age_ms: string | null; pending_rows: string; parked_rows: string }[]>(q.backlogSql(qualified(table)), [BACKLOG_COUNT_CAP]),
      ]);
      answered = true;
      return rows;
    } catch (err) {
      answered = err instanceof postgres.PostgresError && !isConnectionLost(err);
      throw err;
    } finally {
      // Nothing is written to a connection that did not answer: postgres.js 3.4.9 can crash the
      // process writing to a reserved connection whose socket closed (porsager/postgres#1208).
      // That connection stays reserved until the client is replaced (Runtime) or the process ends.
      if (answered) await endReadOnly(sql, conn, deadline);
    }
  })();
  const [row] = await deadline.race('reading the backlog figures', read);
  const pending = Number(row?.pending_rows ?? 0);
  const parked = Number(row?.parked_rows ?? 0);
  return {
    // a clock a little behind the writers' can make a fresh row look younger than 0
    oldestPendingAgeMs: row?.oldest_pending_age_ms == null ? 0 : Math.max(0, Math.round(Number(row.oldest_pending_age_ms))),
    pendingRows: pending,
    pendingRowsCapped: pending > BACKLOG_COUNT_CAP,
    parkedRows: parked,
    parkedRowsCapped: parked > BACKLOG_COUNT_CAP,
  };
}

/**
 * The backlog read's ROLLBACK was not answered in its grace (or failed): the connection may still
 * be in the transaction, so it was not released; the client was ended, and the server rolls back
 * as its connections close (docs/DESIGN.md, "A transaction is ended by the server"). The caller
 * needs a new client.
 */
export class UnconfirmedRollbackError extends DatabaseError {}

/**
 * A connection goes back to the pool only once the server answered its ROLLBACK, within the
 * grace a batch's rollback has (BUDGET.rollbackGraceMs); otherwise the whole client is ended.
 */
async function endReadOnly(sql: Sql, conn: ReservedSql, deadline: Deadline): Promise<void> {
  const { min, max } = BUDGET.rollbackGraceMs;
  const graceMs = Math.min(max, Math.max(min, deadline.remaining()));
  let timer: NodeJS.Timeout | undefined;
  const rollback = conn`ROLLBACK`;
  try {
    await Promise.race([rollback, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${graceMs} ms`)), graceMs)))]);
  } catch (err) {
    rollback.catch(() => undefined);
    void endClient(sql);
    throw new UnconfirmedRollbackError(`the backlog read's ROLLBACK was not confirmed (${(err as Error).message}): the database client was ended, so the server rolls back`, { cause: err });
  } finally {
    clearTimeout(timer);
  }
  conn.release();
}

export interface Status extends Backlog {
  table: string;
  /** exact counts from a full pass over the unsent rows, by topic (below) */
  pending: number;
  retrying: number;
  parked: number;
  /** the exact age of the oldest pending created_at; null when none is pending */
  oldestPendingMs: number | null;
  topics: TopicStatus[];
}

/** `status`: exact counts by topic (one pass over the unsent rows), plus the backlog figures the metrics report. */
export async function status(sql: Sql, table: TableName, template: string, deadline: Deadline): Promise<Status> {
  // per topic, over every pending row: bounded on the server (statement_timeout) and by the deadline.
  // The server's timeout is what should end a blocked read (an ordinary error, the connection
  // fine), 100 ms before the client's deadline. It is computed once connected and in the
  // transaction, and sent pipelined with the query: the time a connection takes (a pooler's
  // SCRAM login, a busy machine) used to come out of those 100 ms, and the client gave up first.
  const [, rows] = await deadline.race(
    'reading the status per topic',
    sql.begin((tx) => {
      const serverMs = String(Math.max(1, deadline.remaining() - 100));
      return [
        tx`SELECT set_config('statement_timeout', ${serverMs}, true)`,
        tx.unsafe<{ topic_override: string; aggregatetype: string; pending: string; retrying: string; parked: string; oldest_pending_ms: string | null }[]>(q.statusSql(qualified(table))),
      ];
    }),
  );
  const byTopic = new Map<string, TopicStatus>();
  for (const r of rows) {
    const topic = topicFor({ topic: r.topic_override || null, aggregatetype: r.aggregatetype, type: '{type}' }, template);
    const t = byTopic.get(topic) ?? { topic, pending: 0, retrying: 0, parked: 0, oldestPendingMs: null };
    t.pending += Number(r.pending);
    t.retrying += Number(r.retrying);
    t.parked += Number(r.parked);
    if (r.oldest_pending_ms !== null) t.oldestPendingMs = Math.max(t.oldestPendingMs ?? 0, Math.round(Number(r.oldest_pending_ms)));
    byTopic.set(topic, t);
  }
  const topics = [...byTopic.values()].sort((a, b) => a.topic.localeCompare(b.topic));
  const oldest = topics.map((t) => t.oldestPendingMs).filter((x): x is number => x !== null);
  const figures = await backlog(sql, table, deadline);
  return {
    table: qualified(table),
    pending: topics.reduce((n, t) => n + t.pending, 0),
    retrying: topics.reduce((n, t) => n + t.retrying, 0),
    parked: topics.reduce((n, t) => n + t.parked, 0),
    oldestPendingMs: oldest.length ? Math.max(...oldest) : null,
    ...figures,
    topics,
  };
}

export interface ParkedRow {
  id: string;
  seq: string;
  aggregatetype: string;
  aggregateid: string;
  type: string;
  topic: string | null;
  attempts: number;
  last_error: string | null;
  parked_at: Date;
  created_at: Date;
  /** the last `parked retry` of this row (it was parked before, and is again), if any */
  retried_at: Date | null;
  retried_by: string | null;
  retried_reason: string | null;
  /** who ran that `parked retry` (--operator, the AWS caller identity or the OS user) */
  retried_operator: string | null;
}

export function listParked(sql: Sql, table: TableName, limit = 100): Promise<ParkedRow[]> {
  return sql.unsafe<ParkedRow[]>(q.parkedListSql(qualified(table)), [limit]);
}

/** What an operator's `parked retry|skip` acts on, and why (stored with each row, and logged). */
export interface OperatorRequest {
  /** the rows named, in the order given; null: every parked row (`retry --all`) */
  ids: string[] | null;
  /** why (required by the CLI): stored with each row acted on */
  reason: string;
  /** who runs the command (src/cli/operator.ts): stored with each row beside the database role */
  operator: string;
  /** decide and report, change nothing */
  dryRun: boolean;
  policy: ParkedPolicy;
}

/** A row named that the command did not act on, and why. */
export interface NotActedOn {
  id: string;
  /** what the row is instead: no such row in the outbox, sent, skipped, pending or retrying */
  state: 'unknown' | 'sent' | 'skipped' | 'pending' | 'retrying';
  why: string;
}

export interface OperatorResult {
  /** the rows acted on (in a dry run: that would be), in seq order */
  actedOn: string[];
  /** the rows named that were not, in the order given */
  notActedOn: NotActedOn[];
  /** the database role (session_user) and the time recorded with each row */
  by: string;
  /** who ran the command, recorded with each row too */
  operator: string;
  at: Date;
}

/** The lookup's row (operatorLookupSql): what decides whether the command may act on it. */
export interface LookedUp {
  id: string;
  aggregateid: string;
  parked_at: Date | null;
  skipped_at: Date | null;
  skipped_by: string | null;
  sent_at: Date | null;
  attempts: number;
  next_attempt_at: Date;
}

/**
 * Which of the rows asked for the command may act on: a parked row, not sent and not skipped.
 * Pure (the unit tests feed it rows). `asked` null: every row found (`retry --all`, whose lookup
 * finds only parked rows). An id asked twice is decided once.
 */
export function decide(action: 'retry' | 'skip', asked: string[] | null, found: LookedUp[]): Pick<OperatorResult, 'actedOn' | 'notActedOn'> {
  const byId = new Map(found.map((r) => [r.id, r]));
  const notActedOn: NotActedOn[] = [];
  for (const id of new Set(asked ?? [])) {
    const r = byId.get(id);
    const no = (state: NotActedOn['state'], why: string) => notActedOn.push({ id, state, why });
    if (!r) no('unknown', 'no such row in the outbox table (never written there; or sent, which moves a row out; or skipped and since pruned)');
    else if (r.sent_at) no('sent', `already sent, at ${r.sent_at.toISOString()}`);
    else if (r.skipped_at) no('skipped', `${action === 'skip' ? 'already skipped' : 'skipped (a skipped row is never sent: it cannot be retried)'}, at ${r.skipped_at.toISOString()} by ${r.skipped_by ?? 'an unknown role'}`);
    else if (!r.parked_at) {
      if (r.attempts > 0) no('retrying', `not parked: retrying (${r.attempts} failed ${r.attempts === 1 ? 'attempt' : 'attempts'}; next attempt at ${r.next_attempt_at.toISOString()})`);
      else no('pending', 'not parked: pending (it has not failed)');
    }
  }
  const named = asked && new Set(asked);
  const refused = new Set(notActedOn.map((n) => n.id));
  return { actedOn: found.filter((r) => (!named || named.has(r.id)) && !refused.has(r.id)).map((r) => r.id), notActedOn };
}

/**
 * `parked retry`: the parked rows named (or all: ids null) back to pending with attempts reset,
 * recording who, when and why. The rows waiting behind them are freed in the same transaction
 * (the waiting marks).
 */
export function retryParked(sql: Sql, table: TableName, request: OperatorRequest): Promise<OperatorResult> {
  return repairParked(sql, table, 'retry', request);
}

/** `parked skip`: the parked rows named are never to be sent, recording who, when and why; they no longer hold their aggregates back. */
export function skipParked(sql: Sql, table: TableName, request: Omit<OperatorRequest, 'ids'> & { ids: string[] }): Promise<OperatorResult> {
  return repairParked(sql, table, 'skip', request);
}

async function repairParked(sql: Sql, table: TableName, action: 'retry' | 'skip', { ids, reason, operator, dryRun, policy }: OperatorRequest): Promise<OperatorResult> {
  const t = qualified(table);
  const lookup = q.operatorLookupSql(t, ids ? 'ids' : 'all-parked', !dryRun);
  const params = ids ? [ids] : [];
  const work = async (tx: TransactionSql): Promise<OperatorResult> => {
    const [[who], found] = await Promise.all([tx.unsafe<{ by: string; at: Date }[]>(q.operatorSql), tx.unsafe<LookedUp[]>(lookup, params)]);
    const decided = decide(action, ids, found);
    const result = { ...decided, by: who!.by, operator, at: who!.at };
    if (dryRun || decided.actedOn.length === 0) return result;
    // the lookup locked the rows: the UPDATE finds each one decided as the lookup read it
    const rows = await tx.unsafe<{ id: string; aggregateid: string }[]>(action === 'retry' ? q.parkedRetrySql(t) : q.parkedSkipSql(t), [decided.actedOn, reason, operator]);
    // every row decided, and only those, or nothing (the transaction rolls back): a change hidden
    // by row-level security or a trigger would report rows retried that stay parked
    const changed = new Set(rows.map((r) => r.id));
    if (rows.length !== decided.actedOn.length || decided.actedOn.some((id) => !changed.has(id))) {
      throw new DatabaseError(
        `${action === 'retry' ? 'retrying' : 'skipping'} ${decided.actedOn.length} parked rows of ${t} changed ${rows.length}: ` +
          'row-level security hiding rows from the role, a trigger that suppresses the UPDATE, or rows sharing an id. Nothing was changed; ' +
          'fix the table (docs/schema.md, "The schema check") and run the command again',
        { retriable: false },
      );
    }
    const aggregates = [...new Set(rows.map((r) => r.aggregateid))];
    if (aggregates.length) await tx.unsafe(q.unwaitSql(t, policy), [aggregates]);
    return result;
  };
  // a dry run in a read-only transaction: whatever it runs, it can change nothing
  return dryRun ? sql.begin('read only', work) : sql.begin(work);
}
