// How the relay's connections are protected: TLS unless the other end is this machine, no login
// (password, SASL, IAM token) sent unencrypted to another machine unless OUTBOX_ALLOW_PLAINTEXT_LOGIN
// says so, and a warning for every setting that encrypts without checking whom it talks to. Pure
// rules: config/load.ts applies them to what the environment names, outbox/connection.ts the
// database's to a secret's host, known only when it is read (databaseLogin, for both).
import { isIP } from 'node:net';
import { checkServerIdentity, type ConnectionOptions, type PeerCertificate } from 'node:tls';
import { judgedHosts, type DatabaseUrl, type SslMode } from './database-url.ts';

/** The one setting that lets a login cross a network unencrypted: a decision, never a default. */
export const ALLOW_PLAINTEXT_LOGIN = 'OUTBOX_ALLOW_PLAINTEXT_LOGIN';
const OPT_IN = `or, only if every network path to it is private and you accept that risk, set ${ALLOW_PLAINTEXT_LOGIN}=true`;

/** DATABASE_SSL's values. */
export const DATABASE_SSL_MODES = ['disable', 'require', 'verify-full'] as const;
export type DatabaseSsl = (typeof DATABASE_SSL_MODES)[number];

/**
 * The local machine: `localhost`, 127.0.0.0/8, ::1, or a Unix socket's directory. Only there may
 * the defaults go without TLS: the bytes never leave the host (the local test services, a
 * developer's database, a tunnel's local end).
 */
export function isLoopbackHost(host: string): boolean {
  let h = host.trim().toLowerCase();
  if (h.startsWith('/')) return true;
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.')) h = h.slice(0, -1);
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) {
    // every spelling of ::1 (0:0:0:0:0:0:0:1, ::0001), and 127.0.0.0/8 mapped (::ffff:127.0.0.1), as the URL parser normalises them
    const normal = new URL(`http://[${h}]`).hostname;
    return normal === '[::1]' || normal.startsWith('[::ffff:7f');
  }
  return false;
}

/** Every host given, and each on this machine. */
export function allLoopback(hosts: readonly string[]): boolean {
  return hosts.length > 0 && hosts.every(isLoopbackHost);
}

// KAFKA_BROKERS as the two clients read it. kafkajs takes a broker's host up to its first `:`;
// @platformatic/kafka up to its last, or inside brackets, and takes an entry with several `:` and
// no brackets for a host without a port. So `::1:9092` is this machine to a reading up to the last
// `:`, and the address ::1:9092, off it, to platformatic. Only forms every reader takes alike are
// accepted: a name or IPv4 address and a port, or (platformatic only) an IPv6 address in brackets.
const NAMED_BROKER = /^([A-Za-z0-9._-]+):(\d{1,5})$/;
const BRACKETED_BROKER = /^\[([^\]]+)\]:(\d{1,5})$/;

/** A KAFKA_BROKERS entry's host and port; undefined when it is not in a form both clients read alike. */
export function parseBroker(broker: string): { host: string; port: number; ipv6: boolean } | undefined {
  const named = NAMED_BROKER.exec(broker);
  if (named) return { host: named[1]!, port: Number(named[2]), ipv6: false };
  const bracketed = BRACKETED_BROKER.exec(broker);
  if (bracketed && isIP(bracketed[1]!) === 6) return { host: bracketed[1]!, port: Number(bracketed[2]), ipv6: true };
  return undefined;
}

/** Every broker on this machine; an entry not read alike by both clients never counts as one. */
function allBrokersLoopback(brokers: readonly string[]): boolean {
  return brokers.length > 0 && brokers.every((b) => isLoopbackHost(parseBroker(b)?.host ?? ''));
}

/** TLS to Postgres as it will be: what postgres.js is given, and what that means. */
export interface DatabaseTls {
  /** postgres.js' `ssl`; undefined: not given, the URL's own sslmode decides */
  ssl: false | 'require' | 'verify-full' | undefined;
  /** the mode in effect: disable, allow, prefer, require or verify-full */
  mode: SslMode;
  /** who chose it */
  source: 'DATABASE_SSL' | 'the URL' | 'the default';
}

