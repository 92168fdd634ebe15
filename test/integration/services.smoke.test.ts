// services: postgres, kafka, moto
// Smoke test of the local services (bash scripts/services.sh up) through the very libraries the
// relay uses: kafkajs, @aws-sdk/client-secrets-manager and postgres.js. It expects the services to
// be up already and says which one is not, and how to start it, when they are not.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { CompressionTypes, Kafka, logLevel, Partitioners, type Admin, type Consumer, type Producer, type SASLOptions } from 'kafkajs';
import {
  CreateSecretCommand,
  DeleteSecretCommand,
  GetSecretValueCommand,
  PutSecretValueCommand,
  SecretsManagerClient,
} from '@aws-sdk/client-secrets-manager';
import postgres from 'postgres';
import { KAFKA_SASL_BROKERS, KAFKA_SCRAM_PASSWORD, KAFKA_SCRAM_USER, setScramPassword } from './helpers.ts';

const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://outbox:outbox@127.0.0.1:5432/outbox';
const KAFKA_BROKERS = (process.env.KAFKA_BROKERS ?? '127.0.0.1:9092').split(',');
const AWS_ENDPOINT_URL = process.env.AWS_ENDPOINT_URL ?? 'http://127.0.0.1:4566';
const HINT = 'start the local services first: npm run services:up (status: npm run services:status)';

function unreachable(what: string, err: unknown): Error {
  const reason = err instanceof Error ? err.message : String(err);
  return new Error(`${what} is not reachable (${reason}); ${HINT}`, { cause: err });
}

describe('postgres on 127.0.0.1:5432 (postgres.js)', () => {
  const sql = postgres(DATABASE_URL, { max: 1, connect_timeout: 5, onnotice: () => {} });
  after(() => sql.end({ timeout: 5 }));

  test('select 1 and wal_level = logical', async () => {
    let one: { one: number }[];
    try {
      one = await sql<{ one: number }[]>`select 1 as one`;
    } catch (err) {
      throw unreachable(`Postgres at ${DATABASE_URL.replace(/:[^:@/]*@/, ':***@')}`, err);
    }
    assert.equal(one[0]?.one, 1);
    const [wal] = await sql<{ wal_level: string }[]>`show wal_level`;
    assert.equal(wal?.wal_level, 'logical');
    const [who] = await sql<{ current_user: string; current_database: string }[]>`select current_user, current_database()`;
    assert.deepEqual({ ...who }, { current_user: 'outbox', current_database: 'outbox' });
  });
});

describe('kafka on 127.0.0.1:9092 (kafkajs)', () => {
  const kafka = new Kafka({
    clientId: 'services-smoke',
    brokers: KAFKA_BROKERS,
    connectionTimeout: 3_000,
    retry: { retries: 5, initialRetryTime: 200 },
    logLevel: logLevel.WARN,
  });
  const topic = `smoke.services.${randomUUID()}`;
  let admin: Admin;
  let producer: Producer | undefined;
  let consumer: Consumer | undefined;

  before(async () => {
    admin = kafka.admin();
    try {
      await admin.connect();
      await admin.listTopics();
    } catch (err) {
      throw unreachable(`Kafka at ${KAFKA_BROKERS.join(',')}`, err);
    }
  });

  after(async () => {
    await consumer?.disconnect();
    await producer?.disconnect();
    await admin.deleteTopics({ topics: [topic] }).catch(() => {});
    await admin.disconnect();
  });

  test('auto.create.topics.enable is false on the broker', async () => {
    const configs = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: 4 /* BROKER */, name: '1', configNames: ['auto.create.topics.enable'] }],
    });
    const entry = configs.resources[0]?.configEntries.find((e) => e.configName === 'auto.create.topics.enable');
    assert.equal(entry?.configValue, 'false');
  });

  test('idempotent producer (acks=all, gzip, key, headers) and a consumer group read it back', async () => {
    assert.equal(await admin.createTopics({ topics: [{ topic, numPartitions: 3 }], waitForLeaders: true }), true);

    producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    await producer.connect();
    const id = randomUUID();
    const value = JSON.stringify({ orderId: 'o-1', total: 42 });
    const [meta] = await producer.send({
      topic,
      acks: -1,
      compression: CompressionTypes.GZIP,
      messages: [{ key: 'order-1', value, headers: { id, type: 'OrderCreated' } }],
    });
    assert.equal(meta?.errorCode, 0);

    consumer = kafka.consumer({ groupId: `smoke-${randomUUID()}`, sessionTimeout: 10_000, heartbeatInterval: 1_000 });
    await consumer.connect();
    await consumer.subscribe({ topics: [topic], fromBeginning: true });
    const got = await new Promise<{ key: string; value: string; headers: Record<string, string>; partition: number }>(
      (resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('no message consumed within 30 s')), 30_000);
        consumer!
          .run({
            eachMessage: async ({ message, partition }) => {
              clearTimeout(timer);
              const headers: Record<string, string> = {};
              for (const [k, v] of Object.entries(message.headers ?? {})) headers[k] = String(v);
              resolve({ key: String(message.key), value: String(message.value), headers, partition });
              return Promise.resolve();
            },
          })
          .catch(reject);
      },
    );
    assert.equal(got.key, 'order-1');
    assert.equal(got.value, value);
    assert.deepEqual(got.headers, { id, type: 'OrderCreated' });
    assert.equal(got.partition, meta?.partition);
  });
});

