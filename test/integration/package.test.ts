// services: build-dir alone
// Packages the service exactly as a deploy would (scripts/package.sh: esbuild bundle + zip, then
// `osls package`, offline) and checks the CloudFormation template that would be deployed: the
// schedule, the runtime, and above all that the function may read exactly its own secrets.
//
// The template keeps optional parts behind CloudFormation Conditions (HasVpc, HasKafkaSecret,
// HasKmsKey) whose operands are literals once the parameters are resolved, so the checks below
// evaluate those conditions the way CloudFormation would and look at the effective result.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../../src/config/load.ts';
import { createLogger } from '../../src/log.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const zipPath = join(root, '.build', 'relay.zip');

/** the names of the zip's entries, in their order */
function zipEntries(): string[] {
  const list = spawnSync('unzip', ['-Z1', zipPath], { encoding: 'utf8' });
  assert.equal(list.status, 0, list.stderr);
  return list.stdout.trim().split('\n');
}

const ACCOUNT = '123456789012';
const DB_SECRET = `arn:aws:secretsmanager:us-east-1:${ACCOUNT}:secret:outbox/database-AbCdEf`;
const KAFKA_SECRET = `arn:aws:secretsmanager:us-east-1:${ACCOUNT}:secret:outbox/kafka-GhIjKl`;
const KMS_KEY = `arn:aws:kms:us-east-1:${ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab`;
const BROKERS = 'b-1.relay.kafka.us-east-1.amazonaws.com:9096,b-2.relay.kafka.us-east-1.amazonaws.com:9096';

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Obj = { [key: string]: Json };
interface Resource {
  Type: string;
  Properties?: Obj;
  DependsOn?: string | string[];
  Condition?: string;
}
interface Template {
  Resources: Record<string, Resource>;
  Conditions?: Obj;
  Outputs?: Record<string, { Value: Json }>;
}
interface Statement {
  Sid?: string;
  Effect: string;
  Action: string | string[];
  Resource: Json;
  Condition?: Obj;
}

const tmpDirs: string[] = [];

