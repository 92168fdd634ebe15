// services: postgres, kafka
// DATABASE_AUTH=iam for real, locally. The relay (the CLI, as an operator runs it) connects to the
// Postgres test proxy (pg-proxy.ts), which accepts only a cleartext password that is a valid RDS
// IAM auth token for its host, port and user, the signature recomputed with the AWS emulator's
// credentials (test/test, us-east-1; rds-token.ts), and then logs in to the real server with the
// real password. The proxy speaks plaintext on 127.0.0.1: the loopback exception to the rule that
// IAM needs TLS. AWS credentials come from the environment, as on Lambda.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Signer } from '@aws-sdk/rds-signer';
import postgres, { type Sql } from 'postgres';
import { counts, DATABASE_URL, db, fixture, insertEvents, runCli, topicCount, invokeOk as invoke, type Fixture } from './helpers.ts';
import { startPgProxy, type PgProxy } from './pg-proxy.ts';

const AWS = { AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test', AWS_REGION: 'us-east-1' };
const real = new URL(DATABASE_URL);

let sql: Sql;
let proxy: PgProxy;
/** added to the proxy's clock: how far the database's time is ahead of the relay's */
let skewMs = 0;

before(async () => {
  sql = db();
  proxy = await startPgProxy({
    listenPort: 0,
    targetPort: Number(real.port || 5432),
    iam: {
      host: '127.0.0.1',
      accessKeyId: 'test',
      secretAccessKey: 'test',
      region: 'us-east-1',
      upstream: { user: decodeURIComponent(real.username), password: decodeURIComponent(real.password) },
      now: () => Date.now() + skewMs,
      // connections asked for their password 1.2 s apart: a token made earlier would carry an older X-Amz-Date
      askDelayMs: (n) => (n % 3) * 1_200,
    },
  });
});
after(async () => {
  await proxy.close();
  await sql.end();
});

/** The fixture's env with the database reached through the proxy, logging in with IAM tokens. */
function iamEnv(f: Fixture, extra: Record<string, string> = {}): Record<string, string> {
  return { ...f.env, DATABASE_URL: `postgres://${real.username}@127.0.0.1:${proxy.port}${real.pathname}`, DATABASE_PREPARE: 'true', DATABASE_AUTH: 'iam', ...AWS, ...extra };
}

describe('DATABASE_AUTH=iam through a proxy that checks RDS IAM auth tokens', () => {
  it('publishes; every connection logs in with a token of its own, signed when the server asks for it, none twice', async () => {
    const f = await fixture(sql, 'iam_ok');
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }, { aggregateid: 'b' }, { aggregateid: 'a' }]);
    const before = proxy.logins.length;
    const summary = await invoke(iamEnv(f));
    assert.equal(summary.published, 3);
    assert.equal(await topicCount([f.topic('order')]), 3);

    const logins = proxy.logins.slice(before);
    assert.ok(logins.length >= 3, `the relay opens its 3 connections (logins seen: ${logins.length})`);
    for (const l of logins) {
      assert.equal(l.refused, undefined, l.refused);
      assert.equal(l.facts?.user, 'outbox');
      // X-Amz-Date has whole seconds: signed no earlier than the second the proxy asked in
      assert.ok(l.facts.signedAt >= Math.floor(l.askedAt / 1_000) * 1_000, `token signed at ${new Date(l.facts.signedAt).toISOString()}, asked for at ${new Date(l.askedAt).toISOString()}`);
    }
    assert.equal(new Set(logins.map((l) => l.token)).size, logins.length, 'one token per connection: the tokens the proxy saw are all different');

    // another process (a cold start) signs its own again
    await insertEvents(sql, f.table, [{ aggregateid: 'c' }]);
    const second = proxy.logins.length;
    assert.equal((await invoke(iamEnv(f))).published, 1);
    const again = proxy.logins.slice(second);
    assert.ok(again.length >= 3 && again.every((l) => l.facts && !logins.some((o) => o.token === l.token)));
  });

  async function refusedInvocation(f: Fixture, env: Record<string, string>): Promise<string> {
    await insertEvents(sql, f.table, [{ aggregateid: 'a' }]);
    const res = await runCli(['invoke', '--timeout', '15000'], env);
    assert.notEqual(res.code, 0, res.stderr);
    const c = await counts(sql, f.table);
    assert.deepEqual({ pending: c.pending, sent: c.sent }, { pending: 1, sent: 0 }, 'nothing claimed or marked');
    assert.equal(await topicCount([f.topic('order')]), 0);
    return res.stderr;
  }

  /** What every refusal of the relay says to do. */
  function assertSaysWhatToDo(stderr: string): void {
    assert.match(stderr, /the database refused the IAM auth token of user \\?"outbox\\?" at 127\.0\.0\.1:\d+/);
    assert.match(stderr, /AWS_ACCESS_KEY_ID/);
    assert.match(stderr, /rds-db:connect on dbuser:<the database's resource id>\/outbox \(serverless\.yml: databaseIamResourceId, databaseIamUser\)/);
    assert.match(stderr, /GRANT rds_iam TO outbox/);
  }

  it('G8: a token signed with the wrong secret key is refused by the proxy; the relay (and `status`) says so and what to check; nothing is marked', async () => {
    const f = await fixture(sql, 'iam_badkey');
    const before = proxy.logins.length;
    const stderr = await refusedInvocation(f, iamEnv(f, { AWS_SECRET_ACCESS_KEY: 'not-the-secret' }));
    assertSaysWhatToDo(stderr);
    assert.match(stderr, /28P01: IAM authentication failed for user \\"outbox\\": the token's signature does not match/);
    const refused = proxy.logins.slice(before);
    assert.ok(refused.length >= 1 && refused.every((l) => l.refused?.startsWith("the token's signature does not match")), JSON.stringify(refused));
    // an operator command says the same (it connects without an invocation around it)
    const status = await runCli(['status'], iamEnv(f, { AWS_SECRET_ACCESS_KEY: 'not-the-secret' }));
    assert.equal(status.code, 1, status.stderr);
    assertSaysWhatToDo(status.stderr);
  });

  it("G8: an expired token (the database's clock 16 minutes ahead) is refused; the relay says so, and to check the clock (named statements off: the refusal meets the first statement, not the connect probe)", async () => {
    const f = await fixture(sql, 'iam_expired');
    skewMs = 16 * 60_000;
    try {
      const stderr = await refusedInvocation(f, iamEnv(f, { DATABASE_PREPARE: 'false' }));
      assertSaysWhatToDo(stderr);
      assert.match(stderr, /IAM authentication failed for user \\"outbox\\": the token expired at /);
      assert.match(stderr, /this machine's clock is right/);
    } finally {
      skewMs = 0;
    }
  });

  it('G8: no AWS credentials: the relay fails before any connection, saying which credentials and region it signs with', async () => {
    const f = await fixture(sql, 'iam_nocreds');
    const before = proxy.logins.length;
    const { AWS_ACCESS_KEY_ID: _k, AWS_SECRET_ACCESS_KEY: _s, ...withoutKeys } = iamEnv(f);
    const stderr = await refusedInvocation(f, { ...withoutKeys, AWS_EC2_METADATA_DISABLED: 'true', HOME: '/nonexistent' });
    assert.match(stderr, /could not sign an RDS IAM auth token for user \\"outbox\\" at 127\.0\.0\.1:\d+ \(DATABASE_AUTH=iam\): .*AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \(or AWS_PROFILE\) and AWS_REGION/);
    assert.equal(proxy.logins.length, before, 'no login was attempted');
  });

  it('the proxy refuses a token for another user, another endpoint or action, and a plain password', async () => {
    const sign = (over: { username?: string; port?: number }) =>
      new Signer({ hostname: '127.0.0.1', port: over.port ?? proxy.port, username: over.username ?? 'outbox', region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' } }).getAuthToken();
    const attempt = async (password: string | (() => Promise<string>)) => {
      const client = postgres({ host: '127.0.0.1', port: proxy.port, user: 'outbox', database: real.pathname.slice(1), password, max: 1, onnotice: () => undefined, connect_timeout: 5 });
      try {
        await client`SELECT 1`;
        return 'accepted';
      } catch (err) {
        return `${(err as { code?: string }).code}: ${(err as Error).message}`;
      } finally {
        await client.end();
      }
    };
    assert.equal(await attempt(() => sign({})), 'accepted', 'a valid token, for this user, host and port');
    assert.equal(await attempt(() => sign({ username: 'someone_else' })), '28P01: IAM authentication failed for user "outbox": the token is for DBUser "someone_else", not "outbox"');
    assert.match(await attempt(() => sign({ port: 5432 })), /^28P01: .*the token is for 127\.0\.0\.1:5432, not 127\.0\.0\.1:\d+$/);
    const other = (await sign({})).replace('Action=connect', 'Action=describe');
    assert.match(await attempt(other), /^28P01: .*the token's action is "describe", not connect$/);
    assert.match(await attempt(decodeURIComponent(real.password)), /^28P01: .*the password is not an RDS IAM auth token/);
  });
});
