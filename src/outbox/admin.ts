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

/** The metrics' names, also in `status --json`; bounded whatever the table's size (backlogSql). */
export interface Backlog {
  /** the lowest pending seq's age, standing in for the oldest pending row's; 0 when none is pending */
  oldestPendingAgeMs: number;
  /** exact up to BACKLOG_COUNT_CAP; more than that reads CAP + 1 */
  pendingRows: number;
  pendingRowsCapped: boolean;
  parkedRows: number;
  parkedRowsCapped: boolean;
}

/** +1, to tell "exactly the cap" from "more". */
export const BACKLOG_COUNT_CAP = 10_000;

/**
 * Raced against `deadline` too, in case the server or network hangs: then the statement may still
 * be running, and the caller should not reuse the client. One round trip: BEGIN, the timeouts and
 * the query are pipelined on a reserved connection.
 */
export async function backlog(sql: Sql, table: TableName, deadline: Deadline): Promise<Backlog> {
  // the server gives up first, with an ordinary error, so the client-side race is only a backstop
  const serverMs = String(Math.max(1, deadline.remaining() - BUDGET.serverFirstMs));
  const read = (async () => {
    await openConnections(sql);
    const conn = await sql.reserve();
    // an answer (rows, or an error such as the statement timeout) means the connection can take the ROLLBACK
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

/** The connection may still be in the transaction, so the client was ended (docs/DESIGN.md, "The batch transaction's states"). */
export class UnconfirmedRollbackError extends DatabaseError {}

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
  pending: number;
  retrying: number;
  parked: number;
  oldestPendingMs: number | null;
  topics: TopicStatus[];
}

export async function status(sql: Sql, table: TableName, template: string, deadline: Deadline): Promise<Status> {
  // The server's timeout should end a blocked read (an ordinary error, the connection fine), 100 ms
  // before the client's deadline. It is computed once in the transaction and pipelined with the
  // query: the time a connection takes (a pooler's SCRAM login) used to come out of those 100 ms.
  const [, rows] = await deadline.race(
    'reading the status per topic',
    sql.begin((tx) => {
      const serverMs = String(Math.max(1, deadline.remaining() - BUDGET.serverFirstMs));
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
  retried_at: Date | null;
  retried_by: string | null;
  retried_reason: string | null;
  /** --operator, the AWS caller identity or the OS user */
  retried_operator: string | null;
}

export function listParked(sql: Sql, table: TableName, limit = 100): Promise<ParkedRow[]> {
  return sql.unsafe<ParkedRow[]>(q.parkedListSql(qualified(table)), [limit]);
}

export interface OperatorRequest {
  /** null: every parked row (`retry --all`) */
  ids: string[] | null;
  reason: string;
  operator: string;
  dryRun: boolean;
  policy: ParkedPolicy;
}

export interface NotActedOn {
  id: string;
  state: 'unknown' | 'sent' | 'skipped' | 'pending' | 'retrying';
  why: string;
}

export interface OperatorResult {
  /** in a dry run: that would be */
  actedOn: string[];
  notActedOn: NotActedOn[];
  by: string;
  operator: string;
  at: Date;
}

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

/** Pure, for the unit tests. An id asked twice is decided once. */
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

/** The rows waiting behind them are freed in the same transaction. */
export function retryParked(sql: Sql, table: TableName, request: OperatorRequest): Promise<OperatorResult> {
  return repairParked(sql, table, 'retry', request);
}

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
