// Runs every test file of `npm test` (scripts/test.sh starts the services first) as its own
// `node --test` process, several at once, and prints each file's report whole when it ends.
//
// The integration suite runs once per Kafka client, its guarantee files a third time through
// PgBouncer, and some of them a fourth time in exactly-once delivery (the passes below). The second client's pass runs the guarantee files over TLS:
// Postgres with verify-full, the broker's SSL listener, the local CA (scripts/services/tls.sh).
// The PgBouncer pass runs them against an outbox partitioned by range of created_at
// (TEST_OUTBOX_SHAPE=partitioned, test/integration/helpers.ts). Files share the local services, and some of them stop, pause or
// kill one on purpose, or bind a fixed port. So every integration and model file names, in a
// header line, the services it uses, and those it needs alone:
//
//   // services: postgres, kafka alone, moto
//
// A file runs only when each service it names is free for it: one that needs a service alone waits
// until no other file uses it, and holds off every file that uses it meanwhile. A file waiting for a
// service is not overtaken by later files that want the same service, so no file waits forever.
// The longest files start first (their last measured durations, kept in .cache/test-times.json; a
// fresh clone has none and goes by the order below).
//
//   node --import tsx scripts/run-tests.ts [substring ...]   only the jobs whose name contains one
//   TEST_CONCURRENCY=N                                       files at once (default 3)
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import kafkajs from 'kafkajs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const TIMES = join(ROOT, '.cache', 'test-times.json');
/** where each running file notes the topics it creates (test/integration/helpers.ts noteTopics) */
const TOPICS_DIR = join(ROOT, '.cache', 'run', 'test-topics');
const KAFKA_BROKERS = process.env.TEST_KAFKA_BROKERS ?? '127.0.0.1:9092';

/** The shared things a test file can name in its `// services:` line. */
const SERVICES = ['postgres', 'kafka', 'pgbouncer', 'moto', 'kafka-proxy-ports', 'build-dir'] as const;
/** The unit tests need none, and share the machine (~15 s, green beside two busy cores). */
export type Service = (typeof SERVICES)[number];
export type Claims = Map<Service, 'shared' | 'alone'>;

interface Job {
  name: string;
  /** arguments after `node --import tsx --test --test-reporter=spec` */
  args: string[];
  env: Record<string, string>;
  claims: Claims;
}

/** The files whose relay does not depend on its Kafka client: the second client's pass leaves them out. */
const CLIENT_INDEPENDENT = /\/(claim-plan|search-path|transactions|services\.smoke|services\.status|kafka-proxy|package|partitions|lambda-runtime|fanout|pooler|template-lint|deploy-local|kcat)\.test\.ts$/;
/** The guarantee files, run a third time with every relay connecting through PgBouncer, each fixture's outbox partitioned. */
const VIA_POOLER = /\/(relay|on-the-wire|row-rules|poison-rows|missing-topics|operator-commands|database-faults|secrets|broker-faults|publishing|exactly-once)\.test\.ts$/;

/**
 * The guarantee files whose promises hold alike in both delivery modes, run once more with every
 * relay in OUTBOX_DELIVERY=exactly-once (test/integration/helpers.ts, DELIVERY). The others assert
 * at-least-once's own windows (a batch re-sent after a crash, a COMMIT pipelined behind the next
 * batch's records, a producer kept or replaced, part of a batch marked when the rest failed):
 * exactly-once's are exactly-once.test.ts's and exactly-once-broker.test.ts's.
 */
const VIA_EXACTLY_ONCE = /\/(row-rules|poison-rows|operator-commands|secrets|publishing)\.test\.ts$/;

/** test/integration/helpers.ts, VIA_TLS; Node reads NODE_EXTRA_CA_CERTS at start, for a test's in-process relays */
const VIA_TLS = { TEST_VIA_TLS: '1', NODE_EXTRA_CA_CERTS: join(ROOT, '.cache', 'tls', 'ca.pem') };

