// serverless.yml read as plain YAML (the ${…} variables are just strings to a YAML parser):
// the local stage and its plugin, offline-only variables, and that every environment variable
// it sets is one the relay reads, with defaults equal to the relay's own.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { loadConfig } from '../../src/config.ts';

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
    const configSource = readFileSync(join(root, 'src', 'config.ts'), 'utf8');
    for (const name of Object.keys(sls.provider.environment)) {
      if (name === 'NODE_OPTIONS') continue;
      assert.ok(configSource.includes(`'${name}'`), `${name} is not read by src/config.ts`);
    }
  });

  it("defaults every relay setting to the relay's own default (except KAFKA_SSL, on for MSK)", () => {
    // Substitute params.default into the environment block, as osls would for a stage without overrides.
    const env: Record<string, string> = {};
    for (const [name, value] of Object.entries(sls.provider.environment)) {
      const m = /^\$\{param:(\w+)(?:, [^}]*)?\}$/.exec(value);
      const def = m ? sls.params.default?.[m[1] as string] : value;
      if (typeof def === 'number' || (typeof def === 'string' && def !== '')) env[name] = String(def);
    }
    assert.equal(env.KAFKA_SSL, 'true');
    delete env.KAFKA_SSL;
    const required = { DATABASE_URL: 'postgres://u:p@127.0.0.1:5432/db', KAFKA_BROKERS: '127.0.0.1:9092' };
    const fromYaml = loadConfig({ ...env, ...required });
    const builtIn = loadConfig(required);
    assert.deepEqual(fromYaml, builtIn);
  });
});
