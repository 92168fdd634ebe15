// Where the relay connects (src/outbox/client.ts, DatabaseTarget; src/lambda/secrets.ts): an RDS-style
// JSON secret's fields become postgres.js options as they are, never parts of a URL, so a host
// that holds URL syntax cannot add connection parameters, hosts or a port. postgres.js builds a
// client without connecting, so its parsed options show what it would send.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import postgres from 'postgres';
import { SecretError } from '../../src/errors.ts';
import { CLIENT_OPTIONS, clientFor } from '../../src/outbox/client.ts';
import { databaseTargetFromSecret } from '../../src/lambda/secrets.ts';

const rds = (over: Record<string, unknown> = {}) => JSON.stringify({ username: 'relay', password: 'pw', host: 'db.example.com', port: 5432, dbname: 'app', engine: 'postgres', ...over });

describe('database target from a secret', () => {
  it('an RDS-style JSON secret gives its fields, a URL secret its URL', () => {
    assert.deepEqual(databaseTargetFromSecret('s', rds()), { host: 'db.example.com', user: 'relay', database: 'app', port: 5432, password: 'pw' });
    assert.deepEqual(databaseTargetFromSecret('s', rds({ port: '6432', dbname: undefined })), { host: 'db.example.com', user: 'relay', database: 'postgres', port: 6432, password: 'pw' });
    assert.deepEqual(databaseTargetFromSecret('s', ' postgres://u:p@h:5432/d?sslmode=require '), { url: 'postgres://u:p@h:5432/d?sslmode=require' });
  });

  it('a hostile host cannot add connection parameters, hosts, a port or a socket: it stays one host, verbatim', () => {
    const hostile = [
      'db.example.com/app?sslmode=disable&options=-c%20search_path%3Devil&application_name=x#',
      'evil.example.com:6543,db.example.com',
      'user@evil.example.com',
      '/tmp',
    ];
    for (const host of hostile) {
      const target = databaseTargetFromSecret('s', rds({ host }));
      const sql = clientFor(target, { ...CLIENT_OPTIONS, ssl: 'verify-full', connection: { application_name: 'outbox-relay' } });
      const o = sql.options;
      assert.deepEqual(o.host, [host], host);
      assert.deepEqual(o.port, [5432], host);
      assert.equal(o.path, false, `${host}: not a Unix socket`);
      assert.equal(o.ssl, 'verify-full', host);
      assert.equal(o.user, 'relay');
      assert.equal(o.database, 'app');
      assert.deepEqual(o.connection, { application_name: 'outbox-relay' }, `${host}: no startup parameter but the relay's own`);
    }
    // the same host pasted into a URL, as before: it turned TLS off and set the session's search_path
    const pasted = postgres(`postgres://relay:pw@${hostile[0]}:5432/app`).options;
    assert.equal(pasted.ssl, false);
    assert.equal(pasted.connection.options, '-c search_path=evil');
  });

  it('a NUL in the host, username or dbname is refused: the startup message would end the value there and read on as a parameter of its own', () => {
    for (const [field, value] of [['host', 'db\0x'], ['username', 'relay\0options'], ['dbname', 'app\0options']] as const) {
      assert.throws(
        () => databaseTargetFromSecret('outbox/db', rds({ [field]: value })),
        (err: unknown) => err instanceof SecretError && err.message === `secret "outbox/db": has a NUL character in ${field}` && !err.message.includes(value),
      );
    }
  });
});