function testFiles(dir: string): string[] {
  return readdirSync(join(ROOT, dir))
    .filter((f) => f.endsWith('.test.ts'))
    .sort()
    .map((f) => `${dir}/${f}`);
}

/** The `// services:` line of a test file, parsed; a file without one, or naming an unknown service, is an error. */
export function parseServices(file: string, text: string): Claims {
  const line = text.split('\n').find((l) => l.startsWith('// services:'));
  if (!line) throw new Error(`${file}: no "// services: ..." header line; name the shared services it uses (${SERVICES.join(', ')}), "<service> alone" for one it stops, pauses, kills or binds a fixed port of`);
  const claims: Claims = new Map();
  for (const item of line.slice('// services:'.length).split(',')) {
    const m = /^\s*([\w-]+)(\s+alone)?\s*$/.exec(item);
    if (!m || !(SERVICES as readonly string[]).includes(m[1]!)) throw new Error(`${file}: "${item.trim()}" in its services line is not one of ${SERVICES.join(', ')} (optionally followed by "alone")`);
    claims.set(m[1] as Service, m[2] ? 'alone' : 'shared');
  }
  return claims;
}

export function jobs(): Job[] {
  const claimsOf = (file: string) => parseServices(file, readFileSync(join(ROOT, file), 'utf8'));
  const integration = testFiles('test/integration');
  const list: Job[] = [
    // pure logic: no service, one process for all of them
    { name: 'unit', args: ['test/unit/**/*.test.ts'], env: {}, claims: new Map() },
    ...testFiles('test/model').map((file) => ({ name: `model ${file}`, args: [file], env: {}, claims: claimsOf(file) })),
  ];
  for (const file of integration) list.push({ name: `kafkajs ${file}`, args: [file], env: { TEST_KAFKA_CLIENT: 'kafkajs' }, claims: claimsOf(file) });
  for (const file of integration.filter((f) => !CLIENT_INDEPENDENT.test(f))) {
    const env = { TEST_KAFKA_CLIENT: 'platformatic', ...(VIA_POOLER.test(file) ? VIA_TLS : {}) };
    list.push({ name: `platformatic ${file}`, args: [file], env, claims: claimsOf(file) });
  }
  for (const file of integration.filter((f) => VIA_POOLER.test(f))) {
    const claims = claimsOf(file);
    if (!claims.has('pgbouncer')) claims.set('pgbouncer', 'shared');
    list.push({ name: `pgbouncer ${file}`, args: [file], env: { TEST_KAFKA_CLIENT: 'kafkajs', TEST_VIA_POOLER: '1', TEST_OUTBOX_SHAPE: 'partitioned' }, claims });
  }
  for (const file of integration.filter((f) => VIA_EXACTLY_ONCE.test(f))) {
    list.push({ name: `eos ${file}`, args: [file], env: { TEST_KAFKA_CLIENT: 'kafkajs', TEST_DELIVERY: 'exactly-once' }, claims: claimsOf(file) });
  }
  return list;
}

/** Who holds each service now. */
export class Services {
  private readonly holders = new Map<Service, { alone: boolean; count: number }>();

  /** The services of `claims` that are not free for it now. */
  busy(claims: Claims): Service[] {
    return [...claims].filter(([service, mode]) => {
      const h = this.holders.get(service);
      return h !== undefined && h.count > 0 && (h.alone || mode === 'alone');
    }).map(([service]) => service);
  }

  take(claims: Claims): void {
    for (const [service, mode] of claims) {
      const h = this.holders.get(service) ?? { alone: false, count: 0 };
      this.holders.set(service, { alone: mode === 'alone', count: h.count + 1 });
    }
  }

  release(claims: Claims): void {
    for (const service of claims.keys()) this.holders.get(service)!.count -= 1;
  }
}

interface Result {
  job: Job;
  code: number;
  seconds: number;
  tests: number;
  fail: number;
}

let jobsStarted = 0;