/**
 * TLS to Postgres: DATABASE_SSL when set; else a URL's own `sslmode` (or `ssl`, or
 * `sslrootcert=system`) when it has one; else verify-full, the certificate and the host name
 * checked, unless every host is this machine (isLoopbackHost), where it is off. An RDS-style JSON
 * secret has no sslmode, so its database gets verify-full.
 */
export function databaseTls(configured: DatabaseSsl | undefined, fromUrl: SslMode | undefined, hosts: readonly string[]): DatabaseTls {
  if (configured) return { ssl: configured === 'disable' ? false : configured, mode: configured, source: 'DATABASE_SSL' };
  if (fromUrl) return { ssl: undefined, mode: fromUrl, source: 'the URL' };
  if (allLoopback(hosts)) return { ssl: false, mode: 'disable', source: 'the default' };
  return { ssl: 'verify-full', mode: 'verify-full', source: 'the default' };
}

/**
 * postgres.js' `ssl` for verify-full. Given 'verify-full' it checks the certificate against
 * "localhost" when the host is an IP address (it gives Node no name then, and that is Node's
 * default): any certificate for localhost would pass. So check it against the hosts named; with
 * several, against any of them (the connection does not tell which it reached).
 */
export function verifyFull(hosts: readonly string[]): ConnectionOptions {
  return {
    rejectUnauthorized: true,
    checkServerIdentity: (_name: string, cert: PeerCertificate) => {
      const errors = hosts.map((host) => checkServerIdentity(host, cert));
      return errors.includes(undefined) ? undefined : errors[0];
    },
  };
}

const settingOf = (tls: DatabaseTls) => (tls.source === 'DATABASE_SSL' ? `DATABASE_SSL=${tls.mode}` : `the database URL's sslmode=${tls.mode}`);

/** A warning for TLS that encrypts (or may) without checking the server; undefined when there is nothing to say. */
export function databaseTlsWarning(tls: DatabaseTls): string | undefined {
  const setting = settingOf(tls);
  const fix = 'use DATABASE_SSL=verify-full (on Lambda with NODE_EXTRA_CA_CERTS=/var/runtime/ca-cert.pem for the RDS CAs; docs/DEPLOY.md, "TLS to Postgres")';
  if (tls.mode === 'require') {
    return `${setting} encrypts the database connection but checks no certificate, so anyone on the network path can pose as the database and read the password: ${fix}`;
  }
  if (tls.mode === 'prefer' || tls.mode === 'allow') {
    return `${setting} checks no certificate and falls back to no encryption when the server offers none, the login and every row then in the clear: ${fix}`;
  }
  return undefined;
}

/**
 * A database login that may go unencrypted to a host off this machine: anything short of require,
 * for a password as for an IAM token (it logs anyone in as its user for 15 minutes). allow and
 * prefer count as off: with libpq they fall back to plaintext when the server (or whoever answers
 * for it) offers no TLS, and postgres.js does so with prefer. `hosts`: every host the driver may
 * connect to. Refused unless OUTBOX_ALLOW_PLAINTEXT_LOGIN=true; undefined when the login is protected.
 */
export function databasePlaintextProblem(tls: DatabaseTls, hosts: readonly string[], auth: 'password' | 'iam'): string | undefined {
  if (allLoopback(hosts)) return undefined;
  const setting = settingOf(tls);
  const fix = tls.source === 'the URL' ? 'remove sslmode from the URL (the default is verify-full) or set DATABASE_SSL=verify-full' : 'unset DATABASE_SSL (the default is verify-full) or set it to verify-full';
  if (tls.mode === 'require' || tls.mode === 'verify-full') return undefined;
  if (auth === 'iam') {
    return `DATABASE_AUTH=iam needs TLS to a database off this machine (the auth token logs anyone in as its user for 15 minutes), and ${setting} may send it unencrypted to ${hosts.join(',')}: ${fix}; ${OPT_IN}`;
  }
  if (tls.mode !== 'disable') {
    return `${setting} falls back to no encryption when the server (or anyone posing as it) offers none, and would then send the database password and every row unencrypted to ${hosts.join(',')}: ${fix}; ${OPT_IN}`;
  }
  return `${setting} sends the database login and every row unencrypted to ${hosts.join(',')}, for anyone on the network path to read or alter: ${fix}; ${OPT_IN}`;
}

