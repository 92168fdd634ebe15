'use strict';
// A local Serverless Framework plugin (listed in serverless.yml): builds the Lambda bundle and
// .build/relay.zip right before the framework packages the service, so `osls package`,
// `osls deploy` and `osls deploy function` never ship a stale or missing zip. A deploy of an
// already packaged directory (`osls deploy --package DIR`) does not rebuild.
// CommonJS because the framework loads plugins with require().
const { execFileSync } = require('node:child_process');
const path = require('node:path');

/**
 * Parameters that belong together, checked before anything is built: CloudFormation would take an
 * empty one without a word and deploy a policy that grants nothing (rds-db:connect on
 * `dbuser:/`), or fail half-way through the stack with a message about a policy, not the
 * parameter. Read from the resolved template, the only place a plugin sees the parameters' values.
 */
function parameterProblems(service) {
  const env = (service.provider && service.provider.environment) || {};
  const resources = (service.resources && service.resources.Resources) || {};
  const statement = (name) => resources[name] && resources[name].Properties.PolicyDocument.Statement[0];
  const problems = [];
  if (env.KAFKA_AUTH === 'iam') {
    const arn = String(statement('RelayMskIamPolicy').Resource);
    if (!/^arn:aws[a-z-]*:kafka:[a-z0-9-]+:\d{12}:cluster\/[^/]+\/[^/]+$/.test(arn)) {
      problems.push(
        `kafkaAuth=iam needs mskClusterArn, the MSK cluster's ARN (arn:aws:kafka:<region>:<account>:cluster/<name>/<uuid>; got ${JSON.stringify(arn)}): ` +
          "the role's kafka-cluster permissions are granted on it and on its topics (docs/DEPLOY.md, MSK with IAM access control)",
      );
    }
  }
  // the relay refuses this at run time (src/config/load.ts); the policy would grant every topic (topic/<cluster>/*)
  const topicPrefix = env.OUTBOX_TOPIC_PREFIX || String(env.OUTBOX_TOPIC_TEMPLATE || '').split('{')[0];
  if (env.KAFKA_AUTH === 'iam' && !topicPrefix) {
    problems.push(
      `kafkaAuth=iam with an empty topicPrefix and a topicTemplate that starts with a placeholder ` +
        `(${JSON.stringify(env.OUTBOX_TOPIC_TEMPLATE)}) would grant kafka-cluster:WriteData on every topic of the cluster: ` +
        'set topicPrefix to the text all the relay\'s topics start with (docs/DEPLOY.md, MSK with IAM access control)',
    );
  }
  problems.push(...tags(service).problems);
  problems.push(...fanoutProblems(env, service));
  if (env.DATABASE_AUTH === 'iam') {
    const parts = statement('RelayDatabaseIamPolicy').Resource['Fn::Join'][1];
    const dbuser = String(parts[parts.length - 1]);
    if (!/^:dbuser:[^/]+\/.+$/.test(dbuser)) {
      problems.push(
        `databaseAuth=iam needs databaseIamResourceId and databaseIamUser (got ${JSON.stringify(dbuser)}): ` +
          'rds-db:connect is granted on exactly that database user (docs/DEPLOY.md, RDS IAM authentication)',
      );
    }
  }
  return problems;
}

/**
 * fanoutMax: a whole number from 1 (off), and at most the function's reserved concurrency: past it
 * Lambda would queue or throttle the helpers, and the next tick with them.
 */
function fanoutProblems(env, service) {
  const raw = String(env.OUTBOX_FANOUT_MAX ?? '1');
  const reserved = Number(service.functions && service.functions.relay && service.functions.relay.reservedConcurrency);
  if (!/^\d+$/.test(raw) || Number(raw) < 1) {
    return [`fanoutMax=${JSON.stringify(raw)} is not a whole number of invocations: 1 turns fan-out off, N > 1 lets up to N work at once on a backlog`];
  }
  if (Number.isInteger(reserved) && Number(raw) > reserved) {
    return [
      `fanoutMax=${raw} is more than reservedConcurrency=${reserved}: fan-out would run more invocations at once than the function may. ` +
        `Raise reservedConcurrency to ${Number(raw) + 1} (fanoutMax + 1 leaves room for the next tick), or lower fanoutMax ` +
        '(docs/operations.md, Fan-out on backlog)',
    ];
  }
  return [];
}

const TAG = /^[\p{L}\p{Z}\p{N}_.:/=+@-]*$/u;

/** The `tags` parameter (custom.relayTags): comma-separated key=value pairs, as AWS accepts them. */
function tags(service) {
  const text = String((service.custom && service.custom.relayTags) || '').trim();
  const map = {};
  const problems = [];
  for (const pair of text ? text.split(',') : []) {
    const eq = pair.indexOf('=');
    const key = (eq < 0 ? pair : pair.slice(0, eq)).trim();
    const value = eq < 0 ? undefined : pair.slice(eq + 1).trim();
    if (value === undefined || !key || key.length > 128 || value.length > 256 || !TAG.test(key) || !TAG.test(value) ||
      key.toLowerCase().startsWith('aws:') || key in map) {
      problems.push(
        `tags: ${JSON.stringify(pair)} is not a tag: give comma-separated key=value pairs, keys unique, 1 to 128 ` +
          'characters not starting with aws:, values up to 256, letters, digits, spaces and _.:/=+-@ only',
      );
    } else map[key] = value;
  }
  return { map, problems };
}

// the resource types of the template that take a Tags list (the dashboard, policies, the rule and
// permissions take none; the stack's own tags also reach whatever else supports tagging)
const TAGGABLE = new Set(['AWS::Lambda::Function', 'AWS::IAM::Role', 'AWS::Logs::LogGroup', 'AWS::SQS::Queue',
  'AWS::SNS::Topic', 'AWS::CloudWatch::Alarm']);

