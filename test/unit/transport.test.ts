// Secure transport by default (src/transport.ts and where config/load.ts and lambda/runtime.ts apply it): TLS
// to Postgres verified unless the host is this machine, TLS to Kafka whenever the relay logs in
// to brokers off this machine, no login in the clear to another machine unless
// OUTBOX_ALLOW_PLAINTEXT_LOGIN=true says so, and a warning at start for every setting that
// encrypts without checking the other end, or sends a login in the clear because it was allowed. The Runtime tests
// use listeners on this machine only (no shared service): what the relay sends first tells
// whether it asked for TLS.
import assert from 'node:assert/strict';
import net from 'node:net';
import { describe, it } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { ConfigError, DatabaseError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import type { SecretSource } from '../../src/lambda/secrets.ts';
import { parseDatabaseUrl } from '../../src/database-url.ts';
import {
  databasePlaintextProblem,
  databaseTls,
  databaseTlsWarning,
  isLoopbackHost,
  kafkaPlaintextProblem,
  kafkaTlsDefault,
  kafkaTlsWarning,
  parseBroker,
} from '../../src/transport.ts';

/** The TLS mode a URL asks for, as the relay reads it (src/database-url.ts). */
const urlMode = (url: string) => parseDatabaseUrl(url, 'DATABASE_URL').sslmode;

const remote = { DATABASE_URL: 'postgres://u:p@db.example.com:5432/db', KAFKA_BROKERS: 'b-1.example.com:9096,b-2.example.com:9096' };
const local = { DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };

describe('transport: what counts as this machine', () => {
  it('localhost, 127.0.0.0/8, ::1 in any spelling, a Unix socket; nothing else', () => {
    for (const h of ['localhost', 'LOCALHOST', 'localhost.', '127.0.0.1', '127.1.2.3', '::1', '[::1]', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1', '/var/run/postgresql']) {
      assert.equal(isLoopbackHost(h), true, h);
    }
    for (const h of ['db.example.com', '10.0.0.5', '128.0.0.1', '0.0.0.0', '::', '::2', 'localhost.example.com', 'mylocalhost', '127.0.0.1.nip.io', '']) {
      assert.equal(isLoopbackHost(h), false, h);
    }
  });

  it("a broker's host and port, in the forms both Kafka clients read alike; any other form is no broker", () => {
    assert.deepEqual(parseBroker('b-1.example.com:9096'), { host: 'b-1.example.com', port: 9096, ipv6: false });
    assert.deepEqual(parseBroker('[::1]:9092'), { host: '::1', port: 9092, ipv6: true });
    // platformatic reads these as the hosts ::1:9092, localhost:9092:1 (port 9092); kafkajs as '' and localhost
    for (const b of ['::1:9092', '::ffff:7f00:1:9092', 'localhost:9092:1', '[localhost]:9092', 'localhost', 'localhost:', '[::1]']) assert.equal(parseBroker(b), undefined, b);
  });
});

describe('transport: TLS to Postgres', () => {
  it('default: verify-full for a host off this machine, off for a loopback host (every host must be local)', () => {
    assert.deepEqual(databaseTls(undefined, undefined, ['db.example.com']), { ssl: 'verify-full', mode: 'verify-full', source: 'the default' });
    assert.deepEqual(databaseTls(undefined, urlMode('postgres://u:p@db.example.com/db'), ['db.example.com']), { ssl: 'verify-full', mode: 'verify-full', source: 'the default' });
    assert.deepEqual(databaseTls(undefined, urlMode('postgres://u:p@127.0.0.1/db'), ['127.0.0.1']), { ssl: false, mode: 'disable', source: 'the default' });
    assert.deepEqual(databaseTls(undefined, undefined, ['localhost', '::1']), { ssl: false, mode: 'disable', source: 'the default' });
    assert.equal(databaseTls(undefined, undefined, ['localhost', 'db.example.com']).mode, 'verify-full');
  });

  it("DATABASE_SSL wins; else a URL's own sslmode (or ssl, or sslrootcert=system) is left to postgres.js", () => {
    assert.deepEqual(databaseTls('require', urlMode('postgres://u:p@127.0.0.1/db?sslmode=disable'), ['127.0.0.1']), { ssl: 'require', mode: 'require', source: 'DATABASE_SSL' });
    assert.deepEqual(databaseTls('disable', undefined, ['db.example.com']), { ssl: false, mode: 'disable', source: 'DATABASE_SSL' });
    assert.deepEqual(databaseTls(undefined, urlMode('postgres://u:p@db.example.com/db?sslmode=require'), ['db.example.com']), { ssl: undefined, mode: 'require', source: 'the URL' });
    assert.equal(databaseTls(undefined, urlMode('postgres://u:p@db.example.com/db?sslmode=disable'), ['db.example.com']).mode, 'disable');
    assert.equal(databaseTls(undefined, urlMode('postgres://u:p@db.example.com/db?ssl=true'), ['db.example.com']).mode, 'verify-full');
    assert.equal(databaseTls(undefined, urlMode('postgres://u:p@db.example.com/db?sslrootcert=system'), ['db.example.com']).mode, 'verify-full');
    assert.equal(databaseTls(undefined, urlMode('postgres://u:p@localhost/db?sslmode=prefer'), ['localhost']).mode, 'prefer');
    assert.equal(databaseTls(undefined, urlMode('postgres://u:p@localhost/db?application_name=x'), ['localhost']).mode, 'disable');
  });

  it('warns for require (and prefer/allow), naming the setting, the risk and the fix; not for verify-full (disable off this machine is refused)', () => {
    const w = databaseTlsWarning(databaseTls('require', undefined, ['db.example.com']));
    assert.match(w ?? '', /^DATABASE_SSL=require encrypts the database connection but checks no certificate.*use DATABASE_SSL=verify-full/);
    assert.match(databaseTlsWarning(databaseTls(undefined, urlMode('postgres://h/db?sslmode=require'), ['h'])) ?? '', /^the database URL's sslmode=require/);
    assert.match(databaseTlsWarning(databaseTls(undefined, urlMode('postgres://h/db?sslmode=prefer'), ['h'])) ?? '', /falls back to no encryption when the server offers none, the login and every row then in the clear/);
    assert.equal(databaseTlsWarning(databaseTls(undefined, undefined, ['db.example.com'])), undefined);
  });

  it('a password login in the clear to a host off this machine is refused, naming the setting that allows it; loopback is not', () => {
    const problem = /^DATABASE_SSL=disable sends the database login and every row unencrypted to db\.example\.com, for anyone on the network path to read or alter: unset DATABASE_SSL .*; or, only if every network path to it is private and you accept that risk, set OUTBOX_ALLOW_PLAINTEXT_LOGIN=true$/;
    assert.throws(() => loadConfig({ ...remote, DATABASE_SSL: 'disable' }), (err: unknown) => err instanceof ConfigError && err.problems.length === 1 && problem.test(err.problems[0]!));
    assert.throws(() => loadConfig({ ...remote, DATABASE_URL: 'postgres://u:p@db.example.com/db?sslmode=disable' }), /the database URL's sslmode=disable sends the database login .*remove sslmode from the URL.*OUTBOX_ALLOW_PLAINTEXT_LOGIN=true/);
    assert.equal(loadConfig({ ...remote, DATABASE_SSL: 'disable', OUTBOX_ALLOW_PLAINTEXT_LOGIN: 'true' }).allowPlaintextLogin, true);
    assert.equal(loadConfig({ ...local, DATABASE_SSL: 'disable' }).database.ssl, 'disable', 'this machine: nothing crosses a network');
    assert.equal(databasePlaintextProblem(databaseTls('require', undefined, ['db.example.com']), ['db.example.com'], 'password'), undefined);
    assert.match(databasePlaintextProblem(databaseTls(undefined, urlMode('postgres://h/db?sslmode=prefer'), ['h']), ['h'], 'password') ?? '', /^the database URL's sslmode=prefer falls back to no encryption/);
    assert.equal(databasePlaintextProblem(databaseTls(undefined, urlMode('postgres://localhost/db?sslmode=prefer'), ['localhost']), ['localhost'], 'password'), undefined, 'this machine: nothing crosses a network');
  });

  it('config: DATABASE_SSL names its default; a URL without a host is refused (the default could not tell where it goes)', () => {
    assert.throws(() => loadConfig({ ...remote, DATABASE_SSL: 'prefer' }), /DATABASE_SSL="prefer" is not one of disable, require, verify-full \(default verify-full, or disable when the host is this machine\)/);
    assert.throws(() => loadConfig({ ...remote, DATABASE_URL: 'postgres:///db' }), /DATABASE_URL names no host/);
    assert.equal(loadConfig(remote).database.ssl, undefined, 'unset: decided per host when the host is known (a secret names it)');
  });
});

describe('transport: DATABASE_AUTH=iam needs TLS off this machine', () => {
  const iam = { ...remote, DATABASE_AUTH: 'iam', DATABASE_URL: 'postgres://relay@db.example.com:5432/app' };
  const problemsOf = (env: Record<string, string>): string[] => {
    try {
      loadConfig(env);
      return [];
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      return err.problems;
    }
  };

  it('the rule: verify-full or require, unless every host is this machine', () => {
    const iamProblem = (tls: ReturnType<typeof databaseTls>, hosts: string[]) => databasePlaintextProblem(tls, hosts, 'iam');
    assert.equal(iamProblem(databaseTls(undefined, undefined, ['db.example.com']), ['db.example.com']), undefined);
    assert.equal(iamProblem(databaseTls('require', undefined, ['db.example.com']), ['db.example.com']), undefined);
    assert.equal(iamProblem(databaseTls(undefined, undefined, ['127.0.0.1']), ['127.0.0.1']), undefined, 'a local proxy or tunnel: plaintext stays on the machine');
    assert.match(iamProblem(databaseTls('disable', undefined, ['db.example.com']), ['db.example.com']) ?? '', /^DATABASE_AUTH=iam needs TLS to a database off this machine .* DATABASE_SSL=disable may send it unencrypted to db\.example\.com: unset DATABASE_SSL.*set OUTBOX_ALLOW_PLAINTEXT_LOGIN=true$/);
    assert.match(iamProblem(databaseTls(undefined, urlMode('postgres://h/d?sslmode=prefer'), ['h']), ['h']) ?? '', /the database URL's sslmode=prefer .*remove sslmode from the URL/);
  });

  it('config, with DATABASE_URL: refused at once without TLS, with a password, without a user, with several hosts; TLS by default is enough', () => {
    assert.equal(loadConfig(iam).database.auth, 'iam');
    assert.equal(loadConfig(remote).database.auth, 'password', 'the default');
    assert.deepEqual(problemsOf({ ...iam, DATABASE_URL: 'postgres://relay@127.0.0.1:6543/app' }), [], 'loopback: no TLS needed');
    assert.match(problemsOf({ ...iam, DATABASE_SSL: 'disable' }).join(), /^DATABASE_AUTH=iam needs TLS/);
    assert.match(problemsOf({ ...iam, DATABASE_URL: 'postgres://relay@db.example.com/app?sslmode=allow' }).join(), /sslmode=allow may send it unencrypted/);
    assert.deepEqual(problemsOf({ ...iam, DATABASE_URL: 'postgres://relay:pw@db.example.com/app' }), ['DATABASE_URL has a password, but DATABASE_AUTH=iam logs in with a token: remove the password (postgres://user@host:5432/db)']);
    assert.deepEqual(problemsOf({ ...iam, DATABASE_URL: 'postgres://db.example.com/app' }), ['DATABASE_AUTH=iam needs the database user in DATABASE_URL, as the token is signed for it: postgres://user@host:5432/db']);
    assert.match(problemsOf({ ...iam, DATABASE_URL: 'postgres://relay@h1:5432,h2:5432/app' }).join(), /signs a token for one host, and DATABASE_URL names several/);
    assert.match(problemsOf({ ...iam, DATABASE_AUTH: 'token' }).join(), /DATABASE_AUTH="token" is not one of password, iam \(default password\)/);
  });

  it("with a secret: its password is not needed; the TLS rule is applied once its host is known, before any connection", async () => {
    const secrets = new MapSecrets({ db: JSON.stringify({ username: 'relay', host: '0.0.0.0', port: 1, dbname: 'app' }) });
    const rt = new Runtime(loadConfig({ ...remote, DATABASE_URL: '', DATABASE_SECRET_ID: 'db', DATABASE_AUTH: 'iam', DATABASE_SSL: 'disable' }), capture().logger, secrets);
    try {
      await assert.rejects(rt.database(), (err: unknown) => err instanceof ConfigError && /DATABASE_AUTH=iam needs TLS .* DATABASE_SSL=disable may send it unencrypted to 0\.0\.0\.0/.test(err.message));
    } finally {
      await rt.close();
    }
  });
});

describe('transport: TLS and SASL to Kafka', () => {
  it('KAFKA_SSL defaults on when the relay logs in to brokers off this machine; off without SASL or when every broker is local; explicit wins', () => {
    assert.equal(kafkaTlsDefault(true, ['b-1.example.com:9096']), true);
    assert.equal(kafkaTlsDefault(true, ['127.0.0.1:9092', 'b-1.example.com:9096']), true);
    assert.equal(kafkaTlsDefault(true, ['127.0.0.1:9092', '[::1]:9093']), false);
    assert.equal(kafkaTlsDefault(false, ['b-1.example.com:9092']), false);
    assert.equal(loadConfig({ ...remote, KAFKA_SECRET_ID: 'k' }).kafka.ssl, true);
    assert.equal(loadConfig({ ...remote }).kafka.ssl, false);
    assert.equal(loadConfig({ ...local, KAFKA_SECRET_ID: 'k' }).kafka.ssl, false);
    assert.equal(loadConfig({ ...remote, KAFKA_SECRET_ID: 'k', KAFKA_SSL: 'false', OUTBOX_ALLOW_PLAINTEXT_LOGIN: 'true' }).kafka.ssl, false);
    assert.equal(loadConfig({ ...local, KAFKA_SSL: 'true' }).kafka.ssl, true);
  });

  it('any SASL or IAM login without TLS to a broker off this machine is refused at config time, naming the setting that allows it; TLS, no login or loopback brokers are not', () => {
    assert.throws(
      () => loadConfig({ ...remote, KAFKA_SECRET_ID: 'k', KAFKA_SSL: 'false' }),
      /KAFKA_SSL=false would send the SASL login of KAFKA_SECRET_ID unencrypted to b-1\.example\.com:9096,b-2\.example\.com:9096 \(mechanism PLAIN .*SCRAM.*\): unset KAFKA_SSL .*set OUTBOX_ALLOW_PLAINTEXT_LOGIN=true/,
    );
    assert.throws(() => loadConfig({ ...remote, KAFKA_AUTH: 'iam', AWS_REGION: 'eu-west-1', KAFKA_SSL: 'false' }), /KAFKA_AUTH=iam with KAFKA_SSL=false would send the IAM token.*set OUTBOX_ALLOW_PLAINTEXT_LOGIN=true/);
    assert.equal(loadConfig({ ...remote, KAFKA_SECRET_ID: 'k', KAFKA_SSL: 'false', OUTBOX_ALLOW_PLAINTEXT_LOGIN: 'true' }).kafka.ssl, false);
    assert.equal(kafkaPlaintextProblem({ ssl: true, brokers: ['b-1.example.com:9096'], auth: 'sasl' }), undefined);
    assert.equal(kafkaPlaintextProblem({ ssl: false, brokers: ['b-1.example.com:9092'], auth: 'none' }), undefined, 'no login: no secret to lose (the events are the deployment\'s call)');
    assert.equal(kafkaPlaintextProblem({ ssl: false, brokers: ['127.0.0.1:9092', 'localhost:9093'], auth: 'sasl' }), undefined);
  });

  it('warns when TLS checks no broker certificate', () => {
    assert.match(kafkaTlsWarning({ ssl: true, sslRejectUnauthorized: false }) ?? '', /^KAFKA_SSL=no-verify: the brokers' certificates are not checked/);
    assert.equal(kafkaTlsWarning({ ssl: true, sslRejectUnauthorized: true }), undefined);
    assert.equal(kafkaTlsWarning({ ssl: false, sslRejectUnauthorized: false }), undefined, 'nothing to check without TLS');
  });
});

/** A SecretSource that answers from a map and counts the reads. */
class MapSecrets implements SecretSource {
  reads = 0;
  constructor(private readonly values: Record<string, string>) {}
  get(secretId: string): Promise<string> {
    this.reads++;
    const v = this.values[secretId];
    return v === undefined ? Promise.reject(new Error(`no secret ${secretId}`)) : Promise.resolve(v);
  }
}

function capture(): { lines: Array<Record<string, unknown>>; logger: ReturnType<typeof createLogger> } {
  const lines: Array<Record<string, unknown>> = [];
  return { lines, logger: createLogger('info', {}, (l) => lines.push(JSON.parse(l) as Record<string, unknown>)) };
}

/** A TCP listener that keeps the first 8 bytes a client sends, then closes the connection. */
async function firstBytes(host: string): Promise<{ port: number; seen: Promise<Buffer>; close(): Promise<void> }> {
  let resolve!: (b: Buffer) => void;
  const seen = new Promise<Buffer>((r) => (resolve = r));
  const server = net.createServer((socket) => {
    let got = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => {
      got = Buffer.concat([got, d]);
      if (got.length >= 8) {
        resolve(got.subarray(0, 8));
        socket.destroy();
      }
    });
    socket.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, host, r));
  return { port: (server.address() as net.AddressInfo).port, seen, close: () => new Promise<void>((r) => server.close(() => r())) };
}

// SSLRequest: length 8, then the code 80877103
const SSL_REQUEST = Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);

describe('transport: the Runtime applies the rules', () => {
  it('an RDS-style JSON secret (no sslmode) to a host off this machine: the relay asks for TLS first; to 127.0.0.1 it does not', async () => {
    // 0.0.0.0 reaches this machine on Linux but is not a loopback name: it stands for a remote host
    for (const [host, tls] of [['0.0.0.0', true], ['127.0.0.1', false]] as const) {
      const listener = await firstBytes(host);
      const secrets = new MapSecrets({ db: JSON.stringify({ username: 'u', password: 'p', host, port: listener.port, dbname: 'd' }) });
      const { logger } = capture();
      const rt = new Runtime(loadConfig({ DATABASE_SECRET_ID: 'db', KAFKA_BROKERS: '127.0.0.1:9092', DATABASE_CONNECT_TIMEOUT_MS: '300' }), logger, secrets);
      try {
        await assert.rejects(rt.database());
        const first = await listener.seen;
        assert.equal(first.equals(SSL_REQUEST), tls, `${host}: first packet ${first.toString('hex')}`);
      } finally {
        await rt.close();
        await listener.close();
      }
    }
  });

  it('warns at start: KAFKA_SSL=no-verify when the Runtime is built, DATABASE_SSL=require when the database is first reached; each once', async () => {
    const { lines, logger } = capture();
    const rt = new Runtime(loadConfig({ ...local, DATABASE_URL: 'postgres://u:p@127.0.0.1:1/db', DATABASE_SSL: 'require', KAFKA_SSL: 'no-verify' }), logger);
    try {
      const warnings = () => lines.filter((l) => l.level === 'WARN').map((l) => String(l.message));
      assert.deepEqual(warnings().map((m) => m.split(':')[0]), ['KAFKA_SSL=no-verify']);
      await assert.rejects(rt.database());
      await assert.rejects(rt.database());
      assert.deepEqual(warnings().map((m) => m.split(' ')[0]), ['KAFKA_SSL=no-verify:', 'DATABASE_SSL=require']);
    } finally {
      await rt.close();
    }
  });

  it("G8: a secret's database host off this machine with DATABASE_SSL=disable is refused before any connection; allowed, the invocation goes on and a warning says what it risks", async () => {
    const listener = await firstBytes('0.0.0.0');
    const secrets = new MapSecrets({ db: JSON.stringify({ username: 'u', password: 'p', host: '0.0.0.0', port: listener.port, dbname: 'd' }) });
    const env = { DATABASE_SECRET_ID: 'db', DATABASE_SSL: 'disable', KAFKA_BROKERS: '127.0.0.1:9092', DATABASE_CONNECT_TIMEOUT_MS: '300' };
    const rt = new Runtime(loadConfig(env), capture().logger, secrets);
    try {
      await assert.rejects(rt.database(), (err: unknown) => err instanceof ConfigError && /^invalid configuration:\n {2}- DATABASE_SSL=disable sends the database login and every row unencrypted to 0\.0\.0\.0.*OUTBOX_ALLOW_PLAINTEXT_LOGIN=true/.test(err.message));
    } finally {
      await rt.close();
    }
    const { lines, logger } = capture();
    const allowed = new Runtime(loadConfig({ ...env, OUTBOX_ALLOW_PLAINTEXT_LOGIN: 'true' }), logger, secrets);
    try {
      await assert.rejects(allowed.database(), DatabaseError);
      assert.equal((await listener.seen).equals(SSL_REQUEST), false, 'plaintext, as allowed');
      const warnings = lines.filter((l) => l.level === 'WARN').map((l) => String(l.message));
      assert.deepEqual(warnings, ['OUTBOX_ALLOW_PLAINTEXT_LOGIN=true allows it: DATABASE_SSL=disable sends the database login and every row unencrypted to 0.0.0.0, for anyone on the network path to read or alter']);
    } finally {
      await allowed.close();
      await listener.close();
    }
  });

  it("a secret's URL is read as postgres.js reads it, before any connection: a duplicate sslmode, prefer, user info holding '@' off this machine are refused", async () => {
    const urls = {
      twice: 'postgres://u:p@db.example.com/d?sslmode=require&sslmode=disable',
      prefer: 'postgres://u:p@db.example.com/d?sslmode=prefer',
      at: 'postgres://u:p@evil.example:5432,x@127.0.0.1,localhost/d?sslmode=disable',
    };
    const rt = (id: string) => new Runtime(loadConfig({ DATABASE_SECRET_ID: id, KAFKA_BROKERS: '127.0.0.1:9092' }), capture().logger, new MapSecrets(urls));
    const refused: Record<keyof typeof urls, RegExp> = {
      twice: /the URL of the secret "twice" gives the query parameter "sslmode" more than once/,
      prefer: /the database URL's sslmode=prefer falls back to no encryption .* unencrypted to db\.example\.com/,
      at: /the database URL's sslmode=disable sends the database login and every row unencrypted to evil\.example,x@127\.0\.0\.1,localhost/,
    };
    for (const [id, problem] of Object.entries(refused)) {
      const runtime = rt(id);
      try {
        await assert.rejects(runtime.database(), (err: unknown) => err instanceof ConfigError && problem.test(err.message), id);
      } finally {
        await runtime.close();
      }
    }
  });

  it('an allowed SASL login in the clear to brokers off this machine is logged at start, saying what it risks', () => {
    const { lines, logger } = capture();
    new Runtime(loadConfig({ ...remote, DATABASE_URL: local.DATABASE_URL, KAFKA_SECRET_ID: 'k', KAFKA_SSL: 'false', OUTBOX_ALLOW_PLAINTEXT_LOGIN: 'true' }), logger);
    assert.match(String(lines.find((l) => l.level === 'WARN')?.message), /^OUTBOX_ALLOW_PLAINTEXT_LOGIN=true allows it: KAFKA_SSL=false would send the SASL login of KAFKA_SECRET_ID unencrypted to b-1\.example\.com:9096/);
  });
});
