// serverless.yml read as plain YAML (the ${…} variables are just strings to a YAML parser):
// the local stage and its plugin, offline-only variables, and that every environment variable
// it sets is one the relay reads, with defaults equal to the relay's own but for a short list of
// intended differences, each with its reason. The alarms and the
// dashboard are checked on the template as a deployment would see it: the few variable sources
// the file uses are resolved here the way osls resolves them (params.<stage>, then
// params.default, `--param` overrides first), and the CloudFormation conditions evaluated.
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { loadConfig } from '../../src/config/load.ts';
import { type Config } from '../../src/config/types.ts';
import { METRICS } from '../../src/lambda/metrics.ts';
import { databaseTls } from '../../src/transport.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const text = readFileSync(join(root, 'serverless.yml'), 'utf8');

interface Serverless {
  service: string;
  plugins: string[];
  params: Record<string, Record<string, unknown>>;
  provider: {
    name: string;
    runtime: string;
    architecture: string;
    stage: string;
    region: string;
    environment: Record<string, string>;
  };
  functions: Record<
    string,
    {
      handler: string;
      package: { artifact: string };
      maximumRetryAttempts: number;
      events: { schedule?: { rate: string[]; enabled: string } }[];
    }
  >;
  custom: {
    localstack: { stages: string[]; host: string; edgePort: number; autostart: boolean; lambda: { mountCode: boolean } };
  };
}
const sls = parse(text) as Serverless;

