'use strict';
// A local Serverless Framework plugin (listed in serverless.yml): builds the Lambda bundle and
// .build/relay.zip right before the framework packages the service, so `osls package`,
// `osls deploy` and `osls deploy function` never ship a stale or missing zip. A deploy of an
// already packaged directory (`osls deploy --package DIR`) does not rebuild.
// CommonJS because the framework loads plugins with require().
const { execFileSync } = require('node:child_process');
const path = require('node:path');

class BuildRelayBundle {
  constructor(serverless) {
    const serviceDir = serverless.serviceDir || serverless.config.servicePath;
    const build = () => {
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
