// services: postgres, kafka
// KAFKA_AUTH=iam against a broker that checks Amazon MSK IAM tokens for real: a private broker
// (private-broker.ts; the shared one is never touched) with a SASL/OAUTHBEARER listener whose
// server-side validator, scripts/services/MskIamValidator.java, recomputes each token's SigV4
// signature with the local AWS emulator's key (test/test) and refuses a token signed with another
// key, for an unknown key, or expired. The listener is SASL_SSL as MSK's is: every client here
// connects over TLS, checking the certificate against the services' CA (.cache/tls/ca.pem) and the
// host name. The relay signs with aws-msk-iam-sasl-signer-js and the
// AWS SDK's default credentials, here the emulator's in the environment. Guarantees: G1 (what is
// marked is on Kafka; a refused login marks nothing and charges no row) and G8 (a refused or
// unsignable token fails the invocation saying what to check).
// (The shared broker is on the services line only because the fixtures' helpers load with it;
// every topic of this file is on its private brokers.)
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import tls from 'node:tls';
import kafkajs from 'kafkajs';
import { generateAuthToken } from 'aws-msk-iam-sasl-signer-js';
import type { Sql } from 'postgres';
import { loadConfig } from '../../src/config/load.ts';
import type { MskIamTokens } from '../../src/kafka/msk-iam.ts';
import { createLogger } from '../../src/log.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { consumeAll, counts, db, fixture, idsOf, insertEvents, invokeOk, rowStates, runCli, TLS_CA, useKafka, type Fixture } from './helpers.ts';
import { startPrivateBroker, type PrivateBroker } from './private-broker.ts';