describe('serverless.yml', () => {
  it('uses serverless-localstack on the local stage only, against :4566', () => {
    assert.ok(sls.plugins.includes('serverless-localstack'));
    const ls = sls.custom.localstack;
    assert.deepEqual(ls.stages, ['local']);
    assert.equal(`${ls.host}:${ls.edgePort}`, 'http://localhost:4566');
    assert.equal(ls.autostart, false, 'the emulator is started by localstack/ or scripts/services.sh, not by the plugin');
    assert.equal(ls.lambda.mountCode, false, 'deploy the same zip as on AWS');
  });

  it('gives the local stage every parameter that has no default', () => {
    const local = sls.params.local ?? {};
    for (const name of ['databaseSecretArn', 'kafkaBrokers']) {
      assert.equal(sls.params.default?.[name], undefined, `${name} must stay required outside local`);
      assert.ok(local[name], `params.local.${name}`);
    }
    assert.equal(local.kafkaSsl, 'false');
    assert.match(String(local.databaseSecretArn), /^arn:aws:secretsmanager:[^:]+:000000000000:secret:/);
  });

  it('defaults to stage prod and a region from the options or the environment', () => {
    assert.equal(sls.provider.stage, "${opt:stage, 'prod'}");
    assert.match(sls.provider.region, /^\$\{opt:region,/);
    assert.equal(sls.provider.runtime, 'nodejs24.x');
    assert.equal(sls.provider.architecture, 'arm64');
  });

  it('needs no AWS account to package: no ssm:, cf:, s3: or aws: lookups', () => {
    const strings: string[] = [];
    const walk = (v: unknown): void => {
      if (typeof v === 'string') strings.push(v);
      else if (v && typeof v === 'object') Object.values(v).forEach(walk);
    };
    walk(sls);
    const lookups = strings.filter((s) => /\$\{(ssm|cf|s3|aws):/.test(s));
    assert.deepEqual(lookups, []);
  });

  it('builds the zip before every package or deploy', () => {
    assert.ok(sls.plugins.includes('./scripts/serverless-build.cjs'));
  });

  it('schedules the relay function, without Lambda async retries, from the built zip', () => {
    const relay = sls.functions.relay;
    assert.ok(relay);
    assert.equal(relay.handler, 'handler.handler');
    assert.equal(relay.package.artifact, '.build/relay.zip');
    assert.equal(relay.maximumRetryAttempts, 0);
    assert.deepEqual(relay.events[0]?.schedule?.rate, ['${param:scheduleRate}']);
    assert.equal(sls.params.default?.scheduleRate, 'rate(1 minute)');
  });

  it('sets only environment variables the relay reads', () => {
    const configSource = readFileSync(join(root, 'src', 'config', 'load.ts'), 'utf8');
    for (const name of Object.keys(sls.provider.environment)) {
      if (name === 'NODE_OPTIONS' || name === 'NODE_EXTRA_CA_CERTS') continue; // read by Node itself
      assert.ok(configSource.includes(`'${name}'`), `${name} is not read by src/config/load.ts`);
    }
  });

  it("sets every relay variable to the relay's own default, except the intended differences, each with its reason", () => {
    // The environment block as osls resolves it for a stage without overrides (null: a parameter
    // without a default), against what the relay does with nothing set, for a database and
    // brokers as on AWS (off this machine, so the loopback exceptions do not apply).
    const env = deployed().provider.environment;
    const base = { DATABASE_SECRET_ID: 'outbox/database', KAFKA_BROKERS: 'b-1.example.kafka.eu-west-1.amazonaws.com:9096' };
    const builtIn = actsAs(loadConfig(base));
    const seen = new Set<string>();
    for (const [name, value] of Object.entries(env)) {
      seen.add(name);
      if (name in READ_BY_NODE) continue;
      if (value === null) {
        assert.ok(REQUIRED.includes(name), `${name} has no value in a stage without overrides, and is not one of the required ${REQUIRED.join(', ')}`);
        continue;
      }
      assert.ok(typeof value === 'string' || typeof value === 'number', `${name} resolves to ${JSON.stringify(value)}, not a value`);
      const configured = actsAs(loadConfig({ ...base, [name]: String(value) }));
      if (name in INTENDED_DIFFERENCES) {
        assert.notDeepEqual(configured, builtIn, `${name} is listed as an intended difference but equals the relay's default: remove it from the list`);
      } else {
        assert.deepEqual(configured, builtIn, `${name}=${value} differs from the relay's own default: make them agree, or list it in INTENDED_DIFFERENCES with the reason`);
      }
    }
    for (const name of [...Object.keys(INTENDED_DIFFERENCES), ...Object.keys(READ_BY_NODE), ...REQUIRED]) assert.ok(seen.has(name), `${name} is listed here but serverless.yml does not set it`);
    assert.equal(env.DATABASE_SSL, 'verify-full', 'TLS to the database, verified: the relay\'s default for a host off this machine, stated for the reader');
    assert.equal(env.NODE_EXTRA_CA_CERTS, '/var/runtime/ca-cert.pem', "with the RDS CAs of Lambda's Node runtime");
  });
});

/** Variables serverless.yml sets with no default on either side: packaging fails without them. */
const REQUIRED = ['DATABASE_SECRET_ID', 'KAFKA_BROKERS'];

/** Variables for Node itself, not the relay (src/config/load.ts does not read them). */
const READ_BY_NODE: Record<string, string> = {
  NODE_OPTIONS: 'source-mapped stack traces (--enable-source-maps)',
  NODE_EXTRA_CA_CERTS: "the Amazon RDS CAs, which Lambda's Node runtime ships in /var/runtime/ca-cert.pem but does not load, for DATABASE_SSL=verify-full",
};

/** Where a deployment means to differ from the relay's own default, and why. Keep it short. */
const INTENDED_DIFFERENCES: Record<string, string> = {
  KAFKA_SSL:
    "TLS even without a Kafka secret: on MSK every listener but the in-VPC plaintext one (9092) is TLS, and the TLS-only one (9094) needs no secret. The relay's own default turns TLS on only when it logs in (SASL): the same, once kafkaSecretArn is given",
  OUTBOX_STAGE: "the deployment's stage (${sls:stage}) as the metrics' stage dimension; the relay's own default is local",
};

/** A Config as it acts: DATABASE_SSL unset is decided per host (src/transport.ts), here for an RDS host named by the secret. */
function actsAs(c: Config): unknown {
  const host = 'outbox.abc123.eu-west-1.rds.amazonaws.com';
  return { ...c, database: { ...c.database, ssl: databaseTls(c.database.ssl, undefined, [host]).mode } };
}

// ---------------------------------------------------------------------------------------------
// The template as deployed: variables resolved, conditions evaluated.

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Obj = { [key: string]: Json };
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

interface Deployment {
  stage: string;
  region: string;
  /** as --param="name=value" */
  params: Record<string, string>;
}

/** One variable's value, as osls resolves the sources this file uses; undefined: unresolved. */
function variable(expr: string, d: Deployment): Json | undefined {
  for (const alt of expr.split(/,\s*/)) {
    let v: Json | undefined;
    const param = /^param:(\w+)$/.exec(alt);
    if (param) {
      const name = param[1]!;
      v = (d.params[name] ?? sls.params[d.stage]?.[name] ?? sls.params.default?.[name]) as Json | undefined;
    } else if (alt === 'self:service') v = sls.service;
    else if (alt === 'sls:stage' || alt === 'opt:stage') v = d.stage;
    else if (alt === 'self:provider.region' || alt === 'opt:region') v = d.region;
    else if (alt.startsWith('env:')) v = undefined;
    else if (alt === 'null') v = null;
    else if (/^'.*'$/.test(alt)) v = alt.slice(1, -1);
    else assert.fail(`serverless.yml uses a variable source this test does not resolve: \${${expr}}`);
    if (v !== undefined) return v;
  }
  return undefined;
}

/** Resolves ${…} in strings, innermost first; a string that is one whole variable takes the value's type, as in osls. */
function resolve(value: Json, d: Deployment): Json {
  if (Array.isArray(value)) return value.map((v) => resolve(v, d));
  if (isObj(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolve(v, d)]));
  if (typeof value !== 'string') return value;
  let s = value;
  for (;;) {
    const m = /\$\{([^${}]+)\}/.exec(s);
    if (!m) return s;
    const v = variable(m[1]!, d);
    if (m[0] === s) return v === undefined ? null : v;
    assert.ok(v !== undefined && v !== null, `\${${m[1]}} has no value inside ${JSON.stringify(value.slice(0, 80))}`);
    s = s.replace(m[0], typeof v === 'object' ? JSON.stringify(v) : String(v));
  }
}

interface Resolved {
  provider: { environment: Record<string, Json> };
  resources: { Conditions: Obj; Resources: Record<string, { Type: string; Properties: Obj }> };
}

function deployed(params: Record<string, string> = {}, stage = 'prod', region = 'us-east-1'): Resolved {
  const d = { stage, region, params };
  return {
    provider: { environment: resolve(sls.provider.environment, d) as Record<string, Json> },
    resources: resolve((sls as unknown as { resources: Json }).resources, d) as unknown as Resolved['resources'],
  };
}

/** Evaluates a condition as CloudFormation would; only literal operands occur once resolved. */
function condition(t: Resolved, name: string): boolean {
  const def = t.resources.Conditions[name];
  assert.ok(def !== undefined, `condition ${name} is not defined`);
  const ev = (c: Json): boolean | string => {
    if (typeof c === 'string') return c;
    assert.ok(isObj(c), `unsupported condition operand ${JSON.stringify(c)}`);
    const [fn, args] = Object.entries(c)[0] as [string, Json[]];
    if (fn === 'Fn::Not') return !ev(args[0]!);
    if (fn === 'Fn::Equals') return ev(args[0]!) === ev(args[1]!);
    if (fn === 'Fn::And') return args.every((a) => ev(a) === true);
    if (fn === 'Condition') return condition(t, args as unknown as string);
    return assert.fail(`unsupported condition function ${fn}`);
  };
  const v = ev(def);
  assert.equal(typeof v, 'boolean');
  return v as boolean;
}

const isNoValue = (v: Json): boolean => isObj(v) && v.Ref === 'AWS::NoValue';

/** Resolves Fn::If (conditions evaluated; AWS::NoValue left out of lists), leaving every other intrinsic as it is. */
function effective(t: Resolved, v: Json): Json {
  if (Array.isArray(v)) return v.map((x) => effective(t, x)).filter((x) => !isNoValue(x));
  if (!isObj(v)) return v;
  if ('Fn::If' in v) {
    const [name, yes, no] = v['Fn::If'] as [string, Json, Json];
    return effective(t, condition(t, name) ? yes : no);
  }
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, effective(t, x)]));
}

