// services: build-dir alone
// What `npm pack` puts in the published package (package.json `files`, and what npm adds by
// itself), read from `npm pack --dry-run --json`, which runs the build first (prepack) as a publish
// would: what a user needs is in, and nothing of the repository's own (tests, local services'
// data, benchmark results, docs) is.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** the paths `npm pack` would publish */
function packed(): string[] {
  const res = spawnSync('npm', ['pack', '--dry-run', '--json'], { cwd: root, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
  assert.equal(res.status, 0, res.stderr);
  // prepack's build prints its summary to stdout before npm's JSON
  const [pack] = JSON.parse(res.stdout.slice(res.stdout.indexOf('\n[') + 1)) as Array<{ files: Array<{ path: string }> }>;
  return pack!.files.map((f) => f.path).sort();
}

describe('the npm package', () => {
  it('holds the CLI, the built library, the sources its types point at, the migrations, serverless.yml, README, CHANGELOG (and LICENSE when the repository has one); no tests, local data, benchmark results or docs', () => {
    const files = packed();
    const must = ['package.json', 'README.md', 'CHANGELOG.md', 'serverless.yml', 'bin/outbox-relay.js', 'dist/index.js', 'dist/cli.js', 'src/index.ts', 'src/outbox/migrations/001_baseline.sql'];
    if (existsSync(join(root, 'LICENSE'))) must.push('LICENSE');
    for (const path of must) assert.ok(files.includes(path), `${path} is not in the package: ${files.join(', ')}`);
    const never = [/^test\//, /\.test\.ts$/, /^\.cache\//, /^\.build\//, /^bench\//, /^docs\//, /^scripts\//, /^localstack\//, /^node_modules\//, /^\.ci\//, /^\.git/, /\.tgz$/];
    const unwanted = files.filter((f) => never.some((re) => re.test(f)));
    assert.deepEqual(unwanted, [], 'files of the repository, not of the package');
  });
});
