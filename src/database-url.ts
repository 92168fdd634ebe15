// A postgres:// URL read as postgres.js reads it: the TLS and loopback rules (transport.ts) must
// judge the hosts and the TLS mode the driver will connect with. A reading of the relay's own once
// disagreed with the driver's on where the user info ends (the last `@` against the first) and on
// which of two `sslmode` values counts (the first against the last), and so let a password go
// unencrypted to a host the relay took for this machine. This follows postgres.js 3.4.9
// (src/index.js, parseUrl and parseOptions) step for step, odd steps included;
// test/unit/database-url.test.ts compares it with postgres(url).options for generated URLs, and
// fails when an upgrade of the driver reads a URL differently.
import { ConfigError } from './errors.ts';

/** The TLS modes as the relay judges them: what postgres.js does with a URL's `ssl` or `sslmode`. */
export type SslMode = 'disable' | 'allow' | 'prefer' | 'require' | 'verify-full';

export interface DatabaseUrl {
  /** every host postgres.js tries, in its order */
  hosts: string[];
  /** the port for each host */
  ports: number[];
  /** the Unix socket postgres.js connects to instead of any host (the host list names a directory); undefined for TCP */
  socket: string | undefined;
  user: string;
  password: string;
  /** the URL's TLS mode; undefined when it gives none (the relay then passes its own) */
  sslmode: SslMode | undefined;
}

/**
 * The URL as postgres.js will read it, or a ConfigError saying what it cannot be. `name` says where
 * the URL comes from in the messages (DATABASE_URL, a secret). Refused besides what the driver
 * itself refuses: no host (it would fall back to PGHOST or localhost, and the TLS rules could not
 * tell which), an IPv6 address (the driver cannot reach it), an empty host in a list, a port that
 * is not one, and any query parameter given twice (the driver takes the last; someone reading the
 * URL, the first).
 */
export function parseDatabaseUrl(url: string, name: string): DatabaseUrl {
  const problem = (text: string) => new ConfigError([`${name} ${text}`]);
  let hostText: string;
  let parsed: URL;
  try {
    // the host list: after the FIRST `@` (WHATWG URL takes the last), up to the first `?` or `/`
    hostText = url.slice(url.indexOf('://') + 3).split(/[?/]/)[0] ?? '';
    hostText = decodeURIComponent(hostText.slice(hostText.indexOf('@') + 1));
    // the driver hands WHATWG URL the URL with its host list cut to the first host, and reads the
    // user, password, single host, port and query from that
    parsed = new URL(url.replace(hostText, hostText.split(',')[0] ?? ''));
  } catch (err) {
    throw problem(`is not a URL postgres.js can read (${(err as Error).message}): percent-encode any reserved character of the user or password, e.g. postgres://user:p%40ss@host:5432/db`);
  }
  let user: string;
  let password: string;
  try {
    user = decodeURIComponent(parsed.username);
    password = decodeURIComponent(parsed.password);
  } catch {
    throw problem('has a user or password postgres.js cannot decode (a % not followed by two hex digits): write a % as %25');
  }
  const list = hostText.includes(',') ? hostText : parsed.hostname;
  if (list === '') throw problem('names no host: give one (e.g. postgres://user:pass@host:5432/db)');
  const bracketed = list.split(',').find((h) => h.startsWith('['));
  if (bracketed !== undefined) {
    throw problem(
      `names the IPv6 address ${bracketed}, which postgres.js cannot connect to (it reads a host up to its first ":"): name the host by a DNS name, or use an RDS-style JSON secret, whose host goes to the driver as it is`,
    );
  }
  const defaultPort = parsed.port || 5432;
  const hosts = list.split(',').map((h) => h.split(':')[0] ?? '');
  const ports = list.split(',').map((h) => parseInt(h.split(':')[1] || String(defaultPort)));
  if (hosts.includes('')) throw problem(`names an empty host in its list ${JSON.stringify(list)}: remove the extra comma, or name the host`);
  const badPort = ports.findIndex((p) => !Number.isInteger(p) || p < 1 || p > 65_535);
  if (badPort !== -1) throw problem(`gives host ${hosts[badPort]} a port that is not one (${JSON.stringify(list.split(',')[badPort])}): a number from 1 to 65535`);
  const seen = new Set<string>();
  for (const key of parsed.searchParams.keys()) {
    if (seen.has(key)) {
      throw problem(`gives the query parameter ${JSON.stringify(key)} more than once: postgres.js takes the last value, and whoever reads the URL may take the first; give it once`);
    }
    seen.add(key);
  }
  return {
    hosts,
    ports,
    // postgres.js takes a host list holding a `/` for a socket directory, all of it
    socket: list.includes('/') ? `${list}/.s.PGSQL.${defaultPort}` : undefined,
    user,
    password,
    sslmode: sslModeOf(parsed.searchParams),
  };
}

/**
 * What postgres.js does with the URL's `ssl`, `sslmode` and `sslrootcert`: `sslmode` (when not
 * empty) replaces `ssl`, `sslrootcert=system` replaces both with verify-full; disable, false and an
 * empty value turn TLS off; allow, prefer and require encrypt without checking the certificate
 * (prefer falls back to none when the server offers none); any other value hands Node's TLS the
 * connection with the certificate and host name checked.
 */
function sslModeOf(params: URLSearchParams): SslMode | undefined {
  const query = Object.fromEntries(params);
  let value = query.sslmode || query.ssl;
  if (query.sslrootcert === 'system') value = 'verify-full';
  if (value === undefined) return undefined;
  if (value === '' || value === 'disable' || value === 'false') return 'disable';
  if (value === 'allow' || value === 'prefer' || value === 'require') return value;
  return 'verify-full';
}

/** The hosts to judge for loopback: the socket's path when the driver takes one, else every host. */
export function judgedHosts(url: DatabaseUrl): string[] {
  return url.socket === undefined ? url.hosts : [url.socket];
}