function resourcesOfType(t: Resolved, type: string): Record<string, Obj> {
  const out: Record<string, Obj> = {};
  for (const [id, r] of Object.entries(t.resources.Resources)) if (r.Type === type) out[id] = effective(t, r.Properties) as Obj;
  return out;
}

const FUNCTION = { Ref: 'RelayLambdaFunction' };
/** the name the framework gives the `relay` function: service-stage-relay */
const functionName = (stage: string) => `${sls.service}-${stage}-relay`;

interface AlarmSpec {
  namespace: string;
  metric: string;
  dimensions: Json;
  statistic: string;
  operator: string;
  threshold: number;
  minutes: number;
  missing: string;
}

/** Every alarm, with the defaults of params.default. */
function expectedAlarms(stage: string): Record<string, AlarmSpec> {
  const relay = [
    { Name: 'service', Value: sls.service },
    { Name: 'stage', Value: stage },
  ];
  const lambda = [{ Name: 'FunctionName', Value: FUNCTION }];
  return {
    OldestPendingAgeAlarm: { namespace: 'OutboxRelay', metric: 'OldestPendingAgeMs', dimensions: relay, statistic: 'Maximum', operator: 'GreaterThanThreshold', threshold: 300_000, minutes: 3, missing: 'ignore' },
    ParkedRowsAlarm: { namespace: 'OutboxRelay', metric: 'ParkedRows', dimensions: relay, statistic: 'Maximum', operator: 'GreaterThanThreshold', threshold: 0, minutes: 1, missing: 'ignore' },
    InvocationErrorsAlarm: { namespace: 'AWS/Lambda', metric: 'Errors', dimensions: lambda, statistic: 'Sum', operator: 'GreaterThanThreshold', threshold: 0, minutes: 3, missing: 'notBreaching' },
    NoInvocationsAlarm: { namespace: 'AWS/Lambda', metric: 'Invocations', dimensions: lambda, statistic: 'Sum', operator: 'LessThanThreshold', threshold: 1, minutes: 5, missing: 'breaching' },
    ThrottlesAlarm: { namespace: 'AWS/Lambda', metric: 'Throttles', dimensions: lambda, statistic: 'Sum', operator: 'GreaterThanThreshold', threshold: 0, minutes: 5, missing: 'notBreaching' },
    AsyncEventsDroppedAlarm: { namespace: 'AWS/Lambda', metric: 'AsyncEventsDropped', dimensions: lambda, statistic: 'Sum', operator: 'GreaterThanThreshold', threshold: 0, minutes: 3, missing: 'notBreaching' },
    HelpersNotStartedAlarm: { namespace: 'OutboxRelay', metric: 'HelpersNotStarted', dimensions: relay, statistic: 'Sum', operator: 'GreaterThanThreshold', threshold: 0, minutes: 5, missing: 'notBreaching' },
  };
}

