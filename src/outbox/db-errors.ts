import { DatabaseError, DeadlineExceededError } from '../errors.ts';
import { tlsRefusal } from '../transport.ts';
import { ROW_CHECK_FAILED } from './sql.ts';

const AUTH_CODES = new Set(['28P01', '28000']);

function authCode(err: unknown): string | undefined {
  const e = err as { code?: unknown; cause?: { code?: unknown } } | undefined;
  const code = e?.code ?? e?.cause?.code;
  return typeof code === 'string' && AUTH_CODES.has(code) ? code : undefined;
}

export function isAuthError(err: unknown): boolean {
  return authCode(err) !== undefined;
}

/** postgres.js' own codes for a closed socket, the OS's, and the server's "terminating connection" (57P0x) */
const CONNECTION_LOST_CODES = new Set([
  'CONNECTION_CLOSED',
  'CONNECTION_ENDED',
  'CONNECTION_DESTROYED',
  'ECONNRESET',
  'EPIPE',
  '57P01',
  '57P02',
  '57P03',
]);

/** for the waits postgres.js does not end itself */
export function connectionClosed(message: string): Error {
  return Object.assign(new Error(message), { code: 'CONNECTION_CLOSED' });
}

export function isConnectionLost(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === 'string' && CONNECTION_LOST_CODES.has(code);
}

/** The server's statement_timeout (57014), which the side transactions set to end before the client's race (BUDGET.serverFirstMs). */
export function isStatementTimeout(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; e && depth < 3; depth++) {
    if ((e as { code?: unknown }).code === '57014') return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** A transaction-mode pooler's lost named statements (docs/DESIGN.md, "Through a pooler"): 26000, 42P05. */
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
  'the database connection looks pooled in transaction mode (PgBouncer/RDS Proxy), which loses named prepared ' +
  'statements between transactions: set DATABASE_PREPARE=false';

export function wrapDbError(err: unknown, what: string): Error {
  if (err instanceof DeadlineExceededError || err instanceof DatabaseError) return err;
  const e = err as { code?: string; message?: string };
  if (isPreparedStatementLost(err)) {
    // not retriable: every invocation through that pooler can hit it again until the setting changes
    const detail = `${e.message ?? String(err)}; ${e.code}`;
    return new DatabaseError(`database error while ${what}: ${POOLED_PREPARE_ADVICE} (${detail})`, {
      cause: err,
      retriable: false,
    });
  }
  const auth = authCode(err);
  if (auth) {
    const message =
      `database rejected the credentials while ${what} (${auth}): ` +
      'check DATABASE_URL or the DATABASE_SECRET_ID secret';
    return new DatabaseError(message, { cause: err, retriable: false });
  }
  const check = rowCheckFailure(e);
  if (check) {
    // not retriable: the table's shape, not a passing fault; the batch is rolled back with it
    const message =
      `the batch was rolled back while ${what}: ${check}. The outbox table (or its sent table) is not shaped as the relay's ` +
      'statements expect: row-level security hiding rows from the role or forbidding the change, a trigger or rule that suppresses it, ' +
      'or rows the statement did not name. Nothing of the batch was marked or charged and the invocation stopped; its rows stay ' +
      'pending and are published again (same ids) once the table is fixed (docs/schema.md, "The schema check")';
    return new DatabaseError(message, { cause: err, retriable: false });
  }
  const refused = tlsRefusal(err, 'database');
  if (refused) return new DatabaseError(refused, { cause: err, retriable: false });
  if (e?.code === '42703') {
    // a column a later migration adds (the operator commands' audit columns, say): the relay's
    // own statements never get here, the schema check refuses a table without its migrations
    const message =
      `a column the relay needs does not exist (${e.message}): ` +
      'the outbox table lacks a migration; run `outbox-relay migrate` (idempotent)';
    return new DatabaseError(message, { cause: err, retriable: false });
  }
  if (e?.code === '42P01') {
    const message =
      `a table the relay needs does not exist (${e.message}): ` +
      'run `outbox-relay migrate` (it creates the outbox table and its sent table) or check OUTBOX_TABLE';
    return new DatabaseError(message, { cause: err, retriable: false });
  }
  return new DatabaseError(
    `database error while ${what}: ${e?.message ?? String(err)}${e?.code ? ` (${e.code})` : ''}`,
    { cause: err },
  );
}

function rowCheckFailure(e: { code?: string; message?: string } | undefined): string | undefined {
  if (e?.code !== '22P02' || !e.message) return undefined;
  const at = e.message.indexOf(`${ROW_CHECK_FAILED}: `);
  if (at < 0) return undefined;
  return e.message.slice(at + ROW_CHECK_FAILED.length + 2).replace(/"$/, '');
}
