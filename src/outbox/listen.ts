import { BUDGET, type Deadline } from '../budget.ts';
import type { InsertWatch } from '../loop/ports.ts';
import { wrapDbError } from './db-errors.ts';
import { quoteIdent } from './identifier.ts';
import postgres, { type Sql } from 'postgres';

/** Never kept across invocations: a frozen listener fills the server's notification queue (docs/DESIGN.md, "Linger mode: waiting for rows instead of exiting"). */
export async function watchInserts(
  sql: Sql,
  channel: string,
  deadline: Deadline,
  on: { insert(): void; lost(err: unknown): void },
): Promise<InsertWatch> {
  let closing = false;
  const listener = postgres({
    // the main client's parsed options (postgres.js' own listen() does the same)
    ...sql.options,
    max: 1,
    idle_timeout: null,
    max_lifetime: null,
    fetch_types: false,
    onnotify: (from: string) => {
      if (from === channel) on.insert();
    },
    onclose: () => {
      if (!closing) on.lost(new Error('the LISTEN connection closed'));
    },
  } as unknown as postgres.Options<Record<string, never>>);
  const close = async () => {
    closing = true;
    await listener.end({ timeout: BUDGET.listenCloseMs / 1_000 }).catch(() => undefined);
  };
  try {
    // not bounded(): losing this race says nothing about the main client's connections
    await deadline.race('listening for new rows (LISTEN)', listener.unsafe(`LISTEN ${quoteIdent(channel)}`));
  } catch (err) {
    await close();
    throw wrapDbError(err, 'listening for new rows (LISTEN)');
  }
  return { close };
}
