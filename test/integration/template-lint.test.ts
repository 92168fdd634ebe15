// services: build-dir alone
// What an AWS reviewer runs on the packaged template: cfn-lint (AWS's linter, with the
// cfn-lint-serverless rules) and checkov's CloudFormation policies, the pinned versions that
// scripts/template-lint.sh installs once under .cache/template-lint. Two templates: the default
// parameters, and every optional feature at once (MSK and RDS IAM auth, a Kafka secret, a KMS key,
// a VPC, a failure queue and an alarm topic given, a permissions boundary, tracing, fan-out, tags).
// Nothing may be reported; what either tool is told to skip is in the template with its reason.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const ACCOUNT = '123456789012';

const EVERY_OPTION = [
  `databaseSecretArn=arn:aws:secretsmanager:us-east-1:${ACCOUNT}:secret:outbox/database-AbCdEf`,
  `kafkaSecretArn=arn:aws:secretsmanager:us-east-1:${ACCOUNT}:secret:outbox/kafka-GhIjKl`,
  `kmsKeyArn=arn:aws:kms:us-east-1:${ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab`,
  'subnetIds=subnet-0aaa1111bbbb22223,subnet-0ccc3333dddd44445',
  'securityGroupIds=sg-0eee5555ffff66667',
  `failureQueueArn=arn:aws:sqs:us-east-1:${ACCOUNT}:outbox-dropped`,
  `alarmTopicArn=arn:aws:sns:us-east-1:${ACCOUNT}:outbox-oncall`,
  `permissionsBoundary=arn:aws:iam::${ACCOUNT}:policy/team-boundary`,
  'tracing=true',
  'fanoutMax=3',
  'reservedConcurrency=4',
  'databaseAuth=iam',
  'databaseIamResourceId=db-ABCDEFGHIJKLMNOPQRSTUVWXY',
  'databaseIamUser=relay',
  'kafkaAuth=iam',
  'delivery=exactly-once',
  `mskClusterArn=arn:aws:kafka:us-east-1:${ACCOUNT}:cluster/orders/0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d-2`,
  'topicPrefix=orders.events.',
  'tags=team=payments',
];

