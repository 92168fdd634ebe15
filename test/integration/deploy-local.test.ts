// services: moto, build-dir alone
// The packaged stack created on the local emulator's CloudFormation (moto), as `npm run
// deploy:local` does it (scripts/deploy-local.sh: package for the local stage, `osls deploy
// --package`), then read back from each service (scripts/stack-inventory.py): the resources exist
// and point at each other. moto's CloudFormation cannot create three of the template's types
// (AWS::CloudWatch::Alarm, AWS::Lambda::EventInvokeConfig, AWS::S3::BucketPolicy; it warns and
// goes on), and ignores a bucket's VersioningConfiguration and PublicAccessBlockConfiguration: for
// those, the template's references are checked against what was deployed.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const ENDPOINT = process.env.TEST_AWS_ENDPOINT_URL ?? 'http://localhost:4566';
/** what moto 5.2.5's CloudFormation cannot create (it warns "not supported" and leaves them out) */
const NOT_CREATED_BY_THE_EMULATOR = ['AWS::CloudWatch::Alarm', 'AWS::Lambda::EventInvokeConfig', 'AWS::S3::BucketPolicy'];

/** a value inside JSON read back from the AWS APIs, by its path; undefined where there is none */
function at(v: unknown, ...path: (string | number)[]): unknown {
  let cur = v;
  for (const k of path) cur = cur !== null && typeof cur === 'object' ? (cur as Record<string | number, unknown>)[k] : undefined;
  return cur;
}
const list = (v: unknown): unknown[] => (v === undefined ? [] : Array.isArray(v) ? v : [v]);
interface Inventory {
  stack: { status: string };
  resources: Record<string, { type: string; physical: string | null; status: string }>;
  services: Record<string, unknown>;
}

const env = { ...process.env, AWS_ENDPOINT_URL: ENDPOINT, AWS_REGION: 'us-east-1', AWS_ACCESS_KEY_ID: 'test', AWS_SECRET_ACCESS_KEY: 'test' };
const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-deploy-'));
let inv: Inventory;
let template: { Resources: Record<string, { Type: string; Properties?: Record<string, unknown> }> };
/** what a service reported for a resource of the stack, by path */
const svc = (id: string, ...path: (string | number)[]) => at(inv.services[id], ...path);

function deployLocal(args: string[]) {
  return spawnSync('bash', ['scripts/deploy-local.sh', ...args], { cwd: root, env: { ...env, PACKAGE_DIR: dir }, encoding: 'utf8', timeout: 300_000, maxBuffer: 64 * 1024 * 1024 });
}

/** a Ref or Fn::GetAtt …Arn of the template, as deployed: the resource's ARN read back from its service */
function deployedArn(ref: unknown): unknown {
  const id = at(ref, 'Ref') ?? at(ref, 'Fn::GetAtt', 0);
  assert.ok(typeof id === 'string', `not a reference: ${JSON.stringify(ref)}`);
  const r = inv.resources[id];
  assert.ok(r, `${id} was not created`);
  switch (r.type) {
    case 'AWS::SNS::Topic':
      return svc(id, 'TopicArn');
    case 'AWS::SQS::Queue':
      return svc(id, 'QueueArn');
    case 'AWS::Lambda::Function':
      return svc(id, 'configuration', 'FunctionArn');
    default:
      return assert.fail(`no ARN known for ${r.type}`);
  }
}

