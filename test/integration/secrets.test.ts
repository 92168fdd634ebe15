// services: postgres, kafka, moto alone
// Secrets: the database's credentials from Secrets Manager (moto, the AWS emulator): an RDS-style
// JSON secret and a plain URL; a password rotated under a warm Runtime (the secret re-read once);
// malformed and missing secrets; a Secrets Manager that hangs at a cold start. Guarantees: G8 (a
// bad or missing secret fails clearly, naming it and never printing its value; nothing marked) and
// G5 (a hung Secrets Manager ends the invocation within its budget). Kafka's credentials rotated:
// publishing.test.ts.
import { MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { CreateSecretCommand, DeleteSecretCommand, PutSecretValueCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { loadConfig } from '../../src/config/load.ts';
import { lanesTable, parseTableName, qualified } from '../../src/outbox/identifier.ts';
import { createLogger } from '../../src/log.ts';
import { Runtime } from '../../src/lambda/runtime.ts';
import { SecretsManagerSource } from '../../src/lambda/secrets.ts';
import {
  ADMIN_DATABASE_URL,
  AWS_ENDPOINT_URL,
  EXACTLY_ONCE_PASS,
  counts,
  DATABASE_URL,
  db,
  fileDb,
  fixture,
  insertEvents,
  outboxTableOf as t,
  ROOT,
  runCli,
  sentTableOf,
  startCli,
  terminateBackends,
  topicCount,
  uniqueName,
  type Fixture,
  invokeOk as invoke,
} from './helpers.ts';

const sql = fileDb();

describe('secrets (Secrets Manager in the AWS emulator)', () => {
  const sm = new SecretsManagerClient({ endpoint: AWS_ENDPOINT_URL, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' }, maxAttempts: 2 });
  const awsEnv = { AWS_ENDPOINT_URL, AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test' };
  const created: string[] = [];
  const u = new URL(DATABASE_URL);
  const rds = { username: decodeURIComponent(u.username), password: decodeURIComponent(u.password), host: u.hostname, port: Number(u.port || 5432), dbname: u.pathname.slice(1), engine: 'postgres' };

  async function secret(value: string): Promise<string> {
    const name = `outbox-relay-test/${uniqueName('db')}`;
    await sm.send(new CreateSecretCommand({ Name: name, SecretString: value }));
    created.push(name);
    return name;
  }
  /** the fixture's env with the database coming from the secret instead of DATABASE_URL */
  function secretEnv(f: Fixture, secretId: string): Record<string, string> {
    const { DATABASE_URL: _omit, ...rest } = f.env;
    return { ...rest, ...awsEnv, DATABASE_SECRET_ID: secretId };
  }
  after(async () => {
    for (const name of created) await sm.send(new DeleteSecretCommand({ SecretId: name, ForceDeleteWithoutRecovery: true })).catch(() => undefined);
    sm.destroy();
  });

  it('an RDS-style JSON secret and a plain URL secret both work', async () => {
    const f = await fixture(sql, 'secretok');
    const json = await secret(JSON.stringify(rds));
    const url = await secret(DATABASE_URL);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    assert.equal((await invoke(secretEnv(f, json))).published, 1);
    await insertEvents(sql, f.table, [{ aggregateid: 'b' }]);
    assert.equal((await invoke(secretEnv(f, url))).published, 1);
    assert.equal(await topicCount([f.topic('order')]), 2);
  });

  it('rotation: password changed and the secret updated under a warm Runtime → it re-reads the secret once and carries on', async () => {
    const f = await fixture(sql, 'rotation');
    const admin = db(ADMIN_DATABASE_URL);
    const role = uniqueName('relay_rot');
    const appName = `relay-${f.table}`;
    await admin.unsafe(`CREATE ROLE ${role} LOGIN PASSWORD 'pw-a-${role}'`);
    // what a relay's role needs (README, "The table"): the outbox, INSERT into its sent table, and reading the migrations
    await admin.unsafe(`GRANT SELECT, UPDATE, DELETE ON ${t(f.table)} TO ${role}`);
    await admin.unsafe(`GRANT SELECT, INSERT, DELETE ON ${sentTableOf(f.table)} TO ${role}`);
    await admin.unsafe(`GRANT SELECT ON outbox_relay_migrations TO ${role}`);
    // and, with OUTBOX_DELIVERY=exactly-once (the eos pass), its lanes table (docs/schema.md)
    if (EXACTLY_ONCE_PASS) await admin.unsafe(`GRANT SELECT, INSERT, UPDATE ON ${qualified(lanesTable(parseTableName(f.table)))} TO ${role}`);
    const name = await secret(JSON.stringify({ ...rds, username: role, password: `pw-a-${role}` }));
    const source = new SecretsManagerSource(sm);
    const logs: string[] = [];
    const rt = new Runtime(loadConfig({ ...secretEnv(f, name), OUTBOX_CLIENT_ID: appName }), createLogger('warn', {}, (l) => logs.push(l)), source);
    try {
      await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }]);
      assert.equal((await rt.invoke(20_000)).published, 2);
      assert.equal(source.fetches, 1);
      const [who] = await admin<{ n: number }[]>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = ${role}`;
      assert.ok(who!.n >= 1, 'the relay connected as the rotated role');

      // rotate: new password on the role and in the secret; the warm client's connections go away
      await admin.unsafe(`ALTER ROLE ${role} PASSWORD 'pw-b-${role}'`);
      await sm.send(new PutSecretValueCommand({ SecretId: name, SecretString: JSON.stringify({ ...rds, username: role, password: `pw-b-${role}` }) }));
      assert.ok((await terminateBackends(admin, { user: role })) >= 1);

      await insertEvents(sql, f.table, [{ aggregateid: 'c' }]);
      const s = await rt.invoke(20_000);
      assert.equal(s.published, 1, JSON.stringify(s));
      assert.equal(source.fetches, 2, 'the secret was read again, once');
      assert.ok(logs.some((l) => l.includes('refreshing the database secret once')), logs.join('\n'));
      assert.ok(!logs.some((l) => l.includes(`pw-a-${role}`) || l.includes(`pw-b-${role}`)), 'no password in the logs');
      assert.deepEqual(await counts(sql, f.table), { total: 3, sent: 3, parked: 0, pending: 0 });
    } finally {
      await rt.close();
      await terminateBackends(admin, { user: role }).catch(() => 0);
      await admin.unsafe(`DROP OWNED BY ${role}`).catch(() => undefined);
      await admin.unsafe(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
      await admin.end();
    }
  });

  it('G8: malformed secrets fail clearly, naming the secret and never printing its value; a missing secret too', async () => {
    const f = await fixture(sql, 'secretbad');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const notJson = await secret('hunter2-not-json-or-url');
    const missingFields = await secret(JSON.stringify({ username: 'outbox', password: 'hunter3-secret-value' }));
    const cases: Array<[string, RegExp, string | undefined]> = [
      [notJson, /is not valid JSON; expected a postgres:\/\/ URL or RDS-style JSON/, 'hunter2'],
      [missingFields, /is missing host; expected RDS-style JSON/, 'hunter3'],
      ['outbox-relay-test/does-not-exist', /no such secret: check the id\/ARN and the region/, undefined],
    ];
    const results = await Promise.all(cases.map(([id]) => runCli(['invoke', '--timeout', '10000'], secretEnv(f, id))));
    cases.forEach(([id, message, value], i) => {
      const res = results[i]!;
      assert.notEqual(res.code, 0);
      assert.ok(res.stderr.includes(`SecretError: secret ${JSON.stringify(id)}`), res.stderr);
      assert.match(res.stderr, message);
      if (value) assert.ok(!res.stderr.includes(value) && !res.stdout.includes(value), `the secret value leaked:\n${res.stderr}`);
    });
    assert.equal((await counts(sql, f.table)).sent, 0);
  });

  it('G5/G8: a Secrets Manager that hangs (the emulator SIGSTOPped) at a cold start: the invocation ends within its budget, naming the secret and the network path; nothing is marked', async () => {
    const f = await fixture(sql, 'secrethang');
    const name = await secret(DATABASE_URL);
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const moto = Number(readFileSync(join(ROOT, '.cache', 'run', 'moto.pid'), 'utf8').trim());
    process.kill(moto, 'SIGSTOP');
    let res;
    try {
      const run = startCli(['invoke', '--timeout', '6000'], { ...secretEnv(f, name), OUTBOX_SAFETY_MARGIN_MS: String(MIN_SAFETY_MARGIN_MS) });
      // a hung invocation is killed here, so the test fails on the duration instead of hanging
      const cap = setTimeout(() => run.child.kill('SIGKILL'), 30_000);
      res = await run.result;
      clearTimeout(cap);
    } finally {
      process.kill(moto, 'SIGCONT');
    }
    assert.equal(res.code, 1, res.stderr);
    assert.ok(res.durationMs < 6_000 + 3_000, `ended within the budget (plus process start): ${res.durationMs} ms`);
    assert.match(res.stderr, new RegExp(`secret "${name.replace('/', '\\/')}": Secrets Manager did not answer before the invocation's deadline`));
    assert.match(res.stderr, /interface endpoint or a NAT gateway/);
    assert.equal((await counts(sql, f.table)).sent, 0);
    // resumed, the same secret works
    assert.equal((await invoke(secretEnv(f, name))).published, 1);
  });
});