/** Puts the `tags` parameter on the stack (at deploy) and on every taggable resource of the template. */
function applyTags(service) {
  const { map } = tags(service);
  const keys = Object.keys(map);
  if (keys.length === 0) return;
  service.provider.stackTags = { ...service.provider.stackTags, ...map };
  for (const resource of Object.values(service.provider.compiledCloudFormationTemplate.Resources)) {
    if (!TAGGABLE.has(resource.Type)) continue;
    resource.Properties = resource.Properties || {};
    const kept = (resource.Properties.Tags || []).filter((t) => !keys.includes(t.Key));
    resource.Properties.Tags = [...kept, ...keys.map((Key) => ({ Key, Value: map[Key] }))];
  }
}

const NO_VALUE = Symbol('AWS::NoValue');

/**
 * Decides at package time every Condition whose operands are literals (all of serverless.yml's:
 * the parameters are resolved by then) and writes the template as CloudFormation would evaluate
 * it: each Fn::If replaced by its chosen branch, AWS::NoValue dropped, resources and outputs whose
 * condition is false removed (with the DependsOn naming them), the decided conditions removed. A
 * reviewer's linter then sees only what is deployed: no dead branch holding an empty parameter
 * (kms:Decrypt on "", a permissions boundary of ""), no condition that "always returns true".
 * A condition on anything not literal (a Ref, a pseudo parameter) is left to CloudFormation.
 */
function foldConditions(template) {
  const defs = template.Conditions || {};
  const decided = new Map();
  const decide = (name) => {
    if (!decided.has(name)) {
      decided.set(name, undefined); // a cycle stays undecided
      decided.set(name, evaluate(defs[name]));
    }
    return decided.get(name);
  };
  // true | false | a literal operand's text | undefined (not decidable here)
  const evaluate = (c) => {
    if (typeof c === 'string' || typeof c === 'number' || typeof c === 'boolean') return String(c);
    if (!c || typeof c !== 'object' || Array.isArray(c)) return undefined;
    const keys = Object.keys(c);
    if (keys.length !== 1) return undefined;
    const args = c[keys[0]];
    const all = (list) => (Array.isArray(list) ? list.map(evaluate) : [undefined]);
    switch (keys[0]) {
      case 'Condition':
        return typeof args === 'string' && args in defs ? decide(args) : undefined;
      case 'Fn::Equals': {
        const [a, b] = all(args);
        return typeof a === 'string' && typeof b === 'string' ? a === b : undefined;
      }
      case 'Fn::Not': {
        const [a] = all(args);
        return typeof a === 'boolean' ? !a : undefined;
      }
      case 'Fn::And':
      case 'Fn::Or': {
        const vs = all(args);
        if (!vs.every((v) => typeof v === 'boolean')) return undefined;
        return keys[0] === 'Fn::And' ? vs.every(Boolean) : vs.some(Boolean);
      }
      default:
        return undefined;
    }
  };
  for (const name of Object.keys(defs)) decide(name);
  const known = (name) => typeof decided.get(name) === 'boolean';

  const walk = (v) => {
    if (Array.isArray(v)) return v.map(walk).filter((x) => x !== NO_VALUE);
    if (!v || typeof v !== 'object') return v;
    if (v.Ref === 'AWS::NoValue' && Object.keys(v).length === 1) return NO_VALUE;
    if (Array.isArray(v['Fn::If']) && Object.keys(v).length === 1 && known(v['Fn::If'][0])) {
      const [name, yes, no] = v['Fn::If'];
      return walk(decided.get(name) ? yes : no);
    }
    const out = {};
    for (const [k, x] of Object.entries(v)) {
      const w = walk(x);
      if (w !== NO_VALUE) out[k] = w;
    }
    return out;
  };

  const removed = new Set();
  for (const section of ['Resources', 'Outputs']) {
    const entries = template[section] || {};
    for (const [id, entry] of Object.entries(entries)) {
      if (!entry.Condition || !known(entry.Condition)) continue;
      if (decided.get(entry.Condition)) delete entry.Condition;
      else {
        delete entries[id];
        if (section === 'Resources') removed.add(id);
      }
    }
  }
  for (const [id, resource] of Object.entries(template.Resources || {})) {
    const r = walk(resource);
    if (r.DependsOn !== undefined) {
      const kept = [].concat(r.DependsOn).filter((d) => !removed.has(d));
      if (kept.length === 0) delete r.DependsOn;
      else r.DependsOn = kept;
    }
    template.Resources[id] = r;
  }
  if (template.Outputs) template.Outputs = walk(template.Outputs);
  for (const name of Object.keys(defs)) if (known(name)) delete defs[name];
  if (template.Conditions && Object.keys(template.Conditions).length === 0) delete template.Conditions;
}

class BuildRelayBundle {
  constructor(serverless) {
    const serviceDir = serverless.serviceDir || serverless.config.servicePath;
    const build = () => {
      const problems = parameterProblems(serverless.service);
      if (problems.length > 0) throw new serverless.classes.Error(problems.join('\n'));
      execFileSync(process.execPath, [path.join(serviceDir, 'scripts', 'build.mjs'), '--lambda-only'], {
        cwd: serviceDir,
        stdio: 'inherit',
      });
    };
    this.hooks = {
      'before:package:createDeploymentArtifacts': build,
      'before:package:function:package': build,
      'before:aws:package:finalize:saveServiceState': () => {
        applyTags(serverless.service);
        foldConditions(serverless.service.provider.compiledCloudFormationTemplate);
      },
    };
  }
}

module.exports = BuildRelayBundle;
module.exports.foldConditions = foldConditions;
