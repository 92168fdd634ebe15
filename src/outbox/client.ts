import postgres, { type Options, type Sql } from 'postgres';

/** One text form for every element type: the SQL casts the parameter ($1::bigint[]). */
export function arrayLiteral(values: unknown): string {
  if (!Array.isArray(values)) return String(values);
  return `{${values.map((v) => (v === null || v === undefined ? 'NULL' : `"${String(v).replace(/[\\"]/g, (c) => `\\${c}`)}"`)).join(',')}}`;
}

// built in, with fixed OIDs, so their serializers can be given without fetching the server's types
const ARRAY_OIDS = { int8: 1016, text: 1009, uuid: 2951, int4: 1007, tid: 1010, oid: 1028 } as const;

/**
 * fetch_types off: postgres.js 3.4.9 leaves the failure of its array-types query unhandled
 * (connection.js: ReadyForQuery returns fetchArrayTypes() to nobody), so a connection closed during
 * it crashed the process. No statement of the relay reads an array column back: they return json.
 */
export const CLIENT_OPTIONS: Pick<Options<Record<string, never>>, 'fetch_types' | 'types'> = {
  fetch_types: false,
  // typed as no custom types: else the client would be another Sql type everywhere
  types: Object.fromEntries(Object.entries(ARRAY_OIDS).map(([name, oid]) => [`${name}_array`, { to: oid, serialize: arrayLiteral }])) as unknown as Record<string, never>,
};

/** An RDS-style secret's fields are never pasted into a URL: a host holding `/`, `?`, `#` or `@` would add parameters of its own. */
export type DatabaseTarget = { url: string } | { host: string; port: number; user: string; password: string | undefined; database: string };

/** Host and port as one-element lists: postgres.js splits a host string at `,` and `:`, and takes one holding `/` for a socket directory. */
export function clientFor(target: DatabaseTarget, options: Options<Record<string, never>>): Sql {
  if ('url' in target) return postgres(target.url, options);
  // typed as one host and port, accepted as lists (postgres.js 3.4.9: parseOptions, Array.isArray)
  const where = { host: [target.host] as unknown as string, port: [target.port] as unknown as number };
  // a password in the options (a token function, DATABASE_AUTH=iam) goes before the target's
  return postgres({ ...options, ...where, user: target.user, password: options.password ?? target.password, database: target.database });
}

const opened = new WeakMap<Sql, Promise<unknown>>();

/**
 * Call before reserve(): postgres.js 3.4.9 never answers a reserve() that opens a new connection
 * of a client that does not fetch array types (porsager/postgres#751). The relay replaces a client
 * once one of its connections closes, so no reserve meets a connection opened later.
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
 * The sweep: postgres.js 3.4.9 reconnects a closed connection that had a wait queued
 * (porsager/postgres#1195) even after end(), and end() does not see it come back, so it would keep
 * a CLI or test process alive. Its backoff stays under 20 s, the sweep lasts 25.
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