/** A plaintext login OUTBOX_ALLOW_PLAINTEXT_LOGIN allowed, as the warning that says what it risks. */
export function allowedPlaintextWarning(problem: string | undefined): string | undefined {
  return problem && `${ALLOW_PLAINTEXT_LOGIN}=true allows it: ${problem.slice(0, problem.lastIndexOf(':'))}`;
}

/** Whom the database login goes to: a URL as the driver reads it, or a secret's fields. */
export type LoginTarget = { url: DatabaseUrl } | { host: string; port: number; user: string | undefined };

/** How a database login goes: its TLS, and what is refused or warned about. */
export interface DatabaseLogin {
  tls: DatabaseTls;
  /** the names verify-full checks the certificate against */
  names: readonly string[];
  /** DATABASE_AUTH=iam: whom the token is signed for (undefined with a password, or when refused) */
  iam?: { host: string; port: number; user: string };
  /** refused: each says what to do */
  problems: string[];
  warnings: string[];
}

/**
 * The database login's one rule, for DATABASE_URL (config/load.ts) and for a secret's target
 * (outbox/connection.ts): TLS as databaseTls decides, no plaintext login off this machine unless
 * allowed, and for DATABASE_AUTH=iam one host and a user to sign the token for. `source` names
 * where the target came from, for the messages.
 */
export function databaseLogin(target: LoginTarget, source: string, o: { ssl: DatabaseSsl | undefined; auth: 'password' | 'iam'; allowPlaintext: boolean }): DatabaseLogin {
  const url = 'url' in target ? target.url : undefined;
  const hosts = url ? judgedHosts(url) : [(target as { host: string }).host];
  const tls = databaseTls(o.ssl, url?.sslmode, hosts);
  const problems: string[] = [];
  const warnings = [databaseTlsWarning(tls)];
  let iam: DatabaseLogin['iam'];
  if (o.auth === 'iam') {
    const login = url ? { host: url.hosts[0]!, port: url.ports[0]!, user: url.user } : (target as { host: string; port: number; user: string | undefined });
    if (url && url.hosts.length !== 1) problems.push(`DATABASE_AUTH=iam signs a token for one host, and ${source} names several: name the one endpoint (an instance, cluster or RDS Proxy endpoint)`);
    else if (!login.user) problems.push(url ? `DATABASE_AUTH=iam needs the database user in ${source}, as the token is signed for it: postgres://user@host:5432/db` : `DATABASE_AUTH=iam needs the database user, as the token is signed for it, and ${source} names none`);
    else iam = { host: login.host, port: login.port, user: login.user };
  }
  const plaintext = databasePlaintextProblem(tls, hosts, o.auth);
  if (plaintext && !o.allowPlaintext) problems.push(plaintext);
  else warnings.push(allowedPlaintextWarning(plaintext));
  return { tls, names: url ? url.hosts : hosts, ...(iam ? { iam } : {}), problems, warnings: warnings.filter((w) => w !== undefined) };
}

/**
 * KAFKA_SSL's default: on whenever the relay logs in (SASL) to brokers that are not all on this
 * machine, so that credentials never cross a network in the clear by default.
 */
export function kafkaTlsDefault(sasl: boolean, brokers: readonly string[]): boolean {
  return sasl && !allBrokersLoopback(brokers);
}