type Obj = Record<string, unknown>;
const tmpDirs: string[] = [];
after(() => {
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

function packaged(params: string[]): string {
  const dir = mkdtempSync(join(tmpdir(), 'outbox-relay-lint-'));
  tmpDirs.push(dir);
  const res = spawnSync('bash', ['scripts/package.sh', ...params.map((p) => `--param=${p}`)], {
    cwd: root,
    env: { ...process.env, STAGE: 'prod', REGION: 'us-east-1', PACKAGE_DIR: dir },
    encoding: 'utf8',
    timeout: 300_000,
  });
  assert.equal(res.status, 0, `scripts/package.sh failed (status ${res.status}):\n${res.stdout}\n${res.stderr}`);
  return join(dir, 'cloudformation-template-update-stack.json');
}

function tool(name: 'cfn-lint' | 'checkov', args: string[]): { status: number | null; stdout: string; stderr: string } {
  return spawnSync('bash', ['scripts/template-lint.sh', name, ...args], { cwd: root, encoding: 'utf8', timeout: 300_000, maxBuffer: 64 * 1024 * 1024 });
}

/** Every Fn::If, Condition key of a resource or output, and the Conditions section: what a decided condition leaves behind. */
function undecided(t: Obj): string[] {
  const found: string[] = [];
  if (t.Conditions) found.push(`Conditions: ${Object.keys(t.Conditions).join(', ')}`);
  for (const section of ['Resources', 'Outputs']) {
    for (const [id, entry] of Object.entries(t[section] ?? {}) as [string, Obj][]) {
      if (entry.Condition) found.push(`${section}.${id}.Condition`);
      if (JSON.stringify(entry).includes('"Fn::If"')) found.push(`${section}.${id}: Fn::If`);
    }
  }
  return found;
}

/** Each skip the template tells the linters about, with its stated reason ('' if it has none). */
function skips(t: Obj): { where: string; reason: string }[] {
  const out: { where: string; reason: string }[] = [];
  for (const [id, r] of Object.entries(t.Resources as Record<string, Obj>)) {
    const meta = (r.Metadata ?? {}) as Obj;
    for (const s of (((meta.checkov as Obj | undefined)?.skip ?? []) as Obj[])) {
      out.push({ where: `${id} checkov ${String(s.id)}`, reason: typeof s.comment === 'string' ? s.comment : '' });
    }
    const cfn = (meta['cfn-lint'] ?? {}) as Obj;
    const reasons = (cfn.reasons ?? {}) as Obj;
    for (const check of (((cfn.config as Obj | undefined)?.ignore_checks ?? []) as string[])) {
      out.push({ where: `${id} cfn-lint ${check}`, reason: typeof reasons[check] === 'string' ? reasons[check] : '' });
    }
  }
  return out;
}

for (const [title, params] of [
  ['default parameters', []],
  ['every optional feature', EVERY_OPTION],
] as const) {
  describe(`the packaged template, ${title}: what an AWS reviewer runs on it`, () => {
    let file: string;
    let t: Obj;
    before(() => {
      // a no-op once installed (CI installs it before the tests); the first time takes minutes
      const install = spawnSync('bash', ['scripts/template-lint.sh', 'install'], { cwd: root, encoding: 'utf8', timeout: 900_000 });
      assert.equal(install.status, 0, `scripts/template-lint.sh install failed:\n${install.stdout}${install.stderr}`);
      file = packaged([...params]);
      t = JSON.parse(readFileSync(file, 'utf8')) as Obj;
    });

    it('decides every condition at package time: no Fn::If, no conditional resource or output, no Conditions left', () => {
      assert.deepEqual(undecided(t), []);
    });

    it('cfn-lint 1.58 with the cfn-lint-serverless rules reports nothing: no error, no warning, no informational finding', () => {
      const res = tool('cfn-lint', ['--format', 'json', '--', file]);
      const findings = JSON.parse(res.stdout || 'null') as { Rule: { Id: string }; Message: string; Location: { Path: unknown[] } }[] | null;
      assert.ok(Array.isArray(findings), `cfn-lint printed no JSON (status ${res.status}):\n${res.stdout}\n${res.stderr}`);
      assert.deepEqual(findings.map((f) => `${f.Rule.Id} ${f.Message} at ${JSON.stringify(f.Location.Path)}`), []);
      assert.equal(res.status, 0, res.stderr);
    });

    it("checkov 3.3's CloudFormation policies: none failed, and every one it skips is skipped by the template itself", () => {
      const res = tool('checkov', ['-o', 'json', '-f', file]);
      const report = JSON.parse(res.stdout || 'null') as { check_type: string; results: { failed_checks: Obj[]; skipped_checks: Obj[]; passed_checks: Obj[] }; summary: { passed: number; failed: number; parsing_errors: number; checkov_version: string } } | null;
      assert.ok(report && report.check_type === 'cloudformation', `checkov printed no CloudFormation report (status ${res.status}):\n${res.stdout.slice(0, 4000)}\n${res.stderr.slice(-4000)}`);
      const failed = report.results.failed_checks.map((c) => `${String(c.check_id)} ${String(c.check_name)} on ${String(c.resource)}`);
      assert.deepEqual(failed, []);
      assert.equal(report.summary.parsing_errors, 0);
      assert.equal(report.summary.checkov_version, '3.3.30');
      assert.ok(report.summary.passed > 20, `checkov ran its policies (${report.summary.passed} passed)`);
      const declared = new Set(skips(t).filter((s) => s.where.includes(' checkov ')).map((s) => s.where));
      for (const c of report.results.skipped_checks) {
        const where = `${String(c.resource).split('.').pop()} checkov ${String(c.check_id)}`;
        assert.ok(declared.has(where), `${where} skipped by something other than the template's Metadata`);
      }
      assert.equal(res.status, 0, res.stderr);
    });

    it("gives a reason for each check it tells cfn-lint or checkov to skip, beside the skip", () => {
      const all = skips(t);
      assert.ok(all.length > 0);
      for (const s of all) assert.ok(s.reason.length >= 40, `${s.where}: no reason given (${JSON.stringify(s.reason)})`);
    });
  });
}