describe('serverless.yml: RDS IAM authentication', () => {
  /** the resource's own `Condition`, evaluated; true when it has none */
  const exists = (t: Resolved, id: string): boolean => {
    const c = (t.resources.Resources[id] as { Condition?: string } | undefined)?.Condition;
    return c === undefined ? id in t.resources.Resources : condition(t, c);
  };
  /** Fn::Join of strings and pseudo-parameter Refs, as CloudFormation would give it in us-east-1 of account 123456789012 */
  const joined = (v: Json): string => {
    const [sep, parts] = (v as { 'Fn::Join': [string, Json[]] })['Fn::Join'];
    const pseudo: Record<string, string> = { 'AWS::Partition': 'aws', 'AWS::Region': 'us-east-1', 'AWS::AccountId': '123456789012' };
    return parts.map((p) => (typeof p === 'string' ? p : pseudo[(p as { Ref: string }).Ref]!)).join(sep);
  };

  it('password by default: DATABASE_AUTH=password and no rds-db permission at all', () => {
    const t = deployed();
    assert.equal(t.provider.environment.DATABASE_AUTH, 'password');
    assert.equal(exists(t, 'RelayDatabaseIamPolicy'), false);
    assert.doesNotMatch(JSON.stringify(t.resources.Resources.RelaySecretsPolicy), /rds-db/);
  });

  it('databaseAuth=iam: DATABASE_AUTH=iam, and rds-db:connect on exactly dbuser:<resource id>/<user>, on the function\'s role', () => {
    const t = deployed({ databaseAuth: 'iam', databaseIamResourceId: 'db-ABCDEFGHIJKLMNOPQRSTUVWXY', databaseIamUser: 'relay' });
    assert.equal(t.provider.environment.DATABASE_AUTH, 'iam');
    assert.equal(exists(t, 'RelayDatabaseIamPolicy'), true);
    const policy = resourcesOfType(t, 'AWS::IAM::Policy').RelayDatabaseIamPolicy!;
    assert.deepEqual(policy.Roles, [{ Ref: 'IamRoleLambdaExecution' }]);
    const statements = (policy.PolicyDocument as Obj).Statement as Obj[];
    assert.equal(statements.length, 1);
    assert.equal(statements[0]!.Effect, 'Allow');
    assert.equal(statements[0]!.Action, 'rds-db:connect');
    assert.equal(joined(statements[0]!.Resource!), 'arn:aws:rds-db:us-east-1:123456789012:dbuser:db-ABCDEFGHIJKLMNOPQRSTUVWXY/relay');
  });
});

describe('serverless.yml: fan-out on backlog', () => {
  const fanoutPolicy = (t: Resolved): Obj | undefined => {
    const r = t.resources.Resources.RelayFanoutPolicy as { Condition?: string } | undefined;
    return r && condition(t, r.Condition!) ? resourcesOfType(t, 'AWS::IAM::Policy').RelayFanoutPolicy : undefined;
  };

  it('off by default: OUTBOX_FANOUT_MAX=1 and no lambda:InvokeFunction at all', () => {
    const t = deployed();
    assert.equal(t.provider.environment.OUTBOX_FANOUT_MAX, '1');
    assert.equal(fanoutPolicy(t), undefined);
    const policies = Object.values(t.resources.Resources).filter((r) => {
      const c = (r as { Condition?: string }).Condition;
      return r.Type === 'AWS::IAM::Policy' && (c === undefined || condition(t, c));
    });
    assert.doesNotMatch(JSON.stringify(effective(t, policies)), /lambda:/);
  });

  it("fanoutMax=3: OUTBOX_FANOUT_MAX=3, and lambda:InvokeFunction on the function's own ARN only, on its role", () => {
    const t = deployed({ fanoutMax: '3', reservedConcurrency: '4' });
    assert.equal(t.provider.environment.OUTBOX_FANOUT_MAX, '3');
    const policy = fanoutPolicy(t)!;
    assert.deepEqual(policy.Roles, [{ Ref: 'IamRoleLambdaExecution' }]);
    assert.deepEqual((policy.PolicyDocument as Obj).Statement, [
      { Sid: 'StartHelpersOfItself', Effect: 'Allow', Action: 'lambda:InvokeFunction', Resource: { 'Fn::GetAtt': ['RelayLambdaFunction', 'Arn'] } },
    ]);
  });
});