/**
 * A Kafka login unencrypted to brokers off this machine: an IAM token (it logs anyone in as the
 * relay's role for up to 15 minutes), or the secret's SASL login (PLAIN sends the password as it
 * is; SCRAM does not, but leaves the session and every event to whoever is on the path). Refused
 * unless OUTBOX_ALLOW_PLAINTEXT_LOGIN=true; undefined when there is no login or it is protected.
 */
export function kafkaPlaintextProblem(kafka: { ssl: boolean; brokers: readonly string[]; auth: 'none' | 'sasl' | 'iam' }): string | undefined {
  if (kafka.auth === 'none' || kafka.ssl || allBrokersLoopback(kafka.brokers)) return undefined;
  if (kafka.auth === 'iam') {
    return (
      `KAFKA_AUTH=iam with KAFKA_SSL=false would send the IAM token (it logs anyone in as the relay's role for up to 15 minutes) unencrypted to ${kafka.brokers.join(',')}: ` +
      `unset KAFKA_SSL (it is on by default with IAM) and point KAFKA_BROKERS at the cluster's IAM listener (port 9098); ${OPT_IN}`
    );
  }
  return (
    `KAFKA_SSL=false would send the SASL login of KAFKA_SECRET_ID unencrypted to ${kafka.brokers.join(',')} (mechanism PLAIN sends the password as it is; with SCRAM, anyone on the path still reads every event): ` +
    `unset KAFKA_SSL (it is on by default with SASL) and point KAFKA_BROKERS at the brokers' TLS listener; ${OPT_IN}`
  );
}

/** A warning for Kafka TLS that does not check the brokers' certificates. */
export function kafkaTlsWarning(kafka: { ssl: boolean; sslRejectUnauthorized: boolean }): string | undefined {
  if (!kafka.ssl || kafka.sslRejectUnauthorized) return undefined;
  return (
    "KAFKA_SSL=no-verify: the brokers' certificates are not checked, so anyone on the network path can pose as a broker, read the events and the SASL credentials: " +
    "set it to true, and give Node a private CA with NODE_EXTRA_CA_CERTS instead"
  );
}

/** Node's codes for a certificate that does not chain up to a CA this process trusts. */
const UNTRUSTED = new Set(['UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'SELF_SIGNED_CERT_IN_CHAIN', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'UNABLE_TO_GET_ISSUER_CERT', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'CERT_UNTRUSTED']);

/**
 * What a certificate the relay refused means and what to do; undefined for any other error. The
 * handshake stopped there: no password, token or row went to that server.
 */
export function tlsRefusal(err: unknown, peer: 'database' | 'broker'): string | undefined {
  const e = err as { code?: unknown; host?: unknown; reason?: unknown; message?: unknown } | null;
  if (!e || typeof e !== 'object' || typeof e.code !== 'string') return undefined;
  const where = peer === 'database' ? "the host of DATABASE_URL or of the database's secret" : 'KAFKA_BROKERS';
  if (e.code === 'ERR_TLS_CERT_ALTNAME_INVALID') {
    // kafkajs keeps only the code and the message of Node's error, not its host and reason
    const host = typeof e.host === 'string' ? `the host ${e.host}` : 'the host';
    return (
      `the ${peer}'s TLS certificate is not for ${host} the relay connected to (${String(e.reason ?? e.message)}): ` +
      `connect by a name the certificate lists (${where}), or give the server a certificate for that name; nothing was sent to it`
    );
  }
  if (UNTRUSTED.has(e.code)) {
    return (
      `the ${peer}'s TLS certificate is not signed by a CA this process trusts (${e.code}): ` +
      "give Node the CA's certificate with NODE_EXTRA_CA_CERTS=/path/to/ca.pem, read when the process starts " +
      `(on Lambda, /var/runtime/ca-cert.pem has the RDS CAs), or check that ${where} names the server you mean; nothing was sent to it`
    );
  }
  if (e.code === 'CERT_HAS_EXPIRED') return `the ${peer}'s TLS certificate has expired (${String(e.message)}): renew it on the server; nothing was sent to it`;
  return undefined;
}