function run(job: Job): Promise<Result> {
  const started = Date.now();
  const topicsFile = join(TOPICS_DIR, `${process.pid}-${(jobsStarted += 1)}.txt`);
  return new Promise((resolve) => {
    const child = spawn(
      process.execPath,
      // No --test-force-exit: with it, Node's test runner exits without draining the pipe its file
      // processes report through, and drops the last verdicts of a file while exiting 0
      // (nodejs/node#64833; here a fresh-clone run reported 247 unit tests of 253, config.test.ts
      // cut after its fourth suite). A file whose process outlives its tests is killed by the
      // watchdog below instead, and fails.
      ['--import', 'tsx', '--test', '--test-reporter=spec', '--test-timeout=600000', ...job.args],
      {
        cwd: ROOT,
        env: { ...process.env, KAFKAJS_NO_PARTITIONER_WARNING: '1', TEST_TOPICS_FILE: topicsFile, ...job.env },
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true,
      },
    );
    running.add(child.pid!);
    const out: Buffer[] = [];
    child.stdout.on('data', (b: Buffer) => out.push(b));
    child.stderr.on('data', (b: Buffer) => out.push(b));
    let killed = false;
    const watchdog = setTimeout(() => {
      killed = true;
      killGroup(child.pid!);
    }, FILE_LIMIT_MS);
    child.on('close', (code, signal) => {
      clearTimeout(watchdog);
      running.delete(child.pid!);
      if (killed) out.push(Buffer.from(`\n✖ ${job.name}: killed after ${FILE_LIMIT_MS / 60_000} minutes, the limit of one file (FILE_LIMIT_MS in scripts/run-tests.ts): a test hung, or the file's process did not exit after its tests (a handle left open: a socket, a timer, a child process)\n`));
      const text = Buffer.concat(out).toString('utf8');
      const count = (label: string) => Number(new RegExp(`^ℹ ${label} (\\d+)`, 'm').exec(text)?.[1] ?? 0);
      const seconds = (Date.now() - started) / 1000;
      // the whole report at once, under a header (.ci/run repeats each failing file's failures under it)
      process.stdout.write(`# ${job.name}\n${text}${text.endsWith('\n') ? '' : '\n'}`);
      // while the job still holds its share of the broker (no file may kill it meanwhile)
      void deleteTopics(topicsFile).then(() => resolve({ job, code: code ?? (signal ? 128 : 1), seconds, tests: count('tests'), fail: count('fail') }));
    });
  });
}

/** The longest one file may take: the longest takes ~4 minutes in a fresh clone (lambda-runtime.test.ts, installs included). */
const FILE_LIMIT_MS = 20 * 60_000;

const running = new Set<number>();

/** each file runs in its own process group: take its children (brokers' clients, CLIs) too */
function killGroup(pid: number): void {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    for (const pid of running) killGroup(pid);
    process.exit(130);
  });
}

const rank = (job: Job) => (job.claims.get('kafka') === 'alone' ? 1 : 0);

/** Deletes the topics a file (or an earlier run that was interrupted) noted; a failure is only reported. */
async function deleteTopics(file: string): Promise<void> {
  if (!existsSync(file)) return;
  const topics = [...new Set(readFileSync(file, 'utf8').split('\n').filter(Boolean))];
  const admin = new kafkajs.Kafka({ clientId: 'run-tests', brokers: KAFKA_BROKERS.split(','), logLevel: kafkajs.logLevel.NOTHING }).admin();
  try {
    await admin.connect();
    const existing = new Set(await admin.listTopics());
    const ours = topics.filter((t) => existing.has(t));
    for (let i = 0; i < ours.length; i += 200) await admin.deleteTopics({ topics: ours.slice(i, i + 200), timeout: 30_000 });
    rmSync(file);
  } catch (err) {
    console.log(`# warning: could not delete the ${topics.length} topics noted in ${relative(ROOT, file)} (left for the next run): ${String(err)}`);
  } finally {
    await admin.disconnect();
  }
}