describe('serverless.yml: alarms', () => {
  it('seven alarms on one metric each, with its namespace and dimensions, its threshold, N of N one-minute periods and missing-data rule', () => {
    const t = deployed();
    const { DurationNearTimeoutAlarm, ...alarms } = resourcesOfType(t, 'AWS::CloudWatch::Alarm');
    assert.ok(DurationNearTimeoutAlarm, 'and the duration alarm, on a metric expression (the next test)');
    const expected = expectedAlarms('prod');
    assert.deepEqual(Object.keys(alarms).sort(), Object.keys(expected).sort());
    for (const [id, e] of Object.entries(expected)) {
      const a = alarms[id]!;
      const actual = {
        namespace: a.Namespace,
        metric: a.MetricName,
        dimensions: a.Dimensions,
        statistic: a.Statistic,
        operator: a.ComparisonOperator,
        threshold: a.Threshold,
        minutes: a.EvaluationPeriods,
        missing: a.TreatMissingData,
      };
      assert.deepEqual(actual, e, id);
      assert.equal(a.Period, 60, `${id}: one-minute periods, the schedule's rate`);
      assert.equal(a.DatapointsToAlarm, a.EvaluationPeriods, `${id}: every period of the window breaches (N consecutive minutes)`);
      assert.match(a.AlarmName as string, /^outbox-relay-prod-/, id);
      assert.ok((a.AlarmDescription as string).length > 80, `${id} says what to do`);
    }
  });

  it("the relay's alarms read the metrics the function emits: its namespace, its service and stage, metric names src/lambda/metrics.ts defines", () => {
    for (const stage of ['prod', 'staging']) {
      const t = deployed({ metricsNamespace: 'Team/Outbox' }, stage);
      const env = Object.fromEntries(Object.entries(t.provider.environment).filter(([, v]) => v !== '' && v !== null).map(([k, v]) => [k, String(v as string)]));
      delete env.DATABASE_SECRET_ID;
      const { telemetry } = loadConfig({ ...env, DATABASE_URL: 'postgres://u:p@h:5432/db', KAFKA_BROKERS: 'b-1:9096', AWS_LAMBDA_FUNCTION_NAME: functionName(stage) });
      assert.deepEqual(telemetry, { serviceName: 'outbox-relay', stage, metricsNamespace: 'Team/Outbox', metrics: 'stdout', tracing: false });
      const alarms = resourcesOfType(t, 'AWS::CloudWatch::Alarm');
      const own = Object.values(alarms).filter((a) => a.Namespace !== 'AWS/Lambda' && a.Metrics === undefined);
      assert.equal(own.length, 3);
      for (const a of own) {
        assert.equal(a.Namespace, telemetry.metricsNamespace);
        assert.deepEqual(a.Dimensions, [
          { Name: 'service', Value: telemetry.serviceName },
          { Name: 'stage', Value: telemetry.stage },
        ]);
        assert.ok(Object.hasOwn(METRICS, a.MetricName as string), `${a.MetricName as string} is emitted`);
      }
    }
  });

  it('thresholds and windows are parameters', () => {
    const t = deployed({
      alarmOldestPendingAgeMs: '600000',
      alarmOldestPendingMinutes: '10',
      alarmParkedRows: '5',
      alarmErrorMinutes: '2',
      alarmNoInvocationMinutes: '15',
      alarmThrottleMinutes: '4',
      alarmDroppedMinutes: '6',
      alarmFanoutMinutes: '7',
    });
    const a = resourcesOfType(t, 'AWS::CloudWatch::Alarm');
    const picked = Object.fromEntries(Object.entries(a).map(([id, p]) => [id, [p.Threshold, p.EvaluationPeriods, p.DatapointsToAlarm]]));
    assert.deepEqual(picked, {
      OldestPendingAgeAlarm: ['600000', '10', '10'],
      ParkedRowsAlarm: ['5', 1, 1],
      InvocationErrorsAlarm: [0, '2', '2'],
      NoInvocationsAlarm: [1, '15', '15'],
      ThrottlesAlarm: [0, '4', '4'],
      AsyncEventsDroppedAlarm: [0, '6', '6'],
      HelpersNotStartedAlarm: [0, '7', '7'],
      DurationNearTimeoutAlarm: [0.5, 1, 1],
    });
  });

  it('near the timeout: an invocation that ends with less than half its safety margin left (timeout and margin are parameters)', () => {
    const alarmsAt = (params: Record<string, string>, durationMs: number): boolean => {
      const a = resourcesOfType(deployed(params), 'AWS::CloudWatch::Alarm').DurationNearTimeoutAlarm!;
      const [duration, expr] = a.Metrics as Obj[];
      const stat = duration!.MetricStat as Obj;
      assert.deepEqual([(stat.Metric as Obj).Namespace, (stat.Metric as Obj).MetricName, stat.Stat, stat.Period], ['AWS/Lambda', 'Duration', 'Maximum', 60]);
      assert.deepEqual((stat.Metric as Obj).Dimensions, [{ Name: 'FunctionName', Value: FUNCTION }]);
      assert.equal(a.ComparisonOperator, 'LessThanThreshold');
      // once the parameters are in, the expression is (timeout ms - duration) / margin ms: evaluated as CloudWatch would
      const m = /^\((\d+) - duration\) \/ (\d+)$/.exec(expr!.Expression as string);
      assert.ok(m, `unexpected expression ${expr!.Expression as string}`);
      return (Number(m[1]) - durationMs) / Number(m[2]) < (a.Threshold as number);
    };
    assert.equal(alarmsAt({}, 57_000), false, 'ended at the relay deadline (60 s - 3 s margin)');
    assert.equal(alarmsAt({}, 58_400), false);
    assert.equal(alarmsAt({}, 58_600), true, 'less than 1.5 s of the 3 s margin left');
    assert.equal(alarmsAt({}, 60_000), true, 'timed out');
    assert.equal(alarmsAt({ timeout: '120', safetyMarginMs: '10000' }, 114_000), false);
    assert.equal(alarmsAt({ timeout: '120', safetyMarginMs: '10000' }, 116_000), true);
  });

  it('notify the topic they create by default; with alarmTopicArn every alarm notifies that topic instead, on ALARM and on OK', () => {
    const own = deployed();
    assert.equal(condition(own, 'CreateAlarmTopic'), true);
    for (const a of Object.values(resourcesOfType(own, 'AWS::CloudWatch::Alarm'))) {
      assert.deepEqual([a.AlarmActions, a.OKActions], [[{ Ref: 'RelayAlarmTopic' }], [{ Ref: 'RelayAlarmTopic' }]]);
    }
    const topic = 'arn:aws:sns:us-east-1:123456789012:outbox-oncall';
    const given = deployed({ alarmTopicArn: topic });
    assert.equal(condition(given, 'CreateAlarmTopic'), false, 'no topic of its own');
    for (const [id, a] of Object.entries(resourcesOfType(given, 'AWS::CloudWatch::Alarm'))) assert.deepEqual([a.AlarmActions, a.OKActions], [[topic], [topic]], id);
  });

  it('the no-invocation alarm acts only while the schedule is enabled', () => {
    assert.equal(resourcesOfType(deployed(), 'AWS::CloudWatch::Alarm').NoInvocationsAlarm!.ActionsEnabled, true);
    assert.equal(resourcesOfType(deployed({ scheduleEnabled: 'false' }), 'AWS::CloudWatch::Alarm').NoInvocationsAlarm!.ActionsEnabled, false);
    for (const [id, a] of Object.entries(resourcesOfType(deployed({ scheduleEnabled: 'false' }), 'AWS::CloudWatch::Alarm'))) {
      if (id !== 'NoInvocationsAlarm') assert.equal(a.ActionsEnabled, undefined, `${id} always acts`);
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The dashboard.

interface Widget {
  type: 'metric' | 'text';
  x: number;
  y: number;
  width: number;
  height: number;
  properties: {
    title?: string;
    markdown?: string;
    region?: string;
    stacked?: boolean;
    metrics?: Array<Array<string | { stat?: string; label?: string }>>;
    annotations?: { horizontal?: Array<{ label: string; value: number }> };
  };
}

function dashboard(params: Record<string, string> = {}, stage = 'prod'): { name: string; widgets: Widget[] } {
  const boards = resourcesOfType(deployed(params, stage), 'AWS::CloudWatch::Dashboard');
  assert.deepEqual(Object.keys(boards), ['RelayDashboard']);
  const board = boards.RelayDashboard!;
  assert.equal(typeof board.DashboardBody, 'string', 'the body is a JSON string');
  const body = JSON.parse(board.DashboardBody as string) as { widgets: Widget[] };
  return { name: board.DashboardName as string, widgets: body.widgets };
}

/** [namespace, name, ...dimension pairs, options] → parts */
function series(m: Array<string | { stat?: string; label?: string }>): { namespace: string; name: string; dimensions: Record<string, string>; stat?: string; label?: string } {
  const parts = m.filter((p): p is string => typeof p === 'string');
  const options = m.find((p): p is { stat?: string; label?: string } => typeof p === 'object') ?? {};
  const dimensions: Record<string, string> = {};
  for (let i = 2; i < parts.length; i += 2) dimensions[parts[i]!] = parts[i + 1]!;
  return { namespace: parts[0]!, name: parts[1]!, dimensions, ...options };
}

describe('serverless.yml: dashboard', () => {
  it("shows backlog age, throughput and errors, from the function's own metrics and Lambda's, in the deployment's region", () => {
    const { name, widgets } = dashboard({}, 'staging');
    assert.equal(name, 'outbox-relay-staging');
    const all = widgets.flatMap((w) => (w.properties.metrics ?? []).map((m) => ({ widget: w.properties.title, ...series(m) })));
    for (const s of all) {
      if (s.namespace === 'AWS/Lambda') assert.deepEqual(s.dimensions, { FunctionName: functionName('staging') }, `${s.widget}: ${s.name}`);
      else {
        assert.equal(s.namespace, 'OutboxRelay');
        assert.deepEqual(s.dimensions, { service: 'outbox-relay', stage: 'staging' }, `${s.widget}: ${s.name}`);
        assert.ok(Object.hasOwn(METRICS, s.name), `${s.name} is a metric the relay emits`);
      }
      assert.ok(s.stat && s.label, `${s.widget}: ${s.name} has a statistic and a label`);
    }
    for (const w of widgets.filter((w) => w.type === 'metric')) assert.equal(w.properties.region, 'us-east-1', w.properties.title);
    const names = new Set(all.map((s) => `${s.namespace}/${s.name}`));
    for (const needed of ['OutboxRelay/OldestPendingAgeMs', 'OutboxRelay/PendingRows', 'OutboxRelay/ParkedRows', 'OutboxRelay/Published', 'AWS/Lambda/Errors', 'AWS/Lambda/Invocations', 'AWS/Lambda/Throttles']) {
      assert.ok(names.has(needed), `${needed} is on the dashboard`);
    }
  });

  it("marks the age alarm's threshold, follows its parameter, and lays widgets on CloudWatch's 24-column grid without overlap", () => {
    const age = (params: Record<string, string>) => dashboard(params).widgets.find((w) => w.properties.metrics?.some((m) => m[1] === 'OldestPendingAgeMs'));
    assert.deepEqual(age({})?.properties.annotations?.horizontal, [{ label: 'alarm', value: 300_000 }]);
    assert.deepEqual(age({ alarmOldestPendingAgeMs: '120000' })?.properties.annotations?.horizontal, [{ label: 'alarm', value: 120_000 }]);
    const duration = dashboard({ timeout: '30' }).widgets.find((w) => w.properties.title?.startsWith('Invocation duration'));
    assert.deepEqual(duration?.properties.annotations?.horizontal, [{ label: 'timeout', value: 30_000 }]);

    const { widgets } = dashboard();
    const cells = new Set<string>();
    for (const w of widgets) {
      assert.ok(w.x >= 0 && w.width > 0 && w.x + w.width <= 24, `${w.properties.title ?? 'text'} fits 24 columns`);
      for (let x = w.x; x < w.x + w.width; x++) {
        for (let y = w.y; y < w.y + w.height; y++) {
          assert.ok(!cells.has(`${x},${y}`), `${w.properties.title ?? 'text'} overlaps another widget at ${x},${y}`);
          cells.add(`${x},${y}`);
        }
      }
    }
  });

  it('docs/dashboard.svg draws the current layout (UPDATE_DASHBOARD_SVG=1 npm run test:unit rewrites it)', () => {
    const svg = renderDashboard(dashboard().widgets);
    const file = join(root, 'docs', 'dashboard.svg');
    if (process.env.UPDATE_DASHBOARD_SVG === '1') writeFileSync(file, svg);
    assert.equal(readFileSync(file, 'utf8'), svg, 'docs/dashboard.svg is stale: UPDATE_DASHBOARD_SVG=1 npm run test:unit');
  });
});

// ---------------------------------------------------------------------------------------------
// docs/dashboard.svg: the widget grid as CloudWatch lays it out (24 columns), each widget with its
// title, series (statistic and metric) and threshold lines. A layout, not data.

const CELL_W = 44;
const CELL_H = 34;
const PAD = 16;
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b'];

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

function renderDashboard(widgets: Widget[]): string {
  const rows = Math.max(...widgets.map((w) => w.y + w.height));
  const width = PAD * 2 + 24 * CELL_W;
  const height = PAD * 2 + rows * CELL_H;
  const out: string[] = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="Helvetica, Arial, sans-serif">`);
  out.push(`<rect width="${width}" height="${height}" fill="#f2f3f3"/>`);
  for (const w of widgets) {
    const x = PAD + w.x * CELL_W + 4;
    const y = PAD + w.y * CELL_H + 4;
    const wpx = w.width * CELL_W - 8;
    const hpx = w.height * CELL_H - 8;
    out.push(`<g>`);
    out.push(`<rect x="${x}" y="${y}" width="${wpx}" height="${hpx}" rx="4" fill="#ffffff" stroke="#d5dbdb"/>`);
    if (w.type === 'text') {
      const [heading = '', ...rest] = (w.properties.markdown ?? '').split('\n');
      out.push(`<text x="${x + 12}" y="${y + 24}" font-size="16" font-weight="bold" fill="#16191f">${esc(heading.replace(/^#+\s*/, ''))}</text>`);
      const text = rest.join(' ');
      const shown = text.length <= 160 ? text : `${text.slice(0, text.lastIndexOf(' ', 160))} …`;
      out.push(`<text x="${x + 12}" y="${y + 44}" font-size="11" fill="#545b64">${esc(shown)}</text>`);
    } else {
      out.push(`<text x="${x + 12}" y="${y + 20}" font-size="13" font-weight="bold" fill="#16191f">${esc(w.properties.title ?? '')}</text>`);
      // the plot area: axes, and each threshold as a dashed line
      const px = x + 12;
      const py = y + 32;
      const pw = wpx - 24;
      const ph = hpx - 44 - 16 * (w.properties.metrics?.length ?? 0);
      out.push(`<path d="M${px} ${py} V${py + ph} H${px + pw}" fill="none" stroke="#aab7b8"/>`);
      if (w.properties.stacked) out.push(`<text x="${px + pw}" y="${py + 10}" font-size="10" text-anchor="end" fill="#879596">stacked</text>`);
      for (const a of w.properties.annotations?.horizontal ?? []) {
        const ay = py + Math.round(ph * 0.3);
        out.push(`<line x1="${px}" y1="${ay}" x2="${px + pw}" y2="${ay}" stroke="#d13212" stroke-dasharray="6 4"/>`);
        out.push(`<text x="${px + pw - 4}" y="${ay - 4}" font-size="10" text-anchor="end" fill="#d13212">${esc(`${a.label} ${a.value.toLocaleString('en-US')}`)}</text>`);
      }
      (w.properties.metrics ?? []).forEach((m, i) => {
        const s = series(m);
        const ly = py + ph + 16 + i * 16;
        out.push(`<rect x="${px}" y="${ly - 9}" width="10" height="10" fill="${COLORS[i % COLORS.length]}"/>`);
        out.push(`<text x="${px + 16}" y="${ly}" font-size="11" fill="#16191f">${esc(`${s.label ?? s.name}: ${s.stat ?? ''} of ${s.namespace} ${s.name}`)}</text>`);
      });
    }
    out.push(`</g>`);
  }
  out.push(`</svg>`);
  return out.join('\n') + '\n';
}

describe('serverless.yml: MSK IAM access control', () => {
  const exists = (t: Resolved, id: string): boolean => {
    const c = (t.resources.Resources[id] as { Condition?: string } | undefined)?.Condition;
    return c === undefined ? id in t.resources.Resources : condition(t, c);
  };
  /** Fn::Join, Fn::Select and Fn::Split of strings, as CloudFormation evaluates them */
  const evaluate = (v: Json): string => {
    if (typeof v === 'string') return v;
    const [fn, args] = Object.entries(v as Obj)[0] as [string, Json[]];
    if (fn === 'Fn::Join') return (args[1] as Json[]).map(evaluate).join(args[0] as string);
    if (fn === 'Fn::Select') {
      const list = args[1] as Obj;
      const [sep, s] = list['Fn::Split'] as [string, Json];
      return evaluate(s).split(sep)[args[0] as number]!;
    }
    return assert.fail(`unsupported function ${fn}`);
  };
  const CLUSTER = 'arn:aws:kafka:eu-west-1:123456789012:cluster/orders/0b1c2d3e-aaaa-bbbb-cccc-1234567890ab-2';
  const statements = (t: Resolved) => (resourcesOfType(t, 'AWS::IAM::Policy').RelayMskIamPolicy!.PolicyDocument as Obj).Statement as Obj[];

  it('not by default: KAFKA_AUTH unset (sasl with a secret, else none) and no kafka-cluster permission at all', () => {
    const t = deployed();
    assert.equal(t.provider.environment.KAFKA_AUTH, '');
    assert.equal(exists(t, 'RelayMskIamPolicy'), false);
    assert.doesNotMatch(JSON.stringify(t.resources.Resources.RelaySecretsPolicy), /kafka-cluster/);
  });

  it("kafkaAuth=iam: Connect and WriteDataIdempotently on the cluster, WriteData and the topic reads on the topics under the template's prefix", () => {
    const t = deployed({ kafkaAuth: 'iam', mskClusterArn: CLUSTER });
    assert.equal(t.provider.environment.KAFKA_AUTH, 'iam');
    assert.equal(exists(t, 'RelayMskIamPolicy'), true);
    const [cluster, topics, ...rest] = statements(t);
    assert.equal(rest.length, 0);
    assert.deepEqual(cluster!.Action, ['kafka-cluster:Connect', 'kafka-cluster:WriteDataIdempotently']);
    assert.equal(cluster!.Resource, CLUSTER);
    assert.deepEqual(topics!.Action, ['kafka-cluster:WriteData', 'kafka-cluster:DescribeTopic', 'kafka-cluster:DescribeTopicDynamicConfiguration']);
    assert.equal(evaluate(topics!.Resource!), 'arn:aws:kafka:eu-west-1:123456789012:topic/orders/0b1c2d3e-aaaa-bbbb-cccc-1234567890ab-2/outbox.event.*');
    // the relay's own prefix for the same settings
    const env = Object.fromEntries(Object.entries(t.provider.environment).map(([k, v]) => [k, typeof v === 'string' || typeof v === 'number' ? String(v) : undefined]));
    assert.equal(loadConfig({ ...env, DATABASE_SECRET_ID: 'db', KAFKA_BROKERS: 'b-1.orders.kafka.eu-west-1.amazonaws.com:9098', AWS_REGION: 'eu-west-1' }).outbox.rowRules.topicPrefix, 'outbox.event.');
  });

  it("kafkaAuth=iam with delivery=exactly-once: also the lanes' transactional ids and consumer groups, and ReadData on the topics (the lane's offset names one); neither without iam", () => {
    const t = deployed({ kafkaAuth: 'iam', mskClusterArn: CLUSTER, delivery: 'exactly-once' });
    const [, topics, ids, groups, ...rest] = statements(t);
    assert.equal(rest.length, 0);
    assert.deepEqual(topics!.Action, ['kafka-cluster:WriteData', 'kafka-cluster:DescribeTopic', 'kafka-cluster:DescribeTopicDynamicConfiguration', 'kafka-cluster:ReadData']);
    assert.deepEqual(ids!.Action, ['kafka-cluster:DescribeTransactionalId', 'kafka-cluster:AlterTransactionalId']);
    assert.equal(evaluate(ids!.Resource!), 'arn:aws:kafka:eu-west-1:123456789012:transactional-id/orders/0b1c2d3e-aaaa-bbbb-cccc-1234567890ab-2/outbox-relay.lane-*');
    assert.deepEqual(groups!.Action, ['kafka-cluster:DescribeGroup', 'kafka-cluster:AlterGroup']);
    assert.equal(evaluate(groups!.Resource!), 'arn:aws:kafka:eu-west-1:123456789012:group/orders/0b1c2d3e-aaaa-bbbb-cccc-1234567890ab-2/outbox-relay.lane-*');
    // the prefix the relay gives every lane's transactional id, which is also its group
    assert.match(readFileSync(new URL('../../src/outbox/lanes.ts', import.meta.url), 'utf8'), /'outbox-relay\.lane-' \|\| n \|\|/);
    assert.equal(exists(deployed({ delivery: 'exactly-once' }), 'RelayMskIamPolicy'), false);
  });

  it('kafkaAuth=iam with topicPrefix: the topics under that prefix', () => {
    const t = deployed({ kafkaAuth: 'iam', mskClusterArn: CLUSTER, topicPrefix: 'billing.', topicTemplate: '{aggregatetype}' });
    assert.equal(evaluate(statements(t)[1]!.Resource!), 'arn:aws:kafka:eu-west-1:123456789012:topic/orders/0b1c2d3e-aaaa-bbbb-cccc-1234567890ab-2/billing.*');
  });
});
