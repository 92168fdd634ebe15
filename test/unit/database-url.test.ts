// The relay reads a postgres:// URL as postgres.js does (src/database-url.ts): for generated URLs,
// the hosts, ports, Unix socket, password and TLS mode it judges are the ones postgres(url).options
// shows (a client built without connecting). Odd user info, host lists, percent-encoding and
// ssl/sslmode/sslrootcert mixes are where two readings once parted.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import postgres from 'postgres';
import { judgedHosts, parseDatabaseUrl, type SslMode } from '../../src/database-url.ts';
import { ConfigError } from '../../src/errors.ts';

/** What postgres.js does with its `ssl`, in the relay's terms (postgres.js connection.js, secure()). */
function driverMode(ssl: unknown): SslMode {
  if (ssl === false || ssl === '') return 'disable';
  if (ssl === 'allow' || ssl === 'prefer' || ssl === 'require') return ssl;
  return 'verify-full';
}

const driverOptions = (url: string) => postgres(url, { max: 1 }).options;

// postgres.js falls back to these where a URL is silent; the comparison is of what the URL says
const PG_ENV = ['PGHOST', 'PGPORT', 'PGSSL', 'PGUSER', 'PGUSERNAME', 'PGPASSWORD', 'PGDATABASE'];
const saved: Record<string, string | undefined> = {};
before(() => PG_ENV.forEach((k) => ((saved[k] = process.env[k]), delete process.env[k])));
after(() => PG_ENV.forEach((k) => (saved[k] === undefined ? delete process.env[k] : (process.env[k] = saved[k]))));

describe('database URL: read as postgres.js reads it', () => {
  it('the three URLs that sent a password in the clear: the relay sees what the driver connects to', () => {
    const multi = parseDatabaseUrl('postgres://u:p@evil.example:5432,x@127.0.0.1,localhost/db', 'DATABASE_URL');
    assert.deepEqual(multi.hosts, driverOptions('postgres://u:p@evil.example:5432,x@127.0.0.1,localhost/db').host);
    assert.deepEqual(multi.hosts, ['evil.example', 'x@127.0.0.1', 'localhost']);
    assert.throws(
      () => parseDatabaseUrl('postgres://u:p@db.example.com/db?sslmode=require&sslmode=disable', 'DATABASE_URL'),
      (err: unknown) => err instanceof ConfigError && /^DATABASE_URL gives the query parameter "sslmode" more than once/.test(err.problems[0]!),
    );
    assert.equal(parseDatabaseUrl('postgres://u:p@db.example.com/db?sslmode=prefer', 'DATABASE_URL').sslmode, 'prefer');
  });

  it('a host list naming a directory is a Unix socket, judged as this machine', () => {
    const url = 'postgres://u@%2Fvar%2Frun%2Fpostgresql,x/db';
    const parsed = parseDatabaseUrl(url, 'DATABASE_URL');
    assert.equal(parsed.socket, driverOptions(url).path);
    assert.deepEqual(judgedHosts(parsed), ['/var/run/postgresql,x/.s.PGSQL.5432']);
  });

  it('property: for generated URLs, hosts, ports, socket, password and TLS mode equal postgres(url).options; a URL the driver refuses is refused', () => {
    const piece = (parts: string[]) => fc.array(fc.constantFrom(...parts), { minLength: 0, maxLength: 5 }).map((xs) => xs.join(''));
    const userinfo = fc.option(
      fc.tuple(piece(['u', 'a', '1', '@', ':', ',', '.', '-', '%40', '%2C', '%3A', '%25']), fc.option(piece(['p', 'w', '@', ':', ',', '%40', '%2C', '%2F', '!']))).map(([u, p]) => (p === null ? `${u}@` : `${u}:${p}@`)),
      { nil: '' },
    );
    const host = fc.constantFrom('localhost', '127.0.0.1', 'db.example.com', 'evil.example', 'h1', '10.0.0.5', 'LocalHost', '%2Ftmp', 'x%2Cy', 'a@b', '');
    const port = fc.option(fc.constantFrom('5432', '5433', '6432', '0', 'x'), { nil: undefined });
    const hosts = fc.array(fc.tuple(host, port).map(([h, p]) => (p === undefined ? h : `${h}:${p}`)), { minLength: 1, maxLength: 3 }).map((hs) => hs.join(','));
    const param = fc.tuple(
      fc.constantFrom('sslmode', 'ssl', 'sslrootcert', 'application_name', 'host', 'options'),
      fc.constantFrom('disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full', 'true', 'false', '', 'system', 'x', 'no-verify'),
    );
    const query = fc.option(fc.array(param, { minLength: 1, maxLength: 3 }).map((ps) => `?${ps.map(([k, v]) => `${k}=${v}`).join('&')}`), { nil: '' });
    const url = fc.tuple(fc.constantFrom('postgres', 'postgresql'), userinfo, hosts, fc.constantFrom('/db', '', '/'), query, fc.constantFrom('', '#f', '#@x')).map((parts) => `${parts[0]}://${parts.slice(1).join('')}`);

    let compared = 0;
    fc.assert(
      fc.property(url, (u) => {
        let driver: ReturnType<typeof driverOptions> | undefined;
        try {
          driver = driverOptions(u);
        } catch {
          driver = undefined;
        }
        let mine: ReturnType<typeof parseDatabaseUrl> | undefined;
        try {
          mine = parseDatabaseUrl(u, 'DATABASE_URL');
        } catch (err) {
          // the relay refuses what the driver refuses, and more (no host, duplicates, bad ports): never anything else
          assert.ok(err instanceof ConfigError, `${u}: ${String(err)}`);
          return;
        }
        assert.ok(driver, `${u}: postgres.js refuses it, the relay took it`);
        compared++;
        assert.deepEqual(mine.hosts, driver.host, u);
        assert.deepEqual(mine.ports, driver.port, u);
        assert.equal(mine.socket ?? false, driver.path, u);
        assert.equal(mine.password, driver.pass, u);
        assert.equal(mine.sslmode ?? 'disable', driverMode(driver.ssl), u);
      }),
      { numRuns: 3_000 },
    );
    // not a property of refusals only
    assert.ok(compared > 500, `only ${compared} URLs compared`);
  });
});