/** the emulator's credentials, the ones MskIamValidator knows */
const AWS = { AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test', AWS_REGION: 'us-east-1' };

let sql: Sql;
const savedEnv = { ...process.env };
before(() => {
  sql = db();
  // this process signs too: the expired token's test, and the warm container's invocations
  Object.assign(process.env, AWS);
  // and trusts the services' CA as the relays it starts do with NODE_EXTRA_CA_CERTS (read only
  // when a process starts): for the warm container's relay, which runs in this process
  tls.setDefaultCACertificates([...tls.getCACertificates('default'), readFileSync(TLS_CA, 'utf8')]);
});
after(async () => {
  await sql.end();
  process.env = savedEnv;
});

/**
 * The relay's environment for the fixture, logging in to the broker's IAM listener over TLS as in
 * production (on loopback, KAFKA_SSL is off by default), trusting the services' CA.
 */
function iamEnv(f: Fixture, broker: PrivateBroker, aws: Record<string, string> = AWS): Record<string, string> {
  return { ...f.env, KAFKA_BROKERS: broker.iamAddress!, KAFKA_AUTH: 'iam', KAFKA_SSL: 'true', NODE_EXTRA_CA_CERTS: TLS_CA, ...aws };
}

/** The reasons MskIamValidator gave for the tokens it refused since `from` (a length of its log). */
function refusals(broker: PrivateBroker, from = 0): string[] {
  return [...readFileSync(broker.logFile, 'utf8').slice(from).matchAll(/MskIamValidator: refused a token: (.*)/g)].map((m) => m[1]!);
}

const logSize = (broker: PrivateBroker) => readFileSync(broker.logFile, 'utf8').length;

describe('MSK IAM: tokens the broker verifies (KAFKA_AUTH=iam)', () => {
  let broker: PrivateBroker;
  before(async () => {
    broker = await startPrivateBroker({ mskIam: {} });
    useKafka(broker.address);
  });
  after(async () => {
    await broker?.stop();
  });

  it('the IAM listener is TLS, as MSK\'s: its certificate checks out against the CA for 127.0.0.1, and a client speaking plaintext to it is never answered', async () => {
    const [host, port] = [broker.iamAddress!.split(':')[0]!, Number(broker.iamAddress!.split(':')[1])];
    const secure = tls.connect({ host, port, ca: readFileSync(TLS_CA) });
    try {
      await new Promise<void>((resolve, reject) => secure.once('secureConnect', resolve).once('error', reject));
      assert.equal(secure.authorized, true, String(secure.authorizationError));
    } finally {
      secure.destroy();
    }
    // a Kafka ApiVersions request in the clear, as a client with KAFKA_SSL=false sends first: the
    // listener takes it for a bad TLS record and closes the connection without a Kafka answer
    const plain = net.connect(port, host);
    const answer = await new Promise<Buffer>((resolve, reject) => {
      const chunks: Buffer[] = [];
      plain.on('data', (d: Buffer) => chunks.push(d));
      plain.once('close', () => resolve(Buffer.concat(chunks)));
      plain.once('error', reject);
      const clientId = Buffer.from('plaintext');
      const body = Buffer.alloc(10 + clientId.length);
      body.writeInt16BE(18, 0); // ApiVersions
      body.writeInt16BE(0, 2); // v0
      body.writeInt32BE(1, 4); // correlation id
      body.writeInt16BE(clientId.length, 8);
      clientId.copy(body, 10);
      const size = Buffer.alloc(4);
      size.writeInt32BE(body.length);
      plain.write(Buffer.concat([size, body]));
    }).finally(() => plain.destroy());
    // a Kafka answer starts with its size then correlation id 1; a TLS alert record starts with 0x15
    assert.ok(answer.length < 8 || answer.readInt32BE(4) !== 1, `the listener answered a plaintext Kafka request: ${answer.toString('hex').slice(0, 80)}`);
  });

  it('G1: the relay publishes through the IAM listener with a signed token; every row marked is on Kafka', async () => {
    const f = await fixture(sql, 'mskiam');
    const ids = await insertEvents(sql, f.table, Array.from({ length: 30 }, (_, i) => ({ aggregateid: `a-${i % 5}`, payload: { i } })));
    const s = await invokeOk(iamEnv(f, broker));
    assert.equal(s.published, 30);
    assert.deepEqual(await counts(sql, f.table), { total: 30, sent: 30, parked: 0, pending: 0 });
    const msgs = await consumeAll([f.topic('order')], 30);
    assert.deepEqual(new Set(idsOf(msgs)), new Set(ids));
  });

  it('G1/G8: a token signed with another secret key, or for an access key the cluster does not know, is refused: the invocation fails saying so, nothing is marked, no row is charged', async () => {
    const f = await fixture(sql, 'mskiamrefused');
    await insertEvents(sql, f.table, Array.from({ length: 5 }, (_, i) => ({ aggregateid: `a-${i}`, payload: { i } })));
    for (const [aws, reason] of [
      [{ ...AWS, AWS_SECRET_ACCESS_KEY: 'not-the-secret' }, /signature does not match/],
      [{ ...AWS, AWS_ACCESS_KEY_ID: 'AKIAUNKNOWNKEY000000' }, /unknown access key AKIAUNKNOWNKEY000000/],
    ] as const) {
      const from = logSize(broker);
      const res = await runCli(['invoke', '--timeout', '20000'], iamEnv(f, broker, aws));
      assert.equal(res.code, 1, res.stderr.slice(-2_000));
      assert.match(res.stderr, /Kafka refused the relay's MSK IAM token \([A-Za-z_]+\): check that the relay's AWS credentials .* may kafka-cluster:Connect/);
      assert.equal(res.summary?.stoppedBecause, 'broker-unavailable');
      assert.equal(res.summary?.published, 0);
      const refused = refusals(broker, from);
      assert.ok(refused.length > 0 && refused.every((r) => reason.test(r)), `the broker's reasons: ${JSON.stringify(refused)}`);
      const states = await rowStates(sql, f.table);
      assert.equal(states.filter((r) => r.sent).length, 0, 'nothing marked');
      assert.equal(Math.max(...states.map((r) => r.attempts)), 0, 'a refused login is charged to no row');
    }
    // the same rows, with the right key
    assert.equal((await invokeOk(iamEnv(f, broker))).published, 5);
  });

  it('G8: KAFKA_AUTH=iam with a Kafka secret too is a configuration error: exit 2, saying which to unset, before anything connects', async () => {
    const f = await fixture(sql, 'mskiamsecret');
    await insertEvents(sql, f.table, [{ aggregateid: 'a', payload: {} }]);
    const res = await runCli(['invoke', '--timeout', '20000'], { ...iamEnv(f, broker), KAFKA_SECRET_ID: 'outbox/kafka' });
    assert.equal(res.code, 2, res.stderr.slice(-2_000));
    assert.match(res.stderr, /ConfigError: invalid configuration:\n {2}- KAFKA_AUTH=iam logs in with tokens signed by the function's AWS credentials and takes no secret, and KAFKA_SECRET_ID is set too: unset KAFKA_SECRET_ID/);
    assert.deepEqual(await counts(sql, f.table), { total: 1, sent: 0, parked: 0, pending: 1 });
  });

  it('G8: no AWS credentials at all: the invocation fails saying none were found and what to set, before any connection; nothing is marked', async () => {
    const f = await fixture(sql, 'mskiamnocreds');
    await insertEvents(sql, f.table, [{ aggregateid: 'a', payload: {} }]);
    // no key in the environment, no ~/.aws, and no instance metadata to ask (it would time out)
    const res = await runCli(['invoke', '--timeout', '20000'], iamEnv(f, broker, { AWS_REGION: 'us-east-1', AWS_EC2_METADATA_DISABLED: 'true', HOME: '/nonexistent' }));
    assert.equal(res.code, 1, res.stderr.slice(-2_000));
    assert.match(res.stderr, /no AWS credentials for MSK IAM: could not sign a token for region us-east-1: .*AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY/);
    assert.deepEqual(await counts(sql, f.table), { total: 1, sent: 0, parked: 0, pending: 1 });
    assert.equal((await rowStates(sql, f.table))[0]!.attempts, 0);
  });
});

describe('MSK IAM: tokens that expire (a listener that takes them for 15 seconds)', () => {
  // above kafkajs' reauthenticationThreshold (10 s): a session shorter than that has it
  // re-authenticate before every request
  const LIFETIME_S = 15;
  let broker: PrivateBroker;
  before(async () => {
    // tokens live 15 s whatever they say (X-Amz-Expires=900), and the broker ends a session when
    // its token expires: connections.max.reauth.ms on, above the tokens' lifetime
    broker = await startPrivateBroker({ mskIam: { maxLifetimeSeconds: LIFETIME_S, maxReauthMs: 60_000 } });
    useKafka(broker.address);
  });
  after(async () => {
    await broker?.stop();
  });

  it('G8: an expired token is refused by the broker (a client logging in with a token signed before its lifetime ran out)', async () => {
    const { token } = await generateAuthToken({ region: 'us-east-1' });
    await new Promise((r) => setTimeout(r, (LIFETIME_S + 1) * 1_000));
    const from = logSize(broker);
    const client = new kafkajs.Kafka({
      brokers: [broker.iamAddress!],
      ssl: true,
      logLevel: kafkajs.logLevel.NOTHING,
      retry: { retries: 0 },
      sasl: { mechanism: 'oauthbearer', oauthBearerProvider: () => Promise.resolve({ value: token }) },
    });
    const admin = client.admin();
    try {
      // (kafkajs' own OAUTHBEARER takes the refusal for success, and fails at the next request)
      await assert.rejects(async () => {
        await admin.connect();
        await admin.listTopics();
      });
    } finally {
      await admin.disconnect();
    }
    const refused = refusals(broker, from);
    assert.ok(refused.length > 0 && refused.every((r) => /^expired at .* lifetime 15\.0 s\)$/.test(r)), JSON.stringify(refused));
    // the same key, signed now: accepted
    const fresh = new kafkajs.Kafka({ brokers: [broker.iamAddress!], ssl: true, logLevel: kafkajs.logLevel.NOTHING, retry: { retries: 0 }, sasl: { mechanism: 'oauthbearer', oauthBearerProvider: async () => ({ value: (await generateAuthToken({ region: 'us-east-1' })).token }) } }).admin();
    await fresh.connect();
    await fresh.disconnect();
  });

  it('G1: a warm container whose cached token expired between invocations replaces it: the next invocation publishes, not fatal', async () => {
    const f = await fixture(sql, 'mskiamwarm');
    const logs: string[] = [];
    // in this process, as a warm Lambda container runs its invocations; the signer reads the
    // credentials from this process' environment
    const rt = new Runtime(loadConfig(iamEnv(f, broker)), createLogger('info', {}, (l) => logs.push(l)));
    const tokens = () => (rt as unknown as { mskIam: MskIamTokens }).mskIam;
    try {
      const first = await insertEvents(sql, f.table, Array.from({ length: 5 }, (_, i) => ({ aggregateid: `a-${i}`, payload: { i } })));
      assert.equal((await rt.invoke(20_000)).published, 5);
      assert.equal(tokens().signed, 1);
      // the container sits idle past the token's lifetime; the broker ends its session
      await new Promise((r) => setTimeout(r, (LIFETIME_S + 2) * 1_000));
      const second = await insertEvents(sql, f.table, Array.from({ length: 5 }, (_, i) => ({ aggregateid: `a-${i}`, payload: { i: i + 5 } })));
      const s = await rt.invoke(20_000);
      assert.equal(s.published, 5, JSON.stringify(s));
      assert.equal(s.stoppedBecause, 'empty');
      assert.ok(tokens().signed >= 2, `the expired token was replaced (${tokens().signed} signed)`);
      assert.deepEqual(await counts(sql, f.table), { total: 10, sent: 10, parked: 0, pending: 0 });
      const msgs = await consumeAll([f.topic('order')], 10);
      assert.deepEqual(new Set(idsOf(msgs)), new Set([...first, ...second]));
    } finally {
      await rt.close();
    }
  });
});
