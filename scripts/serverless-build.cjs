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
    };
  }
}

module.exports = BuildRelayBundle;
