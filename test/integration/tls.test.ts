// services: postgres, kafka, moto
// TLS as production has it: the local Postgres (ssl = on) and the broker's SSL and SASL_SSL
// listeners present certificates of a CA that scripts/services/tls.sh made (.cache/tls). The relay
// runs as a process of its own in every test, since Node reads NODE_EXTRA_CA_CERTS only at start.
// Guarantees: G8 (a certificate for another host, or from a CA Node does not trust, is refused
// before any login is sent, saying what to do) and G1 over TLS (what is marked is on Kafka). The
// run-tests.ts pass `platformatic` runs the guarantee files over TLS as well (helpers.ts, VIA_TLS).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { before, describe, it } from 'node:test';
import { CreateSecretCommand, DeleteSecretCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import {
  AWS_ENDPOINT_URL,
  KAFKA_SCRAM_PASSWORD,
  KAFKA_CLIENT,
  KAFKA_SCRAM_USER,
  KAFKA_SSL_BROKERS,
  TLS_CA,
  TLS_DIR,
  consumeAll,
  counts,
  fileDb,
  fixture,
  insertEvents,
  invokeOk,
  runCli,
  uniqueName,
} from './helpers.ts';

const sql = fileDb();
/** the shared broker's SASL_SSL listener (scripts/services/kafka.sh) */
const KAFKA_SASL_SSL_BROKERS = '127.0.0.1:9100';
const tlsDb = { DATABASE_SSL: 'verify-full', NODE_EXTRA_CA_CERTS: TLS_CA };

describe('G1 over TLS: Postgres verify-full and Kafka SSL, the CA given by NODE_EXTRA_CA_CERTS', () => {
  it('the relay delivers and marks every row over SSL, and over SASL_SSL with SCRAM', async () => {
    const sm = new SecretsManagerClient({ endpoint: AWS_ENDPOINT_URL, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' }, maxAttempts: 2 });
    const secretId = `outbox-relay-test/${uniqueName('tls')}`;
    await sm.send(new CreateSecretCommand({ Name: secretId, SecretString: JSON.stringify({ username: KAFKA_SCRAM_USER, password: KAFKA_SCRAM_PASSWORD, mechanism: 'scram-sha-512' }) }));
    try {
      const f = await fixture(sql, 'tls');
      await insertEvents(sql, f.table, [1, 2, 3].map((n) => ({ aggregateid: `a${n}` })));
      const ssl = await invokeOk({ ...f.env, ...tlsDb, KAFKA_BROKERS: KAFKA_SSL_BROKERS, KAFKA_SSL: 'true' });
      assert.equal(ssl.published, 3);
      await insertEvents(sql, f.table, [4, 5].map((n) => ({ aggregateid: `a${n}` })));
      const aws = { AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test', AWS_REGION: 'us-east-1' };
      const sasl = await invokeOk({ ...f.env, ...tlsDb, ...aws, KAFKA_BROKERS: KAFKA_SASL_SSL_BROKERS, KAFKA_SSL: 'true', KAFKA_SECRET_ID: secretId });
      assert.equal(sasl.published, 2);
      assert.equal((await consumeAll([f.topic('order')], 5)).length, 5);
      assert.deepEqual(await counts(sql, f.table), { total: 5, sent: 5, parked: 0, pending: 0 });
    } finally {
      await sm.send(new DeleteSecretCommand({ SecretId: secretId, ForceDeleteWithoutRecovery: true })).catch(() => undefined);
    }
  });

  it("the database connection is TLS on the server's side, with the certificate checked", async () => {
    // the same CLI, status only: the server's pg_stat_ssl for the relay's own connection
    const appName = uniqueName('tlsapp');
    const f = await fixture(sql, 'tlsstat');
    const res = await runCli(['status', '--json'], { ...f.env, ...tlsDb, OUTBOX_CLIENT_ID: appName });
    assert.equal(res.code, 0, res.stderr);
    // without the CA, the same server is refused: the relay does check the certificate
    const refused = await runCli(['status'], { ...f.env, DATABASE_SSL: 'verify-full' });
    assert.notEqual(refused.code, 0);
    assert.match(refused.stderr, /the database's TLS certificate is not signed by a CA this process trusts .*NODE_EXTRA_CA_CERTS=/);
  });
});

/**
 * A server on this machine presenting the certificate `name` of .cache/tls: as Postgres does
 * (an SSLRequest answered 'S', then TLS) or as a Kafka SSL listener does (TLS at once).
 */
async function impostor(name: string, as: 'postgres' | 'kafka', host = '127.0.0.1'): Promise<{ port: number; handshakes: () => number; close(): Promise<void> }> {
  const context = { key: readFileSync(`${TLS_DIR}/${name}.key`), cert: readFileSync(`${TLS_DIR}/${name}.pem`) };
  let handshakes = 0;
  const secure = (socket: net.Socket) => {
    const s = new tls.TLSSocket(socket, { isServer: true, ...context });
    s.on('secure', () => (handshakes += 1));
    s.on('error', () => socket.destroy());
  };
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
    if (as === 'kafka') return secure(socket);
    socket.once('data', () => {
      socket.write('S');
      secure(socket);
    });
  });
  await new Promise<void>((r) => server.listen(0, host, r));
  const close = () =>
    new Promise<void>((r) => {
      server.close(() => r());
      for (const socket of sockets) socket.destroy();
    });
  return { port: (server.address() as net.AddressInfo).port, handshakes: () => handshakes, close };
}

describe('G8: a certificate for another host, or from an unknown CA, is refused saying what to do', () => {
  const cases = [
    { cert: 'wrong-host', problem: /TLS certificate is not for the host (127\.0\.0\.1 )?the relay connected to \(.*127\.0\.0\.1.*\): connect by a name the certificate lists/ },
    { cert: 'unknown-ca-server', problem: /TLS certificate is not signed by a CA this process trusts .*: give Node the CA's certificate with NODE_EXTRA_CA_CERTS=/ },
  ];
  it('the right certificate at another address: the one for localhost and 127.0.0.1, reached at 127.0.0.2, is refused (postgres.js alone checks an IP host against "localhost")', async () => {
    const server = await impostor('server', 'postgres', '127.0.0.2');
    try {
      const res = await runCli(['status'], { DATABASE_URL: `postgres://outbox:outbox@127.0.0.2:${server.port}/outbox`, KAFKA_BROKERS: '127.0.0.1:9092', ...tlsDb });
      assert.notEqual(res.code, 0);
      assert.match(res.stderr, /the database's TLS certificate is not for the host 127\.0\.0\.2 the relay connected to \(IP: 127\.0\.0\.2 is not in the cert's list: 127\.0\.0\.1\): connect by a name/);
      assert.equal(server.handshakes(), 0);
    } finally {
      await server.close();
    }
  });

  for (const { cert, problem } of cases) {
    it(`${cert}: Postgres with verify-full`, async () => {
      const server = await impostor(cert, 'postgres');
      try {
        const res = await runCli(['status'], { DATABASE_URL: `postgres://outbox:outbox@127.0.0.1:${server.port}/outbox`, KAFKA_BROKERS: '127.0.0.1:9092', ...tlsDb });
        assert.notEqual(res.code, 0);
        assert.match(res.stderr, /database/);
        assert.match(res.stderr, problem);
        assert.equal(server.handshakes(), 0, 'no handshake completed: nothing was sent to it');
      } finally {
        await server.close();
      }
    });

    it(`${cert}: Kafka over SSL (${KAFKA_CLIENT})`, async () => {
      const server = await impostor(cert, 'kafka');
      try {
        const f = await fixture(sql, 'tlsref');
        await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
        const res = await runCli(['invoke', '--timeout', '15000'], { ...f.env, ...tlsDb, KAFKA_BROKERS: `127.0.0.1:${server.port}`, KAFKA_SSL: 'true' });
        assert.notEqual(res.code, 0);
        assert.match(res.stderr, /broker/);
        assert.match(res.stderr, problem);
        assert.equal(server.handshakes(), 0);
        assert.deepEqual(await counts(sql, f.table), { total: 1, sent: 0, parked: 0, pending: 1 });
      } finally {
        await server.close();
      }
    });
  }
});

before(() => assert.ok(readFileSync(TLS_CA, 'utf8').includes('BEGIN CERTIFICATE'), `${TLS_CA}: run npm run services:up (scripts/services/tls.sh makes it)`));
