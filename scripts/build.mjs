// Bundles the Lambda handler (and the CLI, when present) with esbuild and zips the Lambda bundle.
//
//   node scripts/build.mjs                → .build/relay/ (handler.mjs, chunks/, source maps,
//                                           THIRD-PARTY-NOTICES.txt), .build/relay.zip, dist/cli.js
//   node scripts/build.mjs --lambda-only  → the Lambda bundle and zip only (what scripts/package.sh needs;
//                                           a dist/cli.js left behind would shadow src/cli/main.ts for
//                                           bin/outbox-relay.js while developing)
//   node scripts/build.mjs --test-hooks   → .build/relay-test-hooks/, laid out as .build/relay/: the
//                                           Lambda bundle with the test hooks on, never zipped (for
//                                           test/integration/lambda-runtime.test.ts)
//
// Decisions, so nobody has to rediscover them:
// - ESM, platform node, target node24 (the Lambda runtime and our pinned Node). The entry is
//   handler.mjs at the zip's root (serverless.yml: handler.handler); code split off it goes to
//   chunks/*.mjs (.mjs: the zip has no package.json saying "type": "module").
// - Code splitting, for the Kafka clients: src/kafka/clients.ts imports the configured client's
//   module on first use, and each client (kafkajs ~280 KB minified, @platformatic/kafka with its
//   dependencies ~750 KB) lands in chunks of its own, so a cold start parses only the configured
//   one and never the other (docs/benchmarks/cold-start.md measured what that saves).
// - CommonJS dependencies (kafkajs) call require() on Node built-ins; an ESM bundle has no
//   `require`, so the banner creates one with createRequire (plus __filename/__dirname). esbuild
//   puts the banner at the top of every output file, chunks too: each is a module of its own.
// - The AWS SDK v3 is BUNDLED, not marked external, although nodejs24.x ships one: the runtime's
//   copy is whatever version AWS installed that month, while the bundled one is the version in our
//   lock file that the tests ran against. Only @aws-sdk/client-secrets-manager and its smithy
//   pieces are pulled in, tree-shaken and minified, so the cost is a few hundred KB, loaded once
//   per cold start of a function that runs once a minute.
// - Source maps are written next to each output file (without the sources, to keep the zip small)
//   and NODE_OPTIONS=--enable-source-maps in serverless.yml turns stack traces back into src/
//   lines. Node reads a module's map when it loads the module: a chunk not loaded costs nothing.
// - The SQL migrations (src/outbox/migrations/*.sql) are embedded by `define` as the value of
//   globalThis.__OUTBOX_MIGRATIONS__ (see loadMigrations in src/outbox/migrate.ts), once, where it
//   is read: a bundle has no src/ directory to read them from. So is src/outbox/partitioned.sql
//   (globalThis.__OUTBOX_PARTITIONED_SQL__, loadPartitionedSql).
// - @platformatic/kafka's CRC32C and codecs come from @platformatic/wasm-utils, whose main entry
//   reads native.wasm from a path relative to its own file, which a bundle does not have (the
//   import fails at load: ENOENT .../dist/native.wasm). Its `bundled` entry embeds the same wasm:
//   the alias below makes the bundle use that one.
// - License notices: THIRD-PARTY-NOTICES.txt in the zip lists every bundled package with its
//   license and notice files (scripts/third-party-notices.mjs, from esbuild's metafile). The code
//   keeps no license comment (`legalComments: 'none'`): the only ones are coverage pragmas.
// - The zip is reproducible: fixed entry order, fixed timestamps and modes, content-hashed chunk
//   names, so an unchanged bundle gives a byte-identical zip and CloudFormation sees no code change.
// - The test hooks (src/test-hooks.ts: OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS) are compiled out of every
//   build: `define` makes __OUTBOX_TEST_HOOKS__ false, so their code is dead and removed, and no
//   setting of a deployed function can turn one on. Only --test-hooks builds them in, into a
//   directory of its own that nothing zips or packages.
import { build } from 'esbuild';
import { createWriteStream, existsSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import yazl from 'yazl';
import { thirdPartyNotices } from './third-party-notices.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const outDir = join(root, '.build', 'relay');
const testHooksDir = join(root, '.build', 'relay-test-hooks');
const zipPath = join(root, '.build', 'relay.zip');
const handlerEntry = join(root, 'src', 'lambda', 'handler.ts');
const cliEntry = join(root, 'src', 'cli', 'main.ts');
const distDir = join(root, 'dist');
const NOTICES = 'THIRD-PARTY-NOTICES.txt';

const migrationsDir = join(root, 'src', 'outbox', 'migrations');
const partitionedSql = join(root, 'src', 'outbox', 'partitioned.sql');

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
  // the metafile's paths are relative to it (third-party-notices.mjs reads the packages there)
  absWorkingDir: root,
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
  splitting: true,
  chunkNames: 'chunks/[name]-[hash]',
  banner: { js: runtimeBanner },
  alias: { '@platformatic/wasm-utils': '@platformatic/wasm-utils/bundled' },
};