describe('deployed on the local emulator: npm run deploy:local', () => {
  before(() => {
    const res = deployLocal([]);
    assert.equal(res.status, 0, `scripts/deploy-local.sh failed (status ${res.status}):\n${res.stdout.slice(-6000)}\n${res.stderr.slice(-6000)}`);
    inv = JSON.parse(readFileSync(join(dir, 'stack-inventory.json'), 'utf8')) as Inventory;
    template = JSON.parse(readFileSync(join(dir, 'cloudformation-template-update-stack.json'), 'utf8')) as typeof template;
  });
  after(() => {
    // the stack and its (versioned) bucket go again, emptied by the framework
    const res = deployLocal(['remove']);
    rmSync(dir, { recursive: true, force: true });
    assert.equal(res.status, 0, `osls remove failed:\n${res.stdout.slice(-3000)}\n${res.stderr.slice(-3000)}`);
  });

  it("creates the stack with every resource of the template that the emulator can create, and names the ones it can't", () => {
    assert.match(inv.stack.status, /^(CREATE|UPDATE)_COMPLETE$/);
    const inTemplate = Object.entries(template.Resources);
    const expected = inTemplate.filter(([, r]) => !NOT_CREATED_BY_THE_EMULATOR.includes(r.Type)).map(([id]) => id).sort();
    assert.deepEqual(Object.keys(inv.resources).sort(), expected);
    for (const [id, r] of Object.entries(inv.resources)) assert.match(r.status, /_COMPLETE$/, id);
    const left = [...new Set(inTemplate.filter(([id]) => !(id in inv.resources)).map(([, r]) => r.Type))].sort();
    assert.deepEqual(left, [...NOT_CREATED_BY_THE_EMULATOR].sort(), 'what the emulator left out is what it cannot create, nothing else');
  });

  it("fires the function every minute: the rule's schedule, its target, and the function's permission for that rule alone", () => {
    const fnArn = svc('RelayLambdaFunction', 'configuration', 'FunctionArn');
    assert.equal(svc('RelayEventsRuleSchedule1', 'rule', 'ScheduleExpression'), 'rate(1 minute)');
    assert.equal(svc('RelayEventsRuleSchedule1', 'rule', 'State'), 'ENABLED');
    assert.deepEqual(list(svc('RelayEventsRuleSchedule1', 'targets')).map((t) => at(t, 'Arn')), [fnArn]);
    assert.deepEqual(
      list(svc('RelayLambdaFunction', 'policy', 'Statement')).map((s) => [at(s, 'Principal', 'Service'), at(s, 'Action'), at(s, 'Condition', 'ArnLike', 'AWS:SourceArn')]),
      [['events.amazonaws.com', 'lambda:InvokeFunction', svc('RelayEventsRuleSchedule1', 'rule', 'Arn')]],
    );
  });

  it("runs the bundle as the stack's role, which may read exactly the local stage's database secret and send to the failure queue", () => {
    assert.equal(svc('RelayLambdaFunction', 'configuration', 'Runtime'), 'nodejs24.x');
    assert.equal(svc('RelayLambdaFunction', 'configuration', 'Handler'), 'handler.handler');
    assert.equal(svc('RelayLambdaFunction', 'configuration', 'Role'), svc('IamRoleLambdaExecution', 'role', 'Arn'));
    assert.equal(svc('RelayLambdaFunction', 'configuration', 'Environment', 'Variables', 'DATABASE_SECRET_ID'), 'outbox/database');
    const statements = Object.values(svc('IamRoleLambdaExecution', 'inline') as Record<string, unknown>).flatMap((d) => list(at(d, 'Statement')));
    const on = (action: string) => statements.filter((s) => list(at(s, 'Action')).includes(action)).flatMap((s) => list(at(s, 'Resource')));
    assert.deepEqual(on('secretsmanager:GetSecretValue'), ['arn:aws:secretsmanager:us-east-1:000000000000:secret:outbox/database-??????']);
    assert.deepEqual(on('sqs:SendMessage'), [svc('RelayFailureQueue', 'QueueArn')]);
    assert.deepEqual(on('kms:Decrypt'), [], 'no key without kmsKeyArn');
    assert.equal(svc('RelayLogGroup', 'retentionInDays'), 1);
  });

  it('sends dropped ticks to the created queue (SSE-SQS, 14 days) through the on-failure destination', () => {
    assert.equal(svc('RelayFailureQueue', 'SqsManagedSseEnabled'), 'true');
    assert.equal(svc('RelayFailureQueue', 'MessageRetentionPeriod'), '1209600');
    // the emulator cannot create the EventInvokeConfig: its references are checked in the template
    const conf = Object.values(template.Resources).filter((r) => r.Type === 'AWS::Lambda::EventInvokeConfig');
    assert.equal(conf.length, 1);
    assert.equal(deployedArn(at(conf[0], 'Properties', 'FunctionName')), svc('RelayLambdaFunction', 'configuration', 'FunctionArn'));
    assert.equal(deployedArn(at(conf[0], 'Properties', 'DestinationConfig', 'OnFailure', 'Destination')), svc('RelayFailureQueue', 'QueueArn'));
  });

  it("notifies the created topic, encrypted with the stack's key, which CloudWatch may use; every alarm's actions name that topic", () => {
    const keyArn = svc('RelayAlarmTopicKey', 'arn');
    assert.ok(typeof keyArn === 'string', 'the key exists');
    assert.equal(svc('RelayAlarmTopic', 'KmsMasterKeyId'), keyArn);
    assert.equal(svc('RelayAlarmTopicKey', 'rotation'), true);
    const cloudwatch = list(svc('RelayAlarmTopicKey', 'policy', 'Statement')).filter((s) => at(s, 'Principal', 'Service') === 'cloudwatch.amazonaws.com');
    assert.deepEqual(cloudwatch.flatMap((s) => list(at(s, 'Action'))).sort(), ['kms:Decrypt', 'kms:GenerateDataKey*']);
    // the emulator cannot create alarms: their actions are checked in the template, against the deployed topic
    const alarms = Object.entries(template.Resources).filter(([, r]) => r.Type === 'AWS::CloudWatch::Alarm');
    assert.equal(alarms.length, 8);
    for (const [id, a] of alarms) {
      for (const actions of ['AlarmActions', 'OKActions']) {
        assert.deepEqual(list(at(a, 'Properties', actions)).map(deployedArn), [svc('RelayAlarmTopic', 'TopicArn')], `${id} ${actions}`);
      }
    }
    assert.match(String(svc('RelayDashboard', 'DashboardBody')), /OldestPendingAgeMs/, 'the dashboard exists');
  });

  it('keeps the code in the deployment bucket (versioned, public access blocked, as the template asks: the emulator ignores both settings)', () => {
    assert.ok(list(svc('ServerlessDeploymentBucket', 'objects')).some((k) => String(k).endsWith('/relay.zip')), 'the zip was uploaded');
    const p = template.Resources.ServerlessDeploymentBucket?.Properties;
    assert.deepEqual(at(p, 'VersioningConfiguration'), { Status: 'Enabled' });
    assert.deepEqual(at(p, 'PublicAccessBlockConfiguration'), { BlockPublicAcls: true, BlockPublicPolicy: true, IgnorePublicAcls: true, RestrictPublicBuckets: true });
  });
});
