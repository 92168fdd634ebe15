import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BUDGET, MIN_SAFETY_MARGIN_MS } from '../../src/budget.ts';
import { defaultMaxBatchBytes, loadConfig } from '../../src/config/load.ts';
import { DEFAULT_CLAIM_BYTES } from '../../src/outbox/store.ts';
import { ConfigError } from '../../src/errors.ts';
import { createLogger } from '../../src/log.ts';

const base = { DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };

function problems(env: Record<string, string>): string[] {
  try {
    loadConfig(env);
  } catch (e) {
    assert.ok(e instanceof ConfigError);
    return e.problems;
  }
  assert.fail('expected a ConfigError');
}

describe('loadConfig', () => {
  it('applies documented defaults', () => {
    const c = loadConfig(base);
    assert.deepEqual(c.kafka.brokers, ['127.0.0.1:9092']);
    assert.equal(c.outbox.batchSize, 500);
    assert.equal(c.outbox.safetyMarginMs, 3000);
    assert.equal(c.outbox.topicTemplate, 'outbox.event.{aggregatetype}');
    assert.deepEqual(c.outbox.table, { schema: undefined, name: 'outbox' });
    assert.equal(c.outbox.parkedPolicy, 'hold');
    assert.equal(c.database.prepare, true);
    assert.equal(c.kafka.ssl, false);
    assert.equal(c.kafka.client, 'kafkajs', "the user's named client stays the default");
    assert.equal(c.outbox.maxMessageBytes, undefined);
  });

  it('OUTBOX_PARTITION_WIDTH: N hours, days or weeks, in seconds, from 1 hour to 52 weeks; unset: plain tables', () => {
    const base = { DATABASE_URL: 'postgres://u:p@h:5432/d', KAFKA_BROKERS: 'k:9092' };
    const width = (w?: string) => loadConfig(w === undefined ? base : { ...base, OUTBOX_PARTITION_WIDTH: w }).outbox.partitionWidthS;
    assert.equal(width(), undefined);
    assert.equal(width('  '), undefined);
    assert.equal(width('1 day'), 86_400);
    assert.equal(width('6 hours'), 21_600);
    assert.equal(width('1 Hour'), 3_600);
    assert.equal(width('2weeks'), 1_209_600);
    assert.equal(width('52 weeks'), 52 * 604_800);
    for (const bad of ['1 month', '30 minutes', '0 days', '53 weeks', '1.5 days', 'daily', '-1 day', '1 day 2 hours']) {
      assert.throws(() => width(bad), new RegExp(`OUTBOX_PARTITION_WIDTH=${JSON.stringify(bad).replace(/[.+]/g, '\\$&')} is not a partition width: expected N hours, N days or N weeks`), bad);
    }
  });

  it('linger: a lingering invocation LISTENs, and polls with DATABASE_PREPARE=false (a pooler in between)', () => {
    const base = { DATABASE_URL: 'postgres://u:p@h:5432/d', KAFKA_BROKERS: 'k:9092' };
    assert.deepEqual(pick(loadConfig(base).outbox), { idle: 'exit', wake: 'notify', pollMs: 250 });
    assert.deepEqual(pick(loadConfig({ ...base, DATABASE_PREPARE: 'false', OUTBOX_IDLE: 'linger', OUTBOX_POLL_MS: '50' }).outbox), { idle: 'linger', wake: 'poll', pollMs: 50 });
    assert.throws(() => loadConfig({ ...base, OUTBOX_IDLE: 'sleep', OUTBOX_POLL_MS: '5' }), /OUTBOX_IDLE="sleep" is not one of exit, linger[\s\S]*OUTBOX_POLL_MS=5 is out of range/);
    function pick(o: ReturnType<typeof loadConfig>['outbox']) {
      return { idle: o.idle, wake: o.wake, pollMs: o.pollMs };
    }
  });

  it('G8: a removed setting still set is refused, saying it was removed and what took its place; empty is unset', () => {
    assert.deepEqual(problems({ ...base, OUTBOX_MAX_REQUEST_BYTES: '2048', OUTBOX_WAKE: 'poll' }), [
      `OUTBOX_MAX_REQUEST_BYTES was removed: a send carries at most 1 MiB of records (the Java producer's max.request.size) and at most the topic's limit; ` +
        'a larger message that the topic takes still goes, alone. Unset it; to bound messages, set OUTBOX_MAX_MESSAGE_BYTES',
      'OUTBOX_WAKE was removed: a lingering invocation polls when a pooler sits in between (DATABASE_PREPARE=false, or one found at connect) and LISTENs ' +
        'otherwise. Unset it; behind PgBouncer or RDS Proxy set DATABASE_PREPARE=false',
    ]);
    // serverless.yml's parameters of a stage that predates the removal pass '' for them
    assert.doesNotThrow(() => loadConfig({ ...base, OUTBOX_MAX_REQUEST_BYTES: '', OUTBOX_WAKE: ' ' }));
  });

  it('reads every knob', () => {
    const c = loadConfig({
      DATABASE_SECRET_ID: 'outbox/db',
      KAFKA_BROKERS: 'a:9092, b:9093',
      KAFKA_SECRET_ID: 'outbox/kafka',
      KAFKA_SSL: 'true',
      OUTBOX_TABLE: 'app.events',
      OUTBOX_BATCH_SIZE: '100',
      OUTBOX_SAFETY_MARGIN_MS: '1500',
      OUTBOX_MAX_ATTEMPTS: '3',
      OUTBOX_BACKOFF_BASE_MS: '10',
      OUTBOX_BACKOFF_MAX_MS: '100',
      OUTBOX_TOPIC_TEMPLATE: 'events.{aggregatetype}.{type}',
      OUTBOX_PARKED_POLICY: 'skip',
      OUTBOX_MAX_MESSAGE_BYTES: '2048',
      DATABASE_PREPARE: 'false',
      OUTBOX_CLIENT_ID: 'orders-relay',
    });
    assert.deepEqual(c.kafka.brokers, ['a:9092', 'b:9093']);
    assert.equal(c.database.secretId, 'outbox/db');
    assert.equal(c.database.prepare, false);
    assert.deepEqual(c.outbox.table, { schema: 'app', name: 'events' });
    assert.equal(c.outbox.batchSize, 100);
    assert.equal(c.outbox.parkedPolicy, 'skip');
    assert.equal(c.outbox.maxMessageBytes, 2048);
    assert.equal(c.kafka.clientId, 'orders-relay');
    assert.equal(c.kafka.ssl, true);
  });

  it('G8: names the variable and the expected form for every problem at once', () => {
    const p = problems({ KAFKA_BROKERS: '', OUTBOX_BATCH_SIZE: 'lots', OUTBOX_PARKED_POLICY: 'maybe' });
    assert.ok(p.some((x) => x.includes('DATABASE_URL or DATABASE_SECRET_ID is required')));
    assert.ok(p.some((x) => x.startsWith('KAFKA_BROKERS is required')));
    assert.ok(p.some((x) => x.startsWith('OUTBOX_BATCH_SIZE="lots" is not a whole number')));
    assert.ok(p.some((x) => x.startsWith('OUTBOX_PARKED_POLICY="maybe" is not one of hold, skip')));
  });

  it('G8: rejects a table name that is not an identifier, so it never reaches SQL', () => {
    const p = problems({ ...base, OUTBOX_TABLE: 'outbox; drop table x' });
    assert.equal(p.length, 1);
    assert.match(p[0]!, /^OUTBOX_TABLE: "outbox; drop table x" is not a valid table name/);
    assert.ok(problems({ ...base, OUTBOX_TABLE: 'a.b.c' }).length === 1);
    assert.ok(problems({ ...base, OUTBOX_TABLE: '"quoted"' }).length === 1);
  });

  it('G8: rejects bad URLs, brokers, ranges and templates, naming each', () => {
    assert.match(problems({ ...base, DATABASE_URL: 'mysql://x' })[0]!, /DATABASE_URL must start with postgres:\/\//);
    assert.match(problems({ ...base, KAFKA_BROKERS: 'localhost' })[0]!, /KAFKA_BROKERS entry "localhost" is not host:port/);
    assert.match(problems({ ...base, OUTBOX_BATCH_SIZE: '0' })[0]!, /out of range/);
    assert.match(problems({ ...base, OUTBOX_TOPIC_TEMPLATE: 'x.{tenant}' })[0]!, /unknown placeholder\(s\) \{tenant\}/);
    assert.match(problems({ ...base, OUTBOX_BACKOFF_BASE_MS: '1000', OUTBOX_BACKOFF_MAX_MS: '10' })[0]!, /OUTBOX_BACKOFF_MAX_MS/);
    assert.match(problems({ ...base, DATABASE_SECRET_ID: 'x' })[0]!, /only one of DATABASE_URL and DATABASE_SECRET_ID/);
  });
});

describe('loadConfig: what each command needs', () => {
  it('kafka: false (migrate, status, parked): KAFKA_BROKERS is not required, and is still checked when given', () => {
    const dbOnly = { DATABASE_URL: base.DATABASE_URL };
    assert.deepEqual(loadConfig(dbOnly, { kafka: false }).kafka.brokers, []);
    assert.throws(() => loadConfig(dbOnly), /KAFKA_BROKERS is required/);
    assert.throws(() => loadConfig({ ...dbOnly, KAFKA_BROKERS: '::1:9092' }, { kafka: false }), /KAFKA_BROKERS entry "::1:9092"/);
    assert.throws(() => loadConfig({ KAFKA_BROKERS: base.KAFKA_BROKERS }, { kafka: false }), /DATABASE_URL or DATABASE_SECRET_ID is required/);
  });
});

describe('loadConfig: every variable, its default and its bounds', () => {
  it('defaults of the settings not covered above', () => {
    const c = loadConfig(base);
    assert.equal(c.database.connectTimeoutMs, 5_000);
    assert.equal(c.database.applicationName, 'outbox-relay');
    assert.equal(c.database.ssl, undefined);
    assert.equal(c.kafka.secretId, undefined);
    assert.equal(c.kafka.sslRejectUnauthorized, true);
    assert.equal(c.kafka.clientId, 'outbox-relay');
    assert.equal(c.kafka.compression, 'none');
    assert.equal(c.outbox.maxAttempts, 10);
    assert.equal(c.outbox.backoffBaseMs, 1_000);
    assert.equal(c.outbox.backoffMaxMs, 300_000);
    assert.equal(c.outbox.sentRows, 'keep');
    assert.equal(c.outbox.retainSentMs, 86_400_000);
    assert.equal(c.outbox.retainSkippedMs, 30 * 86_400_000, 'skipped rows, with their audit record, are kept a month');
    assert.equal(c.logLevel, 'info');
    assert.equal(c.testPauseAfterPublishMs, 0);
  });

  it('reads the settings not covered above', () => {
    const c = loadConfig({
      ...base,
      DATABASE_CONNECT_TIMEOUT_MS: '2500',
      DATABASE_SSL: 'VERIFY-FULL',
      OUTBOX_CLIENT_ID: 'orders-relay',
      KAFKA_SECRET_ID: 'outbox/kafka',
      KAFKA_SSL: 'no-verify',
      OUTBOX_COMPRESSION: 'gzip',
      OUTBOX_KAFKA_CLIENT: 'Platformatic',
      OUTBOX_SAFETY_MARGIN_MS: '1500',
      OUTBOX_MAX_ATTEMPTS: '3',
      OUTBOX_BACKOFF_BASE_MS: '10',
      OUTBOX_BACKOFF_MAX_MS: '100',
      OUTBOX_SENT_ROWS: 'delete',
      OUTBOX_RETAIN_SENT_MS: '0',
      OUTBOX_RETAIN_SKIPPED_MS: '604800000',
      OUTBOX_LOG_LEVEL: 'debug',
      OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS: '250',
    });
    assert.equal(c.database.connectTimeoutMs, 2_500);
    assert.equal(c.database.ssl, 'verify-full');
    assert.equal(c.database.applicationName, 'orders-relay');
    assert.equal(c.kafka.secretId, 'outbox/kafka');
    assert.equal(c.kafka.sslRejectUnauthorized, false);
    assert.equal(c.kafka.compression, 'gzip');
    assert.equal(c.kafka.client, 'platformatic');
    assert.equal(c.outbox.safetyMarginMs, 1_500);
    assert.equal(c.outbox.maxAttempts, 3);
    assert.equal(c.outbox.backoffBaseMs, 10);
    assert.equal(c.outbox.backoffMaxMs, 100);
    assert.equal(c.outbox.sentRows, 'delete');
    assert.equal(c.outbox.retainSentMs, 0);
    assert.equal(c.outbox.retainSkippedMs, 604_800_000);
    assert.equal(c.logLevel, 'debug');
    assert.equal(c.testPauseAfterPublishMs, 250);
    assert.equal(loadConfig({ ...base, DATABASE_SSL: 'disable' }).database.ssl, 'disable');
  });

  it('trims values; an empty or blank value means the default', () => {
    const c = loadConfig({ ...base, KAFKA_BROKERS: ' a:9092 ', OUTBOX_BATCH_SIZE: ' 100 ', OUTBOX_PARKED_POLICY: ' skip ', OUTBOX_MAX_ATTEMPTS: '', OUTBOX_CLIENT_ID: '   ', DATABASE_SSL: '' });
    assert.deepEqual(c.kafka.brokers, ['a:9092']);
    assert.equal(c.outbox.batchSize, 100);
    assert.equal(c.outbox.parkedPolicy, 'skip');
    assert.equal(c.outbox.maxAttempts, 10);
    assert.equal(c.kafka.clientId, 'outbox-relay');
    assert.equal(c.database.ssl, undefined);
  });

  it('booleans: true, 1, yes, on / false, 0, no, off, any case; anything else is a problem that names the expected values (G8)', () => {
    for (const yes of ['true', '1', 'yes', 'on', 'TRUE', 'On']) assert.equal(loadConfig({ ...base, KAFKA_SSL: yes }).kafka.ssl, true, yes);
    for (const no of ['false', '0', 'no', 'off', 'NO']) assert.equal(loadConfig({ ...base, DATABASE_PREPARE: no }).database.prepare, false, no);
    assert.deepEqual(problems({ ...base, KAFKA_SSL: 'maybe' }), ['KAFKA_SSL="maybe" is not a boolean; expected true or false (default false)']);
    assert.deepEqual(problems({ ...base, DATABASE_PREPARE: '2' }), ['DATABASE_PREPARE="2" is not a boolean; expected true or false (default true)']);
  });

  it('whole numbers only, within their bounds (inclusive); anything else is a problem that names the bounds and the default (G8)', () => {
    for (const bad of ['12abc', 'abc12', '-5', '1.5', '1e3']) {
      assert.deepEqual(problems({ ...base, OUTBOX_BATCH_SIZE: bad }), [`OUTBOX_BATCH_SIZE=${JSON.stringify(bad)} is not a whole number; expected an integer between 1 and 10000 (default 500)`]);
    }
    assert.equal(loadConfig({ ...base, OUTBOX_BATCH_SIZE: '1' }).outbox.batchSize, 1);
    assert.equal(loadConfig({ ...base, OUTBOX_BATCH_SIZE: '10000' }).outbox.batchSize, 10_000);
    assert.deepEqual(problems({ ...base, OUTBOX_BATCH_SIZE: '10001' }), ['OUTBOX_BATCH_SIZE=10001 is out of range; expected an integer between 1 and 10000 (default 500)']);
    assert.deepEqual(problems({ ...base, OUTBOX_POLL_MS: '60001' }), ['OUTBOX_POLL_MS=60001 is out of range; expected an integer between 10 and 60000 (default 250)']);
  });

  it('G5: OUTBOX_SAFETY_MARGIN_MS below what a failure runs past the deadline (the shortest rollback grace, then the LISTEN close) is refused, saying why', () => {
    assert.equal(MIN_SAFETY_MARGIN_MS, BUDGET.rollbackGraceMs.min + BUDGET.listenCloseMs);
    assert.ok(BUDGET.safetyMarginMs >= MIN_SAFETY_MARGIN_MS, 'the default is allowed');
    for (const ms of [0, MIN_SAFETY_MARGIN_MS - 1]) {
      const [p, ...more] = problems({ ...base, OUTBOX_SAFETY_MARGIN_MS: String(ms) });
      assert.deepEqual(more, []);
      assert.match(p!, new RegExp(`^OUTBOX_SAFETY_MARGIN_MS=${ms} is below its minimum of ${MIN_SAFETY_MARGIN_MS}: a failure at the deadline runs that long past it`));
      assert.match(p!, new RegExp(`ROLLBACK's shortest grace, ${BUDGET.rollbackGraceMs.min} ms, then closing the LISTEN connection, up to ${BUDGET.listenCloseMs} ms`));
      assert.match(p!, new RegExp(`set it to ${MIN_SAFETY_MARGIN_MS} or more \\(default 3000\\)$`));
    }
    assert.equal(loadConfig({ ...base, OUTBOX_SAFETY_MARGIN_MS: String(MIN_SAFETY_MARGIN_MS) }).outbox.safetyMarginMs, MIN_SAFETY_MARGIN_MS);
  });

  it('G8: one-of settings name the allowed values and the default', () => {
    assert.deepEqual(problems({ ...base, DATABASE_SSL: 'prefer' }), ['DATABASE_SSL="prefer" is not one of disable, require, verify-full (default verify-full, or disable when the host is this machine)']);
    assert.deepEqual(problems({ ...base, OUTBOX_COMPRESSION: 'zstd' }), ['OUTBOX_COMPRESSION="zstd" is not one of none, gzip (default none)']);
    assert.deepEqual(problems({ ...base, OUTBOX_KAFKA_CLIENT: 'librdkafka' }), ['OUTBOX_KAFKA_CLIENT="librdkafka" is not one of kafkajs, platformatic (default kafkajs)']);
  });

  it('the backoff cap may equal its base', () => {
    const c = loadConfig({ ...base, OUTBOX_BACKOFF_BASE_MS: '1000', OUTBOX_BACKOFF_MAX_MS: '1000' });
    assert.equal(c.outbox.backoffMaxMs, 1_000);
  });

  it('G8: the database URL must start with the scheme; brokers must be exactly host:port', () => {
    assert.match(problems({ ...base, DATABASE_URL: 'jdbc:postgres://h/db' })[0]!, /DATABASE_URL must start with postgres:\/\//);
    assert.equal(loadConfig({ ...base, DATABASE_URL: 'postgresql://h/db' }).database.url, 'postgresql://h/db');
    for (const bad of ['a/b:9092', 'a:123456', 'a:9092/x']) {
      const p = problems({ ...base, KAFKA_BROKERS: bad });
      assert.equal(p.length, 1, bad);
      assert.ok(p[0]!.startsWith(`KAFKA_BROKERS entry ${JSON.stringify(bad)} is not host:port: a host name or IPv4 address`), p[0]);
    }
    assert.deepEqual(problems({ ...base, KAFKA_BROKERS: 'a:0' }), ['KAFKA_BROKERS entry "a:0" has port 0: a port is 1 to 65535']);
    assert.deepEqual(loadConfig({ ...base, KAFKA_BROKERS: 'b-1.msk_x:9096,[::1]:9092,,', OUTBOX_KAFKA_CLIENT: 'platformatic' }).kafka.brokers, ['b-1.msk_x:9096', '[::1]:9092']);
  });

  it('G8: lists every unknown placeholder of the topic template', () => {
    assert.deepEqual(problems({ ...base, OUTBOX_TOPIC_TEMPLATE: 'x.{tenant}.{type}.{}' }), [
      'OUTBOX_TOPIC_TEMPLATE="x.{tenant}.{type}.{}" uses unknown placeholder(s) {tenant}, {}; allowed: {aggregatetype}, {type}',
    ]);
  });
});

describe('loadConfig: DATABASE_URL judged as postgres.js reads it (issue 34)', () => {
  const remote = { DATABASE_URL: 'postgres://u:p@db.example.com:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };

  it('user info holding "@" before a host list: every host postgres.js tries is judged, the first one off this machine', () => {
    // postgres.js splits the user info at the first "@" (hosts evil.example, x@127.0.0.1, localhost);
    // a reading at the last "@" saw only 127.0.0.1,localhost and turned TLS off
    const url = 'postgres://u:p@evil.example:5432,x@127.0.0.1,localhost/db';
    assert.deepEqual(problems({ ...remote, DATABASE_URL: url, DATABASE_SSL: 'disable' }), [
      'DATABASE_SSL=disable sends the database login and every row unencrypted to evil.example,x@127.0.0.1,localhost, for anyone on the network path to read or alter: ' +
        'unset DATABASE_SSL (the default is verify-full) or set it to verify-full; or, only if every network path to it is private and you accept that risk, set OUTBOX_ALLOW_PLAINTEXT_LOGIN=true',
    ]);
    assert.deepEqual(problems({ ...remote, DATABASE_URL: `${url}?sslmode=disable` }).length, 1);
    assert.equal(loadConfig({ ...remote, DATABASE_URL: url }).database.ssl, undefined, 'unset: verify-full, as for any host off this machine');
  });

  it('a query parameter given twice is refused, naming it: postgres.js takes the last sslmode, a reader the first', () => {
    assert.deepEqual(problems({ ...remote, DATABASE_URL: 'postgres://u:p@db.example.com/db?sslmode=require&sslmode=disable' }), [
      'DATABASE_URL gives the query parameter "sslmode" more than once: postgres.js takes the last value, and whoever reads the URL may take the first; give it once',
    ]);
    for (const name of ['host', 'sslrootcert', 'application_name']) {
      assert.match(problems({ ...base, DATABASE_URL: `postgres://u:p@127.0.0.1/db?${name}=a&sslmode=disable&${name}=b` }).join('\n'), new RegExp(`^DATABASE_URL gives the query parameter "${name}" more than once`), name);
    }
  });

  it('sslmode=prefer or allow with a password or a token to a host off this machine is refused like disable; on this machine, or allowed, it is not', () => {
    for (const mode of ['prefer', 'allow']) {
      assert.deepEqual(problems({ ...remote, DATABASE_URL: `postgres://u:p@db.example.com/db?sslmode=${mode}` }), [
        `the database URL's sslmode=${mode} falls back to no encryption when the server (or anyone posing as it) offers none, and would then send the database password and every row unencrypted to db.example.com: ` +
          'remove sslmode from the URL (the default is verify-full) or set DATABASE_SSL=verify-full; or, only if every network path to it is private and you accept that risk, set OUTBOX_ALLOW_PLAINTEXT_LOGIN=true',
      ]);
      assert.match(problems({ ...remote, DATABASE_AUTH: 'iam', DATABASE_URL: `postgres://u@db.example.com/db?sslmode=${mode}` }).join(), new RegExp(`^DATABASE_AUTH=iam needs TLS .*sslmode=${mode} may send it unencrypted`));
      assert.equal(loadConfig({ ...remote, DATABASE_URL: `postgres://u:p@localhost/db?sslmode=${mode}` }).database.auth, 'password');
      assert.equal(loadConfig({ ...remote, DATABASE_URL: `postgres://u:p@db.example.com/db?sslmode=${mode}`, OUTBOX_ALLOW_PLAINTEXT_LOGIN: 'true' }).allowPlaintextLogin, true);
    }
    // ssl= and an empty sslmode: postgres.js turns TLS off with the first and ignores the second
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p@db.example.com/db?ssl=disable&sslmode=' }).join(), /^the database URL's sslmode=disable sends the database login/);
  });

  it('every host of a list counts: one off this machine takes the TLS default and the refusal with it', () => {
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p@localhost:5432,db.example.com:5433/db?sslmode=disable' }).join(), /unencrypted to localhost,db\.example\.com,/);
    assert.equal(loadConfig({ ...remote, DATABASE_URL: 'postgres://u:p@localhost:5432,127.0.0.1:5433/db?sslmode=disable' }).database.auth, 'password');
  });

  it('URLs postgres.js cannot use are refused, saying why', () => {
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p@[::1]:5432/db' }).join(), /^DATABASE_URL names the IPv6 address \[::1\], which postgres\.js cannot connect to/);
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p@h1,,h2/db' }).join(), /^DATABASE_URL names an empty host in its list "h1,,h2"/);
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p@h1,h2:x/db' }).join(), /^DATABASE_URL gives host h2 a port that is not one \("h2:x"\)/);
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p%zz@h/db' }).join(), /^DATABASE_URL has a user or password postgres\.js cannot decode/);
    assert.match(problems({ ...remote, DATABASE_URL: 'postgres://u:p@h%zz/db' }).join(), /^DATABASE_URL is not a URL postgres\.js can read \(URI malformed\)/);
  });
});

describe('loadConfig: KAFKA_BROKERS judged broker by broker (issue 34)', () => {
  const sasl = { ...base, KAFKA_SECRET_ID: 'k' };

  it('an entry the two clients read differently is refused: ::1:9092 is this machine up to its last ":", the address ::1:9092 to platformatic', () => {
    for (const client of ['kafkajs', 'platformatic']) {
      for (const odd of ['::1:9092', '::ffff:7f00:1:9092']) {
        const p = problems({ ...sasl, KAFKA_BROKERS: `127.0.0.1:9092,${odd}`, OUTBOX_KAFKA_CLIENT: client });
        assert.equal(p.length, 1, `${client} ${odd}`);
        assert.match(p[0]!, new RegExp(`^KAFKA_BROKERS entry "${odd}" is not host:port`));
      }
    }
  });

  it('an IPv6 broker: kafkajs cannot reach it (refused, saying so); platformatic judges it like any host', () => {
    assert.deepEqual(problems({ ...sasl, KAFKA_BROKERS: '[::1]:9092' }), [
      'KAFKA_BROKERS entry "[::1]:9092" is an IPv6 address, which kafkajs cannot connect to (it reads a broker\'s host up to its first ":"): name the broker by a host name, or set OUTBOX_KAFKA_CLIENT=platformatic',
    ]);
    assert.equal(loadConfig({ ...sasl, KAFKA_BROKERS: '[::1]:9092,localhost:9093', OUTBOX_KAFKA_CLIENT: 'platformatic' }).kafka.ssl, false, 'all on this machine');
    assert.equal(loadConfig({ ...sasl, KAFKA_BROKERS: '[::1]:9092,[2001:db8::1]:9092', OUTBOX_KAFKA_CLIENT: 'platformatic' }).kafka.ssl, true);
  });

  it('with SASL, one broker off this machine turns KAFKA_SSL on, and KAFKA_SSL=false is refused naming every broker', () => {
    assert.equal(loadConfig({ ...sasl, KAFKA_BROKERS: '127.0.0.1:9092,localhost:9093,b-1.example.com:9096' }).kafka.ssl, true);
    assert.match(problems({ ...sasl, KAFKA_BROKERS: '127.0.0.1:9092,b-1.example.com:9096', KAFKA_SSL: 'false' }).join(), /^KAFKA_SSL=false would send the SASL login of KAFKA_SECRET_ID unencrypted to 127\.0\.0\.1:9092,b-1\.example\.com:9096/);
  });
});

describe('loadConfig: telemetry (service, stage, namespace, where metrics go, tracing)', () => {
  it('defaults: outbox-relay, local, OutboxRelay; metrics to stderr outside Lambda, stdout inside; no tracing', () => {
    assert.deepEqual(loadConfig(base).telemetry, { serviceName: 'outbox-relay', stage: 'local', metricsNamespace: 'OutboxRelay', metrics: 'stderr', tracing: false });
    assert.equal(loadConfig({ ...base, AWS_LAMBDA_FUNCTION_NAME: 'relay-prod' }).telemetry.metrics, 'stdout');
    assert.equal(loadConfig({ ...base, AWS_LAMBDA_FUNCTION_NAME: 'relay-prod', OUTBOX_METRICS: 'off' }).telemetry.metrics, 'off');
  });

  it('reads every variable', () => {
    const env = { POWERTOOLS_SERVICE_NAME: 'orders-relay', OUTBOX_STAGE: 'prod-eu_1', POWERTOOLS_METRICS_NAMESPACE: 'Team/Outbox', OUTBOX_METRICS: 'STDOUT', OUTBOX_TRACING: 'true' };
    const t = loadConfig({ ...base, ...env }).telemetry;
    assert.deepEqual(t, { serviceName: 'orders-relay', stage: 'prod-eu_1', metricsNamespace: 'Team/Outbox', metrics: 'stdout', tracing: true });
  });

  it('G8: refuses what CloudWatch would drop: a long service name, a stage or namespace of the wrong form, the AWS/ prefix', () => {
    assert.deepEqual(problems({ ...base, POWERTOOLS_SERVICE_NAME: 'x'.repeat(251) }), ['POWERTOOLS_SERVICE_NAME must be at most 250 characters']);
    assert.equal(loadConfig({ ...base, POWERTOOLS_SERVICE_NAME: 'x'.repeat(250) }).telemetry.serviceName.length, 250);
    assert.match(problems({ ...base, OUTBOX_STAGE: 'prod stage' })[0]!, /^OUTBOX_STAGE="prod stage" must be 1-64 letters/);
    assert.match(problems({ ...base, OUTBOX_STAGE: 's'.repeat(65) })[0]!, /OUTBOX_STAGE/);
    assert.equal(loadConfig({ ...base, OUTBOX_STAGE: 's'.repeat(64) }).telemetry.stage.length, 64);
    assert.match(problems({ ...base, POWERTOOLS_METRICS_NAMESPACE: 'AWS/Lambda' })[0]!, /not starting with AWS\//);
    assert.match(problems({ ...base, POWERTOOLS_METRICS_NAMESPACE: 'bad|ns' })[0]!, /is not a CloudWatch namespace/);
    assert.match(problems({ ...base, OUTBOX_METRICS: 'file' })[0]!, /OUTBOX_METRICS="file" is not one of stdout, stderr, off/);
  });
});

describe('loadConfig: the log level (OUTBOX_LOG_LEVEL, else POWERTOOLS_LOG_LEVEL, else LOG_LEVEL)', () => {
  it("Powertools' own variables are honoured when OUTBOX_LOG_LEVEL is unset, in Powertools' order; OUTBOX_LOG_LEVEL wins", () => {
    assert.equal(loadConfig(base).logLevel, 'info');
    assert.equal(loadConfig({ ...base, POWERTOOLS_LOG_LEVEL: 'DEBUG' }).logLevel, 'debug');
    assert.equal(loadConfig({ ...base, LOG_LEVEL: 'warn' }).logLevel, 'warn');
    assert.equal(loadConfig({ ...base, POWERTOOLS_LOG_LEVEL: 'error', LOG_LEVEL: 'debug' }).logLevel, 'error');
    assert.equal(loadConfig({ ...base, OUTBOX_LOG_LEVEL: 'warn', POWERTOOLS_LOG_LEVEL: 'debug', LOG_LEVEL: 'debug' }).logLevel, 'warn');
    assert.equal(loadConfig({ ...base, OUTBOX_LOG_LEVEL: ' ', POWERTOOLS_LOG_LEVEL: 'critical' }).logLevel, 'critical', 'blank is unset');
    for (const level of ['TRACE', 'CRITICAL', 'SILENT']) assert.equal(loadConfig({ ...base, POWERTOOLS_LOG_LEVEL: level }).logLevel, level.toLowerCase(), "Powertools' other levels");
  });

  it('G8: a level that is none of them is refused, naming the variable that holds it', () => {
    assert.deepEqual(problems({ ...base, POWERTOOLS_LOG_LEVEL: 'verbose' }), ['POWERTOOLS_LOG_LEVEL="verbose" is not one of trace, debug, info, warn, error, critical, silent (default info)']);
    assert.deepEqual(problems({ ...base, LOG_LEVEL: 'loud' }), ['LOG_LEVEL="loud" is not one of trace, debug, info, warn, error, critical, silent (default info)']);
    assert.deepEqual(problems({ ...base, OUTBOX_LOG_LEVEL: 'all', POWERTOOLS_LOG_LEVEL: 'debug' }), ['OUTBOX_LOG_LEVEL="all" is not one of trace, debug, info, warn, error, critical, silent (default info)']);
  });

  it('the logger built from it writes what that level lets through (POWERTOOLS_LOG_LEVEL=debug: debug lines; =error: no info; silent: nothing)', () => {
    const written = (env: Record<string, string>) => {
      const lines: string[] = [];
      const logger = createLogger(loadConfig({ ...base, ...env }).logLevel, {}, (l) => lines.push((JSON.parse(l) as { level: string }).level));
      logger.debug('d');
      logger.info('i');
      logger.error('e');
      return lines;
    };
    assert.deepEqual(written({ POWERTOOLS_LOG_LEVEL: 'debug' }), ['DEBUG', 'INFO', 'ERROR']);
    assert.deepEqual(written({ LOG_LEVEL: 'error' }), ['ERROR']);
    assert.deepEqual(written({ POWERTOOLS_LOG_LEVEL: 'silent' }), []);
    assert.deepEqual(written({}), ['INFO', 'ERROR']);
  });
});

describe('loadConfig: KAFKA_AUTH (SASL secret, MSK IAM or none)', () => {
  const msk = 'b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098';

  it('unset: sasl with KAFKA_SECRET_ID, else none, as before KAFKA_AUTH existed', () => {
    assert.equal(loadConfig(base).kafka.auth, 'none');
    assert.equal(loadConfig({ ...base, KAFKA_SECRET_ID: 'kafka' }).kafka.auth, 'sasl');
    assert.equal(loadConfig({ ...base, KAFKA_AUTH: 'SASL', KAFKA_SECRET_ID: 'kafka' }).kafka.auth, 'sasl');
  });

  it('iam: no secret, the region from AWS_REGION, TLS on by default off this machine (and off on loopback)', () => {
    const c = loadConfig({ ...base, KAFKA_BROKERS: msk, KAFKA_AUTH: 'iam', AWS_REGION: 'eu-west-1' });
    assert.deepEqual([c.kafka.auth, c.kafka.region, c.kafka.secretId, c.kafka.ssl], ['iam', 'eu-west-1', undefined, true]);
    assert.equal(loadConfig({ ...base, KAFKA_AUTH: 'iam', AWS_REGION: 'us-east-1' }).kafka.ssl, false, 'a broker on this machine: the plaintext exception');
    assert.equal(loadConfig({ ...base, KAFKA_BROKERS: msk, KAFKA_AUTH: 'iam', AWS_REGION: 'eu-west-1', KAFKA_SSL: 'true' }).kafka.ssl, true);
  });

  it('G8: iam with a secret too is refused, saying which to unset', () => {
    const p = problems({ ...base, KAFKA_BROKERS: msk, KAFKA_AUTH: 'iam', AWS_REGION: 'eu-west-1', KAFKA_SECRET_ID: 'kafka' });
    assert.equal(p.length, 1);
    assert.match(p[0]!, /KAFKA_AUTH=iam .*takes no secret, and KAFKA_SECRET_ID is set too: unset KAFKA_SECRET_ID/);
  });

  it('G8: iam without AWS_REGION, iam over plaintext to brokers off this machine, sasl without a secret, none with one: each refused, saying what to do', () => {
    assert.deepEqual(problems({ ...base, KAFKA_BROKERS: msk, KAFKA_AUTH: 'iam' }), [
      "KAFKA_AUTH=iam signs its tokens for the cluster's region, and AWS_REGION is not set: set it to the MSK cluster's region, e.g. AWS_REGION=eu-west-1 (Lambda sets it to the function's)",
    ]);
    const plaintext = problems({ ...base, KAFKA_BROKERS: msk, KAFKA_AUTH: 'iam', AWS_REGION: 'eu-west-1', KAFKA_SSL: 'false' });
    assert.equal(plaintext.length, 1);
    assert.match(plaintext[0]!, /KAFKA_AUTH=iam with KAFKA_SSL=false would send the IAM token .* unencrypted to b-1\.orders.*: unset KAFKA_SSL/);
    assert.match(problems({ ...base, KAFKA_AUTH: 'sasl' })[0]!, /KAFKA_AUTH=sasl needs KAFKA_SECRET_ID/);
    assert.match(problems({ ...base, KAFKA_AUTH: 'none', KAFKA_SECRET_ID: 'kafka' })[0]!, /KAFKA_AUTH=none logs in with no credentials, and KAFKA_SECRET_ID is set too/);
    assert.deepEqual(problems({ ...base, KAFKA_AUTH: 'oauth' }), ['KAFKA_AUTH="oauth" is not one of none, sasl, iam (default sasl when KAFKA_SECRET_ID is set, else none)']);
  });
});

describe('OUTBOX_MAX_BATCH_BYTES', () => {
  const MiB = 1024 * 1024;
  it('defaults from the function\'s memory: 64 MiB for 512 MB (serverless.yml\'s, and outside Lambda), more for more, at least 1 MiB', () => {
    assert.equal(defaultMaxBatchBytes(512), 64 * MiB);
    assert.equal(defaultMaxBatchBytes(1_024), 149 * MiB);
    assert.equal(defaultMaxBatchBytes(128), MiB);
    // expanded payloads hold more copies of a batch: 48 MiB in 512 MB (measured, docs/configuration.md)
    assert.equal(defaultMaxBatchBytes(512, true), 48 * MiB);
    assert.equal(loadConfig({ ...base, OUTBOX_EXPAND_JSON_PAYLOAD: 'true' }).outbox.maxBatchBytes, 48 * MiB);
    assert.equal(loadConfig(base).outbox.maxBatchBytes, 64 * MiB);
    assert.equal(loadConfig({ ...base, AWS_LAMBDA_FUNCTION_MEMORY_SIZE: '2048' }).outbox.maxBatchBytes, defaultMaxBatchBytes(2_048));
    assert.equal(DEFAULT_CLAIM_BYTES.batch, loadConfig(base).outbox.maxBatchBytes, "the store's default is the configuration's");
  });

  it('given, it wins over the memory; out of range or not a number: a problem naming it', () => {
    assert.equal(loadConfig({ ...base, AWS_LAMBDA_FUNCTION_MEMORY_SIZE: '2048', OUTBOX_MAX_BATCH_BYTES: '1048576' }).outbox.maxBatchBytes, MiB);
    assert.match(problems({ ...base, OUTBOX_MAX_BATCH_BYTES: '12' }).join('\n'), /OUTBOX_MAX_BATCH_BYTES=12 is out of range/);
    assert.match(problems({ ...base, OUTBOX_MAX_BATCH_BYTES: '64MB' }).join('\n'), /OUTBOX_MAX_BATCH_BYTES="64MB" is not a whole number/);
  });
});

describe('loadConfig: consumer metadata (OUTBOX_METADATA, OUTBOX_CLOUDEVENTS_SOURCE)', () => {
  it('none by default; each listed option on; cloudevents with its source; the relay\'s headers follow', () => {
    assert.deepEqual(loadConfig(base).outbox.metadata, { timestamp: false, seq: false, trace: false });
    assert.deepEqual(loadConfig(base).outbox.rowRules.relayHeaders, ['id', 'type']);
    const c = loadConfig({ ...base, OUTBOX_METADATA: ' Timestamp, seq,trace ,cloudevents', OUTBOX_CLOUDEVENTS_SOURCE: '/orders' });
    assert.deepEqual(c.outbox.metadata, { timestamp: true, seq: true, trace: true, cloudEventsSource: '/orders' });
    assert.ok(['seq', 'traceparent', 'tracestate', 'ce_id', 'content-type'].every((h) => c.outbox.rowRules.relayHeaders?.includes(h)));
  });

  it('refuses an unknown option, cloudevents without a source, a source without cloudevents, a source that is no URI reference', () => {
    assert.deepEqual(problems({ ...base, OUTBOX_METADATA: 'timestamp,traceid' }), [
      'OUTBOX_METADATA entry "traceid" is not one of timestamp, seq, trace, cloudevents (a comma-separated list, e.g. OUTBOX_METADATA=timestamp,seq,trace)',
    ]);
    assert.match(problems({ ...base, OUTBOX_METADATA: 'cloudevents' })[0]!, /lists cloudevents, which needs OUTBOX_CLOUDEVENTS_SOURCE/);
    assert.match(problems({ ...base, OUTBOX_CLOUDEVENTS_SOURCE: '/orders' })[0]!, /OUTBOX_METADATA does not list cloudevents/);
    assert.match(problems({ ...base, OUTBOX_METADATA: 'cloudevents', OUTBOX_CLOUDEVENTS_SOURCE: 'my orders' })[0]!, /is not a URI reference/);
  });

  it('OUTBOX_CLOUDEVENTS_SOURCE is checked as RFC 3986\'s URI-reference, as CloudEvents requires of ce_source, each refusal saying what is wrong', () => {
    const source = (v: string) => problems({ ...base, OUTBOX_METADATA: 'cloudevents', OUTBOX_CLOUDEVENTS_SOURCE: v });
    for (const ok of ['/orders-service', 'orders', 'urn:example:orders', 'https://example.com/orders?region=eu#x', 'http://[::1]:8080/a', 'https://u:p@h:443/', './a:b', '%E2%9C%93', 'mailto:orders@example.com']) {
      assert.equal(loadConfig({ ...base, OUTBOX_METADATA: 'cloudevents', OUTBOX_CLOUDEVENTS_SOURCE: ok }).outbox.metadata.cloudEventsSource, ok);
    }
    const refused: Array<[string, RegExp]> = [
      ['http://x/%zz<>', /it holds "<", which a URI may not hold as it is: percent-encode it \(%3C\)/],
      ['http://x/%zz', /"%zz" is not a percent-encoding \(% and two hexadecimal digits\); a % itself is %25/],
      ['zoë', /it holds "ë", .*\(%C3%AB\)/],
      ['1a:b', /"1a:" is neither a scheme/],
      ['http://h:x/', /the authority's host "h:x" is neither a name nor an address/],
      ['a#b#c', /the fragment "b#c"/],
      ['a/[b]', /the path "a\/\[b\]"/],
    ];
    for (const [v, reason] of refused) {
      const [problem, ...more] = source(v);
      assert.deepEqual(more, [], v);
      assert.match(problem!, new RegExp(`^OUTBOX_CLOUDEVENTS_SOURCE=${JSON.stringify(v).replace(/[[\]().?*+]/g, '\\$&')} is not a URI reference \\(RFC 3986, as CloudEvents requires of ce_source\\): `), v);
      assert.match(problem!, reason, v);
    }
  });
});

describe('loadConfig: Debezium router options (docs/debezium.md)', () => {
  it('none set: no router options (the relay\'s defaults); each set one read, the rest Debezium\'s defaults where the relay has none', () => {
    assert.equal(loadConfig(base).outbox.metadata.router, undefined);
    const c = loadConfig({ ...base, OUTBOX_KEY_COLUMN: 'id', OUTBOX_ADDITIONAL_PLACEMENT: 'type:header:eventType, tenant:envelope, region:header', OUTBOX_EXPAND_JSON_PAYLOAD: 'true', OUTBOX_HEADER_FORMAT: 'json' });
    assert.deepEqual(c.outbox.metadata.router, {
      key: 'id',
      placement: [
        { column: 'type', place: 'header', alias: 'eventType' },
        { column: 'tenant', place: 'envelope', alias: 'tenant' },
        { column: 'region', place: 'header', alias: 'region' },
      ],
      expandPayload: true,
      headerFormat: 'json',
    });
    assert.deepEqual(c.outbox.rowRules.relayHeaders, ['id', 'eventType', 'region']);
    assert.deepEqual(loadConfig({ ...base, OUTBOX_ADDITIONAL_PLACEMENT: 'none' }).outbox.metadata.router?.placement, []);
  });

  it('refuses a column it cannot place, partition placement, a malformed entry, a second value under one name, more than 4 extra columns', () => {
    const p = (placement: string) => problems({ ...base, OUTBOX_ADDITIONAL_PLACEMENT: placement });
    assert.match(p('payload:header')[0]!, /"payload" is not a column the relay can place/);
    assert.match(p('Tenant:header')[0]!, /"Tenant" is not a column the relay can place/);
    assert.match(p('tenant:partition')[0]!, /partition placement is not supported/);
    assert.match(p('tenant:body')[0]!, /"tenant:body" is not column:header\[:alias\]/);
    assert.match(p('tenant:header:x,region:header:x')[0]!, /places a second value under header "x"/);
    assert.match(p('tenant:header:id')[0]!, /places a second value under header "id"/);
    assert.match(p('a:header,b:header,c:header,d:header,e:header')[0]!, /5 columns beyond id, aggregatetype, aggregateid and type \(a, b, c, d, e\); at most 4/);
    assert.match(problems({ ...base, OUTBOX_KEY_COLUMN: 'tenant' })[0]!, /OUTBOX_KEY_COLUMN="tenant" is not one of aggregateid, id, aggregatetype, type/);
    assert.match(problems({ ...base, OUTBOX_HEADER_FORMAT: 'binary' })[0]!, /OUTBOX_HEADER_FORMAT="binary" is not one of text, json/);
  });
});