function packageWith(params: string[]): Template {
  const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-package-'));
  tmpDirs.push(dir);
  const res = spawnSync('bash', ['scripts/package.sh', ...params.map((p) => `--param=${p}`)], {
    cwd: root,
    env: { ...process.env, STAGE: 'prod', REGION: 'us-east-1', PACKAGE_DIR: dir },
    encoding: 'utf8',
    timeout: 180_000,
  });
  assert.equal(res.status, 0, `scripts/package.sh failed (status ${res.status}):\n${res.stdout}\n${res.stderr}`);
  return JSON.parse(readFileSync(join(dir, 'cloudformation-template-update-stack.json'), 'utf8')) as Template;
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const NO_VALUE = Symbol('AWS::NoValue');

/** Evaluates a condition the way CloudFormation does; only literal operands occur here. */
function condition(t: Template, name: string): boolean {
  const def = t.Conditions?.[name];
  assert.ok(def !== undefined, `condition ${name} is not defined`);
  const ev = (c: Json): boolean | string => {
    if (typeof c === 'string') return c;
    assert.ok(isObj(c), `unsupported condition operand ${JSON.stringify(c)}`);
    const [fn, args] = Object.entries(c)[0] as [string, Json];
    const list = args as Json[];
    switch (fn) {
      case 'Fn::Not':
        return !ev(list[0] as Json);
      case 'Fn::Equals':
        return ev(list[0] as Json) === ev(list[1] as Json);
      case 'Fn::And':
        return list.every((x) => ev(x) === true);
      case 'Fn::Or':
        return list.some((x) => ev(x) === true);
      case 'Condition':
        return condition(t, args as string);
      default:
        assert.fail(`unsupported condition function ${fn}`);
    }
  };
  const v = ev(def);
  assert.equal(typeof v, 'boolean');
  return v as boolean;
}

/** Resolves Fn::If and drops AWS::NoValue, leaving every other intrinsic as it is. */
function effective(t: Template, v: Json): Json | typeof NO_VALUE {
  if (Array.isArray(v)) {
    return v.map((x) => effective(t, x)).filter((x): x is Json => x !== NO_VALUE);
  }
  if (!isObj(v)) return v;
  if (v.Ref === 'AWS::NoValue') return NO_VALUE;
  if ('Fn::If' in v) {
    const [name, yes, no] = v['Fn::If'] as [string, Json, Json];
    return effective(t, condition(t, name) ? yes : no);
  }
  const out: Obj = {};
  for (const [k, x] of Object.entries(v)) {
    const e = effective(t, x);
    if (e !== NO_VALUE) out[k] = e;
  }
  return out;
}

function props(t: Template, logicalId: string): Obj {
  const r = t.Resources[logicalId];
  assert.ok(r, `resource ${logicalId} missing; resources: ${Object.keys(t.Resources).join(', ')}`);
  if (r.Condition) assert.ok(condition(t, r.Condition), `${logicalId} is conditional and its condition is false`);
  const p = effective(t, r.Properties ?? {});
  assert.ok(isObj(p));
  return p;
}

function ofType(t: Template, type: string): string[] {
  return Object.entries(t.Resources)
    .filter(([, r]) => r.Type === type && (!r.Condition || condition(t, r.Condition)))
    .map(([id]) => id);
}

function theFunction(t: Template): { id: string; p: Obj } {
  const ids = ofType(t, 'AWS::Lambda::Function');
  assert.deepEqual(ids, ['RelayLambdaFunction']);
  return { id: 'RelayLambdaFunction', p: props(t, 'RelayLambdaFunction') };
}

/** Every statement granted to the function's role: its inline policies and attached AWS::IAM::Policy resources. */
function roleStatements(t: Template): Statement[] {
  const fn = theFunction(t).p;
  const roleRef = fn.Role as Obj;
  const roleId = (roleRef['Fn::GetAtt'] as string[])[0] as string;
  const role = props(t, roleId);
  const docs: Json[] = [];
  for (const pol of (role.Policies ?? []) as Obj[]) docs.push(pol.PolicyDocument as Json);
  for (const id of ofType(t, 'AWS::IAM::Policy')) {
    const p = props(t, id);
    const roles = (p.Roles ?? []) as Json[];
    if (roles.some((r) => isObj(r) && r.Ref === roleId)) docs.push(p.PolicyDocument as Json);
  }
  return docs.flatMap((d) => (isObj(d) ? ((d.Statement ?? []) as unknown as Statement[]) : []));
}

const list = (v: Json | undefined): Json[] => (v === undefined ? [] : Array.isArray(v) ? v : [v]);
const actions = (s: Statement): string[] => list(s.Action) as string[];
const touches = (s: Statement, service: string) =>
  actions(s).some((a) => a === '*' || a.toLowerCase().startsWith(`${service}:`));

/** No `*` action, no `secretsmanager:*`/`kms:*`, no `Resource: "*"`, and GetSecretValue is the only secretsmanager action. */
function assertNoWildcards(statements: Statement[]): void {
  for (const s of statements.filter((x) => touches(x, 'secretsmanager') || touches(x, 'kms'))) {
    assert.ok(!actions(s).some((a) => a === '*' || a.endsWith(':*')), `wildcard action in ${JSON.stringify(s)}`);
    assert.ok(!list(s.Resource).includes('*'), `Resource "*" in ${JSON.stringify(s)}`);
    for (const a of actions(s).filter((x) => x.startsWith('secretsmanager:'))) assert.equal(a, 'secretsmanager:GetSecretValue');
  }
}

function managedPolicies(t: Template): Json[] {
  const fn = theFunction(t).p;
  const roleId = ((fn.Role as Obj)['Fn::GetAtt'] as string[])[0] as string;
  return list(props(t, roleId).ManagedPolicyArns);
}

after(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

describe('packaged for AWS (stage prod, default parameters)', () => {
  let t: Template;
  before(() => {
    t = packageWith([`databaseSecretArn=${DB_SECRET}`, `kafkaSecretArn=${KAFKA_SECRET}`, `kafkaBrokers=${BROKERS}`]);
  });

  it('runs the bundled handler on nodejs24.x, arm64, with the configured timeout and memory', () => {
    const { p } = theFunction(t);
    assert.equal(p.Runtime, 'nodejs24.x');
    assert.deepEqual(p.Architectures, ['arm64']);
    assert.equal(p.Handler, 'handler.handler');
    assert.equal(p.Timeout, 60);
    assert.equal(p.MemorySize, 512);
    assert.match((p.Code as Obj).S3Key as string, /\/relay\.zip$/);
    assert.equal(p.ReservedConcurrentExecutions, 2, 'reserved concurrency 2 by default: at most 2 × 3 Postgres connections');
    assert.equal(p.VpcConfig, undefined, 'no VPC unless subnetIds is given');
  });

  it('is fired every minute by an EventBridge rule targeting the function', () => {
    const rules = ofType(t, 'AWS::Events::Rule');
    assert.equal(rules.length, 1);
    const rule = props(t, rules[0] as string);
    assert.equal(rule.ScheduleExpression, 'rate(1 minute)');
    assert.equal(rule.State, 'ENABLED');
    const targets = rule.Targets as Obj[];
    assert.equal(targets.length, 1);
    assert.deepEqual((targets[0] as Obj).Arn, { 'Fn::GetAtt': ['RelayLambdaFunction', 'Arn'] });

    const perms = ofType(t, 'AWS::Lambda::Permission').map((id) => props(t, id));
    assert.ok(
      perms.some(
        (p) =>
          p.Principal === 'events.amazonaws.com' &&
          p.Action === 'lambda:InvokeFunction' &&
          JSON.stringify(p.SourceArn) === JSON.stringify({ 'Fn::GetAtt': [rules[0], 'Arn'] }),
      ),
      'EventBridge may invoke the function',
    );
  });

  it('turns Lambda async retries off (the next tick retries anyway)', () => {
    const confs = ofType(t, 'AWS::Lambda::EventInvokeConfig').map((id) => props(t, id));
    assert.equal(confs.length, 1);
    const conf = confs[0] as Obj;
    assert.deepEqual(conf.FunctionName, { Ref: 'RelayLambdaFunction' });
    assert.equal(conf.MaximumRetryAttempts, 0);
    assert.equal(conf.MaximumEventAgeInSeconds, 120);
  });

  it('passes the relay its configuration through the environment', () => {
    const env = (theFunction(t).p.Environment as Obj).Variables as Obj;
    assert.deepEqual(env, {
      NODE_OPTIONS: '--enable-source-maps',
      NODE_EXTRA_CA_CERTS: '/var/runtime/ca-cert.pem',
      DATABASE_SECRET_ID: DB_SECRET,
      DATABASE_PREPARE: 'true',
      DATABASE_SSL: 'verify-full',
      DATABASE_AUTH: 'password',
      KAFKA_BROKERS: BROKERS,
      KAFKA_SECRET_ID: KAFKA_SECRET,
      KAFKA_AUTH: '', // unset for the relay: sasl, since a secret is given
      KAFKA_SSL: 'true',
      OUTBOX_KAFKA_CLIENT: 'kafkajs',
      OUTBOX_COMPRESSION: 'none',
      OUTBOX_FANOUT_MAX: '1',
      OUTBOX_MAX_MESSAGE_BYTES: '',
      OUTBOX_TABLE: 'outbox',
      OUTBOX_BATCH_SIZE: '500',
      OUTBOX_SAFETY_MARGIN_MS: '3000',
      OUTBOX_MAX_ATTEMPTS: '10',
      OUTBOX_TOPIC_TEMPLATE: 'outbox.event.{aggregatetype}',
      OUTBOX_TOPIC_PREFIX: '',
      OUTBOX_HEADERS_ALLOW_RESERVED: '',
      OUTBOX_HEADERS_MAX_COUNT: '32',
      OUTBOX_HEADERS_MAX_BYTES: '16384',
      OUTBOX_PARKED_POLICY: 'hold',
      OUTBOX_SENT_ROWS: 'keep',
      OUTBOX_RETAIN_SENT_MS: '86400000',
      OUTBOX_RETAIN_SKIPPED_MS: '2592000000',
      OUTBOX_IDLE: 'exit',
      OUTBOX_DELIVERY: 'at-least-once',
      POWERTOOLS_LOG_LEVEL: 'info',
      OUTBOX_TRACING: 'false',
      POWERTOOLS_SERVICE_NAME: 'outbox-relay',
      POWERTOOLS_METRICS_NAMESPACE: 'OutboxRelay',
      OUTBOX_STAGE: 'prod',
    });
  });

  it("honours POWERTOOLS_LOG_LEVEL as deployed: the relay's level follows it when an operator changes it on the function", () => {
    const env = (theFunction(t).p.Environment as Obj).Variables as Record<string, string>;
    const levelWith = (changed: Record<string, string>) => loadConfig({ ...env, ...changed }).logLevel;
    assert.equal(levelWith({ POWERTOOLS_LOG_LEVEL: 'DEBUG' }), 'debug', 'POWERTOOLS_LOG_LEVEL=DEBUG on the deployed function');
    assert.equal(levelWith({ POWERTOOLS_LOG_LEVEL: 'ERROR' }), 'error');
    assert.equal(levelWith({}), 'info', 'the logLevel parameter, through POWERTOOLS_LOG_LEVEL');
    assert.equal(levelWith({ POWERTOOLS_LOG_LEVEL: 'DEBUG', OUTBOX_LOG_LEVEL: 'warn' }), 'warn', "the relay's own variable, when set, still wins");
    const lines: string[] = [];
    const log = createLogger(levelWith({ POWERTOOLS_LOG_LEVEL: 'debug' }), {}, (line) => lines.push(line));
    log.debug('probe');
    assert.equal(lines.length, 1, 'the logger built from it writes debug lines');
  });

  it('sends each tick Lambda drops (failed, or expired in its queue) to an SQS queue of its own: encrypted, kept 14 days, the role may send to it alone; AsyncEventsDropped alarms', () => {
    const conf = props(t, ofType(t, 'AWS::Lambda::EventInvokeConfig')[0] as string);
    const queue = { 'Fn::GetAtt': ['RelayFailureQueue', 'Arn'] };
    assert.deepEqual(conf.DestinationConfig, { OnFailure: { Destination: queue } });
    const q = props(t, 'RelayFailureQueue');
    assert.equal(q.SqsManagedSseEnabled, true);
    assert.equal(q.MessageRetentionPeriod, 1_209_600);
    const sqs = roleStatements(t).filter((s) => touches(s, 'sqs'));
    assert.deepEqual(sqs.map((s) => [s.Effect, actions(s), list(s.Resource)]), [['Allow', ['sqs:SendMessage'], [queue]]]);
    const dropped = props(t, 'AsyncEventsDroppedAlarm');
    assert.deepEqual([dropped.Namespace, dropped.MetricName, dropped.Dimensions, dropped.Threshold], ['AWS/Lambda', 'AsyncEventsDropped', [{ Name: 'FunctionName', Value: { Ref: 'RelayLambdaFunction' } }], 0]);
  });

  it('creates an SNS topic for the alarms, which every alarm notifies; alarms when an invocation ends near its timeout', () => {
    const topic = props(t, 'RelayAlarmTopic');
    assert.equal(topic.TopicName, 'outbox-relay-prod-alarms');
    const alarms = ofType(t, 'AWS::CloudWatch::Alarm');
    assert.equal(alarms.length, 8);
    for (const id of alarms) assert.deepEqual([props(t, id).AlarmActions, props(t, id).OKActions], [[{ Ref: 'RelayAlarmTopic' }], [{ Ref: 'RelayAlarmTopic' }]], id);
    const near = props(t, 'DurationNearTimeoutAlarm');
    const [duration, share] = near.Metrics as Obj[];
    assert.deepEqual(((duration!.MetricStat as Obj).Metric as Obj).MetricName, 'Duration');
    // what is left of the 3 s safety margin when the invocation ends, against the 60 s timeout
    assert.equal(share!.Expression, '(60000 - duration) / 3000');
    assert.deepEqual([near.ComparisonOperator, near.Threshold], ['LessThanThreshold', 0.5]);
  });

  it('outputs the function, its role, the dashboard, the alarm topic and the failure queue', () => {
    const outputs = Object.fromEntries(Object.entries(t.Outputs ?? {}).map(([k, o]) => [k, effective(t, o.Value)]));
    assert.deepEqual(outputs, {
      ServerlessDeploymentBucketName: { Ref: 'ServerlessDeploymentBucket' },
      FunctionName: { Ref: 'RelayLambdaFunction' },
      FunctionArn: { 'Fn::GetAtt': ['RelayLambdaFunction', 'Arn'] },
      RoleArn: { 'Fn::GetAtt': ['IamRoleLambdaExecution', 'Arn'] },
      DashboardName: { Ref: 'RelayDashboard' },
      AlarmTopicArn: { Ref: 'RelayAlarmTopic' },
      FailureQueueArn: { 'Fn::GetAtt': ['RelayFailureQueue', 'Arn'] },
    });
  });

  it('traces nothing, tags nothing and sets no permissions boundary unless asked', () => {
    assert.equal(theFunction(t).p.TracingConfig, undefined);
    assert.ok(!roleStatements(t).some((s) => touches(s, 'xray')), 'no xray permission');
    for (const [id, r] of Object.entries(t.Resources)) assert.equal(r.Properties?.Tags, undefined, id);
    assert.equal(props(t, 'IamRoleLambdaExecution').PermissionsBoundary, undefined);
  });

  it('may read exactly the two configured secrets, and nothing with a wildcard', () => {
    const statements = roleStatements(t);
    const read = statements.filter((s) => s.Effect === 'Allow' && actions(s).includes('secretsmanager:GetSecretValue'));
    assert.deepEqual(read.flatMap((s) => list(s.Resource)).sort(), [DB_SECRET, KAFKA_SECRET].sort());
    assertNoWildcards(statements);
    assert.ok(!statements.some((s) => touches(s, 'kms')), 'no kms permission without kmsKeyArn');
    assert.ok(!statements.some((s) => touches(s, 'rds-db')), 'no rds-db permission without databaseAuth=iam');
    assert.ok(!statements.some((s) => touches(s, 'lambda')), 'no lambda permission with fan-out off (fanoutMax 1)');
    // the first tick must not run before the secrets policy is attached
    assert.ok(list(t.Resources.RelayLambdaFunction?.DependsOn).includes('RelaySecretsPolicy'));
  });

  it('keeps its logs for 14 days and attaches no managed policy outside a VPC', () => {
    const groups = ofType(t, 'AWS::Logs::LogGroup').map((id) => props(t, id));
    assert.equal(groups.length, 1);
    assert.equal((groups[0] as Obj).RetentionInDays, 14);
    assert.deepEqual(managedPolicies(t), []);
  });

  it('ships a small, self-contained zip: handler.mjs at its root with its chunks, source maps and the third-party notices', () => {
    assert.ok(existsSync(zipPath), `${zipPath} missing`);
    const size = statSync(zipPath).size;
    assert.ok(size > 10_000 && size < 5 * 1024 * 1024, `zip is ${size} bytes`);
    const names = zipEntries();
    assert.ok(names.includes('handler.mjs'), `zip contains handler.mjs (the function's handler.handler): ${names.join(', ')}`);
    assert.ok(names.includes('THIRD-PARTY-NOTICES.txt'), 'zip contains the third-party notices');
    const code = names.filter((n) => n.endsWith('.mjs'));
    assert.ok(code.some((n) => n.startsWith('chunks/')), 'the Kafka clients are split into chunks');
    for (const file of code) assert.ok(names.includes(`${file}.map`), `zip contains ${file}'s source map`);
    assert.deepEqual(names.filter((n) => !code.includes(n) && !n.endsWith('.mjs.map')), ['THIRD-PARTY-NOTICES.txt'], 'nothing else');

    // The bundle must load with no node_modules around it, as in Lambda: the zip's files only.
    const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-bundle-'));
    tmpDirs.push(dir);
    const unzip = spawnSync('unzip', ['-q', zipPath, '-d', dir], { encoding: 'utf8' });
    assert.equal(unzip.status, 0, unzip.stderr);
    // no test hook is deployed: their settings and code are compiled out (src/test-hooks.ts)
    for (const file of code) assert.doesNotMatch(readFileSync(join(dir, file), 'utf8'), /OUTBOX_TEST_\w*|test hook: /, file);
    const probe = spawnSync(
      process.execPath,
      ['--input-type=module', '-e', `const m = await import(${JSON.stringify(join(dir, 'handler.mjs'))}); console.log(typeof m.handler);`],
      {
        cwd: dir,
        encoding: 'utf8',
        timeout: 30_000,
        env: {
          PATH: process.env.PATH ?? '',
          DATABASE_URL: 'postgres://relay:relay@127.0.0.1:1/relay',
          KAFKA_BROKERS: '127.0.0.1:1',
          KAFKAJS_NO_PARTITIONER_WARNING: '1',
        },
      },
    );
    assert.equal(probe.status, 0, `importing the bundle failed:\n${probe.stderr}`);
    assert.equal(probe.stdout.trim(), 'function');
  });

  it("ships THIRD-PARTY-NOTICES.txt: every package whose code is in the bundle (as its source maps name them), with its version, its declared license and its license files' text", () => {
    const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-notices-'));
    tmpDirs.push(dir);
    assert.equal(spawnSync('unzip', ['-q', zipPath, '-d', dir]).status, 0);
    const notices = readFileSync(join(dir, 'THIRD-PARTY-NOTICES.txt'), 'utf8');
    // the packages the code came from, read from the source maps of every code file in the zip
    // (their sources are paths like ../../node_modules/kafkajs/src/producer/index.js)
    const packageDirs = new Set<string>();
    for (const file of zipEntries().filter((n) => n.endsWith('.mjs.map'))) {
      for (const source of (JSON.parse(readFileSync(join(dir, file), 'utf8')) as { sources: string[] }).sources) {
        const m = /^(?:\.\.\/)*(node_modules\/(?:.*\/node_modules\/)?(?:@[^/]+\/)?[^/]+)\//.exec(source);
        if (m) packageDirs.add(m[1]!);
      }
    }
    for (const lib of ['kafkajs', '@platformatic/kafka', 'postgres', '@aws-sdk/client-secrets-manager', '@middy/core']) {
      assert.ok(packageDirs.has(`node_modules/${lib}`), `the bundle holds ${lib} (source maps name: ${[...packageDirs].join(', ')})`);
    }
    const entries = notices.split(`\n${'='.repeat(80)}\n`).slice(1);
    const normalise = (t: string) => t.replace(/\r\n?/g, '\n').replace(/\s+$/, '');
    for (const pkgDir of packageDirs) {
      const pkg = JSON.parse(readFileSync(join(root, pkgDir, 'package.json'), 'utf8')) as { name: string; version: string; license?: string | { type: string } };
      const license = typeof pkg.license === 'object' ? pkg.license.type : pkg.license;
      const entry = entries.find((e) => e.startsWith(`${pkg.name} ${pkg.version}\nLicense: ${license}\n`));
      assert.ok(entry, `THIRD-PARTY-NOTICES.txt has no entry "${pkg.name} ${pkg.version}" (License: ${license}) for ${pkgDir}`);
      assert.ok(notices.includes(`\n  ${pkg.name} ${pkg.version} (${license})\n`), `the summary at the top lists ${pkg.name} ${pkg.version}`);
      const files = readdirSync(join(root, pkgDir)).filter((f) => /^(licen[cs]e|copying|notice)([-._].*)?$/i.test(f));
      for (const f of files) {
        const text = normalise(readFileSync(join(root, pkgDir, f), 'utf8'));
        assert.ok(notices.includes(`\n${text}\n`), `the text of ${pkgDir}/${f} is in the notices`);
        assert.ok(entry.includes(`\n${f}:\n\n${text}\n`) || entry.includes(`\n${f}: the same text, word for word, as the `), `${pkg.name}'s entry gives its ${f}, or names the same text given above`);
      }
      if (!files.length) assert.match(entry, /ships no license file/, `${pkg.name} ships no license file, and its entry says so`);
    }
    assert.equal(entries.length, packageDirs.size, 'one entry per bundled package, no more');
  });

  it('is reproducible: building again gives a byte-identical zip (CloudFormation sees no code change)', () => {
    const first = readFileSync(zipPath);
    const again = spawnSync(process.execPath, [join(root, 'scripts', 'build.mjs'), '--lambda-only'], { cwd: root, encoding: 'utf8', timeout: 180_000 });
    assert.equal(again.status, 0, `scripts/build.mjs --lambda-only failed:\n${again.stdout}${again.stderr}`);
    const second = readFileSync(zipPath);
    assert.ok(first.equals(second), `the zip changed between two builds of the same code (${first.length} and ${second.length} bytes)`);
  });
});

describe('packaged for AWS with VPC, KMS key, RDS IAM authentication, reserved concurrency, fan-out and a longer timeout', () => {
  let t: Template;
  before(() => {
    t = packageWith([
      `databaseSecretArn=${DB_SECRET}`,
      `kafkaBrokers=${BROKERS}`,
      `kmsKeyArn=${KMS_KEY}`,
      'reservedConcurrency=3',
      'fanoutMax=3',
      'timeout=120',
      'subnetIds=subnet-0aaa,subnet-0bbb',
      'securityGroupIds=sg-0ccc',
      'databasePrepare=false',
      'databaseAuth=iam',
      'databaseIamResourceId=db-ABCDEFGHIJKLMNOPQRSTUVWXY',
      'databaseIamUser=relay',
    ]);
  });

  it('logs in with IAM: DATABASE_AUTH=iam, and rds-db:connect on exactly that database user, nothing more', () => {
    assert.equal(((theFunction(t).p.Environment as Obj).Variables as Obj).DATABASE_AUTH, 'iam');
    const rds = roleStatements(t).filter((s) => touches(s, 'rds-db'));
    assert.equal(rds.length, 1);
    const s = rds[0] as Statement;
    assert.equal(s.Effect, 'Allow');
    assert.deepEqual(actions(s), ['rds-db:connect']);
    assert.deepEqual(list(s.Resource), [
      { 'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':rds-db:', { Ref: 'AWS::Region' }, ':', { Ref: 'AWS::AccountId' }, ':dbuser:db-ABCDEFGHIJKLMNOPQRSTUVWXY/relay']] },
    ]);
  });

  it("fans out: OUTBOX_FANOUT_MAX=3, and lambda:InvokeFunction on the function's own ARN, nothing more", () => {
    assert.equal(((theFunction(t).p.Environment as Obj).Variables as Obj).OUTBOX_FANOUT_MAX, '3');
    const invoke = roleStatements(t).filter((s) => touches(s, 'lambda'));
    assert.deepEqual(invoke, [{ Sid: 'StartHelpersOfItself', Effect: 'Allow', Action: 'lambda:InvokeFunction', Resource: { 'Fn::GetAtt': ['RelayLambdaFunction', 'Arn'] } }]);
  });

  it('uses the given timeout and reserved concurrency', () => {
    const { p } = theFunction(t);
    assert.equal(p.Timeout, 120);
    assert.equal(p.ReservedConcurrentExecutions, 3);
    assert.equal(((p.Environment as Obj).Variables as Obj).DATABASE_PREPARE, 'false');
  });

  it('may decrypt with exactly that key, and only through Secrets Manager', () => {
    const statements = roleStatements(t);
    assertNoWildcards(statements);
    const kms = statements.filter((s) => touches(s, 'kms'));
    assert.equal(kms.length, 1);
    const s = kms[0] as Statement;
    assert.equal(s.Effect, 'Allow');
    assert.deepEqual(actions(s), ['kms:Decrypt']);
    assert.deepEqual(list(s.Resource), [KMS_KEY]);
    assert.ok(JSON.stringify(s.Condition).includes('kms:ViaService'));
  });

  it('reads only the database secret when no Kafka secret is configured', () => {
    const statements = roleStatements(t);
    const read = statements.filter((s) => actions(s).includes('secretsmanager:GetSecretValue'));
    assert.deepEqual(read.flatMap((s) => list(s.Resource)), [DB_SECRET]);
    const env = (theFunction(t).p.Environment as Obj).Variables as Obj;
    assert.equal(env.KAFKA_SECRET_ID, '', 'empty means unset to the relay');
  });

  it('runs in the given subnets and security groups, with the ENI permissions Lambda needs there', () => {
    const vpc = theFunction(t).p.VpcConfig as Obj;
    assert.deepEqual(vpc, {
      SubnetIds: { 'Fn::Split': [',', 'subnet-0aaa,subnet-0bbb'] },
      SecurityGroupIds: { 'Fn::Split': [',', 'sg-0ccc'] },
    });
    assert.equal(managedPolicies(t).length, 1);
    assert.match(JSON.stringify(managedPolicies(t)[0]), /:iam::aws:policy\/service-role\/AWSLambdaVPCAccessExecutionRole/);
  });
});

describe('packaged for AWS with tracing, tags, a permissions boundary, and an alarm topic and a failure queue given', () => {
  const TOPIC = `arn:aws:sns:us-east-1:${ACCOUNT}:outbox-oncall`;
  const QUEUE = `arn:aws:sqs:us-east-1:${ACCOUNT}:outbox-dropped`;
  const BOUNDARY = `arn:aws:iam::${ACCOUNT}:policy/team-boundary`;
  let t: Template;
  before(() => {
    t = packageWith([
      `databaseSecretArn=${DB_SECRET}`,
      `kafkaBrokers=${BROKERS}`,
      'tracing=true',
      'tags=team=payments, cost-center=42',
      `permissionsBoundary=${BOUNDARY}`,
      `alarmTopicArn=${TOPIC}`,
      `failureQueueArn=${QUEUE}`,
    ]);
  });

  it('traces with X-Ray: TracingConfig Active, OUTBOX_TRACING=true for the relay, and the role may put trace segments', () => {
    const { p } = theFunction(t);
    assert.deepEqual(p.TracingConfig, { Mode: 'Active' });
    assert.equal(((p.Environment as Obj).Variables as Obj).OUTBOX_TRACING, 'true');
    assert.equal(loadConfig((p.Environment as Obj).Variables as Record<string, string>).telemetry.tracing, true);
    const xray = roleStatements(t).filter((s) => touches(s, 'xray'));
    assert.deepEqual(xray.flatMap(actions).sort(), ['xray:PutTelemetryRecords', 'xray:PutTraceSegments']);
  });

  it("puts the tags on the function's role, the function, its log group and every alarm, and on the stack", () => {
    const tags = [
      { Key: 'team', Value: 'payments' },
      { Key: 'cost-center', Value: '42' },
    ];
    const tagged = ['IamRoleLambdaExecution', 'RelayLambdaFunction', 'RelayLogGroup', ...ofType(t, 'AWS::CloudWatch::Alarm')];
    assert.equal(tagged.length, 11);
    for (const id of tagged) assert.deepEqual(props(t, id).Tags, tags, id);
  });

  it("sets the permissions boundary on the function's role", () => {
    assert.equal(props(t, 'IamRoleLambdaExecution').PermissionsBoundary, BOUNDARY);
  });

  it('creates no topic and no queue: the alarms notify the given topic, dropped ticks go to the given queue, and the outputs name them', () => {
    assert.deepEqual(ofType(t, 'AWS::SNS::Topic'), []);
    assert.deepEqual(ofType(t, 'AWS::SQS::Queue'), []);
    for (const id of ofType(t, 'AWS::CloudWatch::Alarm')) assert.deepEqual(props(t, id).AlarmActions, [TOPIC], id);
    const conf = props(t, ofType(t, 'AWS::Lambda::EventInvokeConfig')[0] as string);
    assert.deepEqual(conf.DestinationConfig, { OnFailure: { Destination: QUEUE } });
    assert.deepEqual(roleStatements(t).filter((s) => touches(s, 'sqs')).map((s) => [actions(s), list(s.Resource)]), [[['sqs:SendMessage'], [QUEUE]]]);
    assert.deepEqual([effective(t, t.Outputs!.AlarmTopicArn!.Value), effective(t, t.Outputs!.FailureQueueArn!.Value)], [TOPIC, QUEUE]);
  });
});

/** A resource string as CloudFormation computes it, for the functions serverless.yml's IAM resources use. */
function evaluate(t: Template, v: Json): string {
  if (typeof v === 'string') return v;
  assert.ok(isObj(v), `unsupported operand ${JSON.stringify(v)}`);
  const [fn, args] = Object.entries(v)[0] as [string, Json[]];
  switch (fn) {
    case 'Fn::Join':
      return (args[1] as Json[]).map((x) => evaluate(t, x)).join(args[0] as string);
    case 'Fn::Select':
      return evaluate(t, args[1] as Json).split('\u0000')[Number(args[0])] ?? '';
    case 'Fn::Split':
      return evaluate(t, args[1] as Json).split(args[0] as string).join('\u0000');
    case 'Fn::If':
      return evaluate(t, condition(t, args[0] as string) ? (args[1] as Json) : (args[2] as Json));
    default:
      assert.fail(`unsupported function ${fn}`);
  }
}

describe('packaged for AWS with MSK IAM access control', () => {
  const CLUSTER = `arn:aws:kafka:us-east-1:${ACCOUNT}:cluster/orders/0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d-2`;

  it('logs in with IAM: KAFKA_AUTH=iam, no Kafka secret, kafka-cluster actions on the cluster and on the topics under the prefix only', () => {
    const t = packageWith([`databaseSecretArn=${DB_SECRET}`, 'kafkaBrokers=b-1.orders.kafka.us-east-1.amazonaws.com:9098', 'kafkaAuth=iam', `mskClusterArn=${CLUSTER}`, 'topicPrefix=orders.events.']);
    const env = (theFunction(t).p.Environment as Obj).Variables as Obj;
    assert.equal(env.KAFKA_AUTH, 'iam');
    assert.equal(env.KAFKA_SECRET_ID, '', 'no Kafka secret');
    const kafka = roleStatements(t).filter((s) => touches(s, 'kafka-cluster'));
    assert.deepEqual(
      kafka.map((s) => [actions(s).sort(), list(s.Resource).map((r) => evaluate(t, r))]),
      [
        [['kafka-cluster:Connect', 'kafka-cluster:WriteDataIdempotently'], [CLUSTER]],
        [['kafka-cluster:DescribeTopic', 'kafka-cluster:DescribeTopicDynamicConfiguration', 'kafka-cluster:WriteData'], [`arn:aws:kafka:us-east-1:${ACCOUNT}:topic/orders/0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d-2/orders.events.*`]],
      ],
    );
    assert.ok(!roleStatements(t).some((s) => touches(s, 'secretsmanager') && JSON.stringify(s).includes('kafka')), 'no permission on a Kafka secret');
  });

  it('G8: kafkaAuth=iam without mskClusterArn, databaseAuth=iam without its user: refused before anything is built, naming each parameter', () => {
    const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-package-'));
    tmpDirs.push(dir);
    const res = spawnSync('bash', ['scripts/package.sh', `--param=databaseSecretArn=${DB_SECRET}`, `--param=kafkaBrokers=${BROKERS}`, '--param=kafkaAuth=iam', '--param=databaseAuth=iam'], {
      cwd: root,
      env: { ...process.env, STAGE: 'prod', REGION: 'us-east-1', PACKAGE_DIR: dir },
      encoding: 'utf8',
      timeout: 180_000,
    });
    const out = `${res.stdout}\n${res.stderr}`;
    assert.notEqual(res.status, 0, out);
    assert.match(out, /kafkaAuth=iam needs mskClusterArn, the MSK cluster's ARN/);
    assert.match(out, /databaseAuth=iam needs databaseIamResourceId and databaseIamUser/);
    assert.ok(!existsSync(join(dir, 'cloudformation-template-update-stack.json')), 'nothing was packaged');
  });

  it('G8: kafkaAuth=iam with no topic prefix (empty topicPrefix, a template starting with a placeholder), malformed tags, fanoutMax > reservedConcurrency: refused, naming the parameters', () => {
    const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-package-'));
    tmpDirs.push(dir);
    const params = [`databaseSecretArn=${DB_SECRET}`, `kafkaBrokers=${BROKERS}`, 'kafkaAuth=iam', `mskClusterArn=${CLUSTER}`, 'topicTemplate={aggregatetype}.events', 'tags=team', 'fanoutMax=5'];
    const res = spawnSync('bash', ['scripts/package.sh', ...params.map((p) => `--param=${p}`)], {
      cwd: root,
      env: { ...process.env, STAGE: 'prod', REGION: 'us-east-1', PACKAGE_DIR: dir },
      encoding: 'utf8',
      timeout: 180_000,
    });
    const out = `${res.stdout}\n${res.stderr}`;
    assert.notEqual(res.status, 0, `packaged a kafka-cluster policy on every topic (topic/<cluster>/*):\n${out}`);
    assert.match(out, /kafkaAuth=iam with an empty topicPrefix and a topicTemplate that starts with a placeholder \("\{aggregatetype\}\.events"\)/);
    assert.match(out, /set topicPrefix/);
    assert.match(out, /tags: "team" is not a tag: give comma-separated key=value pairs/);
    assert.match(out, /fanoutMax=5 is more than reservedConcurrency=2: .* Raise reservedConcurrency to 6 \(fanoutMax \+ 1 leaves room for the next tick\), or lower fanoutMax/);
    assert.ok(!existsSync(join(dir, 'cloudformation-template-update-stack.json')), 'nothing was packaged');
  });
});
