// How the relay's postgres.js clients are built and ended: the parts every client the relay
// opens shares (the Runtime's, the model test's), and where a client connects to.
import postgres, { type Options, type Sql } from 'postgres';

/**
 * A Postgres array literal of the values, each element quoted (Postgres' array input syntax:
 * backslash and double quote escaped). The SQL casts the parameter ($1::bigint[]), so one text
 * form serves every element type the relay sends.
 */
export function arrayLiteral(values: unknown): string {
  if (!Array.isArray(values)) return String(values);
  return `{${values.map((v) => (v === null || v === undefined ? 'NULL' : `"${String(v).replace(/[\\"]/g, (c) => `\\${c}`)}"`)).join(',')}}`;
}

// the array types the relay's statements take as parameters, by their built-in OIDs (element types int8, text, uuid,
// int4, tid, oid)
const ARRAY_OIDS = { int8: 1016, text: 1009, uuid: 2951, int4: 1007, tid: 1010, oid: 1028 } as const;

/**
 * The options every relay client shares. fetch_types off: by default postgres.js asks each new
 * connection for the server's array types before its first statement (~10 KB, a round trip), and
 * 3.4.9 leaves that query's failure unhandled (connection.js: ReadyForQuery returns
 * fetchArrayTypes() to nobody), so a connection closed during it crashed the process with an
 * unhandled rejection. The array types the relay sends are built in, with fixed OIDs: their
 * serializers are given here instead. No statement of the relay reads an array column back (one
 * would arrive as text): they return json. The price: postgres.js then never answers a reserve()
 * that opens a connection (porsager/postgres#751), so every reserve follows openConnections().
 */
export const CLIENT_OPTIONS: Pick<Options<Record<string, never>>, 'fetch_types' | 'types'> = {
  fetch_types: false,
  // typed as no custom types: they only serialize parameters, and a client typed with them would
  // be another Sql type everywhere, for helpers (sql.typed.*) the relay does not use
  types: Object.fromEntries(Object.entries(ARRAY_OIDS).map(([name, oid]) => [`${name}_array`, { to: oid, serialize: arrayLiteral }])) as unknown as Record<string, never>,
};

/**
 * Where the database is: a postgres:// URL as given (DATABASE_URL, or a secret holding one), which
 * postgres.js parses; or the fields of an RDS-style JSON secret, which are never pasted into a URL
 * (a host holding `/`, `?`, `#` or `@` would add connection parameters of its own).
 */
export type DatabaseTarget = { url: string } | { host: string; port: number; user: string; password: string | undefined; database: string };

/**
 * A client of the target with these options. The fields go in as options, host and port as
 * one-element lists: postgres.js splits a host string at `,` (more hosts) and `:` (a port), and
 * takes one holding `/` for a Unix socket's directory; a list is used as it is.
 */
export function clientFor(target: DatabaseTarget, options: Options<Record<string, never>>): Sql {
  if ('url' in target) return postgres(target.url, options);
  // typed as one host and port, accepted as lists (postgres.js 3.4.9: parseOptions, Array.isArray)
  const where = { host: [target.host] as unknown as string, port: [target.port] as unknown as number };
  // a password in the options (a token function, DATABASE_AUTH=iam) goes before the target's
  return postgres({ ...options, ...where, user: target.user, password: options.password ?? target.password, database: target.database });
}

const opened = new WeakMap<Sql, Promise<unknown>>();

/**
 * Every connection of the client opened with a statement, once per client: call before
 * reserve(). postgres.js 3.4.9 never answers a reserve() that opens a new connection of a client
 * that does not fetch array types (CLIENT_OPTIONS; porsager/postgres#751). The relay replaces a
 * client once one of its connections closes, so no reserve meets a connection opened later. A
 * failure is tried again by the next call (a full server, say, may have room later).
 */
export function openConnections(sql: Sql): Promise<unknown> {
  const known = opened.get(sql);
  if (known) return known;
  const all = Promise.all(Array.from({ length: sql.options.max }, () => sql`SELECT 1`));
  opened.set(sql, all);
  all.catch(() => {
    if (opened.get(sql) === all) opened.delete(sql);
  });
  return all;
}

/**
 * End a client for good: end() (a second for the connections to finish, then closed), and then,
 * for 25 s, its idle connections closed every 250 ms. postgres.js 3.4.9 reconnects a closed
 * connection that had a wait queued (porsager/postgres#1195) even after end(): its reconnect timer
 * outlives terminate(), and end() does not see the connection that comes back, which would stay
 * open for good (and keep a CLI or test process alive). Its backoff stays under 20 s. The sweep's
 * timers do not keep the process alive themselves.
 */
export async function endClient(sql: Sql): Promise<void> {
  await sql.end({ timeout: 1 }).catch(() => undefined);
  sweepReconnects(sql, Date.now() + 25_000);
}

function sweepReconnects(sql: Sql, until: number): void {
  setTimeout(() => {
    // `close` is in postgres.js 3.4.9 but not in its types: it ends every idle connection
    const closing = (sql as unknown as { close(): Promise<void> }).close().catch(() => undefined);
    const bounded = new Promise((r) => setTimeout(r, 1_000).unref());
    void Promise.race([closing, bounded]).then(() => {
      if (Date.now() < until) sweepReconnects(sql, until);
    });
  }, 250).unref();
}