describe(`kafka SASL/SCRAM on ${KAFKA_SASL_BROKERS} (kafkajs)`, () => {
  /** Authenticates (admin connect) and lists topics; rejects with kafkajs's error on a bad login. */
  async function login(mechanism: 'scram-sha-256' | 'scram-sha-512', password: string, username = KAFKA_SCRAM_USER): Promise<void> {
    const admin = new Kafka({
      clientId: 'services-smoke-sasl',
      brokers: [KAFKA_SASL_BROKERS],
      sasl: { mechanism, username, password } as SASLOptions,
      connectionTimeout: 3_000,
      retry: { retries: 0 },
      logLevel: logLevel.NOTHING,
    }).admin();
    try {
      await admin.connect();
      await admin.listTopics();
    } finally {
      await admin.disconnect();
    }
  }
  const refused = { name: 'KafkaJSSASLAuthenticationError' };

  test(`user ${KAFKA_SCRAM_USER}: both mechanisms accept the password and refuse a wrong one; setScramPassword rotates a user's password`, async () => {
    try {
      await login('scram-sha-256', KAFKA_SCRAM_PASSWORD);
    } catch (err) {
      throw unreachable(`Kafka's SASL listener at ${KAFKA_SASL_BROKERS} (user ${KAFKA_SCRAM_USER})`, err);
    }
    await login('scram-sha-512', KAFKA_SCRAM_PASSWORD);
    await assert.rejects(login('scram-sha-256', 'wrong-secret'), refused);
    await assert.rejects(login('scram-sha-512', 'wrong-secret'), refused);

    // rotated on a user of its own: the relay's tests (tls, secrets) log in as the shared user at the
    // same time, and a rotation of its password between their secret and their login failed them
    const user = `smoke-${randomUUID().slice(0, 8)}`;
    const first = `first-${randomUUID()}`;
    const rotated = `rotated-${randomUUID()}`;
    await setScramPassword(user, first);
    await login('scram-sha-256', first, user);
    await setScramPassword(user, rotated);
    await login('scram-sha-256', rotated, user);
    await login('scram-sha-512', rotated, user);
    await assert.rejects(login('scram-sha-256', first, user), refused);
    await login('scram-sha-256', KAFKA_SCRAM_PASSWORD);
  });
});

describe('AWS emulator on 127.0.0.1:4566 (Secrets Manager)', () => {
  const sm = new SecretsManagerClient({
    endpoint: AWS_ENDPOINT_URL,
    region: process.env.AWS_REGION ?? 'us-east-1',
    credentials: { accessKeyId: process.env.AWS_ACCESS_KEY_ID ?? 'test', secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY ?? 'test' },
    maxAttempts: 2,
  });
  const name = `smoke/services/${randomUUID()}`;
  after(async () => {
    await sm.send(new DeleteSecretCommand({ SecretId: name, ForceDeleteWithoutRecovery: true })).catch(() => {});
    sm.destroy();
  });

  test('create, read, rotate with PutSecretValue', async () => {
    const v1 = { username: 'outbox', password: 'one', host: '127.0.0.1', port: 5432, dbname: 'outbox' };
    try {
      await sm.send(new CreateSecretCommand({ Name: name, SecretString: JSON.stringify(v1) }));
    } catch (err) {
      throw unreachable(`the AWS emulator at ${AWS_ENDPOINT_URL}`, err);
    }
    const read1 = await sm.send(new GetSecretValueCommand({ SecretId: name }));
    assert.deepEqual(JSON.parse(read1.SecretString ?? 'null'), v1);

    const v2 = { ...v1, password: 'two' };
    await sm.send(new PutSecretValueCommand({ SecretId: name, SecretString: JSON.stringify(v2) }));
    const read2 = await sm.send(new GetSecretValueCommand({ SecretId: name }));
    assert.deepEqual(JSON.parse(read2.SecretString ?? 'null'), v2);
    assert.notEqual(read2.VersionId, read1.VersionId);
    assert.ok(read2.VersionStages?.includes('AWSCURRENT'));
    const previous = await sm.send(new GetSecretValueCommand({ SecretId: name, VersionStage: 'AWSPREVIOUS' }));
    assert.deepEqual(JSON.parse(previous.SecretString ?? 'null'), v1);
  });

  test('the local secrets are seeded (outbox/database, outbox/kafka)', async () => {
    const db = await sm.send(new GetSecretValueCommand({ SecretId: 'outbox/database' }));
    const parsed = JSON.parse(db.SecretString ?? '{}') as Record<string, unknown>;
    assert.deepEqual(Object.keys(parsed).filter((k) => ['username', 'password', 'host', 'port', 'dbname'].includes(k)).sort(), [
      'dbname',
      'host',
      'password',
      'port',
      'username',
    ]);
    const kafkaSecret = await sm.send(new GetSecretValueCommand({ SecretId: 'outbox/kafka' }));
    assert.ok(kafkaSecret.SecretString);
  });
});
