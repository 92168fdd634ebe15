// Bundles the Lambda handler (and the CLI, when present) with esbuild and zips the Lambda bundle.
//
//   node scripts/build.mjs                → .build/relay/handler.mjs(.map), .build/relay.zip, dist/cli.js
//   node scripts/build.mjs --lambda-only  → the Lambda bundle and zip only (what scripts/package.sh needs;
//                                           a dist/cli.js left behind would shadow src/cli.ts for
//                                           bin/outbox-relay.js while developing)
//   node scripts/build.mjs --test-hooks   → .build/relay-test-hooks/handler.mjs(.map) only: the Lambda
//                                           bundle with the test hooks on, never zipped (for
//                                           test/integration/lambda-runtime.test.ts)
//
// Decisions, so nobody has to rediscover them:
// - One ESM file per entry, platform node, target node24 (the Lambda runtime and our pinned Node).
// - CommonJS dependencies (kafkajs) call require() on Node built-ins; an ESM bundle has no
//   `require`, so the banner creates one with createRequire (plus __filename/__dirname).
// - The AWS SDK v3 is BUNDLED, not marked external, although nodejs24.x ships one: the runtime's
//   copy is whatever version AWS installed that month, while the bundled one is the version in our
//   lock file that the tests ran against. Only @aws-sdk/client-secrets-manager and its smithy
//   pieces are pulled in, tree-shaken and minified, so the cost is a few hundred KB, loaded once
//   per cold start of a function that runs once a minute.
// - Source maps are written next to the bundle (without the sources, to keep the zip small) and
//   NODE_OPTIONS=--enable-source-maps in serverless.yml turns stack traces back into src/ lines.
// - The SQL migrations (src/outbox/migrations/*.sql) are embedded as globalThis.__OUTBOX_MIGRATIONS__
//   (see loadMigrations in src/outbox/migrate.ts): a bundle has no src/ directory to read them from.
// - @platformatic/kafka's CRC32C and codecs come from @platformatic/wasm-utils, whose main entry
//   reads native.wasm from a path relative to its own file, which a bundle does not have (the
//   import fails at load: ENOENT .../dist/native.wasm). Its `bundled` entry embeds the same wasm:
//   the alias below makes the bundle use that one.
// - The zip is reproducible: fixed entry order, fixed timestamps and modes, so an unchanged
//   bundle gives a byte-identical zip and CloudFormation sees no code change.
// - The test hooks (src/test-hooks.ts: OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS) are compiled out of every
//   build: `define` makes __OUTBOX_TEST_HOOKS__ false, so their code is dead and removed, and no
//   setting of a deployed function can turn one on. Only --test-hooks builds them in, into a
//   directory of its own that nothing zips or packages.
import { build } from 'esbuild';
import { createWriteStream, existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import yazl from 'yazl';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const outDir = join(root, '.build', 'relay');
const testHooksDir = join(root, '.build', 'relay-test-hooks');
const zipPath = join(root, '.build', 'relay.zip');
const handlerEntry = join(root, 'src', 'handler.ts');
const cliEntry = join(root, 'src', 'cli.ts');

const migrationsDir = join(root, 'src', 'outbox', 'migrations');

/** Same selection and order as loadMigrations() in src/outbox/migrate.ts. */
async function readMigrations() {
  if (!existsSync(migrationsDir)) return [];
  const names = (await readdir(migrationsDir)).filter((f) => /^\d+_.+\.sql$/.test(f)).sort();
  return Promise.all(
    names.map(async (name) => ({
      version: Number(name.split('_')[0]),
      name,
      sql: await readFile(join(migrationsDir, name), 'utf8'),
    })),
  );
}

const runtimeBanner = [
  "import { createRequire as __relayCreateRequire } from 'node:module';",
  "import { fileURLToPath as __relayFileURLToPath } from 'node:url';",
  "import { dirname as __relayDirname } from 'node:path';",
  'const require = __relayCreateRequire(import.meta.url);',
  'const __filename = __relayFileURLToPath(import.meta.url);',
  'const __dirname = __relayDirname(__filename);',
].join('\n');

/** @type {import('esbuild').BuildOptions} */
const common = {
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node24',
  // prefer packages' ESM builds: they tree-shake (the AWS SDK ships both)
  mainFields: ['module', 'main'],
  treeShaking: true,
  minify: true,
  // keep class and function names: errors are logged by name (ConfigError, not `ir`)
  keepNames: true,
  sourcemap: 'linked',
  sourcesContent: false,
  legalComments: 'none',
  logLevel: 'warning',
  metafile: true,
  alias: { '@platformatic/wasm-utils': '@platformatic/wasm-utils/bundled' },
  define: { __OUTBOX_TEST_HOOKS__: 'false' },
};

async function zipDirectory(files, target) {
  const zip = new yazl.ZipFile();
  const mtime = new Date('2000-01-01T00:00:00Z');
  for (const [name, path] of files) {
    zip.addBuffer(await readFile(path), name, { mtime, mode: 0o100644, compress: true });
  }
  zip.end();
  await new Promise((resolve, reject) => {
    const out = createWriteStream(target);
    out.on('close', resolve);
    out.on('error', reject);
    zip.outputStream.on('error', reject).pipe(out);
  });
}

const kb = (bytes) => `${(bytes / 1024).toFixed(1)} KB`;

async function main() {
  if (!existsSync(handlerEntry)) {
    throw new Error(`cannot build the Lambda bundle: ${handlerEntry} does not exist`);
  }
  const migrations = await readMigrations();
  const embed = migrations.length ? `\nglobalThis.__OUTBOX_MIGRATIONS__ = ${JSON.stringify(migrations)};` : '';
  const banner = { js: runtimeBanner + embed };

  if (process.argv.includes('--test-hooks')) {
    await rm(testHooksDir, { recursive: true, force: true });
    await build({
      ...common,
      define: { __OUTBOX_TEST_HOOKS__: 'true' },
      banner,
      entryPoints: [handlerEntry],
      outfile: join(testHooksDir, 'handler.mjs'),
    });
    console.log(`test bundle    .build/relay-test-hooks/handler.mjs  ${kb((await stat(join(testHooksDir, 'handler.mjs'))).size)} (test hooks on; not for deployment)`);
    return;
  }

  await rm(outDir, { recursive: true, force: true });
  await rm(zipPath, { force: true });
  await mkdir(outDir, { recursive: true });

  const lambda = await build({
    ...common,
    banner,
    entryPoints: [handlerEntry],
    outfile: join(outDir, 'handler.mjs'),
  });
  // what the define promises, checked on the bundle: no test hook's setting or code is left in it
  const leaked = (await readFile(join(outDir, 'handler.mjs'), 'utf8')).match(/OUTBOX_TEST_\w*|test hook: [^"'`]*/);
  if (leaked) throw new Error(`the Lambda bundle still holds a test hook (${leaked[0]}): guard it as src/test-hooks.ts says`);
  const inputs = Object.keys(lambda.metafile.inputs).filter((p) => !p.startsWith('src/'));
  const packages = new Set(inputs.map((p) => p.match(/node_modules\/((?:@[^/]+\/)?[^/]+)/)?.[1]).filter(Boolean));

  await zipDirectory(
    [
      ['handler.mjs', join(outDir, 'handler.mjs')],
      ['handler.mjs.map', join(outDir, 'handler.mjs.map')],
    ],
    zipPath,
  );
  const bundleSize = (await stat(join(outDir, 'handler.mjs'))).size;
  const zipSize = (await stat(zipPath)).size;
  console.log(`lambda bundle  .build/relay/handler.mjs  ${kb(bundleSize)} (${packages.size} packages)`);
  console.log(`lambda zip     .build/relay.zip          ${kb(zipSize)}`);

  if (process.argv.includes('--lambda-only')) return;
  if (existsSync(cliEntry)) {
    // The CLI keeps its dependencies external: it runs from an installed package whose
    // node_modules are there, and bin/outbox-relay.js prefers dist/cli.js over tsx.
    await build({
      ...common,
      banner,
      // the CLI and the library entry (enqueue() for applications; package.json "exports")
      entryPoints: [cliEntry, join(root, 'src', 'index.ts')],
      outdir: join(root, 'dist'),
      packages: 'external',
      minify: false,
      metafile: false,
    });
    console.log('cli, library   dist/cli.js, dist/index.js');
  } else {
    console.log('cli            skipped (src/cli.ts does not exist yet)');
  }
}

main().catch((err) => {
  console.error(`build failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