/** The topic files of runs that are not running any more (interrupted, or their deletion failed). */
function leftoverTopicFiles(): string[] {
  if (!existsSync(TOPICS_DIR)) return [];
  const alive = (pid: number) => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  return readdirSync(TOPICS_DIR)
    .filter((f) => !alive(Number(f.split('-')[0])))
    .map((f) => join(TOPICS_DIR, f));
}

function readTimes(): Record<string, number> {
  try {
    return JSON.parse(readFileSync(TIMES, 'utf8')) as Record<string, number>;
  } catch {
    return {};
  }
}

async function main(): Promise<void> {
  const filters = process.argv.slice(2);
  const concurrency = Number(process.env.TEST_CONCURRENCY ?? 3);
  if (!Number.isInteger(concurrency) || concurrency < 1) throw new Error(`TEST_CONCURRENCY=${process.env.TEST_CONCURRENCY}: a whole number of files at once, 1 or more`);
  const times = readTimes();
  const queue = jobs()
    .filter((j) => filters.length === 0 || filters.some((f) => j.name.includes(f)))
    .map((job, order) => ({ job, order }))
    // the unit tests first (alone), then the files that need the broker alone, back to back, while
    // the files that do not use it (the model-based test, the plan's) run beside them; then the
    // longest first, as last measured
    .sort((a, b) => rank(b.job) - rank(a.job) || (times[b.job.name] ?? 0) - (times[a.job.name] ?? 0) || a.order - b.order)
    .map(({ job }) => job);
  if (queue.length === 0) throw new Error(`no test file matches ${filters.join(' or ')}`);
  console.log(`# ${queue.length} test files, ${concurrency} at once`);
  mkdirSync(TOPICS_DIR, { recursive: true });
  for (const file of leftoverTopicFiles()) await deleteTopics(file);

  const services = new Services();
  const results: Result[] = [];
  const active = new Set<Promise<void>>();
  const began = Date.now();
  const clock = () => `${((Date.now() - began) / 1000).toFixed(0).padStart(4)} s`;

  while (queue.length > 0 || active.size > 0) {
    // start what may start: in queue order, a job waiting for a service also holds back every later
    // job that names that service, so an "alone" job is not starved by a stream of shared ones
    const waitedFor = new Set<Service>();
    for (let i = 0; i < queue.length && active.size < concurrency; ) {
      const job = queue[i]!;
      const waits = [...services.busy(job.claims), ...[...job.claims.keys()].filter((s) => waitedFor.has(s))];
      if (waits.length === 0) {
        queue.splice(i, 1);
        services.take(job.claims);
        console.log(`# ${clock()} start ${job.name}`);
        const p = run(job).then((r) => {
          services.release(job.claims);
          results.push(r);
          console.log(`# ${clock()} ${r.code === 0 ? 'passed' : 'FAILED'} ${job.name}: ${r.tests} tests, ${r.fail} failed, ${r.seconds.toFixed(1)} s`);
          active.delete(p);
        });
        active.add(p);
      } else {
        for (const s of waits) waitedFor.add(s);
        i += 1;
      }
    }
    if (active.size > 0) await Promise.race(active);
  }

  mkdirSync(dirname(TIMES), { recursive: true });
  writeFileSync(TIMES, JSON.stringify({ ...times, ...Object.fromEntries(results.map((r) => [r.job.name, Math.round(r.seconds)])) }, null, 1));
  const failed = results.filter((r) => r.code !== 0);
  const total = (k: 'tests' | 'fail') => results.reduce((s, r) => s + r[k], 0);
  console.log(`# ${results.length} files, ${total('tests')} tests, ${total('fail')} failed, ${((Date.now() - began) / 60000).toFixed(1)} min`);
  for (const r of failed) console.log(`# FAILED ${r.job.name} (exit ${r.code}): ${relative(ROOT, join(ROOT, r.job.args[0]!))}`);
  process.exitCode = failed.length > 0 ? 1 : 0;
}

// run only as a script: the unit test imports the rules above
if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) await main();