/** `define`: the test hooks on or off, and the migrations embedded (when there are any). */
function defines(testHooks, migrations) {
  return {
    __OUTBOX_TEST_HOOKS__: String(testHooks),
    ...(migrations.length ? { 'globalThis.__OUTBOX_MIGRATIONS__': JSON.stringify(migrations) } : {}),
    ...(existsSync(partitionedSql) ? { 'globalThis.__OUTBOX_PARTITIONED_SQL__': JSON.stringify(readFileSync(partitionedSql, 'utf8')) } : {}),
  };
}

/** The Lambda bundle into `dir`: handler.mjs, chunks/*.mjs, a source map beside each. */
function buildLambda(dir, testHooks, migrations) {
  return build({
    ...common,
    entryPoints: [handlerEntry],
    outdir: dir,
    entryNames: '[name]',
    outExtension: { '.js': '.mjs' },
    define: defines(testHooks, migrations),
  });
}

/** Every file under `dir`, as zip entry names (forward slashes), sorted by code point. */
async function filesUnder(dir) {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  return entries
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name).slice(dir.length + 1).split(sep).join('/'))
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

async function zipDirectory(dir, names, target) {
  const zip = new yazl.ZipFile();
  const mtime = new Date('2000-01-01T00:00:00Z');
  for (const name of names) {
    zip.addBuffer(await readFile(join(dir, name)), name, { mtime, mode: 0o100644, compress: true });
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

async function sizeOf(dir, names) {
  let total = 0;
  for (const name of names) total += (await stat(join(dir, name))).size;
  return total;
}

async function main() {
  if (!existsSync(handlerEntry)) {
    throw new Error(`cannot build the Lambda bundle: ${handlerEntry} does not exist`);
  }
  const migrations = await readMigrations();

  if (process.argv.includes('--test-hooks')) {
    await rm(testHooksDir, { recursive: true, force: true });
    const hooked = await buildLambda(testHooksDir, true, migrations);
    await writeFile(join(testHooksDir, NOTICES), thirdPartyNotices(hooked.metafile, root).text);
    const code = (await filesUnder(testHooksDir)).filter((f) => f.endsWith('.mjs'));
    console.log(`test bundle    .build/relay-test-hooks/  ${kb(await sizeOf(testHooksDir, code))} in ${code.length} files (test hooks on; not for deployment)`);
    return;
  }

  await rm(outDir, { recursive: true, force: true });
  await rm(zipPath, { force: true });
  await mkdir(outDir, { recursive: true });

  const lambda = await buildLambda(outDir, false, migrations);
  const code = (await filesUnder(outDir)).filter((f) => f.endsWith('.mjs'));
  // what the define promises, checked on the bundle: no test hook's setting or code is left in it
  for (const file of code) {
    const leaked = (await readFile(join(outDir, file), 'utf8')).match(/OUTBOX_TEST_\w*|test hook: [^"'`]*/);
    if (leaked) throw new Error(`the Lambda bundle still holds a test hook (${leaked[0]}, in ${file}): guard it as src/test-hooks.ts says`);
  }
  const notices = thirdPartyNotices(lambda.metafile, root);
  await writeFile(join(outDir, NOTICES), notices.text);

  await zipDirectory(outDir, await filesUnder(outDir), zipPath);
  const zipSize = (await stat(zipPath)).size;
  console.log(`lambda bundle  .build/relay/handler.mjs + chunks/  ${kb(await sizeOf(outDir, code))} in ${code.length} files (${notices.packages.length} packages, ${NOTICES})`);
  console.log(`lambda zip     .build/relay.zip          ${kb(zipSize)}`);

  if (process.argv.includes('--lambda-only')) return;
  if (existsSync(cliEntry)) {
    // The CLI keeps its dependencies external: it runs from an installed package whose
    // node_modules are there, and bin/outbox-relay.js prefers dist/cli.js over tsx. Split like
    // the Lambda bundle, so a command imports only the configured Kafka client.
    await rm(distDir, { recursive: true, force: true });
    await build({
      ...common,
      define: defines(false, migrations),
      // the CLI and the library entry (enqueue() for applications; package.json "exports")
      entryPoints: { cli: cliEntry, index: join(root, 'src', 'index.ts') },
      outdir: distDir,
      packages: 'external',
      minify: false,
      metafile: false,
    });
    console.log('cli, library   dist/cli.js, dist/index.js (+ dist/chunks/)');
  } else {
    console.log('cli            skipped (src/cli/main.ts does not exist yet)');
  }
}

main().catch((err) => {
  console.error(`build failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
